"""experiments/store/track.py: tracking URI resolution, flattened params, job counting, the Tracker."""
import contextlib
import math
import socket
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from experiments.config import Config
from experiments.runner.sweep import count_jobs
from experiments.store.track import StoreError, Tracker, flatten, resolve_uri, run_key

# -- resolve_uri ---------------------------------------------------------------------------------

def test_relative_sqlite_becomes_absolute(tmp_path):
    uri = resolve_uri("sqlite:///stores/a/mlflow.db", base=tmp_path)
    assert uri == f"sqlite:///{tmp_path}/stores/a/mlflow.db"
    assert (tmp_path / "stores" / "a").is_dir()       # the folder of the database exists


def test_relative_sqlite_with_dotdot(tmp_path):
    (tmp_path / "x").mkdir()
    uri = resolve_uri("sqlite:///../y/m.db", base=tmp_path / "x")
    assert uri == f"sqlite:///{tmp_path}/y/m.db"


def test_absolute_sqlite_kept(tmp_path):
    uri = f"sqlite:///{tmp_path}/abs/m.db"           # four slashes: an absolute path
    assert uri.startswith("sqlite:////")
    assert resolve_uri(uri, base=Path("/elsewhere")) == uri
    assert (tmp_path / "abs").is_dir()


@pytest.mark.parametrize("uri", ["http://127.0.0.1:5000", "https://mlflow.example.org/x",
                                 "databricks", "databricks://profile"])
def test_remote_uris_kept(uri, tmp_path):
    assert resolve_uri(uri, base=tmp_path) == uri


@pytest.mark.parametrize("uri, db", [("mlruns", "{tmp}/mlruns.db"), ("/data/mlruns", "/data/mlruns.db"),
                                     ("file:./mlruns", "{tmp}/mlruns.db"), ("file:///data/mlruns", "/data/mlruns.db")])
def test_file_store_is_refused_with_the_sqlite_uri_to_use(uri, db, tmp_path):
    with pytest.raises(StoreError) as err:
        resolve_uri(uri, base=tmp_path)
    assert "file store; MLflow 3 keeps runs in a database store. Use a SQLite file instead, e.g. " \
           f"sqlite:///{db.format(tmp=tmp_path)}, or a tracking server" in str(err.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("uri", ["/tmp/foo/bar.db", "outputs/mlflow.db"])
def test_plain_path_of_a_sqlite_file_gets_its_uri(uri, tmp_path):
    """A path to the .db file itself: the advice is that file's own URI (it used to name another)."""
    with pytest.raises(StoreError) as err:
        resolve_uri(uri, base=tmp_path)
    path = uri if uri.startswith("/") else f"{tmp_path}/{uri}"
    assert str(err.value).endswith(f"as a SQLite store it is sqlite:///{path}")


def test_path_of_a_folder_holding_the_store_or_under_home(tmp_path, monkeypatch):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "mlflow.db").write_bytes(b"")
    with pytest.raises(StoreError, match=f"as a SQLite store it is sqlite:///{tmp_path}/runs/mlflow.db$"):
        resolve_uri(str(tmp_path / "runs"), base=tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(StoreError, match=f"as a SQLite store it is sqlite:///{tmp_path}/m.db$"):
        resolve_uri("~/m.db", base=tmp_path / "elsewhere")


def test_env_used_when_uri_is_none(monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///from_env/m.db")
    assert resolve_uri(None, base=tmp_path) == f"sqlite:///{tmp_path}/from_env/m.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking:5000")
    assert resolve_uri(None, base=tmp_path) == "http://tracking:5000"
    # an explicit uri wins over the environment
    assert resolve_uri("sqlite:///explicit.db", base=tmp_path) == f"sqlite:///{tmp_path}/explicit.db"


# -- flatten, run_key, count_jobs ----------------------------------------------------------------

def test_flatten_config():
    cfg = OmegaConf.merge(OmegaConf.structured(Config),
                          OmegaConf.from_dotlist(["precision=int8", "ktile=64", "cache.op=ca",
                                                  "tile.block=[128,128]", "tile.warps=[2,4]",
                                                  "pipeline.stages=2", "problem.sizes=[512,1024]",
                                                  "problem.shapes=[]", "backend=auto",
                                                  "timing.cuda_graph=true", "verify.rtol=0.001",
                                                  "verify.seed=null", "tracking.uri=null"]))
    flat = flatten(cfg)
    assert flat["tile.block"] == "[128, 128]"
    assert flat["tile.warps"] == "[2, 4]"
    assert flat["precision"] == "int8"
    assert flat["cache.op"] == "ca"
    assert flat["backend"] == "auto"
    assert flat["ktile"] == "64"
    assert flat["pipeline.stages"] == "2"
    assert flat["problem.sizes"] == "[512, 1024]"
    assert flat["problem.shapes"] == "[]"
    assert flat["verify.seed"] == "null"
    assert flat["tracking.uri"] == "null"
    assert flat["timing.cuda_graph"] == "True"
    assert flat["verify.rtol"] == "0.001"
    assert all(isinstance(v, str) for v in flat.values())
    assert not any(isinstance(v, dict) for v in flat.values())
    assert "tile" not in flat and "tracking" not in flat


def test_flatten_plain_dict():
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": None}) == {"a.b": "1", "a.c": "[1, 2]", "d": "null"}


def test_run_key():
    k = run_key("abc", 512, "sm_90")
    assert len(k) == 24 and k == run_key("abc", 512, "sm_90")
    assert k != run_key("abc", 513, "sm_90")


@pytest.mark.parametrize("overrides, n", [
    (["precision=int4,int8", "ktile=32,64", "tracking.uri=x"], 4),
    (["precision=fp16,bf16,int8,int4", "pipeline.stages=range(1,5)"], 16),
    (["precision=int8"], 1),
    ([], 1),
    (["tile.block=[128,128],[64,128]", "cache.op=ca,cg"], 4),
])
def test_count_jobs(overrides, n):
    assert count_jobs(overrides) == n


# -- Tracker on a SQLite store --------------------------------------------------------------------

@pytest.fixture(scope="module")
def tracker(tmp_path_factory):
    db = tmp_path_factory.mktemp("store") / "mlflow.db"
    return Tracker(f"sqlite:///{db}", "track-tests")


def test_tracker_experiment_and_artifact_location(tracker):
    exp = tracker.client.get_experiment(tracker.experiment_id)
    assert exp.name == "track-tests"
    db = Path(tracker.uri[len("sqlite:///"):])
    assert exp.artifact_location == (db.parent / "artifacts").as_uri()
    # a second Tracker on the same store finds the experiment
    assert Tracker(tracker.uri, "track-tests").experiment_id == tracker.experiment_id


def test_log_drops_non_finite_metrics(tracker):
    rid = tracker.start("metrics", {"precision": "int8", "tile.block": [128, 128]}, {"kind": "t"})
    tracker.log(rid, {"registers": 98, "occupancy": 0.25, "inf": math.inf, "ninf": -math.inf,
                      "nan": math.nan, "none": None, "text": "12"}, {"ptxas": "ok"})
    run = tracker.client.get_run(rid)
    assert run.data.metrics == {"registers": 98.0, "occupancy": 0.25}
    assert run.data.params == {"precision": "int8", "tile.block": "[128, 128]"}
    assert run.data.tags["ptxas"] == "ok" and run.data.tags["kind"] == "t"
    assert run.info.status == "RUNNING"
    tracker.end(rid)
    assert tracker.client.get_run(rid).info.status == "FINISHED"


def test_start_with_parent(tracker):
    parent = tracker.start("parent", {}, {"kind": "sweep"})
    child = tracker.start("child", {"x": 1}, {}, parent=parent)
    assert tracker.client.get_run(child).data.tags["mlflow.parentRunId"] == parent


def test_many_params_are_logged_in_batches(tracker):
    params = {f"p{i:03d}": i for i in range(250)}
    rid = tracker.start("params", params, {})
    assert len(tracker.client.get_run(rid).data.params) == 250


def test_finished_run_by_key(tracker):
    done = tracker.start("done", {}, {"run_key": "key-finished"})
    tracker.end(done)
    failed = tracker.start("failed", {}, {"run_key": "key-failed"})
    tracker.end(failed, "FAILED", "verification failed: 3 elements")
    skipped = tracker.start("skipped", {}, {"run_key": "key-killed"})
    tracker.end(skipped, "KILLED", "mma=m16n8k64 is not valid")
    running = tracker.start("running", {}, {"run_key": "key-running"})

    assert tracker.finished_run("key-finished").info.run_id == done
    assert tracker.finished_run("key-failed") is None
    assert tracker.finished_run("key-killed") is None
    assert tracker.finished_run("key-running") is None
    assert tracker.finished_run("key-unknown") is None
    assert running
    f = tracker.client.get_run(failed)
    assert f.info.status == "FAILED" and f.data.tags["error"] == "verification failed: 3 elements"
    k = tracker.client.get_run(skipped)
    assert k.info.status == "KILLED" and k.data.tags["skip_reason"] == "mma=m16n8k64 is not valid"
    # a FAILED run and a FINISHED run with the same key: the FINISHED one is found
    again = tracker.start("done again", {}, {"run_key": "key-failed"})
    tracker.end(again)
    assert tracker.finished_run("key-failed").info.run_id == again
    # found for a sweep, the run joins it as a claim joins it; a deleted sweep's run is not found
    sweep = tracker.start("sweep", {}, {"kind": "sweep"})
    assert tracker.finished_run("key-finished", lambda: sweep).info.run_id == done
    assert tracker.client.get_run(done).data.tags[f"in_sweep.{sweep}"] == "reused"
    assert done in tracker.reused
    own = tracker.start("own", {}, {"run_key": "key-own"}, sweep)
    tracker.end(own)
    tracker.client.delete_run(sweep)
    assert tracker.finished_run("key-own") is None


def test_artifact_text(tracker, tmp_path):
    rid = tracker.start("artifacts", {}, {})
    tracker.artifact_text(rid, "ptxas info : Used 98 registers", "ptxas_report.txt")
    f = tmp_path / "k.ptx"
    f.write_text(".version 7.8\n")
    tracker.artifact_file(rid, f)
    names = sorted(a.path for a in tracker.client.list_artifacts(rid))
    assert names == ["k.ptx", "ptxas_report.txt"]
    local = tracker.client.download_artifacts(rid, "ptxas_report.txt", str(tmp_path / "dl"))
    assert Path(local).read_text() == "ptxas info : Used 98 registers"


def test_log_keeps_numpy_scalars(tracker):
    import numpy as np
    rid = tracker.start("numpy", {}, {})
    tracker.log(rid, {"registers": np.int64(98), "occupancy": np.float32(0.25), "bad": np.float64("inf")})
    assert tracker.client.get_run(rid).data.metrics == {"registers": 98.0, "occupancy": 0.25}


@pytest.mark.parametrize("visible", ["", "-1"])
def test_cuda_visible_devices_can_hide_every_gpu(monkeypatch, visible):
    from experiments.gpu.worker import nvml_gpu
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert nvml_gpu() is None


# -- run lifecycle: claims, parents, stale runs, aborts --------------------------------------------

def test_claim_measures_a_key_once(tracker):
    parents = []
    parent = lambda: parents.append(1) or "p-none"  # noqa: E731
    state, rid = tracker.claim("claim-1", "first", {"a": 1}, {"kernel": "k"}, lambda: None)
    assert state == "new" and tracker.client.get_run(rid).data.tags["run_key"] == "claim-1"
    # RUNNING in this (live) process: busy, not started again; it joins the sweep that asked for it
    assert tracker.claim("claim-1", "again", {}, {}, parent) == ("busy", rid)
    tracker.end(rid)
    assert tracker.claim("claim-1", "again", {}, {}, parent) == ("done", rid)
    assert parents == [1, 1] and rid in tracker.reused
    tags = tracker.client.get_run(rid).data.tags
    assert tags["in_sweep.p-none"] == "reused" and "mlflow.parentRunId" not in tags


def test_claim_closes_the_run_of_a_dead_process(tracker):
    rid = tracker.start("orphan", {}, {"run_key": "claim-2"})
    tracker.log(rid, tags={"owner_pid": "999999999"})          # no such process on this host
    state, new = tracker.claim("claim-2", "retry", {}, {}, lambda: None)
    assert state == "new" and new != rid
    old = tracker.client.get_run(rid)
    assert old.info.status == "KILLED"
    assert old.data.tags["skip_reason"] == f"its process (pid 999999999 on {socket.gethostname()}) ended without closing it"


def test_claim_keeps_runs_of_other_hosts(tracker):
    rid = tracker.start("elsewhere", {}, {"run_key": "claim-3"})
    tracker.log(rid, tags={"owner_host": "another-host", "owner_pid": "999999999"})
    assert tracker.claim("claim-3", "x", {}, {}, lambda: None) == ("busy", rid)
    assert tracker.close_stale() == 0 or tracker.client.get_run(rid).info.status == "RUNNING"


def test_close_stale(tracker):
    rid = tracker.start("stale", {}, {})
    tracker.log(rid, tags={"owner_pid": "999999998"})
    tracker.open.discard(rid)               # as if another process of this host had started it
    assert tracker.close_stale() >= 1
    assert tracker.client.get_run(rid).info.status == "KILLED"


def test_parent_found_again_and_reopened(tracker):
    sweep = {"key": "sweep-a", "name": "sweep precision=int8", "jobs": "2", "overrides": "precision=int8"}
    first = tracker.parent(sweep)
    run = tracker.client.get_run(first)
    assert run.info.run_name == "sweep precision=int8" and run.data.tags["kind"] == "sweep"
    assert tracker.parent(sweep) == first                   # remembered within the process
    tracker.end(first, "KILLED", "interrupted by Ctrl-C")
    tracker.parents.clear()                                 # as in the next command
    assert tracker.find_parent("sweep-a") == first
    again = tracker.parent(sweep)
    assert again == first and tracker.client.get_run(first).info.status == "RUNNING"
    tracker.end(first)
    assert tracker.find_parent("sweep-b") is None


def test_abort_open_runs_ends_everything_this_process_started(tmp_path, monkeypatch):
    from experiments.store import track
    monkeypatch.setattr(track, "_TRACKERS", {})
    tr = track.get_tracker(f"sqlite:///{tmp_path}/m.db", "abort")
    parent = tr.parent({"key": "k", "name": "sweep", "jobs": "3", "overrides": ""})
    done = tr.start("done", {}, {}, parent)
    tr.end(done)
    running = tr.start("running", {}, {}, parent)
    assert track.abort_open_runs("KILLED", "interrupted by Ctrl-C") == (1, 1, 1)    # a run, the sweep; 1 kept
    for rid, status in ((parent, "KILLED"), (running, "KILLED"), (done, "FINISHED")):
        assert tr.client.get_run(rid).info.status == status
    assert tr.client.get_run(running).data.tags["skip_reason"] == "interrupted by Ctrl-C"
    assert track.abort_open_runs("FAILED", "x") == (0, 0, 1)      # nothing left open


def test_read_only_open_of_a_missing_store_creates_nothing(tmp_path):
    with pytest.raises(StoreError, match="no store at .*typo.db"):
        Tracker(f"sqlite:///{tmp_path}/typo.db", "x", create=False)
    assert list(tmp_path.iterdir()) == []


def test_an_absolute_path_given_with_three_slashes_gets_the_four_slash_uri(tmp_path, monkeypatch):
    """sqlite:///tmp/x.db is tmp/x.db under the current folder: "no store at /cwd/tmp/x.db" gave no hint."""
    Tracker(f"sqlite:///{tmp_path}/one.db", "x")
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    relative = str(tmp_path / "one.db").lstrip("/")
    with pytest.raises(StoreError, match=f"no store at {here}/{relative} .*; an absolute path takes four "
                                         f"slashes: sqlite:///{tmp_path}/one.db$"):
        Tracker(resolve_uri(f"sqlite:///{relative}", create=False), "x", create=False)


def test_a_path_that_cannot_hold_a_store_is_refused_at_once(tmp_path):
    """A folder as the store made MLflow retry for about 100 s; a file among its folders ended in
    FileExistsError; a file that is not SQLite in a SQLAlchemy traceback; and another application's
    SQLite file got MLflow's tables added to it."""
    import sqlite3
    import time
    (tmp_path / "dir.db").mkdir()
    (tmp_path / "afile").write_text("x")
    (tmp_path / "text.db").write_text("not a database\n")
    with sqlite3.connect(tmp_path / "other.db") as con:
        con.execute("CREATE TABLE notes (x)")
    t0 = time.time()
    for name, why in (("dir.db", f"{tmp_path}/dir.db is a folder, not a database file: give the file, e.g. "
                                 f"sqlite:///{tmp_path}/dir.db/mlflow.db"),
                      ("text.db", f"{tmp_path}/text.db is not a SQLite database"),
                      ("other.db", f"{tmp_path}/other.db holds 1 table\\(s\\) of another application and none "
                                   "of MLflow's")):
        for create in (True, False):
            with pytest.raises(StoreError, match=why):
                Tracker(f"sqlite:///{tmp_path}/{name}", "x", create=create)
    with pytest.raises(StoreError, match=f"{tmp_path}/afile is a file, not a folder"):
        resolve_uri(f"sqlite:///{tmp_path}/afile/x.db")
    assert time.time() - t0 < 10
    with sqlite3.connect(tmp_path / "other.db") as con:
        assert con.execute("SELECT count(*) FROM sqlite_master").fetchone() == (1,)


def test_sqlite_spelled_otherwise_is_refused_and_spaces_are_trimmed(tmp_path):
    """sqlite:// and SQLITE:/// were read as folders ("e.g. sqlite:////.../sqlite:.db")."""
    for uri, path in (("sqlite://", f"{tmp_path}/mlflow.db"), ("SQLITE:///x.db", f"{tmp_path}/x.db"),
                      ("sqlite:x.db", f"{tmp_path}/x.db"), ("sqlite:/abs/one.db", "/abs/one.db")):
        with pytest.raises(StoreError, match=f"the tracking URI {uri} is no SQLite URI: write sqlite:/// and "
                                             f"the database file's path, e.g. sqlite:///{path} "):
            resolve_uri(uri, base=tmp_path)
    with pytest.raises(StoreError, match="the tracking URI is empty: give one"):   # was the default store
        resolve_uri(" ", base=tmp_path)
    assert resolve_uri(f" sqlite:///{tmp_path}/m.db ") == f"sqlite:///{tmp_path}/m.db"
    for uri in ("ftp://x/y.db", "s3://bucket/m.db"):     # was "a file store ... e.g. sqlite:////cwd/ftp:/x/y.db"
        with pytest.raises(StoreError, match=f"the tracking URI {uri} has a scheme MLflow cannot track to"):
            resolve_uri(uri, base=tmp_path)


def test_read_only_open_of_a_missing_experiment_takes_no_lock(tmp_path):
    """A report naming an experiment the store lacks made the store's lock file beside it."""
    from experiments.store.track import StoreError, Tracker
    uri = Tracker(f"sqlite:///{tmp_path}/m.db", "there").uri
    for lock in tmp_path.glob("*.lock"):
        lock.unlink()
    with pytest.raises(StoreError, match="experiment 'nope' is not in .* it holds: there"):
        Tracker(uri, "nope", create=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.db"]


def test_a_database_server_uri_without_its_driver_is_a_store_error(monkeypatch):
    """postgresql:// or mysql:// without their Python driver ended in a 57-line ModuleNotFoundError; the
    message names the driver and the package, never the password."""
    import sys

    from experiments.store.track import StoreError, Tracker
    for driver in ("psycopg", "psycopg2"):          # as where neither is installed
        monkeypatch.setitem(sys.modules, driver, None)
    with pytest.raises(StoreError) as exc:
        Tracker("postgresql://user:secret@127.0.0.1:9/db", "e", create=False)
    assert str(exc.value).startswith("the tracking URI postgresql://127.0.0.1:9/db needs the database driver "
                                     "psycopg"), exc.value
    assert "which is not installed: pip install " in str(exc.value) and "secret" not in str(exc.value)


def test_read_only_open_of_a_missing_experiment(tracker):
    with pytest.raises(StoreError, match="experiment 'nope' is not in .* it holds: .*track-tests"):
        Tracker(tracker.uri, "nope", create=False)


def test_deleted_experiment_says_how_to_restore(tmp_path):
    tr = Tracker(f"sqlite:///{tmp_path}/m.db", "gone")
    tr.client.delete_experiment(tr.experiment_id)
    with pytest.raises(StoreError) as err:
        Tracker(tr.uri, "gone")
    msg = str(err.value)
    assert f"experiment 'gone' (id {tr.experiment_id})" in msg and "was deleted" in msg
    assert f"mlflow experiments restore --experiment-id {tr.experiment_id}" in msg
    assert "tracking.experiment=NAME" in msg


def test_moved_store_keeps_its_artifacts_beside_the_database(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    tr = Tracker(f"sqlite:///{a}/m.db", "moving")
    rid = tr.start("old", {}, {})
    tr.artifact_text(rid, "old artifact", "note.txt")
    tr.end(rid)
    a.rename(b)
    moved = Tracker(f"sqlite:///{b}/m.db", "moving")
    assert "The store moved from" in capsys.readouterr().out
    exp = moved.client.get_experiment(moved.experiment_id)
    assert exp.artifact_location == (b / "artifacts").as_uri()
    got = moved.client.download_artifacts(rid, "note.txt", str(tmp_path / "dl"))
    assert Path(got).read_text() == "old artifact"
    new = moved.start("new", {}, {})
    moved.artifact_text(new, "new artifact", "note.txt")
    assert (b / "artifacts" / new / "artifacts" / "note.txt").read_text() == "new artifact"
    assert not a.exists()


def test_schema_made_only_for_a_store_mlflow_has_set_up(tmp_path):
    """Job processes open a store without its lock only once MLflow's schema is in it."""
    import sqlite3

    from experiments.store.track import Tracker, _schema_made
    db = tmp_path / "mlflow.db"
    assert not _schema_made(db)                        # no file
    sqlite3.connect(db).close()
    assert not _schema_made(db)                        # an empty file, as a starting migration leaves it
    Tracker(f"sqlite:///{db}", "e")
    assert _schema_made(db)
    second = Tracker(f"sqlite:///{db}", "e")           # opened without the lock, same experiment
    assert second.experiment_id == Tracker(f"sqlite:///{db}", "e").experiment_id


def test_store_named_through_a_link_is_not_rewritten(tmp_path, capsys):
    """A store reached through a symlink or with '..' is the same folder: nothing to relocate; and a
    read-only open (the report) never rewrites a store, even one that did move."""
    a = tmp_path / "a"
    tr = Tracker(f"sqlite:///{a}/m.db", "linked")
    rid = tr.start("r", {}, {})
    tr.artifact_text(rid, "x", "note.txt")
    tr.end(rid)
    (tmp_path / "link").symlink_to(a)
    for uri in (f"sqlite:///{tmp_path}/link/m.db", f"sqlite:///{a}/../a/m.db"):
        for create in (True, False):
            t = Tracker(uri, "linked", create=create)
            assert t.client.get_experiment(t.experiment_id).artifact_location == (a / "artifacts").as_uri()
    a.rename(tmp_path / "b")
    t = Tracker(f"sqlite:///{tmp_path}/b/m.db", "linked", create=False)
    assert t.client.get_experiment(t.experiment_id).artifact_location == (a / "artifacts").as_uri()
    assert "moved" not in capsys.readouterr().out


def test_a_new_store_is_made_whole_before_ctrl_c_takes_effect(tmp_path, monkeypatch):
    """Ctrl-C while MLflow creates a new store's tables used to leave a store no command could open
    again (its migration half done); the signal now waits until the tables exist."""
    import os
    import signal

    import mlflow

    from experiments.store import track
    made = mlflow.MlflowClient

    def interrupted_client(*a, **kw):
        os.kill(os.getpid(), signal.SIGINT)          # arrives while the store is being set up
        client = made(*a, **kw)
        client.search_experiments()                  # the tables are made here, by MLflow
        return client
    monkeypatch.setattr(mlflow, "MlflowClient", interrupted_client)
    with pytest.raises(KeyboardInterrupt):
        Tracker(f"sqlite:///{tmp_path}/new.db", "e")
    monkeypatch.setattr(mlflow, "MlflowClient", made)
    assert track._schema_made(tmp_path / "new.db")
    assert Tracker(f"sqlite:///{tmp_path}/new.db", "e").experiment_id


def test_a_forked_process_owns_its_runs_under_its_own_pid(tmp_path):
    """A process forked after the store's modules were imported (a fork server, the test zygote) tagged
    its runs with the pid of the process it was forked from, which outlives it: a run it left RUNNING
    looked alive, and its Ctrl-C counted runs finished since that process started as its own."""
    import os

    from experiments.store import track
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:                                         # the child: one run, then its pid and start
        code = 1
        try:
            tr = Tracker(f"sqlite:///{tmp_path}/m.db", "forked")
            rid = tr.start("child", {}, {})
            owner = tr.client.get_run(rid).data.tags["owner_pid"]
            tr.end(rid)
            os.write(write, f"{owner} {track.PID} {track.START_MS}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        owner, recorded, start_ms = f.read().split()
    assert os.waitpid(pid, 0)[1] == 0
    assert owner == recorded == str(pid) != str(os.getpid())
    assert int(start_ms) > track.START_MS and track.OWNER["owner_pid"] == str(os.getpid())


def _schema_and_rows(db) -> list:
    """The SQL dump of the SQLite file ``db`` with times (13-digit ms) and folder names left out and the
    clauses of each statement sorted: MLflow's own migrations order a table's constraints differently
    from one new store to the next."""
    import re
    import sqlite3
    with contextlib.closing(sqlite3.connect(db)) as con:
        lines = [re.sub(r"\b1\d{12}\b", "T", line).replace(f"{Path(db).parent}/", "DIR/") for line in con.iterdump()]
    return sorted("\n".join(sorted(line.split("\n"))) for line in lines)


def test_a_new_store_is_a_copy_of_the_empty_store_mlflow_makes(tmp_path, monkeypatch):
    """MLflow makes a new store's schema by running its ~70 migrations (about 1 s of CPU); a new SQLite
    store is instead copied from an empty one made once per MLflow version in the cache folder, and
    holds the same tables, rows and Default experiment as a store MLflow makes. A half-made store is
    never replaced (MLflow completes it), and where the cache folder cannot be written MLflow makes the
    schema itself."""
    import sqlite3

    import mlflow
    import mlflow.store.db.utils as db_utils

    from experiments.store import track
    made = []
    initialize = db_utils._initialize_tables
    monkeypatch.setattr(db_utils, "_initialize_tables", lambda engine: made.append(1) or initialize(engine))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    for name in ("a", "b"):
        Tracker(f"sqlite:///{tmp_path}/{name}/mlflow.db", "e")
    assert len(made) == 1                                     # the empty store, once; both stores copied
    empty = _empty_store_file(tmp_path)
    with contextlib.closing(sqlite3.connect(empty)) as con:
        assert con.execute("SELECT count(*) FROM experiments").fetchone() == (0,)
    (tmp_path / "m").mkdir()
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/m/mlflow.db")     # MLflow makes it
    client.create_experiment("e", artifact_location=(tmp_path / "m" / "artifacts").as_uri())
    assert len(made) == 2
    assert _schema_and_rows(tmp_path / "a" / "mlflow.db") == _schema_and_rows(tmp_path / "m" / "mlflow.db")
    assert [(e.experiment_id, e.name) for e in client.search_experiments()] == [("1", "e"), ("0", "Default")]

    engine = db_utils.create_sqlalchemy_engine(f"sqlite:///{tmp_path}/half.db")
    db_utils.InitialBase.metadata.create_all(engine)         # a store whose making was cut short (kill -9)
    engine.dispose()
    Tracker(f"sqlite:///{tmp_path}/half.db", "e")            # MLflow completes it, in place
    assert len(made) == 3 and track._schema_made(tmp_path / "half.db")

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))          # no folder can be made there
    Tracker(f"sqlite:///{tmp_path}/c.db", "e")
    assert len(made) == 4 and track._schema_made(tmp_path / "c.db")


def _empty_store_file(tmp_path):
    import mlflow

    from experiments.store import track
    return tmp_path / "cache" / "tensorcore-ablations" / f"mlflow-{mlflow.__version__}-{track._schema_head()}.db"


def test_a_damaged_or_written_empty_store_is_made_again_and_leftovers_go(tmp_path, monkeypatch):
    """The empty store in the cache folder was trusted on its schema revision alone: a page damaged
    elsewhere in it made every new store 'database disk image is malformed', and an experiment written
    into it, or a row into any other table, appeared in every new store. Files a killed process left
    aside (in the cache folder, of any MLflow version, an hour old; beside a store, under its lock) are
    removed. A relative XDG_CACHE_HOME is not used."""
    import os
    import sqlite3
    import time

    from experiments.store import track
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    Tracker(f"sqlite:///{tmp_path}/a.db", "e")
    empty = _empty_store_file(tmp_path)
    data = bytearray(empty.read_bytes())
    page = 4096 * 100                                      # a page of some table, not the header
    data[page:page + 4096] = b"\xa5" * 4096
    empty.write_bytes(bytes(data))
    assert track._revision(empty) == track._schema_head() and not track._empty_store_sound(empty)
    left = empty.with_name(f".{empty.name}.abc123")
    left.write_bytes(b"x")
    os.utime(left, (time.time() - 7200,) * 2)
    beside = tmp_path / ".b.db.99999.new"
    beside.write_bytes(b"x")
    b = Tracker(f"sqlite:///{tmp_path}/b.db", "e")
    assert [e.name for e in b.client.search_experiments()] == ["e", "Default"]
    assert track._empty_store_sound(empty) and not left.exists() and not beside.exists()
    with contextlib.closing(sqlite3.connect(empty)) as con:
        con.execute("INSERT INTO experiments (name, lifecycle_stage) VALUES ('leaked', 'active')")
        con.commit()
    c = Tracker(f"sqlite:///{tmp_path}/c.db", "e")
    assert [e.name for e in c.client.search_experiments()] == ["e", "Default"]
    with contextlib.closing(sqlite3.connect(empty)) as con:      # a row of any other table, too
        con.execute("INSERT INTO registered_models (name, creation_time, last_updated_time) VALUES ('intruder', 0, 0)")
        con.commit()
    older = empty.with_name(".mlflow-3.0.0-0123456789ab.db.xyz")  # left by a killed process of another MLflow
    older.write_bytes(b"x")
    os.utime(older, (time.time() - 7200,) * 2)
    d = Tracker(f"sqlite:///{tmp_path}/d.db", "e")
    assert d.client.search_registered_models() == [] and not older.exists()
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")
    assert track._cache_folder() == Path.home() / ".cache" / "tensorcore-ablations"


def test_a_store_path_that_is_there_keeps_its_link_owner_and_mode(tmp_path, monkeypatch):
    """The copy replaced whatever was at the store's path: a link to an empty file became a file of its
    own (the link's target stayed empty), and an empty file made for the store lost its mode and owner.
    Something at the path is set up by MLflow, through the link, in the file."""
    import stat
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "real.db").touch()
    (tmp_path / "link.db").symlink_to(tmp_path / "real.db")
    Tracker(f"sqlite:///{tmp_path}/link.db", "e")
    assert (tmp_path / "link.db").is_symlink() and (tmp_path / "real.db").stat().st_size > 0
    (tmp_path / "own.db").touch(mode=0o600)
    (tmp_path / "own.db").chmod(0o600)
    Tracker(f"sqlite:///{tmp_path}/own.db", "e")
    assert stat.S_IMODE((tmp_path / "own.db").stat().st_mode) == 0o600 and (tmp_path / "own.db").stat().st_size > 0


def test_a_full_disk_while_a_new_store_is_made_leaves_no_store_behind(tmp_path, monkeypatch):
    """A full disk while MLflow made a new store's schema left a half-made store, which the same command
    then took for one of an older MLflow whose upgrade failed ('table spans already exists'): it could
    not resume. The copy of the empty store stops at once on a full disk; MLflow's own set-up that
    fails on a full disk leaves nothing; either way the same command then makes the store."""
    import errno
    import shutil
    import sqlite3

    import mlflow.store.db.utils as db_utils
    import sqlalchemy

    from experiments.store import track
    from experiments.store.track import StoreUnavailable
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    Tracker(f"sqlite:///{tmp_path}/first.db", "e")                 # the empty store exists

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    with monkeypatch.context() as mp:
        mp.setattr(shutil, "copyfile", full)
        with pytest.raises(StoreUnavailable, match="the disk of the store .*copy.db is full"):
            Tracker(f"sqlite:///{tmp_path}/copy.db", "e")
    assert list(tmp_path.glob("*copy.db*")) == [tmp_path / "copy.db.lock"]

    initialize = db_utils._initialize_tables

    def half(engine):                                  # MLflow's tables, then the disk fills up
        db_utils.InitialBase.metadata.create_all(engine)
        raise sqlalchemy.exc.OperationalError("ALTER TABLE", {}, sqlite3.OperationalError("database or disk is full"))
    with monkeypatch.context() as mp:
        mp.setattr(track, "_empty_store", lambda: None)
        mp.setattr(db_utils, "_initialize_tables", half)
        with pytest.raises(StoreUnavailable, match="the disk of the store .*mlflow_made.db is full"):
            Tracker(f"sqlite:///{tmp_path}/mlflow_made.db", "e")
    assert not (tmp_path / "mlflow_made.db").exists()
    assert db_utils._initialize_tables is initialize
    for name in ("copy", "mlflow_made"):
        assert Tracker(f"sqlite:///{tmp_path}/{name}.db", "e").experiment_id == "1"
