"""A measurement a sweep reuses (found FINISHED in the store) belongs to that sweep in every reader:
``track.sweep_runs``, the parent's summary, the UI's view of the sweep, ``experiments.report --sweep``,
the performance and generations tables, the profile step's selection and the analysis' table. Two
overlapping sweeps run here on a stated H200 with the GPU worker replaced (test_family_runner's
stub), and through run.py without a GPU (static and skipped runs). A sweep into another experiment
measures anew there. The ``gpu`` tests run two small overlapping sweeps on the GPU, and one sweep
twice (the second builds no kernel it measured but the first, while the GPU worker starts).
"""
import json
import time
from pathlib import Path

import pytest
from test_cli import empty_store_at, logging_ptxas, run_cli
from test_family_runner import _compose, _stub_gpu

from analysis.runs import load_runs
from experiments.reports import performance, report
from experiments.ncu import profile
from experiments.store import record, track
from experiments.runner.sweep import SweepCallback
from experiments.store.track import Tracker

EXPERIMENT = "reuse-tests"


def _sweep(job, monkeypatch, key: str, store: list, jobs: list, capsys) -> tuple[str, str]:
    """One sweep of ``jobs`` (lists of overrides) as run.py runs it: the sweep's identity handed to
    the jobs, each job run, then the parent closed with its summary (SweepCallback). Returns (parent
    run id, what the sweep printed)."""
    for name, val in (("key", key), ("name", f"sweep {key}"), ("jobs", str(len(jobs))), ("overrides", key)):
        monkeypatch.setenv(track.SWEEP_ENV[name], val)
    monkeypatch.delenv(track.SWEEP_ENV["parent"], raising=False)
    track._TRACKERS.clear()                     # a command of its own
    uri = store[0].split("=", 1)[1]
    experiment = store[1].split("=", 1)[1]
    cb = SweepCallback()
    cb.uri, cb.experiment, cb.key, cb.command, cb.t0 = uri, experiment, key, f"python run.py -m {key}", time.time()
    tr = track.get_tracker(uri, experiment)
    monkeypatch.setenv(track.SWEEP_ENV["parent"], tr.parent({"key": key, "name": f"sweep {key}",
                                                               "jobs": str(len(jobs)), "overrides": key}))
    capsys.readouterr()
    for overrides in jobs:
        job.run_job(_compose(*overrides, *store))
    cb._close()
    return tr.find_parent(key), capsys.readouterr().out


FIRST = [["family=mma_sync", "precision=fp16", "problem.sizes=[512,1024]"],
         ["family=cublas", "precision=fp16", "problem.sizes=[512,1024]"],
         ["family=wgmma", "precision=fp16", "problem.sizes=[512]"]]
# the second sweep asks for all of the first's measurements and one more (wgmma at 1024)
SECOND = FIRST[:2] + [["family=wgmma", "precision=fp16", "problem.sizes=[512,1024]"]]


def test_a_sweep_owns_what_it_reused_in_every_reader(tmp_path, monkeypatch, capsys, need_ptxas):
    job, store, worker = _stub_gpu(tmp_path, monkeypatch, 100.0)
    store[1] = f"tracking.experiment={EXPERIMENT}"
    wrapper, log = logging_ptxas(tmp_path)      # each kernel ptxas assembles: its entry, once per build
    monkeypatch.setenv("PTXAS", str(wrapper))
    first, out1 = _sweep(job, monkeypatch, "first", store, FIRST, capsys)
    assert f"Parent run {first}: 5 verified." in out1 and len(worker.calls) == 5
    assert sum("-arch=sm_90" in line for line in log.read_text().splitlines()) == 2     # mma_sync, wgmma
    log.write_text("")
    tr = Tracker(store[0].split("=", 1)[1], EXPERIMENT)
    mine = {r.info.run_id for r in tr.sweep_runs(first)}
    assert len(mine) == 5

    worker.us = 50.0
    second, out2 = _sweep(job, monkeypatch, "second", store, SECOND, capsys)
    assert len(worker.calls) == 6                                   # one measurement more, not 11
    # only the kernel with a size to measure is built again: wgmma (1024); mma_sync's two are measured
    assert [line.split()[0] for line in log.read_text().splitlines() if "-arch=" in line] == ["-arch=sm_90a"]
    assert out2.count("already measured") == 5 and out2.count(", reused by this sweep);") == 5
    runs = {r.info.run_id: r for r in tr.sweep_runs(second)}
    new = set(runs) - mine
    assert len(runs) == 6 and mine < set(runs) and len(new) == 1    # 5 reused + 1 measured
    assert {r.data.tags[f"in_sweep.{second}"] for r in runs.values() if r.info.run_id in mine} == {"reused"}
    (made,) = new
    assert runs[made].data.tags["mlflow.parentRunId"] == second and runs[made].data.tags[f"in_sweep.{second}"] == "new"
    assert all(runs[r].data.tags["mlflow.parentRunId"] == first for r in mine)     # never moved
    # the parent's summary counts them
    assert f"Parent run {second}: 6 verified; 5 of them reused." in out2 and "Nothing new" not in out2
    p = tr.client.get_run(second)
    assert p.data.tags["runs"] == "6 verified; 5 of them reused" and p.data.metrics["runs_reused"] == 5
    note = p.data.tags["mlflow.note.content"]
    assert "6 verified; 5 of them reused (measured by an earlier sweep)." in note
    best = [line.split() for line in note.splitlines() if line.startswith("fp16 ")]
    assert len(best) == 2 and best[0][1] == "512" and best[0][2].startswith("gemm_fp16_") and best[0][3] == "(reused)"
    assert best[1][1] == "1024" and best[1][2].startswith("wgmma_fp16_") and "(reused)" not in best[1]
    assert [a.path for a in tr.client.list_artifacts(second)] == [record.ARTIFACTS["figure"]]
    # the UI's view of the sweep: the filter it stores finds the same runs
    view = json.loads(tr.client.get_experiment(tr.experiment_id).tags[f"mlflow.sharedViewState.{second}"])
    assert {r.info.run_id for r in tr.client.search_runs([tr.experiment_id], view["searchFilter"])} == set(runs)
    # experiments.reports.report for that sweep
    table = report.results_table(tr.uri, EXPERIMENT, second)
    rows = [line for line in table.splitlines() if line.startswith("| NVIDIA H200")]
    assert len(rows) == 6 and sum(line.endswith("| verified, reused |") for line in rows) == 5
    assert f"; sweep {second}" in table.splitlines()[0]
    assert report.main(["--uri", tr.uri, "--experiment", EXPERIMENT, "--sweep", "latest", "--by-family"]) == 0
    fams = capsys.readouterr().out
    assert "| fp16 | 1024x1024x1024 | cublas | cublas_fp16 (reused) |" in fams
    assert "| fp16 | 1024x1024x1024 | wgmma |" in fams and "(reused)" not in fams.split("| wgmma |")[2].split("\n")[0]
    # the generations table of the second sweep: mma.sync and cuBLAS at both sizes, not "-"
    gens = performance.generations(tr.uri, EXPERIMENT, second).splitlines()
    assert gens[0] == (f"Two generations on one GPU: sweep {second} (5 of its 6 verified runs reused from "
                       f"earlier sweeps); store: {tr.uri}")
    thr = lambda n, us: f"{round(2 * n ** 3 / us / 1e6, 2):.1f} TFLOP/s"  # noqa: E731 - as the runner rounds
    assert gens[4].startswith(f"| fp16 | 512 | {thr(512, 100)} | {thr(512, 100)} | {thr(512, 100)} |")
    assert gens[5].startswith(f"| fp16 | 1024 | {thr(1024, 100)} | {thr(1024, 50)} | {thr(1024, 100)} |")
    # the performance check of the second sweep: ours and cuBLAS at both sizes, ours marked reused
    check = [line for line in performance.check(tr.uri, EXPERIMENT, second).markdown.splitlines()
             if line.startswith("| fp16 | ")][:2]
    for line, n in zip(check, (512, 1024), strict=True):
        assert line.startswith(f"| fp16 | {n}x{n}x{n} | {thr(n, 100)} | gemm_fp16_"), line
        assert line.split(" | ")[3].endswith(" (reused)") and line.split(" | ")[4] == thr(n, 100), line
    # the analysis' tidy table of the sweep
    df = load_runs(tr.uri, EXPERIMENT, sweep=second)
    assert set(df["run_id"]) == set(runs) and df["reused"].sum() == 5
    assert set(df.loc[df["reused"], "run_id"]) == mine
    # the profile step's selection of the sweep
    selected, what = profile.select_runs(tr.client, tr.experiment_id, second, None)
    assert {r.info.run_id for r in selected} == set(runs) and what == f"the runs of sweep {second}"
    # the first sweep is as it was
    assert {r.info.run_id for r in tr.sweep_runs(first)} == mine
    assert set(load_runs(tr.uri, EXPERIMENT, sweep=first)["run_id"]) == mine

    # the same sweep again: nothing new, nothing counted twice
    again, out3 = _sweep(job, monkeypatch, "second", store, SECOND, capsys)
    assert again == second and len(worker.calls) == 6
    assert "Nothing new was tracked" in out3
    assert {r.info.run_id for r in tr.sweep_runs(second)} == set(runs)
    p = tr.client.get_run(second)
    assert p.data.tags["runs"] == "6 verified; 5 of them reused" and p.data.metrics["runs_reused"] == 5

    # a sweep of another preset that asks only for measured kernels: all reused, the parent kept
    third, out4 = _sweep(job, monkeypatch, "third", store, FIRST[1:2], capsys)
    assert f"Parent run {third}: 2 verified; 2 of them reused." in out4 and len(worker.calls) == 6
    assert tr.client.get_run(third).info.lifecycle_stage == "active"
    cublas = {r.info.run_id for r in tr.sweep_runs(third)}
    assert len(cublas) == 2 and cublas < mine

    # a sweep into another experiment measures anew there: its runs are its own
    store[1] = "tracking.experiment=reuse-other"
    other, out5 = _sweep(job, monkeypatch, "fourth", store, FIRST[1:2], capsys)
    assert f"Parent run {other}: 2 verified." in out5 and len(worker.calls) == 8
    theirs = Tracker(tr.uri, "reuse-other").sweep_runs(other)
    assert len(theirs) == 2 and not {r.info.run_id for r in theirs} & mine
    assert all(r.data.tags["mlflow.parentRunId"] == other for r in theirs)
    assert not any(f"in_sweep.{other}" in tr.client.get_run(r).data.tags for r in mine)


def _cli_store(tmp, experiment=EXPERIMENT):
    return [f"tracking.uri={empty_store_at(f'{tmp}/mlflow.db')}", f"tracking.experiment={experiment}",
            f"hydra.sweep.dir={tmp}/out"]


def test_static_and_skipped_runs_reused_by_another_sweep(tmp_path, need_ptxas):
    """Without a GPU, run.py: a second sweep that asks for a static run and a skipped combination
    the first one tracked links them (and says so) instead of leaving them out; run again, it counts
    nothing twice."""
    rc, out = run_cli(tmp_path, "-m", "family=cublas", "precision=int8,fp8_e4m3", "target.arch=sm_80",
                      *_cli_store(tmp_path))
    assert rc == 0, out
    tr = Tracker(f"sqlite:///{tmp_path}/mlflow.db", EXPERIMENT, create=False)
    [first] = [r.info.run_id for r in tr.client.search_runs([tr.experiment_id], "tags.kind = 'sweep'")]
    done = {r.data.tags["outcome"]: r.info.run_id for r in tr.sweep_runs(first)}
    assert sorted(done) == ["skipped", "static"]
    rc, out = run_cli(tmp_path, "-m", "family=cublas", "precision=int8,fp8_e4m3,fp16", "target.arch=sm_80",
                      *_cli_store(tmp_path))
    assert rc == 0, out
    assert f"cublas_int8: already tracked (run {done['static']}, reused by this sweep)" in out
    assert (f"skipped family=cublas precision=fp8_e4m3 target.arch=sm_80: already recorded (run {done['skipped']}, "
            "reused by this sweep)") in out
    [second] = [r.info.run_id for r in tr.client.search_runs([tr.experiment_id], "tags.kind = 'sweep'")
                if r.info.run_id != first]
    assert f"Parent run {second}: 1 skipped, 2 static; 2 of them reused." in out
    runs = tr.sweep_runs(second)
    assert len(runs) == 3 and {done["static"], done["skipped"]} < {r.info.run_id for r in runs}
    assert record.reused_count(runs, second) == 2
    ids = {r.info.run_id for r in runs}
    assert {r.info.run_id for r in profile.select_runs(tr.client, tr.experiment_id, second, None)[0]} == ids
    df = load_runs(tr.uri, EXPERIMENT, sweep=second, backends=None)
    assert set(df["run_id"]) == ids and set(df.loc[df["reused"], "run_id"]) == set(done.values())
    rc, out = run_cli(tmp_path, "-m", "family=cublas", "precision=int8,fp8_e4m3,fp16", "target.arch=sm_80",
                      *_cli_store(tmp_path))
    assert rc == 0 and "Nothing new was tracked" in out and ", reused by this sweep" in out, out
    assert tr.client.get_run(second).data.tags["runs"] == "1 skipped, 2 static; 2 of them reused"
    assert len(tr.sweep_runs(second)) == 3


@pytest.mark.gpu
def test_a_second_gpu_sweep_reports_the_runs_it_reused(tmp_path, capsys):
    """On the GPU (sm_90: wgmma): two overlapping sweeps into one store, as experiment=h200_performance
    then experiment=generations do at full size; the generations table of the second sweep has the
    best mma.sync kernel and cuBLAS at each size from the runs it reused. The same as commands:

        python run.py -m family=mma_sync,cublas precision=fp16 'problem.sizes=[512,1024]' tracking.uri=U
        python run.py -m family=mma_sync,cublas,wgmma precision=fp16 'problem.sizes=[512,1024]' tracking.uri=U
        python -m experiments.performance --uri U --generations --sweep latest
    """
    import os
    import subprocess
    import sys

    from test_cli import ROOT

    from experiments.families.gpu import device_sm
    if device_sm() != 90:
        pytest.skip(f"wgmma needs an sm_90 GPU (sm_90a); this one is sm_{device_sm()}")
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "HYDRA_FULL_ERROR")}
    sizes = ["precision=fp16", "problem.sizes=[512,1024]", "timing.batches=3", "timing.min_batch_ms=2"]
    for families in ("mma_sync,cublas", "mma_sync,cublas,wgmma"):
        proc = subprocess.run([sys.executable, str(ROOT / "run.py"), "-m", f"family={families}", *sizes,
                               *_cli_store(tmp_path)], cwd=tmp_path, env=env, timeout=900, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.returncode == 0, proc.stdout
    assert proc.stdout.count(", reused by this sweep)") == 4 and "; 4 of them reused." in proc.stdout, proc.stdout
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    capsys.readouterr()
    assert performance.main(["--uri", uri, "--experiment", EXPERIMENT, "--generations", "--sweep", "latest"]) == 0
    lines = capsys.readouterr().out.splitlines()
    print("\n".join(lines))
    assert "(4 of its 6 verified runs reused from earlier sweeps)" in lines[0]
    rows = [line.split(" | ") for line in lines if line.startswith("| fp16 | ")][:2]
    assert [r[1] for r in rows] == ["512", "1024"]
    assert all(cell.endswith("TFLOP/s") for r in rows for cell in r[2:5]), rows   # mma.sync, wgmma, cuBLAS


@pytest.mark.gpu
def test_a_gpu_sweep_run_again_builds_no_kernel_it_measured(tmp_path, need_ptxas):
    """On the GPU, the same two-kernel sweep twice (one job process): run again, it measures nothing
    and ptxas assembles only the first job's kernel, while the GPU worker starts (the run keys need what
    the worker reports of the GPU); the second job's kernel is not built. ptxas is a wrapper that writes
    each command line it gets."""
    import os
    import subprocess
    import sys

    from test_cli import ROOT
    wrapper, log = logging_ptxas(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "HYDRA_FULL_ERROR")}
    env["PTXAS"] = str(wrapper)
    outs, built = [], []
    for _ in range(2):
        log.write_text("")
        proc = subprocess.run([sys.executable, str(ROOT / "run.py"), "-m", "precision=int8", "ktile=32,64",
                               "problem.sizes=[512]", "timing.batches=3", "timing.min_batch_ms=2",
                               *_cli_store(tmp_path)], cwd=tmp_path, env=env, timeout=900, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.returncode == 0, proc.stdout
        outs.append(proc.stdout)
        built.append([Path(line.split()[2]).name for line in log.read_text().splitlines() if "-arch=" in line])
    assert "Parent run" in outs[0] and ": 2 verified." in outs[0], outs[0]
    assert len(built[0]) == 2 and built[1] == built[0][:1], built
    assert outs[1].count("already measured") == 2 and "Nothing new was tracked" in outs[1], outs[1]


def test_runs_of_a_deleted_parent_are_measured_anew(tmp_path, monkeypatch, capsys, need_ptxas):
    """A sweep's parent deleted once it ended (``MlflowClient().delete_run(parent)``): the same sweep
    run again is a new sweep that measures its runs anew; the deleted sweep's runs are not reused."""
    job, store, worker = _stub_gpu(tmp_path, monkeypatch, 100.0)
    store[1] = f"tracking.experiment={EXPERIMENT}"
    first, out1 = _sweep(job, monkeypatch, "again", store, FIRST[:2], capsys)
    assert f"Parent run {first}: 4 verified." in out1 and len(worker.calls) == 4
    tr = Tracker(store[0].split("=", 1)[1], EXPERIMENT)
    old = {r.info.run_id for r in tr.sweep_runs(first)}
    tr.client.delete_run(first)
    second, out2 = _sweep(job, monkeypatch, "again", store, FIRST[:2], capsys)
    assert second != first and len(worker.calls) == 8, out2           # measured again, all four
    assert f"Parent run {second}: 4 verified." in out2 and "reused" not in out2, out2
    runs = tr.sweep_runs(second)
    assert len(runs) == 4 and not old & {r.info.run_id for r in runs}
    assert all(r.data.tags["mlflow.parentRunId"] == second for r in runs)
    assert not any(f"in_sweep.{second}" in tr.client.get_run(r).data.tags for r in old)
