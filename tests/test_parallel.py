"""Many writers: the launcher presets, and a sweep of parallel jobs against a real MLflow tracking
server on the loopback address (the documented store for several processes or hosts)."""
import os
import shutil
import socket
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from test_cli import ROOT, _empty_store, run_cli

sys.path.insert(0, str(ROOT))
from tools import tracking_server  # noqa: E402

pytestmark = pytest.mark.usefixtures("need_ptxas")


def test_slurm_preset_asks_one_gpu_per_task(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    rc, out = run_cli(tmp_path, "hydra/launcher=slurm", "hydra.launcher.partition=gpu", "--cfg", "hydra",
                      "--package", "hydra.launcher")
    assert rc == 0, out
    lines = set(out.splitlines())
    for line in ("gpus_per_task: 1", "tasks_per_node: 1", "partition: gpu", "timeout_min: 120", "cpus_per_task: 2",
                 "mem_gb: 4", "_target_: hydra_plugins.tca_slurm_launcher.SlurmLauncher"):
        assert line in lines, out


def test_gpus_preset_runs_three_jobs_per_gpu(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    rc, out = run_cli(tmp_path, "hydra/launcher=gpus", "--cfg", "hydra", "--package", "hydra.launcher",
                      "--resolve")
    assert rc == 0, out
    assert "n_jobs: 3" in out.splitlines()          # no GPU visible here: as for one GPU
    assert "_target_: hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher" in out


def _launcher(*overrides):
    from hydra import compose, initialize_config_dir

    from experiments.config import register
    register()
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=True).hydra.launcher


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:                                           # a zombie child of this process counts as gone
        return open(f"/proc/{pid}/stat").read().split(")")[1].split()[0] != "Z"
    except OSError:
        return True


def test_prewarm_starts_the_processes_the_jobs_then_run_in():
    """The sweep starts the joblib launcher's processes while it opens its store; the launcher's own
    call (the same arguments, as JoblibLauncher.launch makes them) must reuse them, not start others."""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    from hydra.utils import instantiate
    from hydra_plugins.hydra_joblib_launcher._core import process_joblib_cfg
    from joblib import Parallel, delayed

    from experiments.runner.sweep import prewarm, release_job_processes
    launcher = _launcher("hydra/launcher=joblib", "hydra.launcher.n_jobs=2")
    thread = prewarm(launcher, gpu=False)
    thread.join(120)
    assert len(thread.pids) == 2 and os.getpid() not in thread.pids
    args = dict(instantiate(launcher).joblib, backend="loky")
    process_joblib_cfg(args)
    assert set(Parallel(**args)(delayed(os.getpid)() for _ in range(6))) <= set(thread.pids)
    release_job_processes()                        # the sweep's end: they stop at once
    deadline = time.time() + 30
    while time.time() < deadline and any(_alive(pid) for pid in thread.pids):
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in thread.pids)
    assert prewarm(_launcher("hydra/launcher=basic"), gpu=False) is None
    # one job process: joblib runs the jobs in the sweep's own process (warming it in a thread raced
    # the sweep's own MLflow import into a module-lock deadlock)
    assert prewarm(_launcher("hydra/launcher=joblib", "hydra.launcher.n_jobs=1"), gpu=False) is None
    thread = prewarm(_launcher("hydra/launcher=joblib", "hydra.launcher.n_jobs=3"), gpu=False, jobs=1)
    thread.join(120)
    assert len(thread.pids) == 1                   # one job: one process imports MLflow, not three
    release_job_processes()


def test_prewarm_refuses_zero_job_processes():
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    from experiments.runner.sweep import prewarm
    with pytest.raises(SystemExit, match=r"hydra.launcher.n_jobs=0: .*a positive count of job processes"):
        prewarm(_launcher("hydra/launcher=joblib", "hydra.launcher.n_jobs=0"), gpu=False)


@pytest.fixture
def mlflow_server(tmp_path):
    """``mlflow server`` on loopback (tools/tracking_server.py) over a copy of the empty store (migrated
    already: it starts sooner); its URI."""
    shutil.copy(_empty_store(), tmp_path / "server.db")
    uri, proc = tracking_server.start_server(f"sqlite:///{tmp_path}/server.db", tmp_path, workers=1)
    yield uri
    tracking_server.stop(proc)


def test_parallel_sweep_against_a_tracking_server(tmp_path, mlflow_server):
    """4 jobs, 2 at a time in 2 processes: every run stored once, all under one parent, none RUNNING."""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    rc, out = run_cli(tmp_path, "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                      "precision=fp16,int8", "ktile=32,64", f"tracking.uri={mlflow_server}",
                      "tracking.experiment=server-test", f"hydra.sweep.dir={tmp_path}/out")
    assert rc == 0, out
    import mlflow
    client = mlflow.MlflowClient(mlflow_server)
    exp = client.get_experiment_by_name("server-test")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    parents = [r for r in runs if r.data.tags.get("kind") == "sweep"]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 4 and len(runs) == 5
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    assert max(Counter(c.data.tags["run_key"] for c in children).values()) == 1
    assert len({c.data.tags["owner_pid"] for c in children}) > 1      # jobs ran in several processes
    # the server is the UI: its own address in the links, no `mlflow ui` to start, no MLflow link per run
    assert f"Browse the results on the tracking server {mlflow_server}:" in out
    assert f"  all runs:   {mlflow_server}/#/experiments/{exp.experiment_id}/runs" in out
    assert "mlflow ui" not in out and "View run" not in out and "127.0.0.1:5000" not in out, out


def _run(gpu, start, end):
    from types import SimpleNamespace
    tags = {"gpu_uuid": gpu, "gpu_start_unix": f"{start:.3f}", "gpu_end_unix": f"{end:.3f}"}
    return SimpleNamespace(data=SimpleNamespace(tags=tags))


def test_gpu_time_sums_windows_per_gpu_and_counts_overlaps():
    from experiments.runner.sweep import gpu_time
    runs = [_run("GPU-aaaa", 100.0, 102.5), _run("GPU-aaaa", 103.0, 104.0), _run("GPU-bbbb", 101.0, 104.5)]
    line, m = gpu_time(runs, 100.0, 110.0)
    assert m == {"sweep_wall_s": 10.0, "gpu_busy_s": 7.0, "gpu_busy_share": 0.35, "gpus": 2, "gpu_overlaps": 0}
    assert line == ("GPU time: 7.0 s on 2 GPU(s) (GPU-aaaa 3.5 s, GPU-bbbb 3.5 s) of 10.0 s wall (35%); "
                    "no two runs on one GPU at once")
    # two windows of one GPU that overlap are counted (the other GPU's window at the same time is not)
    _, m = gpu_time(runs + [_run("GPU-aaaa", 102.0, 103.5)], 100.0, 110.0)
    assert m["gpu_overlaps"] == 2
    # static runs hold no GPU: nothing to say
    assert gpu_time([_run("x", 0, 0)][:0], 0.0, 1.0) == ("", {})


class _FakeNvml:
    """pynvml for two GPUs (index 0 and 1) that NVML names by index and by UUID."""
    def __init__(self):
        self.uuids = ["GPU-aaaa", "GPU-bbbb"]

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return self.uuids.index(uuid)

    def nvmlDeviceGetUUID(self, h):
        return self.uuids[h]

    def nvmlDeviceGetPciInfo(self, h):
        from types import SimpleNamespace
        return SimpleNamespace(busId=f"00000000:0{h}:00.0")


@pytest.mark.parametrize("visible, first", [(None, "GPU-aaaa"), ("1,0", "GPU-bbbb"), ("GPU-bbbb,GPU-aaaa", "GPU-bbbb")])
def test_claim_spreads_processes_over_the_visible_gpus(monkeypatch, tmp_path, visible, first):
    """JOBS_PER_GPU job processes per GPU: the first two claims take one slot of each GPU (the first
    listed in CUDA_VISIBLE_DEVICES first), the next two the second slots, and so on; each process then
    sees only its own GPU. A list in CUDA_VISIBLE_DEVICES is spread over, not all put on its first GPU."""
    import tempfile

    from experiments.gpu import worker
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml())
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(worker, "nvml_gpu", lambda: {"uuid": os.environ["CUDA_VISIBLE_DEVICES"]})
    claimed, held = [], []
    for _ in range(2 * worker.JOBS_PER_GPU):       # one process after another, each its own claim
        if visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        held.append([])                             # that process's slot lock, held while it lives
        monkeypatch.setattr(worker, "_SLOT", held[-1])
        claimed.append(worker.claim_gpu()["uuid"])
    second = ({"GPU-aaaa", "GPU-bbbb"} - {first}).pop()
    assert claimed == [first, second] * worker.JOBS_PER_GPU
    assert len(list(tmp_path.glob("tensorcore-ablations-slot-*.lock"))) == 2 * worker.JOBS_PER_GPU


def test_gpu_lock_lets_warm_ups_share_the_gpu_but_never_a_timing(tmp_path, monkeypatch):
    """Shared holders (warm-ups) hold the GPU together; an exclusive one (verification and timing)
    waits for all of them and keeps every other holder out; a long wait is noted once, with the holder."""
    import tempfile
    import threading

    from experiments.gpu import worker
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(worker, "WAIT_NOTE_S", 0.2)
    events: list = []

    def timing(hold_s):
        with worker.gpu_lock("0000:01:00.0", on_wait=lambda who: events.append(("noted", who))):
            events.append(("timing", time.monotonic()))
            time.sleep(hold_s)
        events.append(("timed", time.monotonic()))

    with worker.gpu_lock("0000:01:00.0", shared=True):
        with worker.gpu_lock("0000:01:00.0", shared=True):       # a second warm-up gets in at once
            t = threading.Thread(target=timing, args=(0.5,))
            t.start()
            time.sleep(0.4)
            assert [e[0] for e in events] == ["noted"]               # the timing waits (and says so)
            assert events[0][1] == "another process"                 # shared holders write no owner
        released = time.monotonic()
    t.join(10)
    assert events[1][0] == "timing" and events[1][1] >= released
    t = threading.Thread(target=timing, args=(0.5,))
    events.clear()
    t.start()
    while not events:
        time.sleep(0.01)
    with worker.gpu_lock("0000:01:00.0", shared=True):               # a warm-up waits for the timing
        entered = time.monotonic()
    t.join(10)
    assert events[0][0] == "timing" and entered - events[0][1] >= 0.45      # after its 0.5 s
    assert open(tmp_path / "tensorcore-ablations-gpu-0000_01_00_0.lock.owner").read() == \
        f"pid {os.getpid()} on {socket.gethostname()}"


@pytest.mark.parametrize("after, group", [("[HYDRA] Launching jobs", True), ("[1/6] ", False)])
def test_ctrl_c_in_a_parallel_sweep_leaves_no_process_and_no_open_run(tmp_path, after, group):
    """SIGINT while the job processes start (after the launcher's first line) or while they run (after
    the first result), to the whole process group (Ctrl-C in a terminal) or to run.py alone (kill
    -INT): the command ends with 130, no job process of it stays behind (it used to hang at exit
    waiting for them, or leave them running), no run stays RUNNING, and the same command resumes: its job
    processes finish the sweep under the one parent, the store true (test_store.assert_store_is_true)."""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    import signal
    import threading

    from test_cli import all_runs, popen_cli, store_args
    from test_store import assert_store_is_true
    args = ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "backend=static", "experiment=l4_run2_int8",
            *store_args(tmp_path)]
    proc = popen_cli(tmp_path, *args, start_new_session=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if after in line:
            break
    assert after in seen[-1], "".join(seen)
    (os.killpg if group else os.kill)(proc.pid, signal.SIGINT)
    reader = threading.Thread(target=lambda: seen.append(proc.stdout.read()), daemon=True)
    reader.start()
    reader.join(90)
    if reader.is_alive():
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("run.py did not end within 90 s of the SIGINT: " + "".join(seen)[-2000:])
    out = "".join(seen)
    proc.wait(30)
    assert proc.returncode == 130, out
    time.sleep(1)
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cwd(p) == str(tmp_path)]
    assert not left, [(p.name, (p / "cmdline").read_bytes()) for p in left]
    parents, children = all_runs(tmp_path)
    assert "RUNNING" not in {r.info.status for r in parents + children}
    kept = sum(c.info.status == "FINISHED" for c in children)     # finished by the job processes
    killed = sum(c.info.status == "KILLED" for c in children)
    assert f"Interrupted: {kept} run(s) finished in this command are kept; {killed} run(s) in progress" in out
    rc, out = run_cli(tmp_path, *args)
    assert rc == 0, out
    parents, children = assert_store_is_true(tmp_path)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    finished = [c for c in children if c.info.status == "FINISHED"]
    assert len(finished) == 6 and len({c.data.tags["run_key"] for c in finished}) == 6


def _cwd(proc_dir) -> str | None:
    try:
        return os.readlink(proc_dir / "cwd")
    except OSError:
        return None
