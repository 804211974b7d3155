"""The notebooks under analysis/notebooks run headless (python on the jupytext percent file,
MPLBACKEND=Agg) on the fixture store and write the figures and tables they promise."""
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from analysis.predictors import predictor_study
from analysis.runs import load_runs

sys.path.insert(0, str(Path(__file__).parent / "data" / "analysis"))
import fixture_store  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "analysis" / "notebooks"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return fixture_store.shared_store(tmp_path_factory)


@pytest.fixture(scope="module")
def executed(store, tmp_path_factory):
    """Both notebooks run headless, one after the other, in one fresh interpreter (as `python
    analysis/notebooks/<name>.py` would, with the settings in the environment); returns
    {name: (stdout of that notebook, its output folder)}."""
    base = tmp_path_factory.mktemp("notebooks")
    runs = {"predictors": {"ANALYSIS_N_BOOT": "100"},
            "claims": {"ANALYSIS_CLAIMS": str(REPO / "tests" / "data" / "analysis" / "claims_h200.yaml")}}
    driver = ["import os, runpy, sys"]
    for name, env in runs.items():
        env = {**env, "ANALYSIS_URI": store["uri"], "ANALYSIS_SWEEP": store["ncu"], "ANALYSIS_OUT": str(base / name)}
        driver += [f"print('=== {name}', flush=True)", f"os.environ.update({env!r})",
                   f"runpy.run_path({str(NOTEBOOKS / f'{name}.py')!r}, run_name='__main__')"]
    path = os.pathsep.join([str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    full = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": path}
    proc = subprocess.run([sys.executable, "-c", "\n".join(driver)], cwd=REPO, env=full,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    parts = proc.stdout.split("=== ")
    return {p.split("\n", 1)[0]: (p, base / p.split("\n", 1)[0]) for p in parts[1:]}


@pytest.mark.parametrize("name", ["predictors", "claims"])
def test_notebooks_are_jupytext_percent_files_of_plain_python(name):
    jupytext = pytest.importorskip("jupytext")
    nb = jupytext.read(NOTEBOOKS / f"{name}.py")
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert len(code) >= 4 and any(c.cell_type == "markdown" for c in nb.cells)
    assert not any(line.lstrip().startswith(("%", "!")) for c in code for line in c.source.splitlines())
    assert nb.metadata["jupytext"]["formats"] == "ipynb,py:percent"


def test_predictors_notebook_headless(store, executed):
    stdout, out = executed["predictors"]
    assert "32 runs, 30 measured; GPUs: NVIDIA H200" in stdout and "CIRCULARITY FLAG" in stdout
    for png in ("predictors_vs_throughput.png", "throughput_vs_size.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    table = pd.read_csv(out / "predictor_tests.csv")
    direct = predictor_study(load_runs(store["uri"], sweep=store["ncu"]), n_boot=100).tests
    assert len(table) == len(direct) == 16           # 4 measures x 2 stratifications x (slope, rank)
    assert table["estimate"].to_numpy() == pytest.approx(direct["estimate"].to_numpy(), nan_ok=True)
    assert table["ci_low"].to_numpy() == pytest.approx(direct["ci_low"].to_numpy(), nan_ok=True)
    assert not (out / "regression.csv").exists()     # the study no longer fits the share as a predictor


def test_claims_notebook_headless(store, executed):
    stdout, out = executed["claims"]
    counts = stdout.split("NVIDIA H200: ")[1].splitlines()[0]
    assert sorted(counts.split(", ")) == ["3 fails", "3 holds", "3 inconclusive"]
    table = pd.read_csv(out / "claims.csv").set_index("id")
    assert table.loc["H5", "this_gpu"] == "1.1 (N=512), 1.25 (N=8192)" and table.loc["H2", "verdict"] == "fails"
    assert (out / "claims.md").read_text().startswith("| id | claim |")
    assert "speedup figure: not drawn, no baseline runs" in stdout
    if store["reference"]:                     # the study's numbers: 30 flagged, its speedup figure drawn
        assert "30 of 110 published durations flagged implausible" in stdout
        assert (out / "study_speedup_vs_baseline.png").read_bytes()[:4] == b"\x89PNG"
