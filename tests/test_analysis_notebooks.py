"""The notebooks under analysis/notebooks run headless and write the figures and tables they promise,
under the output folder only, one folder per GPU: as scripts on the fixture store, and executed as
notebooks (python -m analysis.notebooks) from a committed tidy table."""
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
    out = out / "nvidia_h200"
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
    assert counts == "9 inconclusive"           # the fixture's runs have no replicates: needs timing.repeats
    table = pd.read_csv(out / "nvidia_h200" / "claims.csv").set_index("id")
    assert table.loc["H5", "this_gpu"] == "1.1 (N=512), 1.25 (N=8192)"
    assert table.loc["H2", "reason"].startswith("needs timing.repeats >= 2: 10 run(s)")
    assert (out / "nvidia_h200" / "claims.md").read_text().startswith("| id | claim |")
    assert "NVIDIA H200: speedup figure not drawn, no baseline runs" in stdout
    # the study's numbers (packaged): 30 flagged, its speedup figure drawn in the L4's own folder
    assert "30 of 110 published durations flagged implausible" in stdout
    assert (out / "nvidia_l4" / "speedup_vs_baseline.png").read_bytes()[:4] == b"\x89PNG"


def test_notebooks_execute_from_a_committed_table(tmp_path):
    """The README's command on the committed H200 table of run 2 (30 INT8 runs): executed notebooks
    and their outputs under --out only, one folder per GPU; nothing written beside the notebooks, nothing
    on stderr."""
    pytest.importorskip("nbclient", reason="executing notebooks needs the 'notebooks' extra")
    pytest.importorskip("ipykernel", reason="executing notebooks needs the 'notebooks' extra")
    before = sorted(p.name for p in NOTEBOOKS.iterdir())
    out = tmp_path / "nb"
    proc = subprocess.run([sys.executable, "-m", "analysis.notebooks", "--table",
                           str(REPO / "results" / "h200" / "l4_run2_int8" / "runs.csv"), "--out", str(out),
                           "--n-boot", "20"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == ""            # the kernel's sockets are local: no warning about TCP
    assert proc.stdout.splitlines() == [f"executed claims: {out / 'claims.ipynb'}",
                                        f"executed predictors: {out / 'predictors.ipynb'}"]
    assert sorted(p.name for p in NOTEBOOKS.iterdir()) == before and not list(tmp_path.glob("outputs"))
    import nbformat
    cells = nbformat.read(out / "claims.ipynb", 4).cells
    text = "".join(o.get("text", "") for c in cells if c.cell_type == "code" for o in c.outputs)
    assert "30 runs, 30 measured; GPUs: NVIDIA H200" in text and "NVIDIA H200: " in text
    claims = pd.read_csv(out / "nvidia_h200" / "claims.csv").set_index("id")
    assert claims.loc["C5", "this_gpu"] == "0.497 (N=2048), 0.491 (N=4096), 0.513 (N=8192)"   # real H200 values
    assert claims.loc["C5", "reason"].startswith("needs timing.repeats >= 2")
    assert sorted(p.name for p in (out / "nvidia_h200").iterdir()) == [
        "claims.csv", "claims.md", "predictor_tests.csv", "predictors_vs_throughput.png",
        "speedup_vs_baseline.png", "throughput_vs_size.png"]
    assert (out / "nvidia_l4" / "speedup_vs_baseline.png").is_file()


def test_notebook_runner_names_a_missing_table(tmp_path, module_cli):
    """As analysis.report names it, exit 2 (it was 1 here)."""
    rc, out, err = module_cli("analysis.notebooks.__main__", "--table", "nope.csv", "--out", str(tmp_path))
    assert (rc, out, err) == (2, "", "Cannot read the runs: no tidy table at nope.csv: give a runs.csv that "
                                     "analysis.report wrote\n")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("uri, said", [
    ("sqlite:///{tmp}/nosuch.db", "no store at {tmp}/nosuch.db (tracking URI sqlite:///{tmp}/nosuch.db): run a "
                                  "sweep first (python run.py ...) or pass the URI it printed with --uri"),
    ("bogus://x", "the tracking URI bogus://x has a scheme MLflow cannot track to: give sqlite:///PATH (a file), "
                  "http://HOST:PORT (a tracking server) or a database server's URI (postgresql://, mysql://)"),
    ("empty", "experiment 'nope' is not in sqlite:///{tmp}/mlflow.db; experiments there: Default"),
    ("sweep", "sweep='0123' is not a run id in sqlite:///{tmp}/mlflow.db; use a parent run id from mlflow ui "
              "--backend-store-uri sqlite:///{tmp}/mlflow.db or sweep='latest'")])
def test_a_store_that_is_not_there_is_refused_before_any_notebook_runs(tmp_path, module_cli, uri, said):
    """A store, experiment or sweep that is not there (or a URI that names no store) is one line, exit 2,
    as analysis.report gives it, before any kernel starts and before --out is made; it was found by the
    first notebook's cell, a kernel started for it (seconds), and its executed copy written."""
    from test_cli import empty_store_at
    args = ["--uri", uri.format(tmp=tmp_path)]
    if uri in ("empty", "sweep"):
        args = ["--uri", empty_store_at(tmp_path / "mlflow.db")]
        args += ["--experiment", "nope"] if uri == "empty" else ["--experiment", "Default", "--sweep", "0123"]
    rc, out, err = module_cli("analysis.notebooks.__main__", *args, "--out", str(tmp_path / "nb"))
    assert (rc, out, err) == (2, "", f"Cannot read the runs: {said.format(tmp=tmp_path)}\n")
    assert not (tmp_path / "nb").exists() and not (tmp_path / "nosuch.db").exists()


def test_what_the_notebooks_will_read_is_checked_from_the_options_else_the_environment(tmp_path, module_cli,
                                                                                     monkeypatch):
    """The check before any kernel reads what the notebooks' load() will read: the options, else the
    ANALYSIS_* environment the kernels inherit (a table named there ran, and was refused as 'no store');
    --uri reads the store, not the environment's table; the predictors notebook's latest sweep is
    looked for too. Each notebook's run is recorded here instead of executed."""
    import analysis.notebooks.__main__ as runner
    from test_cli import empty_store_at
    ran = []
    monkeypatch.setattr(runner, "execute", lambda name, out, env, timeout=600: ran.append((name, env)) or out)
    table = str(REPO / "results" / "h200" / "l4_claims" / "runs.csv")
    monkeypatch.setenv("ANALYSIS_TABLE", table)
    rc, out, err = module_cli("analysis.notebooks.__main__", "--only", "claims", "--out", str(tmp_path / "a"))
    assert (rc, err) == (0, "") and [(n, env["ANALYSIS_TABLE"]) for n, env in ran] == [("claims", table)]
    uri = empty_store_at(tmp_path / "mlflow.db")
    ran.clear()
    rc, out, err = module_cli("analysis.notebooks.__main__", "--uri", uri, "--experiment", "Default", "--only",
                              "claims", "--out", str(tmp_path / "b"))
    assert (rc, err) == (0, "") and [n for n, _ in ran] == ["claims"], err
    assert ran[0][1]["ANALYSIS_URI"] == uri and "ANALYSIS_TABLE" not in ran[0][1]
    ran.clear()
    rc, out, err = module_cli("analysis.notebooks.__main__", "--uri", uri, "--experiment", "Default", "--out",
                              str(tmp_path / "c"))
    assert (rc, out, ran) == (2, "", [])
    assert err == f"Cannot read the runs: no sweep (parent run tagged kind=sweep) in experiment(s) Default of {uri}\n"
    monkeypatch.setenv("ANALYSIS_TABLE", str(tmp_path / "nope.csv"))
    rc, out, err = module_cli("analysis.notebooks.__main__", "--out", str(tmp_path / "d"))
    assert (rc, out, ran) == (2, "", [])
    assert err == f"Cannot read the runs: no tidy table at {tmp_path / 'nope.csv'}: give a runs.csv that analysis.report wrote\n"
    assert not any((tmp_path / d).exists() for d in "cd")


def test_an_input_error_a_notebook_finds_is_one_line_with_the_executed_copy(tmp_path):
    """The error a notebook's cell raises for its input (RunsError: a sweep of static runs only, nothing
    to analyse) is one line with the executed copy's path, exit 2 as analysis.report gives; before, the
    cell's whole traceback, in ANSI colours, exit 1."""
    pytest.importorskip("nbclient", reason="executing notebooks needs the 'notebooks' extra")
    pytest.importorskip("ipykernel", reason="executing notebooks needs the 'notebooks' extra")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    st = fixture_store._Store(uri, "static-only")
    parent = st.run("sweep precision=int8 (static)", {}, {"kind": "sweep"}, {})
    st.run("gemm_int8 static", {"precision": "int8"}, {"backend": "static", "outcome": "static",
                                                       "kernel": "gemm_int8"}, {}, parent=parent)
    proc = subprocess.run([sys.executable, "-m", "analysis.notebooks", "--uri", uri, "--experiment", "static-only",
                           "--sweep", parent, "--only", "claims", "--out", str(tmp_path / "nb")], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    rc, out, err = proc.returncode, proc.stdout, proc.stderr
    assert (rc, out) == (2, "") and err.count("\n") == 1, err
    assert err.startswith(f"notebook claims failed: RunsError: nothing to analyse: sweep {parent} of experiment "
                          f"'static-only' in {uri} holds no run measured on a GPU (1 static)"), err
    assert err.endswith(f"(the executed copy, with the traceback: {tmp_path / 'nb' / 'claims.ipynb'})\n"), err
    assert "\x1b[" not in err


def test_runs_with_nothing_measured_are_refused_as_analysis_report_refuses_them(tmp_path, monkeypatch):
    """A table whose runs all failed, or a sweep of static runs only: the notebooks' load() raises
    RunsError (exit 2 through python -m analysis.notebooks) naming what the runs hold; the notebooks
    ran on to '0 runs' and exit 0."""
    from analysis.notebooks import load
    from analysis.runs import RunsError
    table = pd.read_csv(REPO / "results" / "h200" / "l4_claims" / "runs.csv")
    table["status"] = "FAILED"
    table.to_csv(tmp_path / "failed.csv", index=False)
    monkeypatch.setenv("ANALYSIS_TABLE", str(tmp_path / "failed.csv"))
    with pytest.raises(RunsError, match=rf"^nothing to analyse: {tmp_path / 'failed.csv'} holds no measured run$"):
        load()
    monkeypatch.delenv("ANALYSIS_TABLE")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    st = fixture_store._Store(uri, "static-only")
    parent = st.run("sweep precision=int8 (static)", {}, {"kind": "sweep"}, {})
    st.run("gemm_int8 static", {"precision": "int8"}, {"backend": "static", "outcome": "static",
                                                       "kernel": "gemm_int8"}, {}, parent=parent)
    monkeypatch.setenv("ANALYSIS_URI", uri)
    monkeypatch.setenv("ANALYSIS_EXPERIMENT", "static-only")
    with pytest.raises(RunsError) as exc:
        load(default_sweep="latest")
    assert str(exc.value).startswith(f"nothing to analyse: sweep {parent} of experiment 'static-only' in {uri} "
                                     "holds no run measured on a GPU (1 static): static runs are rendered")
    assert str(exc.value).endswith(". Run the sweep on a GPU, then the notebooks")


@pytest.mark.parametrize("signum, rc, how", [("SIGINT", 130, "Interrupted"), ("SIGTERM", 143, "Terminated")])
def test_ctrl_c_ends_the_notebooks_with_one_line_and_no_kernel_left(tmp_path, signum, rc, how):
    """Ctrl-C (SIGINT) while a notebook ran was ignored (the notebooks ran on, exit 0) or ended in
    nbclient's AssertionError traceback, depending on when it came; SIGTERM ended the command at once
    without the executed copy. Each now ends it with exit 130 (143), one line naming the notebook that
    did not finish, and its kernel gone. The signal comes once the kernel runs the notebook's cells (its
    first output file is there)."""
    import re
    import signal
    import time
    pytest.importorskip("nbclient", reason="executing notebooks needs the 'notebooks' extra")
    pytest.importorskip("ipykernel", reason="executing notebooks needs the 'notebooks' extra")
    out_dir = tmp_path / "nb"
    proc = subprocess.Popen([sys.executable, "-m", "analysis.notebooks", "--table",
                             str(REPO / "results" / "h200" / "l4_run2_int8" / "runs.csv"), "--out",
                             str(out_dir)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def kernels():
        try:
            return [int(c) for t in os.listdir(f"/proc/{proc.pid}/task")
                    for c in (Path(f"/proc/{proc.pid}/task/{t}/children").read_text().split())]
        except OSError:
            return []
    t0, seen = time.monotonic(), set()
    while proc.poll() is None and time.monotonic() - t0 < 120 and not list(out_dir.glob("*/*")):
        seen.update(kernels())
        time.sleep(0.01)
    seen.update(kernels())
    proc.send_signal(getattr(signal, signum))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == rc and err.count("\n") == 1, (out, err)
    m = re.fullmatch(rf"{how}: notebook (claims|predictors) did not finish \(its executed copy so far: "
                     rf"{re.escape(str(out_dir))}/(\w+)\.ipynb\); (none was executed|executed before it: claims)\n",
                     err)
    assert m and m.group(1) == m.group(2), err
    assert m.group(3) == ("none was executed" if m.group(1) == "claims" else "executed before it: claims"), err
    assert out == ("" if m.group(1) == "claims" else f"executed claims: {out_dir / 'claims.ipynb'}\n"), out

    def running(pid):            # a process, not a zombie that the system's init has yet to reap
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False
    t0 = time.monotonic()
    while any(map(running, seen)) and time.monotonic() - t0 < 5:
        time.sleep(0.05)
    assert seen and not any(map(running, seen))
