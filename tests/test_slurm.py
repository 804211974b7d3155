"""hydra/launcher=slurm (experiments.runner.slurm): resources and GPUs checked against sinfo before submitting,
and on a real one-node Slurm (tools/slurm_one_node.sh; skipped without one, or without its accounting): a
re-run submits nothing already in the store, Slurm accounting down is one line, a job's exit status says
whether its runs failed, a task cancelled while the sweep runs is one line and the sweep's summary, Ctrl-C
of the command cancels its jobs, USR2 to a running job requeues it, and the store ends with no run
RUNNING, no duplicate measurement and no run under a deleted parent."""
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
from test_cli import ROOT, _cli_env, all_runs, run_cli, store_args

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="needs the cluster extra (pip install -e '.[cluster]')")
from experiments.runner import slurm  # noqa: E402

pytest.importorskip("hydra_plugins.hydra_submitit_launcher")


def _sinfo(monkeypatch, rows: str):
    """Make check_resources read ``rows`` (lines of ``sinfo -o '%P|%c|%m|%G'``)."""
    real = subprocess.run

    def fake(cmd, **kw):
        if cmd[0] == "sinfo":
            part = cmd[cmd.index("-p") + 1] if "-p" in cmd else None
            shown = [r if "%P|" in cmd[3] else r.split("|")[0] for r in rows.split()
                     if part in (None, r.split("|")[0].rstrip("*"))]
            return subprocess.CompletedProcess(cmd, 0, "\n".join(shown), "")
        return real(cmd, **kw)
    monkeypatch.setattr(slurm.subprocess, "run", fake)


PRESET = {"cpus_per_task": 2, "mem_gb": 4, "gpus_per_task": 1, "tasks_per_node": 1, "partition": None}


NO_GPU = {"gpus_per_task": None, "gpus_per_node": None}


def test_resources_no_node_has_are_refused_with_what_the_nodes_have(monkeypatch):
    """8 CPUs and 32 GB per job on a 2-CPU node: the array pended for ever (Reason=PartitionConfig).
    The preset's GPU is asked for only where the backend uses one and the partition has one: on a
    GPU-less partition the command as written (backend=auto) asked for 1 GPU and was refused."""
    _sinfo(monkeypatch, "debug*|2|24105|(null)\n")
    with pytest.raises(SystemExit) as exc:
        slurm.check_resources({**PRESET, "cpus_per_task": 8, "mem_gb": 32})
    assert str(exc.value) == (
        "Slurm cannot run this sweep's jobs on partition debug: each asks for 8 CPU(s), 32768 MB and 0 GPU(s), "
        "and its largest node has 2 CPU(s), 24105 MB and 0 GPU(s) (sinfo); the jobs would pend for ever. Ask "
        "for what a node has: hydra.launcher.cpus_per_task=2 hydra.launcher.mem_gb=23; or choose another "
        "partition (`sinfo -s`). Nothing was submitted.")
    assert exc.value.code == 2                                         # a refusal before any work
    assert slurm.check_resources(PRESET) == NO_GPU                     # the preset fits a 2-CPU node
    assert slurm.check_resources(PRESET, "static") == NO_GPU
    assert slurm.check_resources(PRESET, given=("hydra.launcher.gpus_per_task=0",)) == NO_GPU
    for given in ("hydra.launcher.gpus_per_task=1", "hydra.launcher.gpus_per_node=2"):
        with pytest.raises(SystemExit) as exc:     # a GPU the command asks for is refused, not dropped
            slurm.check_resources({**PRESET, given.split(".")[-1].split("=")[0]: int(given[-1])}, given=(given,))
        assert exc.value.code == 2 and "and its largest node has 2 CPU(s), 24105 MB and 0 GPU(s)" in str(exc.value)
        assert "hydra.launcher.gpus_per_task=null;" in str(exc.value)
    with pytest.raises(SystemExit) as exc:
        slurm.check_resources(PRESET, "gpu")
    assert str(exc.value) == (
        "backend=gpu needs GPUs, and no node of Slurm partition debug has one (sinfo GRES: (null)). Choose a "
        "partition with GPUs (hydra.launcher.partition=..., `sinfo -o '%P %G'` lists them), or backend=static "
        "(render and assemble only) or backend=auto (static where a node has no GPU). Nothing was submitted.")


def test_resources_of_a_gpu_partition(monkeypatch):
    """backend=gpu may be asked from a login node without a GPU for a partition with GPUs."""
    _sinfo(monkeypatch, "cpu*|64|512000|(null)\ngpu|32|256000|gpu:h100:4(S:0-1)\n")
    with pytest.raises(SystemExit, match=r"^Slurm has no partition gpus: hydra.launcher.partition= one of cpu, "
                                         r"gpu \(sinfo; \* is the default"):
        slurm.check_resources({**PRESET, "partition": "gpus"})
    one = {"gpus_per_task": 1, "gpus_per_node": None}
    assert slurm.check_resources({**PRESET, "partition": "gpu"}, "gpu") == one
    assert slurm.check_resources({**PRESET, "partition": "gpu"}) == one
    assert slurm.check_resources({**PRESET, "partition": "gpu"}, "static") == NO_GPU
    with pytest.raises(SystemExit, match=r"has 32 CPU.* 4 GPU.*: hydra.launcher.gpus_per_task=4; or"):
        slurm.check_resources({**PRESET, "partition": "gpu", "gpus_per_task": 8}, "gpu")
    assert slurm.check_resources(PRESET) == NO_GPU                     # the default partition: no GPU
    with pytest.raises(SystemExit, match=r"^backend=gpu needs GPUs, and no node of Slurm partition cpu has one"):
        slurm.check_resources(PRESET, "gpu")


def _slurm_ready() -> str | None:
    if shutil.which("sinfo") is None:
        return "no Slurm here (sudo bash tools/slurm_one_node.sh starts a one-node one)"
    out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True)
    if out.returncode or not any(s.startswith(("idle", "mix", "alloc")) for s in out.stdout.split()):
        return f"Slurm has no node up: {(out.stderr or out.stdout).strip()}"
    acct = subprocess.run(["sacct", "-n", "-X", "-S", "now"], capture_output=True, text=True)
    if acct.returncode:            # submitit reads job states with sacct
        return f"{slurm.ACCOUNTING_DOWN} ({(acct.stderr.strip().splitlines() or ['sacct failed'])[-1]})"
    return None


needs_slurm = pytest.mark.skipif(_slurm_ready() is not None, reason=str(_slurm_ready()))
SMALL = ["-m", "hydra/launcher=slurm", "hydra.launcher.mem_gb=1", "precision=int8"]


def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT)}   # the jobs import this checkout


def _store_is_sound(tmp):
    """No run RUNNING, no measurement twice, every run's parent there and not deleted."""
    import mlflow
    parents, children = all_runs(tmp)
    client = mlflow.MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    assert [r.info.run_name for r in parents + children if r.info.status == "RUNNING"] == []
    keys = [c.data.tags["run_key"] for c in children if c.info.status == "FINISHED"]
    assert len(keys) == len(set(keys))
    for c in children:
        assert client.get_run(c.data.tags["mlflow.parentRunId"]).info.lifecycle_stage == "active"
    return parents, children


def _sacct(job: str, *ids: str) -> dict:
    """{job or array task id: (state, exit code)} from Slurm accounting once it holds a record of each of
    ``ids`` (default: any) and none is still pending or running (slurmdbd records a job's end a moment
    after squeue drops it), or as it stands after 60 s."""
    deadline = time.time() + 60
    while True:
        out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", job, "-o", "JobID,State,ExitCode"],
                             capture_output=True, text=True)
        if out.returncode:
            pytest.fail(f"{slurm.ACCOUNTING_DOWN} ({(out.stderr.strip().splitlines() or ['sacct failed'])[-1]})")
        got = {line.split("|")[0]: tuple(line.split("|")[1:]) for line in out.stdout.strip().split("\n") if line}
        settled = not any(state.startswith(("PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "REQUEUED"))
                          for state, _ in got.values())
        if (got and set(ids) <= set(got) and settled) or time.time() > deadline:
            return got
        time.sleep(0.5)


def _accounting_down(tmp) -> dict:
    """The environment of a command in which ``sacct`` fails as it does while slurmdbd is down."""
    fake = tmp / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "sacct").write_text(
        "#!/bin/sh\necho 'sacct: error: slurm_persist_conn_open_without_init: failed to open persistent connection "
        "to host:localhost:6819: Connection refused' >&2\necho 'sacct: error: Problem talking to the database: "
        "Connection refused' >&2\nexit 1\n")
    (fake / "sacct").chmod(0o755)
    return {**_env(), "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}


def test_slurm_accounting_down_is_named_by_the_tests(tmp_path, monkeypatch):
    """The real-Slurm tests failed on an empty sacct when slurmdbd was down; they say what is wrong."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "sinfo").write_text("#!/bin/sh\necho idle\n")
    (tmp_path / "bin" / "sinfo").chmod(0o755)
    monkeypatch.setenv("PATH", _accounting_down(tmp_path)["PATH"])
    said = ("Slurm accounting (slurmdbd) is not answering: restart it with bash tools/slurm_one_node.sh (a cluster of "
            "your site: ask its administrators)")
    assert _slurm_ready() == f"{said} (sacct: error: Problem talking to the database: Connection refused)"
    with pytest.raises(pytest.fail.Exception) as failed:
        _sacct("12")
    assert str(failed.value) == f"{said} (sacct: error: Problem talking to the database: Connection refused)"


@needs_slurm
def test_a_rerun_of_a_finished_sweep_submits_nothing(tmp_path, need_ptxas):
    """Each job of a finished sweep was submitted again, and took ~22 s to say "already tracked". The
    first sweep runs with Slurm accounting not answering (sacct fails; the jobs run on the real Slurm):
    each poll of the jobs printed sacct's errors and submitit's warning three times; it is one line."""
    args = [*SMALL, "hydra.launcher.cpus_per_task=1", "ktile=32,64", *store_args(tmp_path)]
    rc, out = run_cli(tmp_path, *args, env=_accounting_down(tmp_path))
    assert rc == 0 and "Submitted Slurm job " in out and "2 static" in out and "Traceback" not in out, out
    assert ("backend=auto: the jobs ask Slurm for no GPU (the partition's nodes have none, or hydra.launcher."
            "gpus_per_task=null): static runs (ptxas only).") in out.splitlines()    # README's command, as written
    assert [line for line in out.splitlines() if "sacct" in line] == [
        f"{slurm.ACCOUNTING_DOWN} (sacct: error: Problem talking to the database: Connection refused). The sweep "
        "goes on: it follows its jobs by squeue and their result files."], out
    job = out.split("Submitted Slurm job ")[1].split(":")[0]
    assert _sacct(job, f"{job}_0", f"{job}_1") == {f"{job}_0": ("COMPLETED", "0:0"), f"{job}_1": ("COMPLETED", "0:0")}
    parents, children = _store_is_sound(tmp_path)
    assert len(children) == 2 and {c.data.tags["slurm_job_id"] for c in children} == {f"{job}_0", f"{job}_1"}
    rc, out = run_cli(tmp_path, *args, env=_env())
    assert rc == 0 and "Submitted Slurm job" not in out, out
    assert (f"Slurm: 2 of 2 job(s) of this sweep are already in the store (parent run {parents[0].info.run_id}): "
            "nothing to submit.") in out
    assert len(_store_is_sound(tmp_path)[1]) == 2


@needs_slurm
def test_failed_runs_fail_their_job_and_a_cancelled_task_is_one_line(tmp_path, need_ptxas):
    """Jobs whose every run FAILED exited 0 (sacct COMPLETED); a task cancelled with scancel ended the
    command with submitit's traceback. Two jobs one after another (2 CPUs each); the second is
    cancelled while it waits."""
    args = [*SMALL, "hydra.launcher.cpus_per_task=2", "ktile=32,64", "target.ptx_version=9.9",
            *store_args(tmp_path)]
    done = {}
    cmd = threading.Thread(target=lambda: done.update(zip(("rc", "out"), run_cli(tmp_path, *args, env=_env()), strict=True)))
    cmd.start()
    job, deadline = None, time.time() + 120
    while job is None and time.time() < deadline and cmd.is_alive():
        queue = subprocess.run(["squeue", "-h", "-r", "-o", "%i|%Z"], capture_output=True, text=True).stdout
        job = next((line.split("|")[0].split("_")[0] for line in queue.split()
                    if line.endswith(f"|{tmp_path}")), None)
        time.sleep(0.5)
    assert job is not None, done
    subprocess.run(["scancel", f"{job}_1"], check=True)
    cmd.join(300)
    rc, out = done["rc"], done["out"]
    assert rc == 1 and "Traceback" not in out, out
    assert f"\nSlurm job {job}_1 (precision=int8 ktile=64 target.ptx_version=9.9) ended CANCELLED" in out
    assert "1 Slurm job(s) of this sweep ended without finishing" in out
    assert "1 of 1 run(s) failed: 1 rejected by the assembler" in out.strip().splitlines()[-1]
    assert _sacct(job, f"{job}_0")[f"{job}_0"] == ("FAILED", "1:0")
    parents, children = _store_is_sound(tmp_path)
    assert [(c.info.status, c.data.tags["failed_stage"]) for c in children] == [("FAILED", "assemble")]
    assert [p.info.status for p in parents] == ["FAILED"]


def test_slurm_signals_close_the_jobs_runs_killed(tmp_path, monkeypatch):
    """submitit ignores SIGTERM in a job and handles USR2 itself: the handler that marks an
    interrupted run KILLED never ran under Slurm. The job's handlers close its runs, then hand USR2
    to submitit's (which requeues) and end the job on SIGTERM."""
    import signal

    from experiments.store import track
    monkeypatch.setattr(track, "_TRACKERS", {})
    seen = []
    old = {s: signal.signal(s, lambda num, frame: seen.append(num)) for s in (signal.SIGUSR2, signal.SIGTERM)}
    try:
        stopping = slurm._on_signals("77_3")
        tr = track.get_tracker(f"sqlite:///{tmp_path}/m.db", "signals")
        rid = tr.start("in progress", {}, {})
        os.kill(os.getpid(), signal.SIGUSR2)
        run = tr.client.get_run(rid)
        assert run.info.status == "KILLED" and seen == [signal.SIGUSR2] and stopping
        assert run.data.tags["skip_reason"] == ("Slurm signalled job 77_3 to stop (USR2: preempted or at its time "
                                                "limit); submitit requeues it and it measures them again")
        stopping.clear()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


@needs_slurm
@pytest.mark.parametrize("given, said", [
    ("backend=gpu", "backend=gpu needs GPUs, and no node of Slurm partition debug has one (sinfo GRES: (null)). "
                    "Choose a partition with GPUs"),
    ("hydra.launcher.partition=gpu", "Slurm has no partition gpu: hydra.launcher.partition= one of debug"),
    ("hydra.launcher.cpus_per_task=64", "Slurm cannot run this sweep's jobs on partition debug: each asks for 64 "
                                        "CPU(s)"),
    ("hydra.launcher.mem_gb=100000", "Slurm cannot run this sweep's jobs on partition debug: each asks for 2 CPU(s), "
                                     "102400000 MB"),
    ("hydra.launcher.gpus_per_task=1", "Slurm cannot run this sweep's jobs on partition debug: each asks for 2 "
                                       "CPU(s), 1024 MB and 1 GPU(s)"),
])
def test_what_no_node_of_the_partition_has_is_refused_before_submitting(tmp_path, given, said):
    """The jobs of backend=gpu on a GPU-less partition would each fail their runs (or pend for ever); a
    partition, CPUs or memory no node has exited 1 (a refusal before any work is 2); a GPU asked for
    on a GPU-less partition was dropped, the jobs ran static with exit 0."""
    rc, out = run_cli(tmp_path, *SMALL, given, *store_args(tmp_path), env=_env())
    assert rc == 2 and "Traceback" not in out, out
    assert out.strip().splitlines()[-1].startswith(said), out
    assert out.strip().endswith("Nothing was submitted."), out
    assert "Submitted Slurm job" not in out and all_runs(tmp_path) == ([], [])


# In the processes of a command (its Slurm jobs included: sbatch hands them its environment) with
# TC_SLOW_RUN_MARKS set: a static run stays in progress TC_SLOW_RUN_S seconds after it started, once
# per kernel (a mark file in that folder), so that a signal finds it open and a requeued job does not wait.
_SLOW_RUN = """import os, sys, threading, time
def _slow():
    while not hasattr(sys.modules.get("experiments.runner.job"), "_log_kernel_artifacts"):
        time.sleep(0.02)
    job = sys.modules["experiments.runner.job"]
    log = job._log_kernel_artifacts
    def slow(tr, rid, kern, cfg):
        log(tr, rid, kern, cfg)
        mark = os.path.join(os.environ["TC_SLOW_RUN_MARKS"], kern.entry)
        if not os.path.exists(mark):
            open(mark, "w").close()
            time.sleep(float(os.environ["TC_SLOW_RUN_S"]))
    job._log_kernel_artifacts = slow
if os.environ.get("TC_SLOW_RUN_MARKS"):
    threading.Thread(target=_slow, daemon=True).start()
"""


def _start(tmp, *args, slow_s=120):
    """``python run.py ARGS`` started in ``tmp`` (output in tmp/command.log), its runs slow (_SLOW_RUN)."""
    site = tmp / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SLOW_RUN)
    (tmp / "marks").mkdir()
    env = {**_cli_env(), "PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "TC_SLOW_RUN_MARKS": str(tmp / "marks"),
           "TC_SLOW_RUN_S": str(slow_s)}
    with open(tmp / "command.log", "w") as log:      # (SIGINT is handled: conftest.handle_sigint)
        return subprocess.Popen([sys.executable, str(ROOT / "run.py"), *args, *store_args(tmp)], cwd=tmp, env=env,
                                stdout=log, stderr=subprocess.STDOUT)


def _poll(what, timeout=120):
    """``what()`` once it is true (every 0.3 s), or fail after ``timeout`` seconds naming it (its docstring)."""
    deadline = time.time() + timeout
    while not (got := what()):
        assert time.time() < deadline, f"not within {timeout} s: {what.__doc__ or what}"
        time.sleep(0.3)
    return got


def _in_progress(tmp, n):
    def runs():
        """the command's runs in progress, each in its slow stretch (its mark made)"""
        # (a run is RUNNING before it logs its kernel: a signal then ends it before its mark, and the
        # requeued job, not the signalled one, would stay TC_SLOW_RUN_S in its run)
        if not (tmp / "mlflow.db").exists() or len(list((tmp / "marks").iterdir())) < n:
            return None
        children = all_runs(tmp)[1]
        return children if sum(c.info.status == "RUNNING" for c in children) >= n else None
    return runs


def _stop(proc, tmp):
    """Kill the command ``proc`` started in ``tmp`` if it still runs, and cancel its Slurm jobs."""
    if proc.poll() is None:
        proc.kill()
        queue = subprocess.run(["squeue", "-h", "-o", "%A|%Z"], capture_output=True, text=True).stdout.split()
        subprocess.run(["scancel", *(q.split("|")[0] for q in queue if q.endswith(f"|{tmp}"))])


def _ended(proc, tmp):
    """(exit status, output) of the command ``proc`` started in ``tmp``, failing after 2 minutes."""
    try:
        return proc.wait(120), (tmp / "command.log").read_text()
    except subprocess.TimeoutExpired:
        _stop(proc, tmp)
        pytest.fail(f"the command did not end within 2 minutes: {(tmp / 'command.log').read_text()}")


@needs_slurm
def test_ctrl_c_of_the_command_cancels_its_jobs_and_kills_their_runs(tmp_path, need_ptxas):
    """Ctrl-C of the submitting command, checked by hand only: its two jobs, each with a run in
    progress, are cancelled; their runs end KILLED with the reason, the parent KILLED (not deleted)."""
    proc = _start(tmp_path, *SMALL, "hydra.launcher.cpus_per_task=1", "ktile=32,64")
    try:
        _poll(_in_progress(tmp_path, 2))
    finally:
        proc.send_signal(signal.SIGINT)
    rc, out = _ended(proc, tmp_path)
    assert rc == 130 and "Traceback" not in out, out
    job = out.split("Submitted Slurm job ")[1].split(":")[0]
    assert f"\nCancelling 2 Slurm task(s) of this sweep (scancel {job}) ...\n" in out
    assert out.strip().splitlines()[-1] == (
        "Interrupted: 0 run(s) finished in this command are kept; 2 run(s) in progress marked KILLED "
        "(outcome=interrupted); the sweep is marked KILLED. Run the same command again to resume (finished runs "
        "are skipped, the sweep continues).")
    assert subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout == ""
    assert {state.split()[0] for state, _ in _sacct(job).values()} == {"CANCELLED"}
    parents, children = _store_is_sound(tmp_path)
    assert sorted(c.data.tags["slurm_job_id"] for c in children) == [f"{job}_0", f"{job}_1"]
    for c in children:       # closed by the job on scancel's SIGTERM, or after Slurm killed it by the command
        assert (c.info.status, c.data.tags["outcome"]) == ("KILLED", "interrupted")
        assert c.data.tags["skip_reason"] in (
            f"Slurm ended job {c.data.tags['slurm_job_id']} (SIGTERM: scancel, or its node is going down)",
            "its Slurm job was cancelled: the sweep was interrupted (Ctrl-C or SIGTERM of the submitting command)")
    assert [(p.info.status, p.data.tags["skip_reason"]) for p in parents] == [("KILLED", "interrupted by Ctrl-C")]


@needs_slurm
def test_usr2_closes_the_runs_killed_and_the_requeued_job_measures_them(tmp_path, need_ptxas):
    """USR2 (what submitit asks Slurm to send before preemption or the time limit) to a running job
    under real Slurm, tested in-process only: its run ends KILLED with the reason, submitit requeues
    the job, and the requeued job measures that run once more (one FINISHED run per measurement)."""
    proc = _start(tmp_path, *SMALL, "hydra.launcher.cpus_per_task=1", "ktile=32")
    try:
        _poll(_in_progress(tmp_path, 1))
        job = next(line.split()[3].rstrip(":") for line in (tmp_path / "command.log").read_text().splitlines()
                   if line.startswith("Submitted Slurm job "))
        subprocess.run(["scancel", "--signal=USR2", job], check=True)
        # (a sweep of one job is a plain Slurm job, no array); the requeued job starts again once its
        # credential expires (cred_expire, 10 s in tools/slurm_one_node.sh): started earlier with
        # "scontrol update StartTime=now" Slurm kills it at once ("Job credential revoked")
        rc, out = _ended(proc, tmp_path)
    finally:
        _stop(proc, tmp_path)
    assert rc == 0 and "Traceback" not in out, out
    assert "1 static." in out.strip().splitlines()[-4] and _sacct(job) == {job: ("COMPLETED", "0:0")}
    parents, children = _store_is_sound(tmp_path)
    assert [(c.info.status, c.data.tags["slurm_job_id"], c.data.tags.get("skip_reason")) for c in children] == [
        ("FINISHED", job, None),
        ("KILLED", job, f"Slurm signalled job {job} to stop (USR2: preempted or at its time limit); "
                        "submitit requeues it and it measures them again")]
    assert len({c.data.tags["run_key"] for c in children}) == 1 and [p.info.status for p in parents] == ["FINISHED"]

