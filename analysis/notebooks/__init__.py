"""The analysis notebooks (jupytext percent files beside this module: claims.py, predictors.py) and
what they share: where their runs come from and where they write.

    python -m analysis.notebooks --table results/h200/l4_claims/runs.csv --out outputs/notebooks/h200

executes every notebook headless (``python -m analysis.notebooks --help``). Their settings come from
the environment: ``ANALYSIS_TABLE`` (tidy CSV tables, separated by os.pathsep) or the store
(``ANALYSIS_URI``, ``ANALYSIS_EXPERIMENT``, ``ANALYSIS_SWEEP``), and ``ANALYSIS_OUT``, the folder
everything goes to: one sub-folder per GPU, so that the outputs of two GPUs never overwrite each other.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pandas as pd

__all__ = ["NAMES", "DEFAULT_SWEEP", "FOLDER", "output_folder", "gpu_folder", "source", "load"]

NAMES = ("claims", "predictors")
# the sweep each notebook reads from a store without ANALYSIS_SWEEP: every run, or the latest sweep's
DEFAULT_SWEEP = {"claims": None, "predictors": "latest"}
FOLDER = Path(__file__).resolve().parent


def output_folder(name: str) -> Path:
    """``ANALYSIS_OUT`` (default outputs/notebooks/<name>), created."""
    out = Path(os.environ.get("ANALYSIS_OUT") or Path("outputs") / "notebooks" / name)
    out.mkdir(parents=True, exist_ok=True)
    return out


def gpu_folder(out: Path, gpu: str) -> Path:
    """out/<the GPU's name as a folder name>, created: 'NVIDIA H200' -> out/nvidia_h200."""
    path = Path(out) / (re.sub(r"[^A-Za-z0-9]+", "_", str(gpu)).strip("_").lower() or "gpu")
    path.mkdir(parents=True, exist_ok=True)
    return path


def source(env, default_sweep: str | None = None) -> tuple:
    """What :func:`load` reads, from the settings ``env`` (a mapping: the environment): (the tidy tables
    of ``ANALYSIS_TABLE`` or None, else the store's ``ANALYSIS_URI``, ``ANALYSIS_EXPERIMENT`` and
    ``ANALYSIS_SWEEP``: a parent run id, "latest", or "" for every run; ``default_sweep`` without it)."""
    from analysis.runs import DEFAULT_EXPERIMENT
    tables = tuple(env["ANALYSIS_TABLE"].split(os.pathsep)) if env.get("ANALYSIS_TABLE") else None
    return (tables, env.get("ANALYSIS_URI"), env.get("ANALYSIS_EXPERIMENT", DEFAULT_EXPERIMENT),
            env.get("ANALYSIS_SWEEP", default_sweep or ""))


def load(default_sweep: str | None = None) -> pd.DataFrame:
    """The runs the environment names (:func:`source`): the tidy tables of ``ANALYSIS_TABLE``, else the
    store's. Raises FileNotFoundError for a missing table, RunsError for a missing store and, as
    ``python -m analysis.report`` refuses them, for runs of which none was measured on a GPU."""
    from analysis.runs import RunsError, load_runs, nothing_measured, read_table
    tables, uri, experiment, sweep = source(os.environ, default_sweep)
    runs = read_table(tables) if tables else load_runs(uri, experiment, sweep or None)
    if why := nothing_measured(runs, tables):
        then = "" if tables else ". Run the sweep on a GPU, then the notebooks"
        raise RunsError(f"nothing to analyse: {why}{then}")
    return runs
