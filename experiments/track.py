"""MLflow tracking: one parent run per sweep, one child run per (kernel config, problem size).

The tracking URI is resolved once, to an absolute location, by :class:`SweepCallback` at the start
of a run or multirun and exported as ``MLFLOW_TRACKING_URI`` so every job (and every launcher
process) writes to the same store. Default: ``sqlite:///<project>/outputs/mlflow.db``.
"""
from __future__ import annotations

import functools
import hashlib
import math
import numbers
import os
import subprocess
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from .spec import value

__all__ = ["PROJECT_ROOT", "resolve_uri", "Tracker", "SweepCallback", "flatten", "run_key",
           "count_jobs", "open_parent", "get_tracker"]

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PARENT_ENV, TOTAL_ENV = "TCA_PARENT_RUN_ID", "TCA_SWEEP_JOBS"
NAME_ENV, OVERRIDES_ENV = "TCA_SWEEP_NAME", "TCA_SWEEP_OVERRIDES"


def resolve_uri(uri: str | None, base: Path | None = None) -> str:
    """Absolute tracking URI: ``uri``, else $MLFLOW_TRACKING_URI, else the project's SQLite store.

    A relative ``sqlite:///path`` or plain path is made absolute against ``base`` (the directory
    the command was started from); ``http(s)://`` and ``databricks`` URIs are kept as they are.
    """
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI")
    base = Path(base or os.getcwd())
    if not uri:
        path = PROJECT_ROOT / "outputs" / "mlflow.db"
        path.parent.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{path}"
    if uri.startswith("sqlite:///"):
        path = Path(uri[len("sqlite:///"):])
        path = path if path.is_absolute() else (base / path).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{path}"
    if "://" not in uri and not uri.startswith("databricks"):
        path = Path(uri)
        return (path if path.is_absolute() else (base / path).resolve()).as_uri()
    return uri


def flatten(cfg, prefix: str = "") -> dict:
    """Dotted scalar params of a config: lists become their string form (``tile.block`` -> '[128, 128]')."""
    data = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True) if isinstance(cfg, DictConfig) else cfg
    out = {}
    for key, val in data.items():
        name = f"{prefix}{key}"
        if isinstance(val, dict):
            out.update(flatten(val, name + "."))
        else:
            out[name] = "null" if val is None else str(val)
    return out


def run_key(*parts) -> str:
    """Identity of a measurement (PTX hash, size, GPU, backend) for resuming sweeps."""
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:24]


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True,
                             text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=10)
        if out.returncode != 0:
            return "unknown"
        return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


class Tracker:
    """Thin layer over ``mlflow.MlflowClient`` for this project's run structure."""

    def __init__(self, uri: str, experiment: str):
        import mlflow
        self.client = mlflow.MlflowClient(tracking_uri=uri)
        self.uri = uri
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None:
            artifacts = None
            if uri.startswith("sqlite:///"):   # keep artifacts beside the database, absolute
                artifacts = (Path(uri[len("sqlite:///"):]).parent / "artifacts").as_uri()
            self.experiment_id = self.client.create_experiment(experiment, artifact_location=artifacts)
        else:
            self.experiment_id = exp.experiment_id

    def start(self, name: str, params: dict, tags: dict, parent: str | None = None) -> str:
        """Create a RUNNING run with params and tags; returns its run id."""
        from mlflow.entities import Param
        tags = {k: str(v) for k, v in tags.items()}
        if parent:
            tags["mlflow.parentRunId"] = parent
        run = self.client.create_run(self.experiment_id, run_name=name, tags=tags)
        rid = run.info.run_id
        items = [Param(k[:250], str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(rid, params=items[i:i + 100])
        return rid

    def log(self, rid: str, metrics: dict | None = None, tags: dict | None = None) -> None:
        """Log finite numeric metrics (inf/NaN are dropped, never logged) and string tags."""
        import time

        from mlflow.entities import Metric, RunTag
        now = int(time.time() * 1000)
        ms = [Metric(k, float(v), now, 0) for k, v in (metrics or {}).items()
              if isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)]
        ts = [RunTag(k, str(v)[:5000]) for k, v in (tags or {}).items()]
        for i in range(0, max(len(ms), len(ts), 1), 200):
            self.client.log_batch(rid, metrics=ms[i:i + 200], tags=ts[i:i + 200])

    def artifact_text(self, rid: str, text: str, name: str) -> None:
        self.client.log_text(rid, text, name)

    def artifact_file(self, rid: str, path: str | Path) -> None:
        self.client.log_artifact(rid, str(path))

    def end(self, rid: str, status: str = "FINISHED", reason: str | None = None) -> None:
        """Terminate a run: FINISHED, FAILED (with ``reason`` as tag ``error``) or KILLED (skipped)."""
        if reason:
            self.log(rid, tags={"error" if status == "FAILED" else "skip_reason": reason})
        self.client.set_terminated(rid, status)

    def finished_run(self, key: str) -> str | None:
        """Id of a FINISHED run with tag run_key == key, or None."""
        runs = self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.run_key = '{key}' and attributes.status = 'FINISHED'",
            max_results=1)
        return runs[0].info.run_id if runs else None


@functools.lru_cache(maxsize=8)
def get_tracker(uri: str, experiment: str) -> Tracker:
    """One Tracker per (store, experiment) and process: jobs of a sweep share its connection."""
    return Tracker(uri, experiment)


def count_jobs(task_overrides) -> int:
    """Number of jobs the basic sweeper makes from the task overrides (product of sweep lengths)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    total = 1
    for ov in OverridesParser.create().parse_overrides(list(task_overrides)):
        if ov.is_sweep_override():
            total *= sum(1 for _ in ov.sweep_iterator())
    return total


def open_parent(tracker: Tracker) -> str:
    """Id of this sweep's parent run, created on first use (name and tags from the callback)."""
    rid = os.environ.get(PARENT_ENV)
    if not rid:
        name = os.environ.get(NAME_ENV, "run")
        rid = tracker.start(name, {}, {"kind": "sweep", "git_commit": git_commit(),
                                       "jobs": os.environ.get(TOTAL_ENV, "1"),
                                       "overrides": os.environ.get(OVERRIDES_ENV, "")})
        os.environ[PARENT_ENV] = rid
    return rid


class SweepCallback(Callback):
    """Resolves the store once, prints the GPU and where results go, and ends the parent run.

    A multirun's parent run is opened at its start; a single run's when its configuration has
    been validated, so an impossible configuration leaves nothing in the store.
    """

    def _open(self, config: DictConfig, name: str, jobs: int, eager: bool) -> None:
        from .worker import nvml_gpu
        uri = resolve_uri(config.tracking.uri)
        os.environ.pop(PARENT_ENV, None)
        os.environ.update({"MLFLOW_TRACKING_URI": uri, TOTAL_ENV: str(jobs), NAME_ENV: name,
                           OVERRIDES_ENV: " ".join(config.hydra.overrides.task)})
        gpu = nvml_gpu() if value(config.backend) != "static" else None
        if value(config.backend) == "static":
            line = "backend=static: rendering and assembling with ptxas only (no verification or timing)."
        elif gpu:
            line = f"GPU: {gpu['gpu']} (sm_{gpu['compute_capability']}, driver {gpu['driver']})."
        else:
            line = ("No NVIDIA GPU found: rendering and assembling with ptxas for the target arch "
                    "only (runs tagged backend=static).")
        print(line, flush=True)
        self.tracker = get_tracker(uri, config.tracking.experiment)
        where = f"Tracking {jobs} job(s) in {uri}"
        if eager:
            where += f" (parent run {open_parent(self.tracker)})"
        print(where + ".", flush=True)

    def _close(self) -> None:
        rid = os.environ.pop(PARENT_ENV, None)
        if rid:
            self.tracker.end(rid)
            print(f"Browse the results:  mlflow ui --backend-store-uri {self.tracker.uri}", flush=True)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self._open(config, f"sweep {Path(config.hydra.sweep.dir).name}",
                   count_jobs(config.hydra.overrides.task), eager=True)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        self._close()

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        self._open(config, f"run {Path(config.hydra.run.dir).name}", 1, eager=False)

    def on_run_end(self, config: DictConfig, **kwargs) -> None:
        self._close()
