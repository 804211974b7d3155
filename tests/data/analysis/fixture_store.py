"""Build the MLflow store the analysis tests and notebooks run on (SQLite in a folder of the caller's).

What is real and what is constructed:
- REAL (measured with this tool on an NVIDIA H200, main_job_h200.md beside this file): kernel names, problem
  sizes, median_us, throughput and spread of 30 runs (6 kernels x 5 sizes), and the configuration
  each kernel name encodes. REAL (ptxas 13.0 for sm_90 on these kernels): registers per thread and the
  theoretical occupancy of 0.125 (one 256-thread block per SM). REAL (ncu_raw_set_full.csv of
  reference/h200): the H200 DRAM clock, dram__cycles_elapsed.avg.per_second = 3,199,436,763.95 Hz.
- CONSTRUCTED for the tests (no kernel of this tool has been profiled with ncu yet):
  * every ``ncu.*`` metric, by the formulas in :func:`ncu_metrics` (DRAM bytes = compulsory traffic,
    DRAM share = those bytes / (median time x 4.8 TB/s), the count = share x duration x the real DRAM clock, achieved occupancy =
    0.125 x wave fill x min(1, 200 / registers));
  * the ``study_kernel`` names given to four of the kernels (:data:`STUDY_NAMES`);
  * one FAILED run (wrong result at 16384), one older FAILED duplicate of a measured run, and one
    skipped run (FINISHED, tag outcome=skipped), with the messages the tool writes for such runs.
- The study's own numbers are loaded by analysis.reference from the tables that ship with the package
  (analysis/data/paper_l4).
"""
from __future__ import annotations

import contextlib
import math
import re
import shutil
import sqlite3
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
# real H200 timings of this tool (the headline and fp16/bf16 sweeps), kept here as the fixture's source
MAIN_JOB = Path(__file__).resolve().parent / "main_job_h200.md"
PAPER_L4 = REPO / "analysis" / "data" / "paper_l4"      # the study's tables, packaged
EXPERIMENT = "tensor-core-ablations"

REGISTERS = {"bf16_bk32": 224, "fp16_bk32": 224, "int4_bk32": 196, "int4_bk64": 236,
             "int8_bk32": 183, "int8_bk64": 224}        # REAL: ptxas 13.0, sm_90
STUDY_NAMES = {"int8_bk32": "int8_ptx_mma_k32", "int4_bk32": "int4_ptx_mma_k32",
               "int4_bk64": "int4_ptx_mma_k64", "fp16_bk32": "fp16_ptx_mma"}   # CONSTRUCTED mapping
H200_SMS, H200_DRAM_HZ, H200_DRAM_BPS = 132, 3_199_436_763.95, 4.8e12
BITS = {"fp16": 16, "bf16": 16, "int8": 8, "int4": 4}
_NAME = re.compile(r"gemm_(?P<prec>\w+?)_bk(?P<bk>\d+)_m16n8k(?P<mk>\d+)_ldx4x2_(?P<cache>c[ag])_bcol_s(?P<st>\d)"
                   r"_(?P<bm>\d+)x(?P<bn>\d+)_w(?P<wm>\d)x(?P<wn>\d)_g(?P<g>\d+)")


def main_job_rows(path: Path = MAIN_JOB) -> list[dict]:
    """The 30 measured rows of main_job_h200.md (a table experiments.reports.report wrote on an H200): kernel, m, n, k, median_us, throughput,
    unit, spread (a fraction), status."""
    rows = []
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 6 or not cells[0].startswith("gemm_"):
            continue
        m, n, k = (int(v) for v in cells[1].split("x"))
        thr, unit = cells[3].split()
        rows.append({"kernel": cells[0], "m": m, "n": n, "k": k, "median_us": float(cells[2]),
                     "throughput": float(thr), "unit": unit, "spread": float(cells[4].rstrip("%")) / 100,
                     "status": cells[5]})
    return rows


def config_of(kernel: str) -> dict:
    """The flattened config params a kernel name encodes (as run.py logs them)."""
    g = _NAME.fullmatch(kernel).groupdict()
    return {"precision": g["prec"], "ktile": g["bk"], "mma": f"m16n8k{g['mk']}", "backend": "auto",
            "tile.block": f"[{g['bm']}, {g['bn']}]", "tile.warps": f"[{g['wm']}, {g['wn']}]",
            "tile.group_m": g["g"], "pipeline.stages": g["st"], "eviction.cache": g["cache"],
            "spec.ktile": g["bk"], "spec.mma": f"m16n8k{g['mk']}"}


def _key(kernel: str) -> str:
    g = _NAME.fullmatch(kernel).groupdict()
    return f"{g['prec']}_bk{g['bk']}"


def ncu_metrics(row: dict) -> dict:
    """CONSTRUCTED ncu.* metrics of one measured row (see the module docstring)."""
    m, n, k, us = row["m"], row["n"], row["k"], row["median_us"]
    bits = BITS[_key(row["kernel"]).split("_")[0]]
    compulsory = (m * k + k * n) * bits / 8 + m * n * 4
    share = 100 * min(0.95, compulsory / (us * 1e-6 * H200_DRAM_BPS))
    blocks = (m // 256) * (n // 128)
    fill = blocks / (math.ceil(blocks / H200_SMS) * H200_SMS)
    occ = 12.5 * fill * min(1.0, 200 / REGISTERS[_key(row["kernel"])])
    return {"ncu.duration_us": us, "ncu.dram_active_pct": share, "ncu.dram_bytes": compulsory,
            "ncu.dram_cycles_active": share / 100 * us * 1e-6 * H200_DRAM_HZ,
            "ncu.achieved_occupancy_pct": occ, "ncu.theoretical_occupancy_pct": 12.5}


class _Store:
    def __init__(self, uri: str, experiment: str):
        import mlflow

        from experiments.store.track import sqlite_path
        self.c = mlflow.MlflowClient(tracking_uri=uri)
        exp = self.c.get_experiment_by_name(experiment)
        db = sqlite_path(uri)      # artifacts beside the database: MLflow's default is ./mlruns of the cwd
        self.exp = exp.experiment_id if exp else self.c.create_experiment(
            experiment, artifact_location=(db.parent / "artifacts").as_uri() if db else None)

    def run(self, name, params, tags, metrics, status="FINISHED", parent=None, start=None):
        from mlflow.entities import Metric, Param
        tags = dict(tags, **({"mlflow.parentRunId": parent} if parent else {}))
        r = self.c.create_run(self.exp, run_name=name, start_time=start, tags=tags)
        rid = r.info.run_id
        self.c.log_batch(rid, metrics=[Metric(k, float(v), 0, 0) for k, v in metrics.items()],
                         params=[Param(k, str(v)) for k, v in params.items()])
        self.c.set_terminated(rid, status)
        return rid


def _measured(st: _Store, parent: str, row: dict, ncu: bool, study: bool, start: int) -> str:
    key = _key(row["kernel"])
    params = {**config_of(row["kernel"]), "problem.m": row["m"], "problem.n": row["n"], "problem.k": row["k"]}
    if study and key in STUDY_NAMES:
        params["study_kernel"] = STUDY_NAMES[key]
    tags = {"kernel": row["kernel"], "gpu": "NVIDIA H200", "compute_capability": "90", "backend": "gpu",
            "verified": "true", "throughput_unit": row["unit"]}
    metrics = {"median_us": row["median_us"], "throughput": row["throughput"], "spread": row["spread"],
               "registers": REGISTERS[key], "theoretical_occupancy": 0.125}
    if ncu:
        metrics.update(ncu_metrics(row))
    return st.run(f"{row['kernel']} {row['m']}x{row['n']}x{row['k']}", params, tags, metrics,
                  parent=parent, start=start)


@contextlib.contextmanager
def _no_fsync():
    """SQLite without fsync while the disposable store is written (several times faster)."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    def fast(conn, _):
        if isinstance(conn, sqlite3.Connection):
            conn.execute("PRAGMA synchronous=OFF")
    event.listen(Engine, "connect", fast)
    try:
        yield
    finally:
        event.remove(Engine, "connect", fast)


def build(folder: Path, reference_dir: Path | None = PAPER_L4) -> dict:
    """Create the store in ``folder``; returns {"uri", "ncu", "plain", "one", "reference"}: the URI,
    the parent run ids of the three sweeps, and the reference parent id (None without the study's
    CSVs). Sweeps: "ncu" = 30 real runs with constructed ncu metrics and study names, plus a FAILED
    run, an older FAILED duplicate and a skipped run; "plain" = the same 30 real runs without ncu;
    "one" = the five sizes of one kernel (with constructed ncu metrics)."""
    folder.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    st = _Store(uri, EXPERIMENT)
    rows = main_job_rows()
    t0 = int(time.time() * 1000) - 10_000_000
    out = {"uri": uri}
    sweeps = (("ncu", "sweep precision=fp16,bf16,int4,int8 ktile=32,64 (fixture, ncu)", rows, True),
              ("plain", "sweep precision=fp16,bf16,int4,int8 ktile=32,64 (fixture)", rows, False),
              ("one", "sweep precision=int8 ktile=64 (fixture)",
               [r for r in rows if r["kernel"].startswith("gemm_int8_bk64")], False))
    for i, (label, name, chosen, ncu) in enumerate(sweeps):
        ncu = ncu or label == "one"
        parent = st.run(name, {}, {"kind": "sweep", "sweep_key": f"fixture-{label}"}, {}, start=t0 + i * 100_000)
        out[label] = parent
        for j, row in enumerate(chosen):
            _measured(st, parent, row, ncu=ncu, study=ncu, start=t0 + i * 100_000 + 10 * (j + 1))
    first = rows[0]
    cfg = config_of(first["kernel"])
    base = {"kernel": first["kernel"], "gpu": "NVIDIA H200", "compute_capability": "90", "backend": "gpu"}
    st.run(f"{first['kernel']} 16384x16384x16384", {**cfg, "problem.m": 16384, "problem.n": 16384, "problem.k": 16384},
           {**base, "verified": "false", "error": "verification failed: 12 of 268435456 elements differ "
            "(worst at [0, 7]: 3.1 vs 2.9)"}, {"verify_mismatches": 12}, "FAILED", out["ncu"], t0 + 50)
    st.run(f"{first['kernel']} 512x512x512", {**cfg, "problem.m": 512, "problem.n": 512, "problem.k": 512},
           {**base, "error": "TimeoutError: the GPU worker did not answer within 600 s"}, {}, "FAILED",
           out["ncu"], t0 + 1)
    st.run("skipped precision=int8 mma=m16n8k64", {"precision": "int8", "mma": "m16n8k64"},
           {"backend": "gpu", "outcome": "skipped", "skip_reason": "mma=m16n8k64 is not valid with "
            "precision=int8; valid values: auto, m16n8k16, m16n8k32"}, {}, "FINISHED", out["ncu"], t0 + 2)
    out["reference"] = None
    if reference_dir is not None and Path(reference_dir).is_dir():
        from analysis.reference import load_into_mlflow
        out["reference"] = load_into_mlflow(uri, reference_dir)
    return out


def shared_store(tmp_path_factory) -> dict:
    """The store in this process's base temp folder (the analysis test modules share it), as :func:`build`
    returns it. It is built once per test run, in the folder the run's processes share (conftest:
    TC_TOOL_CACHE), by the first process that needs it while the others wait, and each process gets a
    copy of its own (tests write reports and tags into it) with the artifact locations moved to the
    copy; without that folder, built here."""
    import json
    import os

    from filelock import FileLock
    folder = tmp_path_factory.getbasetemp() / "analysis_store"
    marker = folder / "ids.json"
    if marker.exists():
        return json.loads(marker.read_text())
    shared = os.environ.get("TC_TOOL_CACHE")
    if not shared:
        with _no_fsync():
            ids = build(folder)
        marker.write_text(json.dumps(ids))
        return ids
    made = Path(shared) / "analysis_store"
    with FileLock(str(made) + ".lock"):
        if not (made / "ids.json").exists():      # built beside, then moved: never half a store in made
            part = made.with_name(made.name + ".part")
            shutil.rmtree(part, ignore_errors=True)
            with _no_fsync():
                (part / "ids.json").write_text(json.dumps(build(part)))
            part.rename(made)
    ids = json.loads((made / "ids.json").read_text())
    _copy(made, Path(ids["uri"][len("sqlite:///"):]).parent, folder)
    ids["uri"] = f"sqlite:///{folder / 'mlflow.db'}"
    marker.write_text(json.dumps(ids))
    return ids


def _copy(made: Path, built_in: Path, folder: Path) -> None:
    """A copy in ``folder`` of the store :func:`build` made in the folder ``built_in``, now ``made``: the
    database through SQLite's backup, the artifacts as files, and every artifact location under
    ``built_in`` moved to ``folder``."""
    shutil.copytree(made, folder, ignore=shutil.ignore_patterns("mlflow.db*", "ids.json"))
    old, new = (built_in / "artifacts").as_uri(), (folder / "artifacts").as_uri()
    with contextlib.closing(sqlite3.connect(made / "mlflow.db")) as src, \
            contextlib.closing(sqlite3.connect(folder / "mlflow.db")) as dst:
        src.backup(dst)
        with dst:
            dst.execute("UPDATE experiments SET artifact_location = replace(artifact_location, ?, ?)", (old, new))
            dst.execute("UPDATE runs SET artifact_uri = replace(artifact_uri, ?, ?)", (old, new))


if __name__ == "__main__":
    import sys
    print(build(Path(sys.argv[1] if len(sys.argv) > 1 else "outputs/analysis_fixture")))
