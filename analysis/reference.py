"""The published study's own numbers as runs: read its CSVs, flag durations that cannot be right,
and load them into MLflow as a reference experiment tagged with its GPU (NVIDIA L4, sm_89).

    python -m analysis.reference [--uri URI] [--dir FOLDER] [--claims FILE.yaml]

Rows use the same record names as tracked runs (param ``study_kernel``, ``problem.m/n/k``, metrics
``median_us`` and ``throughput``; tag ``backend=reference``), so :func:`analysis.runs.load_runs` reads
them and ``mlflow ui`` shows them beside this GPU's runs. Durations come from the study's tables V, VII
and IX (durations.csv); the run-4 ablation (ablation_int4_k64.csv, table XII) publishes speedups
only, so those variants' durations are derived (baseline duration / speedup) and tagged ``derived``.
Throughput is 2N^3 / duration, as the study computes it. The study's tables ship with this package
(analysis/data/paper_l4, :data:`DEFAULT_DIR`), transcribed from the paper; ``--dir`` reads another copy.
"""
from __future__ import annotations

import argparse
import hashlib
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from experiments.families import DEFAULT

from .runs import tidy_from_runs

__all__ = ["DEFAULT_CLAIMS", "DEFAULT_DIR", "load_spec", "study_records", "read_study", "load_into_mlflow",
           "main"]

DEFAULT_CLAIMS = Path(__file__).resolve().parent / "claims" / "l4.yaml"
DEFAULT_DIR = Path(__file__).resolve().parent / "data" / "paper_l4"    # the paper's tables V-XII, as CSV
_UNITS_US = {"us": 1.0, "ms": 1e3, "s": 1e6}


def load_spec(claims: str | Path = DEFAULT_CLAIMS) -> dict:
    """The claims file as a dict (YAML). Raises FileNotFoundError naming the path."""
    import yaml
    path = Path(claims)
    if not path.is_file():
        raise FileNotFoundError(f"claims file {path} does not exist; the L4 study's is {DEFAULT_CLAIMS}")
    return yaml.safe_load(path.read_text())


def _family(name: str) -> str:
    return "wmma" if "wmma" in name else "dp4a" if "dp4a" in name else DEFAULT


def _implausible(precision: str, n: int, rate: float, ref: dict) -> str | None:
    peak = ref.get("dense_peak", {}).get(precision)
    frac = ref.get("plausible_fraction_of_peak")
    if peak is None or frac is None or rate >= frac * peak:
        return None
    unit = "TFLOP/s" if precision.startswith(("fp", "bf")) else "TOP/s"
    return (f"the published duration implies {rate:.2g} {unit} for one {n}^3 GEMM, below {frac:.1%} of the "
            f"{ref['gpu']}'s dense {precision} peak ({peak:g} {unit}): it cannot be the time of one GEMM")


def study_records(ref_dir: str | Path = DEFAULT_DIR, spec: dict | None = None) -> list[dict]:
    """One record per (study kernel, N): name, params, tags, metrics (as tracked runs have them).

    Raises FileNotFoundError naming a missing CSV and ValueError for an unknown duration unit.
    """
    spec = spec or load_spec()
    ref, ref_dir = spec["reference"], Path(ref_dir)
    paths = {k: ref_dir / ref[k] for k in ("durations", "ablation")}
    for p in paths.values():
        if not p.is_file():
            raise FileNotFoundError(f"{p} does not exist: pass --dir, the folder with the study's "
                                    f"{ref['durations']} and {ref['ablation']}")
    dur = pd.read_csv(paths["durations"])
    bad = sorted(set(dur["unit"]) - set(_UNITS_US))
    if bad:
        raise ValueError(f"unit={bad[0]!r} in {paths['durations']}; valid units: {', '.join(_UNITS_US)}")
    dur["us"] = dur["duration"] * dur["unit"].map(_UNITS_US)
    rows = [dict(kernel=r.kernel, precision=r.precision, run=int(r.run), n=int(r.N), us=float(r.us),
                 source=ref["durations"], derived="") for r in dur.itertuples()]
    abl = pd.read_csv(paths["ablation"])
    base = {r["n"]: r for r in rows if r["kernel"] == ref["ablation_kernel"]}
    aliases = spec.get("aliases", {})
    for r in abl.itertuples():
        name = f"{ref['ablation_kernel']}_{r.variant}"
        if aliases.get(name) == ref["ablation_kernel"]:
            continue                                   # the baseline itself, already a durations row
        for col in (c for c in abl.columns if c.startswith("N")):
            n = int(col[1:])
            speed = float(getattr(r, col))
            rows.append(dict(kernel=name, precision=base[n]["precision"], run=4, n=n,
                             us=base[n]["us"] / speed, source=ref["ablation"],
                             derived=f"{ref['ablation_kernel']} duration / published speedup {speed:.2f}"))
    out = []
    for r in rows:
        rate = 2.0 * r["n"] ** 3 / (r["us"] * 1e-6) / 1e12
        tags = {"kernel": r["kernel"], "gpu": ref["gpu"], "backend": "reference",
                "compute_capability": str(ref["compute_capability"]), "verified": "true",
                "source": r["source"],
                "throughput_unit": "TFLOP/s" if r["precision"].startswith(("fp", "bf")) else "TOP/s"}
        if r["derived"]:
            tags["derived"] = r["derived"]
        if why := _implausible(r["precision"], r["n"], rate, ref):
            tags["implausible"] = why
        out.append({"name": f"{r['kernel']} N={r['n']} (study)", "tags": tags,
                    "params": {"study_kernel": r["kernel"], "precision": r["precision"],
                               "family": _family(r["kernel"]), "study_run": r["run"],
                               "problem.m": r["n"], "problem.n": r["n"], "problem.k": r["n"]},
                    "metrics": {"median_us": r["us"], "throughput": rate}})
    return out


def read_study(ref_dir: str | Path = DEFAULT_DIR, spec: dict | None = None) -> pd.DataFrame:
    """The study's numbers as a tidy table, as :func:`analysis.runs.load_runs` reads them from the
    reference experiment (``implausible``: the reason or None; ``derived``: how, or None)."""
    recs = study_records(ref_dir, spec)
    fake = [SimpleNamespace(info=SimpleNamespace(run_id=f"study-{i}", status="FINISHED", start_time=0),
                            data=SimpleNamespace(tags=r["tags"], metrics=r["metrics"],
                                                 params={k: str(v) for k, v in r["params"].items()}))
            for i, r in enumerate(recs)]
    return tidy_from_runs(fake, (spec or load_spec())["reference"]["experiment"])


def load_into_mlflow(uri: str, ref_dir: str | Path = DEFAULT_DIR, claims: str | Path = DEFAULT_CLAIMS) -> str:
    """Log the study's records as runs under one parent (tag ``kind=reference-study``) in the
    reference experiment the claims file names; returns the parent run id. Loading the same CSVs
    again returns the existing parent and adds nothing, also when loaded by two processes at once (the
    check and the loading hold the store's lock). Raises StoreError for a store that cannot be used."""
    from mlflow.entities import Metric, Param, RunTag

    from experiments.store.track import Tracker, store_lock
    spec = load_spec(claims)
    ref = spec["reference"]
    recs = study_records(ref_dir, spec)
    digest = hashlib.sha256("".join((Path(ref_dir) / ref[k]).read_text() for k in ("durations", "ablation"))
                            .encode()).hexdigest()[:16]
    tr = Tracker(uri, ref["experiment"])
    client, exp_id = tr.client, tr.experiment_id
    with store_lock(uri):
        found = client.search_runs(
            [exp_id], f"tags.kind = 'reference-study' and tags.source_sha = '{digest}'", max_results=1)
        if found:
            return found[0].info.run_id
        parent = client.create_run(exp_id, run_name=f"study: {spec['study']}", tags={
            "kind": "reference-study", "source_sha": digest, "gpu": ref["gpu"],
            "compute_capability": str(ref["compute_capability"]),
            "source": spec.get("source", "")}).info.run_id
        for r in recs:
            rid = client.create_run(exp_id, run_name=r["name"],
                                    tags={**r["tags"], "mlflow.parentRunId": parent}).info.run_id
            client.log_batch(rid, metrics=[Metric(k, float(v), 0, 0) for k, v in r["metrics"].items()],
                             params=[Param(k, str(v)) for k, v in r["params"].items()],
                             tags=[RunTag("mlflow.runName", r["name"])])
            client.set_terminated(rid, "FINISHED")
        client.set_terminated(parent, "FINISHED")
    return parent


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uri", default=None, help="tracking URI (default: as run.py resolves it)")
    ap.add_argument("--dir", default=str(DEFAULT_DIR), help="folder with the study's CSVs")
    ap.add_argument("--claims", default=str(DEFAULT_CLAIMS),
                    help="claims file whose `reference` section applies")
    args = ap.parse_args(argv)
    from experiments.store.track import StoreError, StoreUnavailable, resolve_uri
    uri = resolve_uri(args.uri)
    if not (Path(args.dir) / "durations.csv").is_file():
        raise SystemExit(f"no study CSVs (durations.csv, ablation_int4_k64.csv) in {args.dir}; "
                         "give their folder with --dir")
    try:
        parent = load_into_mlflow(uri, args.dir, args.claims)
    except StoreError as exc:
        raise SystemExit(f"Store error: {exc}") from None
    except StoreUnavailable as exc:                # locked by another process, or a full disk
        raise SystemExit(f"Store unavailable: {exc}") from None
    flagged = read_study(args.dir, load_spec(args.claims)).dropna(subset=["implausible"])
    print(f"Study loaded into {uri}, experiment {load_spec(args.claims)['reference']['experiment']!r} "
          f"(parent run {parent}).")
    for r in flagged.itertuples():
        print(f"flagged: {r.kernel} N={r.size}: {r.implausible}")


if __name__ == "__main__":
    main()
