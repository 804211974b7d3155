"""A search over a family's declared space (``hydra/sweeper=search``, experiments.runner.search) without a
GPU: invalid points rejected before any work and not counted, the budget, resume after an interruption
(no run twice, the trial count goes on), reuse of what the store holds, an all-invalid space refused, the
objective from a trial's runs; and tools/search_replay.py on a synthetic table.

Without a GPU a run has no throughput: the searches here minimise ptxas' registers (static runs log them),
through the same loop and the same store as a search on throughput.
"""
import csv
import itertools
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_cli import ROOT, all_runs, run_cli, store_args

optuna = pytest.importorskip("optuna")
pytestmark = pytest.mark.usefixtures("need_ptxas")

# 4 points; bn=256 with 8 stages needs more shared memory than a block has: 3 valid
SPACE = ["hydra/sweeper=search", "family=wgmma", "precision=fp16", "backend=static", "family.bn=256,64",
         "family.stages=2,8", "hydra.sweeper.objective.metric=registers",
         "hydra.sweeper.objective.direction=minimize"]
# run.py's Ctrl-C path, taken inside the first job that starts a run (after its claim)
KILL_IN_FIRST_NEW_RUN = """
import os, signal
import experiments.runner.job as job
_log = job._log_kernel_artifacts
def _killed(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    return _log(*args, **kwargs)
job._log_kernel_artifacts = _killed
"""


def _trials(tmp) -> list:
    """The trials of the one study in ``tmp``/search.db (beside the store)."""
    storage = f"sqlite:///{tmp}/search.db"
    (summary,) = optuna.get_all_study_summaries(storage)
    return optuna.load_study(study_name=summary.study_name, storage=storage).get_trials(deepcopy=False)


def _outcomes(trials) -> list:
    return sorted(t.user_attrs.get("outcome", t.state.name) for t in trials)


def _point(run) -> tuple:
    return run.data.params["family.bn"], run.data.params["family.stages"]


def test_search_rejects_the_invalid_point_and_stops_when_the_space_is_tried(tmp_path):
    """A budget above the space: every valid point runs once, the invalid one (256, 8) never reaches the
    runner and is not counted; the search stops, saying why, and records its best on the parent."""
    rc, out = run_cli(tmp_path, "-m", *SPACE, "hydra.sweeper.trials=10", *store_args(tmp_path))
    assert rc == 0 and "Traceback" not in out, out
    assert "Search stopped: every point of the space (4) was tried, 3 ran." in out
    trials = _trials(tmp_path)
    assert _outcomes(t for t in trials if t.user_attrs["outcome"] != "duplicate") == [
        "invalid", "measured", "measured", "measured"]
    (invalid,) = [t for t in trials if t.user_attrs["outcome"] == "invalid"]
    assert invalid.state.name == "PRUNED" and "stages=8 needs" in invalid.user_attrs["reason"]
    assert (invalid.params["family.bn"], invalid.params["family.stages"]) == ("256", "8")
    parents, children = all_runs(tmp_path)
    assert sorted(_point(r) for r in children) == [("256", "2"), ("64", "2"), ("64", "8")]
    assert {r.data.tags["outcome"] for r in children} == {"static"}
    fewest = min(r.data.metrics["registers"] for r in children)
    (parent,) = parents
    assert parent.data.tags["search_trials"] == "3" and parent.data.tags["search_invalid_points"] == "1"
    (best,) = [r for r in children if r.info.run_id == parent.data.tags["search_best_runs"]]
    assert best.data.metrics["registers"] == fewest
    assert parent.data.tags["search_best"].startswith(f"registers {fewest:g}: family.bn={_point(best)[0]} ")


def test_an_interrupted_search_resumes_without_running_a_point_twice(tmp_path):
    """The trial budget covers both commands; the store already holds one point (a plain sweep measured it):
    the search reuses that run. SIGTERM in the first trial that starts a run: exit 143, that trial left
    RUNNING; the same command runs it again first (its killed run stays KILLED, a new one finishes), and no
    point has two finished runs."""
    store = store_args(tmp_path)
    rc, out = run_cli(tmp_path, "-m", *SPACE[1:4], "family.bn=64", "family.stages=2", *store)
    assert rc == 0, out
    rc, out = run_cli(tmp_path, "-m", *SPACE, "hydra.sweeper.trials=3", *store, prelude=KILL_IN_FIRST_NEW_RUN)
    assert rc == 143 and "Interrupted:" in out, out
    assert [t.state.name for t in _trials(tmp_path)].count("RUNNING") == 1
    rc, out = run_cli(tmp_path, "-m", *SPACE, "hydra.sweeper.trials=3", *store)
    assert rc == 0 and "Traceback" not in out, out
    assert ", 1 interrupted one(s) run again." in out
    trials = _trials(tmp_path)
    assert _outcomes(t for t in trials if t.user_attrs["outcome"] in ("measured", "interrupted")) == [
        "interrupted", "measured", "measured", "measured"]
    parents, children = all_runs(tmp_path)
    finished = [r for r in children if r.info.status == "FINISHED"]
    assert sorted(_point(r) for r in finished) == [("256", "2"), ("64", "2"), ("64", "8")]
    assert len({r.data.tags["run_key"] for r in finished}) == 3
    assert [r.info.status for r in children if r.info.status != "FINISHED"] == ["KILLED"]
    search = next(p for p in parents if "search_trials" in p.data.tags)
    assert search.data.tags["search_trials"] == "3"
    (reused,) = [r for r in finished if _point(r) == ("64", "2")]
    assert reused.data.tags[f"in_sweep.{search.info.run_id}"] == "reused"
    measured = {t.user_attrs["runs"]: t.value for t in trials if t.user_attrs["outcome"] == "measured"}
    assert measured[reused.info.run_id] == reused.data.metrics["registers"]


def test_the_trial_budget_counts_runs_not_proposals(tmp_path):
    """trials=1: one job, one run, whatever the sampler proposed before it; the mma_sync preset's space
    (a config group, tile, among its keys) composes per point."""
    rc, out = run_cli(tmp_path, "-m", "experiment=search_mma_sync", "backend=static", "hydra.sweeper.trials=1",
                      "hydra.sweeper.objective.metric=registers", *store_args(tmp_path))
    assert rc == 0 and "Traceback" not in out, out
    assert "Search: 262144 points (ktile 4 x mma 4 x tile 8 x " in out
    assert "[1/1] " in out and "[2/" not in out
    parents, children = all_runs(tmp_path)
    assert len(children) == 1 and children[0].data.tags["outcome"] == "static"
    assert [t.user_attrs["outcome"] for t in _trials(tmp_path)].count("measured") == 1


def test_a_trial_whose_run_fails_is_a_failed_trial_with_its_reason(tmp_path):
    """ptxas rejects every mma_sync kernel of PTX ISA 9.9: each trial is FAILED with the run's error and
    counted; the search goes on to its budget and the command exits 1 as any sweep with a failed run."""
    rc, out = run_cli(tmp_path, "-m", "hydra/sweeper=search", "precision=int8", "backend=static",
                      "target.ptx_version=9.9", "ktile=32,64", "pipeline.stages=2,3", *SPACE[-2:],
                      "hydra.sweeper.trials=2", *store_args(tmp_path))
    assert rc == 1 and "Traceback" not in out, out
    assert "Search: 2 trial(s), " in out and "none measured registers." in out
    failed = [t for t in _trials(tmp_path) if t.user_attrs["outcome"] == "failed"]
    assert len(failed) == 2 and {t.state.name for t in failed} == {"FAIL"}
    parents, children = all_runs(tmp_path)
    assert sorted(t.user_attrs["runs"] for t in failed) == sorted(r.info.run_id for r in children)
    for t in failed:
        assert t.user_attrs["reason"].startswith(f"run {t.user_attrs['runs']} (")
        assert "Unsupported .version 9.9" in t.user_attrs["reason"]
    assert [p.info.status for p in parents] == ["FAILED"]


@pytest.mark.parametrize("args, message", [
    (["target.arch=sm_80", "hydra.sweeper.objective.metric=registers"],
     "The search space (family.bn 2 x family.stages 2) has no valid point for this target: every one of its 4 "
     "points is invalid: 4 x family=wgmma needs target.arch=sm_90a"),
    (["hydra.sweeper.objective.metric=throughput"],
     "hydra.sweeper.objective.metric=throughput is measured on a GPU, and this search has none"),
    (["hydra.sweeper.objective.metric=speed"], "hydra.sweeper.objective.metric=speed is no metric a run logs"),
    (["hydra.sweeper.objective.metric=registers", "family.group=interval(8,32)"],
     "'family.group=interval(8,32)': a search takes the values of each key"),
    (["hydra.sweeper.objective.metric=registers", "family.group=8,99"],
     "The search space: family.group=99 is not valid for family=wgmma ('family.group=99'); valid: 8, 16, 32"),
    (["hydra.sweeper.objective.metric=registers", "hydra.sweeper.sampler=grid"],
     "hydra.sweeper.sampler=grid is not valid; valid: tpe, random"),
    (["hydra.sweeper.objective.metric=throughput"], "Run it on a GPU, or search on a resource: "
     "hydra.sweeper.objective.metric=registers hydra.sweeper.objective.direction=minimize (without a GPU: "),
    (["hydra.sweeper.objective.metric=regs"], "regs is no metric a run logs (experiments/metrics.py declares "
     "them); e.g. without a GPU: smem_static_bytes, registers, spill_stores_bytes, "),
    *[([*SPACE[-2:], f"hydra.sweeper.{key}={value}"], f"hydra.sweeper.{key}={value} is not valid; valid: {valid}")
      for key, values, valid in [("trials", ["abc", 0, -3, 2.5], "a positive integer (trials that run a job), or null"),
                                 ("minutes", ["abc", 0, -1], "a positive number of minutes, or null"),
                                 ("seed", ["abc", -1], "an integer, 0 or more"),
                                 ("max_rejects", [0], "a positive integer")] for value in values],
    ([*SPACE[-2:], "hydra.sweeper.trials=null"], "The search has no budget (hydra.sweeper.trials=null, "
     "hydra.sweeper.minutes unset): give hydra.sweeper.trials or hydra.sweeper.minutes"),
    ([*SPACE[-2:], "hydra.sweeper.storage=bogus://x"], "hydra.sweeper.storage=bogus://x is no database URL "
     "SQLAlchemy can open (Can't load plugin: sqlalchemy.dialects:bogus); valid: null"),
    ([*SPACE[-2:], "family.group=range(5,2)"], "'family.group=range(5,2)' has no values (an empty range or "
     "choice): give at least one"),
    ([*SPACE[-2:], "family.group=axis"], "family.group=axis is not an integer ('family.group=axis'); valid: "
     "8, 16, 32; axis (every value the family declares) is a search's, in its space: "
     "'hydra.sweeper.params={family.group: axis}' with hydra/sweeper=search"),
])
def test_a_search_that_cannot_start_says_why_before_any_work(tmp_path, run_checks, args, message):
    rc, out = run_checks(tmp_path, "-m", *SPACE[:-2], *args, *store_args(tmp_path, new_store=True))
    assert rc == 2 and message in out, out
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "search.db").exists()


def test_a_preset_searches_every_value_the_family_declares(tmp_path, run_checks):
    """experiment=search_wgmma: ``axis`` is each option's declared values (Family.declared); on sm_80 the
    whole space (48384 points) is tried and refused."""
    rc, out = run_checks(tmp_path, "-m", "experiment=search_wgmma", "backend=static", "target.arch=sm_80",
                         "hydra.sweeper.objective.metric=registers", *store_args(tmp_path, new_store=True))
    assert rc == 2, out
    assert ("(family.bn 4 x family.consumers 2 x family.producer 2 x family.stages 7 x family.swizzle 3 x "
            "family.persistent 2 x family.order 2 x family.group 3 x family.epilogue 2 x family.cluster 3 x "
            "family.schedule 2) has no valid point for this target: every one of its 48384 points") in out


def _run(status="FINISHED", metrics=None, **tags):
    return SimpleNamespace(info=SimpleNamespace(run_id="r1", run_name="8192 wgmma fp16", status=status),
                           data=SimpleNamespace(tags=tags, metrics=metrics or {}))


def test_the_objective_combines_the_sizes_and_names_a_failure():
    from experiments.runner.search import objective
    two = [_run(metrics={"throughput": 400.0}, outcome="verified"),
           _run(metrics={"throughput": 900.0}, outcome="verified")]
    assert objective(two, "throughput", "geomean") == (600.0, "measured", "")
    assert objective(two, "throughput", "min") == (400.0, "measured", "")
    wrong = _run("FAILED", outcome="failed", error="verification failed: 12 of 64 elements differ\nmore")
    assert objective([two[0], wrong], "throughput", "geomean") == (
        None, "failed", "run r1 (8192 wgmma fp16) failed: verification failed: 12 of 64 elements differ")
    assert objective([_run(outcome="skipped", skip_reason="cap 3 > 2")], "throughput", "mean") == (
        None, "invalid", "cap 3 > 2")
    assert objective([_run(outcome="static")], "throughput", "mean")[1:] == (
        "failed", "run r1 (8192 wgmma fp16, outcome static) has no metric throughput")
    assert objective([], "throughput", "mean")[1] == "failed"


def test_a_value_of_zero_needs_no_geometric_mean_for_one_size_and_names_the_fix_for_several():
    """One run (one size): its value as it is, 0 included; several with a 0 and combine=geomean: a failed
    trial that says to combine by the mean."""
    from experiments.runner.search import objective
    assert objective([_run(metrics={"spill_stores_bytes": 0.0})], "spill_stores_bytes", "geomean") == (
        0.0, "measured", "")
    runs = [_run(metrics={"spill_stores_bytes": v}) for v in (0.0, 8.0)]
    value, outcome, why = objective(runs, "spill_stores_bytes", "geomean")
    assert (value, outcome) == (None, "unusable")
    assert why.endswith("not defined; use hydra.sweeper.objective.combine=mean (or min, max)")
    assert objective(runs, "spill_stores_bytes", "mean") == (4.0, "measured", "")


def test_the_minutes_budget_counts_from_the_command_s_start(monkeypatch):
    from experiments.runner import search
    sweeper = search.SearchSweeper(trials=None, minutes=1)
    monkeypatch.setattr(search, "STARTED", time.time() - 61)
    assert sweeper._spent(0)
    monkeypatch.setattr(search, "STARTED", time.time() - 50)
    assert not sweeper._spent(10**6)
    assert search.SearchSweeper(trials=3)._spent(3) and not search.SearchSweeper(trials=3)._spent(2)


def test_a_resumed_search_runs_again_the_trials_of_ended_commands_only():
    """A trial RUNNING in a command that has ended is run again; one a live command (here, this process)
    is measuring stays its own: two commands may search one study at once."""
    import socket
    import subprocess

    from experiments.runner import search
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    study = optuna.create_study()
    dist = {"family.bn": optuna.distributions.CategoricalDistribution(("256", "64"))}
    for owner, bn in ((f"{socket.gethostname()}:{ended.pid}", "64"), (search.OWNER, "256")):
        study.enqueue_trial({"family.bn": bn})
        study.ask(dist).set_user_attr("owner", owner)
    assert search._recover(study) == 1
    assert [(t.state.name, t.user_attrs.get("outcome")) for t in study.trials] == [
        ("FAIL", "interrupted"), ("RUNNING", None), ("WAITING", None)]
    assert study.ask(dist).params == {"family.bn": "64"}           # the interrupted point first


def _synthetic(path: Path) -> None:
    """An exhaustive table of a made-up subspace: 96 of its 120 points valid, 8 of them failed, one best."""
    rng = random.Random(1)
    rows = []
    for bn, stages, swizzle, consumers in itertools.product((256, 192, 128, 64), (2, 3, 4, 5, 6), (128, 64, 32),
                                                            (2, 1)):
        if bn >= 192 and stages >= 5:
            continue
        v = 400 + bn / 4 + 30 * (stages == 4) + 20 * (swizzle == 128) + 15 * (consumers == 2) + rng.gauss(0, 5)
        rows.append({"family.bn": bn, "family.stages": stages, "family.swizzle": swizzle,
                     "family.consumers": consumers, "throughput": "" if rng.random() < 0.08 else f"{v:.2f}",
                     "replicate_spread": "0.01"})
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def test_the_replay_tool_writes_its_table_from_a_synthetic_subspace(tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    import search_replay
    table, out = tmp_path / "runs.csv", tmp_path / "search.md"
    _synthetic(table)
    assert search_replay.main([str(table), "--seeds", "3", "--out", str(out)]) == 0
    text = out.read_text()
    assert "Subspace: family.bn 4 x family.stages 5 x family.swizzle 3 x family.consumers 2 = 120 points, " \
           "96 in the table (" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [r.split(" | ")[0] for r in rows] == ["| 0", "| 1", "| 2"]
    needed = sorted(int(r.split(" | ")[1]) for r in rows)
    share = needed[1] / 96
    assert f"Median seed: {needed[1]} trials = {share:.1%} of the 96 valid points" in text
    assert ("met)." if share <= 0.15 else "not met).") in text
    assert search_replay.main([str(table), "--value", "tflops"]) == 2


def test_a_search_preset_without_m_gives_the_command(tmp_path, run_checks):
    rc, out = run_checks(tmp_path, "experiment=search_wgmma", "precision=bf16")
    assert rc == 2, out
    assert ("experiment=search_wgmma is a search (hydra/sweeper=search) over family.bn, family.consumers, "
            "family.producer, ") in out
    assert out.strip().endswith("nothing was run. Run it: python run.py -m experiment=search_wgmma precision=bf16")


def test_searches_with_different_objectives_have_their_own_parent_and_command(tmp_path):
    """The objective is part of a search's identity: a second objective in the same store makes another
    parent (its own study and tags), whose command keeps the sweeper's overrides; the first parent's
    description ends with its result."""
    store = store_args(tmp_path)
    rc, out = run_cli(tmp_path, "-m", *SPACE, "hydra.sweeper.trials=2", *store)
    assert rc == 0 and "continuing parent run" not in out, out
    rc, out = run_cli(tmp_path, "-m", *SPACE[:-2], "hydra.sweeper.objective.metric=spill_stores_bytes",
                      "hydra.sweeper.objective.direction=minimize", "hydra.sweeper.trials=1", *store)
    assert rc == 0 and "continuing parent run" not in out, out
    parents, _ = all_runs(tmp_path)
    by_metric = {p.data.tags["search_study"].split()[1]: p for p in parents}
    assert sorted(by_metric) == ["registers", "spill_stores_bytes"]
    registers, spills = by_metric["registers"].data.tags, by_metric["spill_stores_bytes"].data.tags
    assert registers["search_best"].startswith("registers ")
    assert spills["search_best"].startswith("spill_stores_bytes 0: ")
    assert spills["overrides"].startswith("hydra/sweeper=search hydra.sweeper.objective.metric=spill_stores_bytes "
                                          "hydra.sweeper.objective.direction=minimize hydra.sweeper.trials=1 ")
    assert registers["mlflow.note.content"].endswith(f"\n\nSearch result: best {registers['search_best']}.")


def test_help_with_the_search_lists_its_options(tmp_path):
    """--help with hydra/sweeper=search lists every hydra.sweeper.* key with its default and meaning; the plain
    --help says how to see them."""
    rc, out = run_cli(tmp_path, "hydra/sweeper=search", "--help")
    assert rc == 0, out
    for line in ["  hydra.sweeper.trials=50  (budget: trials that ran a job", "  hydra.sweeper.minutes=null  (",
                 "  hydra.sweeper.seed=0  (the sampler's seed", "  hydra.sweeper.objective.metric=throughput  (",
                 "  hydra.sweeper.objective.combine=geomean  (", "  hydra.sweeper.storage=null  (Optuna storage URL",
                 "  hydra.sweeper.params=null  (the space: {key: ", "  hydra.sweeper.max_rejects=2000  ("]:
        assert line in out, out
    rc, out = run_cli(tmp_path, "--help")
    assert rc == 0 and "(python run.py hydra/sweeper=search --help lists the search's options)" in out, out


def test_a_geometric_mean_of_zeros_stops_the_search_at_its_first_trial_with_the_fix(tmp_path):
    """Two sizes whose spill_stores_bytes is 0: the first trial cannot form the objective; the search stops
    there, the parent records why (search_error) and the command exits 2 naming the combine to use. (A static
    run holds every size: two sizes are made by reading each trial's runs twice.)"""
    twice = ("import experiments.runner.search as search\n_objective = search.objective\n"
             "search.objective = lambda runs, metric, combine: _objective(runs * 2, metric, combine)\n")
    rc, out = run_cli(tmp_path, "-m", *SPACE[:-2], "hydra.sweeper.objective.metric=spill_stores_bytes",
                      "hydra.sweeper.objective.direction=minimize", "hydra.sweeper.trials=3", *store_args(tmp_path),
                      prelude=twice)
    assert rc == 2 and "Traceback" not in out, out
    assert ("The search stopped: the objective cannot be formed: spill_stores_bytes is 0 in a run: the geometric "
            "mean over the sizes is not defined; use hydra.sweeper.objective.combine=mean (or min, max). Exit "
            "status 2.") in out
    assert [t.user_attrs["outcome"] for t in _trials(tmp_path) if t.user_attrs["outcome"] != "invalid"] == [
        "unusable"]
    parents, children = all_runs(tmp_path)
    (parent,) = parents
    assert parent.data.tags["search_error"].startswith("the objective cannot be formed: spill_stores_bytes is 0")
    assert len(children) == 1 and children[0].data.metrics["spill_stores_bytes"] == 0.0
