"""Tidy table of tracked runs: one row per (kernel, problem size, GPU), from an MLflow store.

This module is the one place that names what the analysis reads from a run record: :data:`COLUMNS`
maps each canonical column of the table to the tag, param or metric the tracking (experiments/runner/job.py)
and the Nsight Compute step write; the units and meanings of the metric columns come from the metric
declarations (experiments/metrics.py), and metrics without a column are kept under their own names
(pct_of_peak, speedup_vs_<family>, power_w_mean, ...), none dropped. Columns that no run has are
still present (all missing), so a sweep without ncu metrics loads and the analysis says what it
cannot answer instead of failing.

    df = load_runs(sweep="latest")                      # the newest sweep of the default store
    df = load_runs(uri, experiment="tensor-core-ablations", filter_string="params.precision = 'int8'")
"""
from __future__ import annotations

import math
import shlex
import typing
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.metrics import describe
from experiments.families import DEFAULT

from .schema import cast, infer, schema_types

__all__ = ["Column", "COLUMNS", "NCU_STALL_PREFIX", "THROUGHPUT", "MEDIAN_US", "NCU_DURATION", "OCCUPANCY",
           "DRAM_SHARE", "DRAM_COUNT", "SPREAD", "DEFAULT_EXPERIMENT", "RunsError", "load_runs", "read_table",
           "tidy_from_runs", "ok_runs", "unmeasured_note", "config_axes", "size_order", "short_labels"]

DEFAULT_EXPERIMENT = "tensor-core-ablations"


class RunsError(LookupError):
    """The runs asked for are not in the store; the message names what was asked and what exists."""


@dataclass(frozen=True)
class Column:
    """One canonical column: where it comes from in the run record and what it holds."""
    name: str       # column of the tidy table
    source: str     # "info" (run attributes), "tag", "param" or "metric"
    key: str        # the run record's name of it
    dtype: str      # "str", "int", "float" or "bool"
    doc: str        # unit and meaning


COLUMNS: tuple[Column, ...] = (
    Column("run_id", "info", "run_id", "str", "MLflow run id"),
    Column("status", "info", "status", "str",
           "FINISHED (also a skipped run: outcome skipped), FAILED (tag error) or KILLED (interrupted)"),
    Column("start_time", "info", "start_time", "int", "ms since the epoch"),
    Column("parent_run_id", "tag", "mlflow.parentRunId", "str", "the sweep's parent run"),
    Column("outcome", "tag", "outcome", "str",
           "verified, static, skipped, failed or interrupted (derived from status for older runs)"),
    Column("kernel", "tag", "kernel", "str", "PTX entry name (unique per kernel configuration)"),
    Column("gpu", "tag", "gpu", "str", "GPU name as NVML reports it, e.g. 'NVIDIA H200'"),
    Column("compute_capability", "tag", "compute_capability", "str", "e.g. '90'"),
    Column("backend", "tag", "backend", "str", "gpu (measured), static (ptxas only) or reference (a study)"),
    Column("verified", "tag", "verified", "bool", "the output matched the reference before timing"),
    Column("throughput_unit", "tag", "throughput_unit", "str", "TFLOP/s (float types) or TOP/s (integer)"),
    Column("error", "tag", "error", "str", "why a FAILED run failed"),
    Column("skip_reason", "tag", "skip_reason", "str", "why a run was skipped (or interrupted)"),
    Column("implausible", "tag", "implausible", "str",
           "reference runs: why a published duration cannot be right"),
    Column("derived", "tag", "derived", "str",
           "reference runs: how a duration was derived from published ratios"),
    Column("study_kernel", "param", "study_kernel", "str", "the study's name of this kernel (study presets)"),
    Column("study_kernel", "tag", "study_kernel", "str", "the same, where the record carries it as a tag"),
    Column("family", "param", "family", "str",
           f"kernel family: {DEFAULT} (default), wmma, dp4a, cublas, ..."),
    Column("mma_native", "tag", "mma_native", "str",
           "true / false / unknown: the SASS holds the element type's tensor-core MMA (false: emulated)"),
    Column("m", "param", "problem.m", "int", "rows of A and C"),
    Column("n", "param", "problem.n", "int", "columns of B and C"),
    Column("k", "param", "problem.k", "int", "inner dimension"),
    *(Column(name, "metric", key, "float", describe(key)) for name, key in (
        ("median_us", "median_us"), ("min_us", "min_us"), ("max_us", "max_us"), ("spread", "spread"),
        ("throughput", "throughput"), ("registers", "registers"),
        ("theoretical_occupancy_pct", "theoretical_occupancy_pct"),
        ("theoretical_occupancy", "theoretical_occupancy"),       # runs logged before the % (0..1)
        ("sm_clock_mhz_before", "sm_clock_mhz_before"), ("sm_clock_mhz_after", "sm_clock_mhz_after"),
        ("ncu_duration_us", "ncu.duration_us"), ("achieved_occupancy_pct", "ncu.achieved_occupancy_pct"),
        ("ncu_theoretical_occupancy_pct", "ncu.theoretical_occupancy_pct"),
        ("dram_cycles_active", "ncu.dram_cycles_active"), ("dram_active_pct", "ncu.dram_active_pct"),
        ("dram_bytes", "ncu.dram_bytes"), ("l1_hit_rate_pct", "ncu.l1_hit_rate_pct"),
        ("l2_hit_rate_pct", "ncu.l2_hit_rate_pct"), ("tensor_pipe_active_pct", "ncu.tensor_pipe_active_pct"),
        ("ncu_sm_clock_hz", "ncu.sm_clock_hz"), ("ipc", "ncu.ipc"), ("inst_executed", "ncu.inst_executed"))),
)
NCU_STALL_PREFIX = "ncu.stall_"     # ncu.stall_<reason> -> column stall_<reason>

# canonical names the statistics and figures use (the left column of COLUMNS)
THROUGHPUT, MEDIAN_US, SPREAD, NCU_DURATION = "throughput", "median_us", "spread", "ncu_duration_us"
OCCUPANCY, DRAM_SHARE, DRAM_COUNT = "achieved_occupancy_pct", "dram_active_pct", "dram_cycles_active"

_BY_KEY = {(c.source, c.key): c for c in COLUMNS}
_NAMES = {c.name for c in COLUMNS}
_IDENTITY = ["kernel", "m", "n", "k", "gpu"]
# run-key settings the kernel's entry name does not carry (the same PTX launched otherwise), with the
# value a run logged before the setting existed ran with: runs that differ in one are not duplicates
_SETTINGS = {"launch.blocks_per_sm": 0, "data": "full", "timing.regime": "sustained"}


def tidy_from_runs(runs: typing.Iterable, experiment: str = "") -> pd.DataFrame:
    """Tidy table from MLflow ``Run`` objects (or anything with ``.info`` and ``.data``).

    Returns a DataFrame with one row per run (before de-duplication): the canonical columns of
    :data:`COLUMNS` (all present; missing values NaN/None), other ``ncu.<name>`` metrics as
    ``ncu_<name>``, every other metric, declared in experiments/metrics.py or not, under its own name
    (``metrics.<name>`` where a column or config key has that name), every config param under its dotted name
    cast to the schema type (``tile.block`` -> tuple), ``stall_<reason>`` columns, and derived columns
    ``size`` (N for square problems, else 'MxNxK'), ``flop`` (2MNK) and ``experiment``.
    """
    types = schema_types()
    rows = []
    for r in runs:
        row = {"run_id": r.info.run_id, "status": r.info.status, "start_time": r.info.start_time,
               "experiment": experiment}
        for source, store in (("tag", r.data.tags), ("param", r.data.params), ("metric", r.data.metrics)):
            for key, val in store.items():
                col = _BY_KEY.get((source, key))
                if col is not None:
                    row[col.name] = None if source == "param" and val in ("null", "None", "none") else val
                elif source == "metric" and key.startswith(NCU_STALL_PREFIX):
                    row["stall_" + key[len(NCU_STALL_PREFIX):]] = val
                elif source == "metric" and key.startswith("ncu."):       # no column of its own: ncu_<name>
                    row["ncu_" + key[len("ncu."):]] = val
                elif source == "metric":        # every other metric, declared or not, under its own name
                    row[f"metrics.{key}" if key in _NAMES or key in types else key] = val
                elif source == "param":          # a param named like a column (backend) -> params.<key>
                    name = f"params.{key}" if key in _NAMES else key
                    row[name] = cast(val, types[key]) if key in types else val
        rows.append(row)
    df = pd.DataFrame(rows)
    for c in COLUMNS:
        if c.name not in df:
            df[c.name] = np.nan if c.dtype in ("int", "float") else None
        elif c.dtype == "float":
            df[c.name] = pd.to_numeric(df[c.name], errors="coerce")
        elif c.dtype == "int" and c.source != "info":
            df[c.name] = pd.to_numeric(df[c.name], errors="coerce").astype("Int64")
        elif c.dtype == "bool":
            df[c.name] = df[c.name].map(lambda v: None if v is None or v != v else str(v).lower() == "true")
    for key in [k for k in df.columns if k not in _NAMES and k not in ("experiment", "start_time")]:
        if types.get(key) is int:                     # missing in some runs: nullable integers
            df[key] = pd.to_numeric(df[key]).astype("Int64")
        elif key not in types and (df[key].dtype == object or pd.api.types.is_string_dtype(df[key])):
            df[key] = infer(df[key])
    df["family"] = df["family"].fillna(DEFAULT)
    # one scale: runs logged before theoretical_occupancy_pct hold the fraction 0..1
    occ = "theoretical_occupancy_pct"
    df[occ] = df[occ].fillna(100 * df["theoretical_occupancy"])
    older = {"FINISHED": "verified", "FAILED": "failed", "KILLED": "skipped", "RUNNING": "running"}
    df["outcome"] = df["outcome"].fillna(df["status"].map(older))
    df.loc[(df["outcome"] == "verified") & (df["backend"] == "static"), "outcome"] = "static"
    square = (df["m"] == df["n"]) & (df["n"] == df["k"])
    df["size"] = [(str(int(m)) if sq else f"{m}x{n}x{k}") if pd.notna(m) else None
                  for m, n, k, sq in zip(df["m"], df["n"], df["k"], square.fillna(False), strict=True)]
    df["flop"] = 2.0 * df["m"].astype(float) * df["n"].astype(float) * df["k"].astype(float)
    return df


def value_text(v) -> str:
    """A param value as text to compare by: '-' for missing, integral numbers without '.0' (a param
    read back as 2, 2.0 or '2' is the same setting), else str()."""
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
        return "-"
    number = isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
    if number and float(v).is_integer():
        return str(int(v))
    return str(v)


def _dedupe(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (kernel, size, GPU, settings of :data:`_SETTINGS`): a FINISHED run before others,
    then the newest."""
    keyed = df.dropna(subset=["kernel", "m"])
    rest = df.drop(keyed.index)
    settings = {f"_{c}": keyed[c].astype(object).where(keyed[c].notna(), v).map(value_text)
                for c, v in _SETTINGS.items() if c in keyed}
    keyed = keyed.assign(_fin=(keyed["status"] == "FINISHED").astype(int), **settings)
    keyed = keyed.sort_values(["_fin", "start_time"], ascending=False)
    keyed = keyed.drop_duplicates(subset=_IDENTITY + list(settings), keep="first")
    keyed = keyed.drop(columns=["_fin", *settings])
    out = pd.concat([keyed, rest], ignore_index=True)
    out.attrs["duplicates_dropped"] = len(df) - len(out)
    return out


def load_runs(uri: str | None = None, experiment: str | typing.Sequence[str] | None = DEFAULT_EXPERIMENT,
              sweep: str | None = None, filter_string: str | None = None,
              backends: typing.Sequence[str] | None = ("gpu", "reference")) -> pd.DataFrame:
    """Read the runs of an experiment (or several), one sweep of it, or a filter, into a tidy table.

    ``uri``: tracking URI (default: as run.py resolves it). ``experiment``: name(s); None = every
    experiment of the store. ``sweep``: a parent run id, or "latest" (the newest run tagged
    ``kind=sweep``); only its runs are read, those it reused from earlier sweeps included (column
    ``reused`` True; experiments.store.track.sweep_runs). ``filter_string``: an MLflow search filter,
    e.g. ``"params.precision = 'int8'"``. ``backends``: keep runs with these ``backend`` tags
    (None keeps all, static runs included). Parent runs are never rows.

    Returns the table of :func:`tidy_from_runs`, de-duplicated to one row per (kernel, size, GPU)
    (a FINISHED run before others, then the newest); ``df.attrs`` holds uri, experiments, sweep and
    duplicates_dropped. FAILED and KILLED runs stay as rows (see :func:`ok_runs`).
    Raises what :func:`open_source` raises (the store, experiment or sweep as given), and RunsError for
    a filter MLflow cannot read.
    """
    from experiments.store.record import reused_in
    from experiments.store.track import sweep_runs
    uri, client, names, ids, sweep = open_source(uri, experiment, sweep)
    filters = [filter_string] if filter_string else []
    id_to_name = dict(zip(ids, names, strict=True))
    runs, token = [], None
    from mlflow.exceptions import MlflowException
    try:
        if sweep:               # the runs it measured and those it reused from earlier sweeps
            runs = sweep_runs(client, ids, sweep, filter_string or "")
        else:
            while True:
                page = client.search_runs(ids, " and ".join(filters), max_results=5000, page_token=token)
                runs.extend(page)
                token = page.token
                if not token:
                    break
    except MlflowException as exc:
        if not filter_string or exc.error_code != "INVALID_PARAMETER_VALUE":
            raise
        why = str(exc.message).strip().splitlines()[0]
        raise RunsError(f"the filter {filter_string!r} is not an MLflow search filter ({why}); e.g. "
                        "\"params.precision = 'int8' and metrics.throughput > 100\"") from None
    runs = [r for r in runs if r.data.tags.get("kind") not in ("sweep", "report", "reference-study")]
    frames = [tidy_from_runs([r for r in runs if r.info.experiment_id == i], id_to_name[i]) for i in ids]
    frames = [f for f in frames if len(f)]
    df = tidy_from_runs([]) if not frames else pd.concat(frames, ignore_index=True)
    if backends is not None:
        df = df[df["backend"].isin(list(backends))]
    df = df.assign(reused=df["run_id"].isin({r.info.run_id for r in runs if reused_in(r, sweep)}))
    df = _dedupe(df.reset_index(drop=True))
    df.attrs.update(uri=uri, experiments=names, sweep=sweep, filter=filter_string)
    return df


def open_source(uri: str | None, experiment: str | typing.Sequence[str] | None = DEFAULT_EXPERIMENT,
                sweep: str | None = None) -> tuple:
    """What :func:`load_runs` reads from, checked before a run is read: (uri, MlflowClient, experiment
    names, their ids, the sweep's parent run id or None). ``uri`` as run.py resolves it; ``sweep`` a
    parent run id or "latest". Raises experiments.store.track.UriError for a URI that names no store,
    RunsError for a store, experiment or sweep that is not there (naming what is), and at once when no
    tracking server answers at an http(s) URI or the store is another MLflow version's."""
    import mlflow

    from experiments.store.track import StoreError, check_schema, check_server, resolve_uri
    uri = resolve_uri(uri, create=False)
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).exists():
        raise RunsError(f"no store at {uri[len('sqlite:///'):]} (tracking URI {uri}): run a sweep first "
                        "(python run.py ...) or pass the URI it printed with --uri")
    try:
        if uri.startswith(("http://", "https://")):
            check_server(uri, option="--uri")     # MLflow's client would retry for minutes
        check_schema(uri, write=False)            # MLflow would migrate another version's store
    except StoreError as exc:
        raise RunsError(str(exc)) from None
    client = mlflow.MlflowClient(tracking_uri=uri)
    all_exps = {e.name: e.experiment_id for e in client.search_experiments()}
    names = (list(all_exps) if experiment is None
             else [experiment] if isinstance(experiment, str) else list(experiment))
    missing = [n for n in names if n not in all_exps]
    if missing:
        raise RunsError(f"experiment {missing[0]!r} is not in {uri}; experiments there: "
                        + (", ".join(sorted(all_exps)) or "none"))
    ids = [all_exps[n] for n in names]
    if sweep == "latest":
        parents = client.search_runs(ids, "tags.kind = 'sweep'", max_results=1,
                                     order_by=["attributes.start_time DESC"])
        if not parents:
            raise RunsError(f"no sweep (parent run tagged kind=sweep) in experiment(s) "
                            f"{', '.join(names)} of {uri}")
        sweep = parents[0].info.run_id
    if sweep:
        try:
            tags = client.get_run(sweep).data.tags
        except Exception as exc:  # noqa: BLE001 - MlflowException for an unknown id
            raise RunsError(f"sweep={sweep!r} is not a run id in {uri}; use a parent run id from "
                            f"mlflow ui --backend-store-uri {shlex.quote(uri)} or sweep='latest'") from exc
        if tags.get("kind") != "sweep":
            parent = tags.get("mlflow.parentRunId")
            raise RunsError(f"sweep={sweep!r} is the run of one kernel, not a sweep's parent run"
                            + (f"; its sweep is {parent}" if parent else "") + " (or use sweep='latest')")
    return uri, client, names, ids, sweep


# the columns of every run, which a tidy table always has
_TABLE_KEYS = ("run_id", "status", "experiment", "kernel", "backend")


def read_table(paths: str | Path | typing.Sequence[str | Path]) -> pd.DataFrame:
    """A tidy table saved as CSV (the ``runs.csv`` analysis.report writes, e.g. the committed
    results/h200/*/runs.csv), read back with the types :func:`load_runs` gives: str columns as str
    (``size`` '512'), params cast to their schema types (``tile.block`` (256, 128)), numbers numeric.
    Several paths are concatenated. ``attrs`` name the files. Raises FileNotFoundError naming a
    missing file, RunsError naming a file that is not such a table (empty, not CSV, not text, or
    without the columns every run has)."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    for p in paths:
        if not Path(p).is_file():
            raise FileNotFoundError(f"no tidy table at {p}: give a runs.csv that analysis.report wrote")
    frames = []
    for p in paths:
        try:
            frames.append(pd.read_csv(p, dtype=str))
        except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as exc:
            why = "empty" if isinstance(exc, pd.errors.EmptyDataError) else str(exc).strip().splitlines()[-1]
            raise RunsError(f"{p} is not a tidy table ({why}): give a runs.csv that analysis.report "
                            "wrote") from None
        if missing := [c for c in _TABLE_KEYS if c not in frames[-1].columns]:
            raise RunsError(f"{p} is not a tidy table: it has no column {', '.join(missing)}; give a "
                            "runs.csv that analysis.report wrote")
    df = pd.concat(frames, ignore_index=True)
    df = df.astype(object).where(df.notna(), None)
    types = schema_types()
    for col in df.columns:
        c = next((c for c in COLUMNS if c.name == col), None)
        if c is not None and c.dtype == "str" or col in ("size", "experiment"):
            continue
        if c is not None and c.dtype == "bool":
            df[col] = df[col].map(lambda v: None if v is None else str(v).lower() == "true")
        elif c is not None and c.dtype == "int" and c.source != "info":
            df[col] = pd.to_numeric(df[col]).astype("Int64")
        elif col in types and types[col] is not int:
            df[col] = df[col].map(lambda v, tp=types[col]: cast(v, tp))
        else:
            df[col] = infer(df[col])
    df = df.copy()                                      # one block per column, not fragmented
    df.attrs.update(uri=None, table=", ".join(map(str, paths)), sweep=None, filter=None,
                    experiments=sorted(df["experiment"].dropna().unique()))
    return df


def unmeasured_note(runs: pd.DataFrame) -> str | None:
    """For a table of :func:`load_runs` without rows (no run measured on a GPU): one line saying what
    its selection (store, experiment, sweep, filter as in ``runs.attrs``) holds instead, e.g. "sweep
    1a2b... of experiment 'e' in URI holds no run measured on a GPU (4 static)", and, where it holds
    static runs, the command
    that tables their registers, spills, occupancy and SASS. None when the table has rows."""
    if not runs.empty:
        return None
    from experiments.reports.report import static_command
    a = runs.attrs
    every = load_runs(a["uri"], a["experiments"], a.get("sweep"), a.get("filter"), backends=None)
    held = every["outcome"].value_counts().to_dict() if not every.empty else {}
    what = ", ".join(f"{n} {o}" for o, n in sorted(held.items())) or "no runs"
    which = f"sweep {a['sweep']} of " if a.get("sweep") else ""
    names = ", ".join(map(repr, a["experiments"]))
    note = f"{which}experiment {names} in {a['uri']} holds no run measured on a GPU ({what})"
    if held.get("static"):
        experiment = a["experiments"][0] if len(a["experiments"]) == 1 else DEFAULT_EXPERIMENT
        note += (": static runs are rendered and assembled only; their table: "
                 + static_command(a["uri"], experiment, a.get("sweep")))
    return note


def nothing_measured(runs: pd.DataFrame, tables: typing.Sequence[str] | None = None) -> str | None:
    """Why ``runs`` hold nothing to analyse, or None: for the tidy table(s) ``tables`` (read_table), that
    no row measured something (:func:`ok_runs`); for a table of :func:`load_runs`, :func:`unmeasured_note`."""
    if tables:
        return f"{', '.join(map(str, tables))} holds no measured run" if ok_runs(runs).empty else None
    return unmeasured_note(runs)


def ok_runs(df: pd.DataFrame) -> pd.DataFrame:
    """Rows that measured something: FINISHED, not failed verification, with a median time."""
    return df[(df["status"] == "FINISHED") & (df["verified"].fillna(True).astype(bool))
              & df["median_us"].notna()]


def config_axes(df: pd.DataFrame) -> list[str]:
    """Config params (schema keys) that take two or more values among the rows, in schema order.

    These are the axes a main-effect plot shows; the problem size, the study's kernel name and
    bookkeeping keys (tracking, timing, verify, problem, backend, target) are left out.
    """
    skip = ("tracking.", "timing.", "verify.", "problem.", "target.", "backend", "spec.", "study_kernel")
    names = [k for k in schema_types() if not k.startswith(skip)]
    names += [c for c in ("family",) if c not in names]
    return [k for k in names if k in df and df[k].dropna().astype(str).nunique() >= 2]


def size_order(df: pd.DataFrame) -> list[str]:
    """The ``size`` labels of the rows, smallest problem (fewest FLOPs) first."""
    return list(df.dropna(subset=["size"]).sort_values("flop")["size"].drop_duplicates())


def short_labels(names: typing.Iterable[str]) -> dict[str, str]:
    """Shorter display names: ``_``-separated tokens shared by every name are dropped.

    ``gemm_int8_bk32_..._g8`` and ``gemm_int4_bk64_..._g8`` -> ``int8_bk32_m16n8k32``, ...
    A single name, or names without common tokens, are kept whole.
    """
    names = [n for n in dict.fromkeys(names) if isinstance(n, str)]
    if len(names) < 2:
        return {n: n for n in names}
    toks = [n.split("_") for n in names]
    common = set(toks[0]).intersection(*map(set, toks[1:]))
    out = {n: "_".join(t for t in tk if t not in common) or n for n, tk in zip(names, toks, strict=True)}
    return out if len(set(out.values())) == len(out) else {n: n for n in names}
