"""Where runs land is what the command said.

The sweep's start resolves the store and the experiment once, absolutely, and every job writes there
(also with ``hydra.job.chdir=True`` and in the processes of a parallel launcher); a ``tracking.*`` key
that would differ between the jobs of a sweep stops it before any work; a SQLite path that SQLAlchemy
or MLflow would misread is refused with the path to use; a parent run or experiment deleted while the
sweep runs is restored, so that no run is left under a deleted one.

The commands run ``run.py`` as a user would, without a GPU (static runs), and the tests read the store.
"""
import re
import shutil
import textwrap
from pathlib import Path

import pytest
from test_cli import EXPERIMENT, ROOT, _empty_store, run_cli

from experiments.store.track import StoreError, Tracker, resolve_uri, sqlite_path

pytestmark = pytest.mark.usefixtures("need_ptxas")


def store_at(db: Path) -> str:
    """A copy of an empty store at ``db`` (spares the migration); returns its path as text."""
    db.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(_empty_store(), db)
    return str(db)


def runs_in(db: Path, experiment: str = EXPERIMENT):
    """(client, experiment, parent runs, child runs) of the store ``db``, deleted runs included."""
    import mlflow
    from mlflow.entities import ViewType
    client = mlflow.MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], run_view_type=ViewType.ALL) if exp else []
    parents = [r for r in runs if r.data.tags.get("kind") == "sweep"]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) + len(children) == len(runs)
    return client, exp, parents, children


def assert_one_live_sweep(db: Path, n: int, experiment: str = EXPERIMENT):
    """The store ``db`` holds one live, FINISHED parent in ``experiment`` with ``n`` live, FINISHED
    children under it; returns the parent's id."""
    client, exp, parents, children = runs_in(db, experiment)
    assert exp is not None and exp.lifecycle_stage == "active"
    assert [(p.info.status, p.info.lifecycle_stage) for p in parents] == [("FINISHED", "active")]
    pid = parents[0].info.run_id
    assert len(children) == n
    for c in children:
        assert c.data.tags["mlflow.parentRunId"] == pid
        assert (c.info.status, c.info.lifecycle_stage) == ("FINISHED", "active"), c.info.run_name
    return pid


def default_store():
    """What the default store (outputs/mlflow.db of the project) is now: a command that must not
    write to it leaves this unchanged."""
    db = ROOT / "outputs" / "mlflow.db"
    return db.stat().st_mtime_ns if db.exists() else None


# -- hydra.job.chdir and launcher processes -----------------------------------------------------

@pytest.mark.parametrize("multirun", [True, False])
def test_chdir_with_a_relative_store_writes_to_the_announced_store(tmp_path, multirun):
    """hydra.job.chdir=True with a relative store: each job resolved tracking.uri again in its own
    folder and wrote a store there; the announced store stayed empty and "Nothing new was tracked"."""
    store_at(tmp_path / "rel" / "mlflow.db")
    sweep = ["-m", "precision=int4,int8", f"hydra.sweep.dir={tmp_path}/out"] if multirun else \
        ["precision=int8", f"hydra.run.dir={tmp_path}/out"]
    rc, out = run_cli(tmp_path, *sweep, "ktile=64", "hydra.job.chdir=True", "tracking.uri=sqlite:///rel/mlflow.db",
                      f"tracking.experiment={EXPERIMENT}")
    assert rc == 0, out
    n = 2 if multirun else 1
    assert f"Tracking {n} job(s) in sqlite:///{tmp_path}/rel/mlflow.db" in out, out
    assert "Nothing new was tracked" not in out
    assert sorted(tmp_path.rglob("*.db")) == [tmp_path / "rel" / "mlflow.db"]
    pid = assert_one_live_sweep(tmp_path / "rel" / "mlflow.db", n)
    assert f"Parent run {pid}: {n} static." in out


def test_parallel_launcher_with_chdir_and_an_odd_relative_path(tmp_path, module_cli):
    """Job processes of the joblib launcher, each in its own folder: one store, at the path written
    (a space, '#', non-ASCII, %20 and '..' in it), found by the report at the URI run.py printed and
    at the URI the user wrote."""
    written = "sqlite:///odd dir/%C3%A9t%C3%A9 x/../st #1 %C3%BC%20b/mlflow.db"
    db = tmp_path / "odd dir" / "st #1 ü b" / "mlflow.db"
    rc, out = run_cli(tmp_path, "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "hydra.job.chdir=True",
                      "precision=int4,int8", "ktile=64", f"tracking.uri='{written}'",
                      f"tracking.experiment={EXPERIMENT}", f"hydra.sweep.dir={tmp_path}/out")
    assert rc == 0, out
    printed = re.search(r"Tracking 2 job\(s\) in (sqlite:///.*) \(parent run", out).group(1)
    assert printed == f"sqlite:///{db}"
    assert sorted(tmp_path.rglob("*.db")) == [db]
    assert sorted(p.name for p in (tmp_path / "odd dir").iterdir()) == ["st #1 ü b"]   # no stray folder
    assert_one_live_sweep(db, 2)
    for uri in (printed, written):
        rc, out, err = module_cli("experiments.report", "--uri", uri, "--experiment", EXPERIMENT, cwd=tmp_path)
        text = out + err
        assert f"{printed} was measured on a GPU yet: 2 static run(s)" in text, text    # found, read


# -- tracking.* keys that would differ between jobs --------------------------------------------

REFUSED = [
    (["precision=int4,int8", "tracking.experiment=abl-a,abl-b"],
     "Cannot sweep tracking.experiment (tracking.experiment=abl-a,abl-b): a sweep is tracked in one store "
     "and experiment, set at its start. Run one sweep per value instead: python run.py -m "
     "precision=int4,int8 ktile=64 tracking.experiment=abl-a, then the next value."),
    (["precision=int8", "tracking.uri=sqlite:///{tmp}/a.db,sqlite:///{tmp}/b.db"], "Cannot sweep tracking.uri ("),
    (["precision=int4,int8", "tracking.experiment=abl-${precision}"],
     "Cannot use tracking.experiment=abl-${precision} in this sweep: precision differs from job to job "
     "(precision=int4,int8), and a sweep is tracked in one store and experiment, set at its start. Run one "
     "sweep per value, or give tracking.experiment a value that is the same for every job."),
    (["precision=int8", "tracking.uri=sqlite:///{tmp}/${hydra:job.num}/mlflow.db"],
     "Cannot use tracking.uri=sqlite:///{tmp}/${hydra:job.num}/mlflow.db in this sweep: hydra:job.num "
     "differs from job to job,"),
    (["variant=int8_wmma,int4_wmma", "tracking.experiment=v-${precision}"],
     "tracking.experiment=v-${precision} in this sweep: precision may differ from job to job "
     "(variant=int8_wmma,int4_wmma)"),
    (["precision=int8", "experiment=sweeps_tracking"], "Cannot sweep tracking.experiment (tracking.experiment=p-a,p-b)"),
]


@pytest.mark.parametrize("overrides, message", REFUSED)
def test_tracking_keys_that_vary_per_job_stop_the_sweep_before_any_work(tmp_path, overrides, message):
    """Sweeping tracking.experiment left children in another experiment than their (deleted) parent;
    an interpolation of a swept key named experiments abl-Precision.int8; sweeping tracking.uri also
    wrote outputs/mlflow.db. Now each stops at once with one line saying what to do, and writes nothing."""
    presets = tmp_path / "extra" / "experiment"
    presets.mkdir(parents=True)
    (presets / "sweeps_tracking.yaml").write_text(
        "# @package _global_\nhydra:\n  sweeper:\n    params:\n      tracking.experiment: p-a,p-b\n")
    before = default_store()
    given = [o.replace("{tmp}", str(tmp_path)) for o in overrides]
    rc, out = run_cli(tmp_path, "-m", f"--config-dir={tmp_path / 'extra'}", *given, "ktile=64",
                      f"hydra.sweep.dir={tmp_path}/out")
    assert rc == 2 and "Traceback" not in out, out         # a value the sweep cannot take (it exited 1)
    assert message.replace("{tmp}", str(tmp_path)) in out
    assert "Tracking" not in out and "[1/" not in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["extra"]       # no store, no job folder
    assert default_store() == before


def test_interpolated_experiment_takes_plain_names(tmp_path):
    """tracking.experiment=abl-${precision} with precision fixed: the experiment is abl-int8 (it was
    abl-Precision.int8), for the parent and every child."""
    db = Path(store_at(tmp_path / "mlflow.db"))
    rc, out = run_cli(tmp_path, "-m", "precision=int8", "ktile=32,64", "tracking.experiment=abl-${precision}",
                      f"tracking.uri=sqlite:///{db}", f"hydra.sweep.dir={tmp_path}/out")
    assert rc == 0, out
    assert_one_live_sweep(db, 2, "abl-int8")
    client, *_ = runs_in(db)
    assert sorted(e.name for e in client.search_experiments()) == ["Default", "abl-int8"]


# -- SQLite paths ------------------------------------------------------------------------------

@pytest.mark.parametrize("written, path", [
    ("a b/m.db", "a b/m.db"), ("a%20b/m.db", "a b/m.db"), ("%C3%A9/m.db", "é/m.db"), ("é/m.db", "é/m.db"),
    ("h#1/m.db", "h#1/m.db"), ("x/../y/m.db", "y/m.db"), ("./z/./m.db", "z/m.db"),
    ("{tmp}/x/../w/m.db", "w/m.db"), ("~/home.db", "home/home.db")])
def test_sqlite_paths_land_where_sqlalchemy_opens_them(tmp_path, monkeypatch, written, path):
    """The URI resolve_uri returns names the path that was written, and SQLAlchemy (which MLflow opens
    the store with) reads that same path from it."""
    from sqlalchemy.engine import make_url
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    uri = resolve_uri("sqlite:///" + written.replace("{tmp}", str(tmp_path)), base=tmp_path)
    assert uri == f"sqlite:///{tmp_path / path}"
    assert sqlite_path(uri) == tmp_path / path == Path(make_url(uri).database)
    assert (tmp_path / path).parent.is_dir()


def test_a_store_at_an_odd_path_is_made_there_and_nowhere_else(tmp_path):
    uri = resolve_uri("sqlite:///o d/%C3%A9#1/../é #2/m.db", base=tmp_path)
    tr = Tracker(uri, "x")
    tr.end(tr.start("r", {}, {}))
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.suffix != ".lock") \
        == ["o d", "o d/é #2", "o d/é #2/m.db"]                     # no folder named with % or the escape
    assert Tracker(uri, "x", create=False).client.get_experiment_by_name("x") is not None


@pytest.mark.parametrize("written, char, why", [
    ("{tmp}/s/q?x=1/mlflow.db", "?", "SQLAlchemy ends the path at '?': the store would be {tmp}/s/q"),
    ("{tmp}/m.db?timeout=30", "?", "SQLAlchemy ends the path at '?': the store would be {tmp}/m.db"),
    ("{tmp}/s/q%3Fx=1/mlflow.db", "?", "MLflow makes a stray folder named with %3F beside the store"),
    ("{tmp}/50%/mlflow.db", "%", "SQLAlchemy reads '%' as the start of an escape such as %20, and MLflow"),
    ("{tmp}/a%25b/mlflow.db", "%", "SQLAlchemy reads '%' as the start of an escape such as %20, and MLflow "
                                   "makes a stray folder named with %25 beside the store")])
def test_sqlite_paths_sqlalchemy_or_mlflow_would_misread_are_refused(tmp_path, written, char, why):
    """sqlite:////data/s/q?x=1/mlflow.db wrote its store to /data/s/q, and the report then found no
    store at the URI run.py printed: refused, naming the path to use, by run.py and the readers."""
    uri = "sqlite:///" + written.replace("{tmp}", str(tmp_path))
    fixed = uri.replace("%3F", "_").replace("%25", "_").replace("?", "_").replace("%", "_")
    message = (f"the tracking URI {uri}: a SQLite store's path cannot hold '{char}' "
               f"({why.replace('{tmp}', str(tmp_path))}")
    with pytest.raises(StoreError) as err:
        resolve_uri(uri, base=tmp_path)
    assert str(err.value).startswith(message) and str(err.value).endswith(f"e.g. {fixed}")
    assert list(tmp_path.iterdir()) == []


def test_run_and_readers_refuse_a_question_mark_in_the_path(tmp_path, module_cli):
    """The reported input end to end: run.py stops before any work with the path to use, and writes no
    store (it wrote one to {tmp}/s/q); the report says the same of that URI."""
    uri = f"sqlite:///{tmp_path}/s/q?x=1/mlflow.db"
    rc, out = run_cli(tmp_path, "precision=int8", "ktile=64", f"tracking.uri='{uri}'",
                      f"hydra.run.dir={tmp_path}/out")
    assert rc == 2 and "Traceback" not in out, out
    assert f"Store error: the tracking URI {uri}: a SQLite store's path cannot hold '?' (SQLAlchemy ends the " \
           f"path at '?': the store would be {tmp_path}/s/q); use a path without '?' and '%', e.g. " \
           f"sqlite:///{tmp_path}/s/q_x=1/mlflow.db" in out
    assert not (tmp_path / "s").exists() and list(tmp_path.rglob("*.db")) == []
    rc, out, err = module_cli("experiments.report", "--uri", uri, cwd=ROOT)
    text = out + err
    assert rc != 0 and "a SQLite store's path cannot hold '?'" in text and "Traceback" not in text, text
    assert not (tmp_path / "s").exists()


# -- the parent or the experiment deleted while the sweep runs ---------------------------------

def _deleting_run(tmp_path, what: str, when: str) -> tuple[int, str]:
    """A two-job sweep during which ``what`` (parent, experiment) is deleted, as in the MLflow UI:
    ``when`` = mid (before the second job adds its run) or end (after the last job)."""
    prelude = textwrap.dedent(f"""
        import os
        import mlflow
        import experiments.runner.job as job
        real, jobs = job.run_job, []

        def delete():
            client = mlflow.MlflowClient(os.environ["TCA_TRACKING_URI"])
            parent = os.environ["TCA_PARENT_RUN_ID"]
            if {what!r} == "parent":
                client.delete_run(parent)
            else:
                client.delete_experiment(client.get_run(parent).info.experiment_id)

        def run_job(cfg):
            jobs.append(1)
            if {when!r} == "mid" and len(jobs) == 2:
                delete()
            out = real(cfg)
            if {when!r} == "end" and len(jobs) == 2:
                delete()
            return out
        job.run_job = run_job
    """)
    db = store_at(tmp_path / "mlflow.db")
    return run_cli(tmp_path, "-m", "precision=int4,int8", "ktile=64", f"tracking.uri=sqlite:///{db}",
                   f"tracking.experiment={EXPERIMENT}", f"hydra.sweep.dir={tmp_path}/out", prelude=prelude)


@pytest.mark.parametrize("what, when", [("parent", "mid"), ("parent", "end"), ("experiment", "mid"),
                                        ("experiment", "end")])
def test_parent_or_experiment_deleted_mid_sweep_is_restored(tmp_path, what, when):
    """The parent deleted in the UI mid-sweep: the sweep ended normally with a link to the deleted run
    and its children stayed orphaned. Now it is restored when a job adds a run or at the sweep's end,
    with a line saying so; every child is under the live parent, and the link leads to it."""
    rc, out = _deleting_run(tmp_path, what, when)
    assert rc == 0 and "Traceback" not in out, out
    pid = assert_one_live_sweep(tmp_path / "mlflow.db", 2)
    _, exp, _, _ = runs_in(tmp_path / "mlflow.db")
    said = (f"Parent run {pid} of this sweep was deleted while the sweep ran: restored it" if what == "parent"
            else f"Experiment '{EXPERIMENT}' (id {exp.experiment_id}) was deleted while this sweep ran: restored it")
    assert out.count(said) == 1, out
    assert f"Parent run {pid}: 2 static." in out
    assert f"#/experiments/{exp.experiment_id}/runs?viewStateShareKey={pid}" in out


def test_a_job_process_restores_an_experiment_deleted_mid_sweep(tmp_path, capsys):
    """A job process of a parallel launcher opens the store after the experiment was deleted: it
    restores it (with the sweep's parent) instead of failing; the sweep's start still refuses it."""
    tr = Tracker(resolve_uri(f"sqlite:///{tmp_path}/m.db"), "e")
    parent = tr.start("sweep", {}, {"kind": "sweep"})
    tr.client.delete_experiment(tr.experiment_id)
    with pytest.raises(StoreError, match="was deleted. Restore it"):
        Tracker(tr.uri, "e")
    job = Tracker(tr.uri, "e", restore=True)
    child = job.start("child", {}, {}, parent)
    assert tr.client.get_experiment(tr.experiment_id).lifecycle_stage == "active"
    for rid in (parent, child):
        assert tr.client.get_run(rid).info.lifecycle_stage == "active"
    assert tr.client.get_run(child).data.tags["mlflow.parentRunId"] == parent
    assert capsys.readouterr().out.count("was deleted while this sweep ran: restored it") == 1


# -- every character of the store's path reaches the jobs; stores that cannot hold a sweep ---------

@pytest.mark.parametrize("text", ["/tmp/a\\b/s.db", "tail\\", "a\\'b", "q'u\"o", "$HOME ${x} \\${y}", "a b=c,d",
                                  "sqlite:////t r\\\\'\"$=,{}[]()#"])
def test_the_hand_off_to_jobs_keeps_every_character(text):
    """The store's URI went to the jobs with each backslash doubled (a\\b became a\\\\b): the jobs
    opened another store and failed with "Run ... not found". Hydra's grammar and OmegaConf now read
    the handed value back unchanged, whatever it holds."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from experiments.runner.sweep import _quoted
    override = OverridesParser.create().parse_override(f"++hydra.job.env_set.K={_quoted(text)}")
    assert OmegaConf.create({"k": override.value()}).k == text


def test_a_backslash_in_the_store_path_keeps_one_store(tmp_path):
    """python run.py -m ... 'tracking.uri="sqlite:////PATH/a\\b/s.db"' made the parent in a\\b and the
    job looked for it in a\\\\b: two stores, two tracebacks. Now one store holds the whole sweep."""
    db = tmp_path / "a\\b $x=1,y" / "s.db"
    rc, out = run_cli(tmp_path, "-m", "precision=int8", "ktile=32", f'tracking.uri="sqlite:///{db}"',
                      f"tracking.experiment={EXPERIMENT}", f"hydra.sweep.dir={tmp_path}/out")
    assert rc == 0 and "Traceback" not in out, out
    assert sorted(tmp_path.rglob("*.db")) == [db]
    assert_one_live_sweep(db, 1)


@pytest.mark.parametrize("uri, folder", [("sqlite:////proc/x.db", "/proc"), ("sqlite:////sys/x.db", "/sys"),
                                         ("sqlite:////proc/sub/x.db", "/proc")])
def test_a_store_on_a_pseudo_file_system_is_refused(uri, folder):
    """/proc hung for minutes (past tracking.wait) and /sys ended in "PermissionError ... x.db.lock":
    the superuser passes every permission check there. A folder counts as writable only where a file
    can be made in it."""
    with pytest.raises(StoreError, match=f"cannot be written: {folder} is read-only .* give a writable place"):
        resolve_uri(uri)


def test_a_store_on_procfs_stops_the_command_at_once(tmp_path):
    rc, out = run_cli(tmp_path, "precision=int8", "ktile=32", "tracking.uri=sqlite:////proc/x.db",
                      f"hydra.run.dir={tmp_path}/out", timeout=120)
    assert rc == 1 and "Traceback" not in out, out
    assert "Store error: the store /proc/x.db cannot be written: /proc is read-only" in out, out
    assert "Tracking" not in out and not (tmp_path / "out").exists()


@pytest.mark.parametrize("uri", ["sqlite:///:memory:", "sqlite:///", "sqlite:///:memory:?cache=shared"])
def test_an_in_memory_store_is_refused_with_a_file_to_use(tmp_path, uri):
    """sqlite:///:memory: made the files ':memory:', ':memory:.lock' and artifacts/ in the project
    folder; an in-memory store neither outlives the command nor reaches the jobs."""
    with pytest.raises(StoreError, match=f"in-memory SQLite store, .* give a file, e.g. sqlite:///{tmp_path}/mlflow.db"):
        resolve_uri(uri, base=tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, message", [
    (["tracking.wait=-1"], "tracking.wait=-1 is out of range; valid: 0 ... 2147483 seconds"),
    (["tracking.wait=abc"], "tracking.wait=abc is not a number ('tracking.wait=abc'); valid: 0 ... 2147483 "
                            "seconds"),
    (["tracking.stale_after_s=abc"], "tracking.stale_after_s=abc is not a number ('tracking.stale_after_s=abc'); "
                                     "valid: more than 0 seconds, finite"),
    (["-m", "tracking.wait=5,-2"], "Cannot sweep tracking.wait (tracking.wait=5,-2): the wait for the store's "
                                   "write lock is set once for the whole sweep. Run one sweep per value instead: "
                                   "python run.py -m tracking.wait=5, then the next value."),
    (["tracking.experiment=''"], "tracking.experiment is empty; give a name, e.g. tracking.experiment=ablation"),
    (["-m", "precision=int8", "tracking.rerun=true,false"],
     "Cannot sweep tracking.rerun (tracking.rerun=true,false): whether finished runs are measured again is set "
     "once for the whole sweep. Run one sweep per value instead: python run.py -m precision=int8 "
     "tracking.rerun=true, then the next value."),
    (["-m", "precision=int8", "tracking.wait=1,2"],
     "Cannot sweep tracking.wait (tracking.wait=1,2): the wait for the store's write lock is set once"),
    (["-m", "precision=int8", "tracking.stale_after_s=60,120"],       # exit 1, the reason of the store's keys
     "Cannot sweep tracking.stale_after_s (tracking.stale_after_s=60,120): how long a RUNNING run may go "
     "without a heartbeat before it is redone is set once for the whole sweep."),
])
def test_invalid_tracking_settings_stop_before_any_work(tmp_path, run_checks, args, message):
    """tracking.wait=-1 was taken ("holding a write transaction for -1 s"), tracking.wait=abc gave Hydra's
    two-line merge error, an empty experiment an MlflowException, and a sweep over tracking.rerun or
    tracking.wait the reason of the store's keys with exit 1: now one line each, exit 2."""
    rc, out = run_checks(tmp_path, *args)
    assert rc == 2 and message in out and len(out.strip().splitlines()) == 1, out
    assert list(tmp_path.iterdir()) == []


def test_hydra_values_the_same_in_every_job_resolve_at_the_start(tmp_path):
    """tracking.uri=sqlite:///${hydra:runtime.cwd}/x.db and tracking.experiment=e-${hydra:job.name}
    ended in "HydraConfig was not set" (exit 1): the sweep's start resolves them from its config."""
    rc, out = run_cli(tmp_path, "-m", "precision=int8", "ktile=32", "tracking.uri=sqlite:///${hydra:runtime.cwd}/x.db",
                      "tracking.experiment=e-${hydra:job.name}", f"hydra.sweep.dir={tmp_path}/out")
    assert rc == 0 and "Traceback" not in out, out
    assert f"Tracking 1 job(s) in sqlite:///{tmp_path}/x.db" in out, out
    assert sorted(tmp_path.rglob("*.db")) == [tmp_path / "x.db"]
    assert_one_live_sweep(tmp_path / "x.db", 1, experiment="e-run")
