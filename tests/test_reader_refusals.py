"""Arguments the readers and tools/ui_screenshots.py cannot use as given: one line each naming what was
wrong and what to give instead, exit 2, no traceback, and nothing made or changed in the store."""
import shutil
import socket
import sys
import time
from pathlib import Path

import pytest
from test_cli import EXPERIMENT, _empty_store

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


@pytest.fixture
def sweep(tmp_path):
    """A store at tmp_path/mlflow.db with one sweep: (uri, parent run id, child run id)."""
    import mlflow
    shutil.copy(_empty_store(), tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment(EXPERIMENT)
    parent = client.create_run(exp, tags={"kind": "sweep"}, run_name="sweep").info.run_id
    child = client.create_run(exp, tags={"mlflow.parentRunId": parent, "outcome": "static"}).info.run_id
    return uri, parent, child


def _runs(uri):
    import mlflow
    client = mlflow.MlflowClient(uri)
    return sorted((r.info.run_id, r.info.status, tuple(sorted(r.data.tags.items())))
                  for r in client.search_runs([e.experiment_id for e in client.search_experiments()]))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("case", ["unknown sweep", "child as sweep", "bare path", "out in /proc",
                                  "no store there", "no server"])
def test_screenshot_tool_refuses_bad_arguments_in_one_line(tmp_path, sweep, module_cli, case):
    """A MlflowException or FileNotFoundError traceback, screenshots of a view that does not exist (a
    child run as --sweep), an empty store made where none was, or a hang on an unreachable server."""
    uri, parent, child = sweep
    port = _free_port()
    args, said = {
        "unknown sweep": (["--sweep", "deadbeef"], f"--sweep deadbeef is not a run id in the store {uri}: give "
                                                   "the parent run id that run.py -m printed"),
        "child as sweep": (["--sweep", child], f"--sweep {child} is not a sweep's parent run (no tag kind=sweep): "
                                               f"it is a run of the sweep {parent}; give --sweep {parent}"),
        "bare path": (["--store", f"{tmp_path}/mlflow.db"], f"Store error: the tracking URI {tmp_path}/mlflow.db is "
                      f"a path, which MLflow reads as a file store; as a SQLite store it is sqlite:///{tmp_path}/mlflow.db"),
        "out in /proc": (["--out", "/proc/x"], "--out /proc/x cannot be made or written: /proc is not writable for "
                                               "this user; give a writable folder for the PNG files"),
        "no store there": (["--store", f"sqlite:///{tmp_path}/nonexist/x.db"],
                           f"Store error: no store at {tmp_path}/nonexist/x.db (tracking URI "
                           f"sqlite:///{tmp_path}/nonexist/x.db)"),
        "no server": (["--store", f"http://127.0.0.1:{port}"],
                      f"Store error: no MLflow tracking server answers at http://127.0.0.1:{port}"),
    }[case]
    given = {"--store": uri, "--experiment": EXPERIMENT, "--out": str(tmp_path / "img")}
    given.update(zip(args[::2], args[1::2], strict=True))
    before, t0 = _runs(uri), time.time()
    rc, out, err = module_cli("tools.ui_screenshots", *(x for kv in given.items() for x in kv))
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith(said), err
    assert time.time() - t0 < 30 and out == ""
    assert _runs(uri) == before and not (tmp_path / "img").exists() and not (tmp_path / "nonexist").exists()


def test_profile_parent_that_is_no_sweep_is_named(sweep, module_cli):
    """--parent deadbeef said "matched no run: the runs of sweep deadbeef", as if the sweep existed."""
    uri, parent, child = sweep
    before = _runs(uri)
    rc, out, err = module_cli("experiments.profile", "--uri", uri, "--experiment", EXPERIMENT, "--parent", "deadbeef",
                              "--dry-run")
    assert rc == 2 and err.strip() == (f"error: --parent deadbeef is not a run id in {uri}; give a sweep's parent "
                                       "run id (run.py -m prints it), or leave --parent out for the latest sweep"), err
    rc, out, err = module_cli("experiments.profile", "--uri", uri, "--experiment", EXPERIMENT, "--parent", child,
                              "--dry-run")
    assert rc == 2 and err.strip().startswith(f"error: --parent {child} is a run of the sweep {parent}, not a "
                                              f"sweep: give --parent {parent}"), err
    assert _runs(uri) == before


def test_analysis_report_study_is_checked_before_the_store(tmp_path, module_cli):
    """--study nope was found unknown only after the store had been read (here: no store at all)."""
    rc, out, err = module_cli("analysis.report", "--uri", f"sqlite:///{tmp_path}/none.db", "--study", "nope")
    assert rc == 2 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].endswith(
        "error: --study nope: no such study or claims file; valid: l4, none, auto, or the path of a claims YAML "
        "file (e.g. analysis/claims/l4.yaml)"), err
    assert list(tmp_path.iterdir()) == []
