"""The store under pressure: another process holding its write lock, a full disk, a store of another
MLflow version, several commands making one new store at once.

Each test runs the commands as a user would (``run.py`` without a GPU: the static path) and asserts on
the store, the exit status and the message.
"""
import functools
import hashlib
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from test_cli import EXPERIMENT, ROOT, _empty_store, all_runs, popen_cli, run_cli, store_args
from test_store import assert_store_is_true, cli_env

pytestmark = pytest.mark.usefixtures("need_ptxas")

MLFLOW_2_16_HEAD = "acf3f17fdcc7"     # the last schema revision of MLflow 2.16 (add_storage_location ...)
TCP = ROOT.parent / "shared" / "reference" / "tensorcoreptx"


@functools.lru_cache(maxsize=1)
def _mlflow_2_16_store() -> Path:
    """A store as MLflow 2.16 leaves it: MLflow's initial tables migrated up to 2.16's last revision by
    the migrations the installed MLflow carries (the same scripts 2.16 shipped), with one experiment
    and one finished run written in that schema. Made once (seconds)."""
    import sqlalchemy
    from alembic import command
    from mlflow.store.db.utils import _get_alembic_config
    from mlflow.store.tracking.dbmodels.initial_models import Base
    db = Path(tempfile.mkdtemp(prefix="mlflow216_")) / "mlflow.db"
    engine = sqlalchemy.create_engine(f"sqlite:///{db}")
    Base.metadata.create_all(engine)
    config = _get_alembic_config(str(engine.url))
    with engine.begin() as con:
        config.attributes["connection"] = con
        command.upgrade(config, MLFLOW_2_16_HEAD)
    engine.dispose()
    with sqlite3.connect(db) as con:
        con.execute("INSERT INTO experiments VALUES (1, 'old', 'file:///old/artifacts', 'active', 0, 0)")
        con.execute("INSERT INTO runs (run_uuid, name, source_type, source_name, entry_point_name, user_id, "
                    "status, start_time, end_time, source_version, lifecycle_stage, artifact_uri, "
                    "experiment_id) VALUES ('a' || hex(randomblob(15)), 'kept', 'LOCAL', '', '', 'u', "
                    "'FINISHED', 1, 2, '', 'active', 'file:///old/artifacts/x', 1)")
    return db


def _revision(db: Path) -> str:
    with sqlite3.connect(db) as con:
        return con.execute("SELECT version_num FROM alembic_version").fetchone()[0]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _dump(path: Path) -> list:
    """The SQL text of a database's schema and rows (a copy made by SQLite's backup differs in bytes)."""
    with sqlite3.connect(path) as con:
        return list(con.iterdump())


def test_store_of_an_older_mlflow_is_kept_before_it_is_upgraded(tmp_path, capsys, module_cli):
    """A read-only command refuses it unchanged and names the upgrade; run.py keeps a copy first."""
    from analysis.runs import RunsError, load_runs
    db = tmp_path / "mlflow.db"
    shutil.copy(_mlflow_2_16_store(), db)
    before, rows = _sha(db), _dump(db)
    rc, _, err = module_cli("experiments.report", "--uri", f"sqlite:///{db}", cwd=ROOT)
    assert rc == 2 and "Traceback" not in err, err
    assert f"was written by an older MLflow (schema revision {MLFLOW_2_16_HEAD}" in err
    assert f"mlflow db upgrade sqlite:///{db}" in err
    with pytest.raises(RunsError, match="older MLflow"):
        load_runs(f"sqlite:///{db}")
    assert _sha(db) == before and sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db"]

    rc, out = run_cli(tmp_path, "-m", "precision=int8", "ktile=64", *store_args(tmp_path))
    assert rc == 0 and "Traceback" not in out, out
    backup = tmp_path / f"mlflow.db.bak-{MLFLOW_2_16_HEAD}"
    assert out.count("upgraded in place") == 1 and f"the old file is kept as {backup}" in out, out
    assert _dump(backup) == rows and _revision(backup) == MLFLOW_2_16_HEAD
    from experiments.store.track import _schema_head
    assert _revision(db) == _schema_head()
    parents, children = assert_store_is_true(tmp_path)
    assert [c.info.status for c in children] == ["FINISHED"]
    import mlflow
    old = mlflow.MlflowClient(f"sqlite:///{db}").search_runs(["1"])
    assert [r.info.run_name for r in old] == ["kept"]             # the old runs are still there
    from experiments.store.track import check_schema                  # upgraded once: the next open is plain
    assert check_schema(f"sqlite:///{db}") and len(list(tmp_path.glob("mlflow.db.bak-*"))) == 1
    assert "upgraded" not in capsys.readouterr().out


def test_store_of_a_newer_mlflow_is_left_alone_with_the_pip_command(tmp_path, module_cli):
    import mlflow
    db = tmp_path / "mlflow.db"
    shutil.copy(_empty_store(), db)
    with sqlite3.connect(db) as con:
        con.execute("UPDATE alembic_version SET version_num = 'f00dfeed1234'")
    before = _sha(db)
    advice = f"written by a newer MLflow than the installed {mlflow.__version__}"
    rc, out = run_cli(tmp_path, "-m", "precision=int8", "ktile=64", *store_args(tmp_path))
    assert rc == 1 and "Traceback" not in out, out
    assert advice in out and f"pip install 'mlflow>{mlflow.__version__}'" in out, out
    rc, _, err = module_cli("experiments.report", "--uri", f"sqlite:///{db}", cwd=ROOT)
    assert rc == 2 and advice in err and "Traceback" not in err, err
    assert _sha(db) == before and _revision(db) == "f00dfeed1234"


def _hold_write_lock(db: Path, seconds: float = 60) -> subprocess.Popen:
    """Another process holding a write transaction on ``db`` (as a client in the middle of a write)."""
    code = ("import sqlite3, sys, time\n"
            "con = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "con.execute('BEGIN IMMEDIATE')\n"
            "print('held', flush=True)\n"
            f"time.sleep({seconds})\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(db)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_write_held_up_past_the_wait_ends_in_one_line_while_reads_go_on(tmp_path):
    from experiments.store.track import StoreUnavailable, Tracker
    shutil.copy(_empty_store(), tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tr = Tracker(uri, "e", wait=0.5)
    holder = _hold_write_lock(tmp_path / "mlflow.db")
    try:
        t0 = time.time()
        with pytest.raises(StoreUnavailable) as err:
            tr.start("r", {}, {})
        took = time.time() - t0
        reader = Tracker(uri, "e", create=False)
        assert reader.client.search_runs([reader.experiment_id]) == []         # reading is not held up
    finally:
        holder.kill()
        holder.wait()
    assert 0.5 <= took < 5 and tr.open == set(), took
    assert str(err.value).startswith(f"the store {tmp_path}/mlflow.db stayed locked by another process "
                                     f"(pid {holder.pid}: ") and "\n" not in str(err.value)
    assert tr.client.search_runs([tr.experiment_id]) == []                     # nothing half-written


def test_store_locked_by_another_process_waits_its_bound_and_says_who(tmp_path):
    args = ["-m", "precision=int4,int8", "ktile=64", "tracking.wait=2", *store_args(tmp_path)]
    holder = _hold_write_lock(tmp_path / "mlflow.db")
    try:
        t0 = time.time()
        rc, out = run_cli(tmp_path, *args)
        took = time.time() - t0
    finally:
        holder.kill()
        holder.wait()
    assert rc == 1 and "Traceback" not in out and "database is locked" not in out, out
    lines = [line for line in out.splitlines() if line.startswith("Store unavailable:")]
    assert len(lines) == 1, out
    assert f"the store {tmp_path}/mlflow.db stayed locked by another process (pid {holder.pid}:" in lines[0]
    assert "holding a write transaction for 2 s (tracking.wait)" in lines[0]
    assert "0 run(s) finished in this command are kept" in lines[0]
    assert took < 25, took                                          # one wait of 2 s, not one per job
    assert all_runs(tmp_path) == ([], [])                            # nothing half-written, nothing RUNNING
    rc, out = run_cli(tmp_path, *args)                              # the lock gone, the same command works
    assert rc == 0, out
    parents, children = assert_store_is_true(tmp_path)
    assert len(parents) == 1 and sorted(c.info.status for c in children) == ["FINISHED"] * 2


@pytest.fixture
def small_disk(tmp_path):
    """A 1,400 KiB tmpfs holding a copy of an empty store (about 930 KiB): room for a few runs."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1400k", "tmpfs", str(disk)],
                      capture_output=True).returncode != 0:
        pytest.skip("a tmpfs cannot be mounted here (needs root)")
    try:
        shutil.copy(_empty_store(), disk / "mlflow.db")
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_full_disk_mid_sweep_ends_in_one_line_and_the_next_command_closes_what_was_left(tmp_path, small_disk):
    args = ["-m", "precision=bf16,int8", "ktile=32,64", f"tracking.uri=sqlite:///{small_disk}/mlflow.db",
            f"tracking.experiment={EXPERIMENT}", f"hydra.sweep.dir={tmp_path}/out"]
    rc, out = run_cli(tmp_path, *args)
    assert rc == 1 and "Traceback" not in out and "disk is full" not in out.replace("disk of the store", ""), out
    lines = [line for line in out.splitlines() if line.startswith("Store unavailable:")]
    assert len(lines) == 1, out
    assert f"the disk of the store {small_disk}/mlflow.db is full; free space there" in lines[0]
    parents, children = all_runs(small_disk)
    kept = [c for c in children if c.info.status == "FINISHED"]
    assert 1 <= len(kept) < 4 and f"{len(kept)} run(s) finished in this command are kept" in lines[0]
    left = [r for r in parents + children if r.info.status == "RUNNING"]
    if left:                    # the store took no write any more: what was open is left to the next command
        sweep = int(any(r in parents for r in left))
        assert f"{len(left)} run(s) ({sweep} of them the sweep's parent) stay RUNNING until the next" in lines[0]
    else:                       # the run in progress could still be closed
        killed = [c for c in children if c.info.status == "KILLED"]
        assert killed and all("is full" in c.data.tags["skip_reason"] for c in killed)
        assert f"{len(killed)} run(s) in progress marked KILLED" in lines[0]

    subprocess.run(["mount", "-o", "remount,size=16m", str(small_disk)], check=True)   # space freed
    rc, out = run_cli(tmp_path, *args)
    assert rc == 0, out
    assert f"continuing parent run {parents[0].info.run_id}" in out
    parents2, children2 = assert_store_is_true(small_disk)          # nothing RUNNING any more
    assert [p.info.run_id for p in parents2] == [parents[0].info.run_id]
    assert len([c for c in children2 if c.info.status == "FINISHED"]) == 4


@pytest.mark.skipif(not TCP.is_dir(), reason="shared/reference/tensorcoreptx (third-party reports) not present")
def test_concurrent_imports_and_a_sweep_make_one_new_store_once(tmp_path):
    """Three imports of one report, a sweep and a report, all at once on a store that does not exist yet."""
    import mlflow
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    report = str(TCP / "run2__int8_wmma_ncu_8192.txt")
    imports = [popen_cli(ROOT, "--import-text", report, "--uri", uri, module="experiments.profile", env=cli_env())
               for _ in range(3)]
    reader = popen_cli(ROOT, "--uri", uri, module="experiments.report", env=cli_env())
    rc, out = run_cli(tmp_path, "-m", "precision=int8", "ktile=32,64", *store_args(tmp_path, new_store=True))
    outs = [p.communicate(timeout=240)[0] for p in imports]
    read = reader.communicate(timeout=240)[0]       # a table, or the store or experiment not there yet
    assert "Traceback" not in read and (reader.returncode == 0 or "Store error:" in read), read
    assert rc == 0 and "Traceback" not in out, out
    assert [p.returncode for p in imports] == [0, 0, 0] and not any("Traceback" in o for o in outs), outs
    assert sum("already imported" in o for o in outs) == 2, outs
    client = mlflow.MlflowClient(uri)
    ref = client.get_experiment_by_name("ncu-reference").experiment_id
    runs = client.search_runs([ref], max_results=100)
    assert len(runs) == 2 and sorted(r.info.status for r in runs) == ["FINISHED"] * 2     # a parent, one block
    parents, children = assert_store_is_true(tmp_path)
    assert len(parents) == 1 and len(children) == 2
