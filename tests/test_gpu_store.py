"""On a GPU: jobs of a parallel launcher take turns on the GPU (never two timings at once), and a
Ctrl-C during GPU work closes the run in progress."""
import os
import subprocess
import sys

import pytest
from test_cli import ROOT, all_runs, store_args

pytestmark = pytest.mark.gpu


def run_gpu_cli(cwd, *args, timeout=600, one_gpu=False):
    """run.py in ``cwd``; ``one_gpu``: only the first GPU visible (unless CUDA_VISIBLE_DEVICES is set)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "HYDRA_FULL_ERROR")}
    if one_gpu:
        env.setdefault("CUDA_VISIBLE_DEVICES", "0")
    proc = subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=cwd, env=env, timeout=timeout,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc.returncode, proc.stdout


def test_parallel_jobs_take_turns_on_the_gpu(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    rc, out = run_gpu_cli(tmp_path, "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                          "precision=fp16,int8", "ktile=32,64", "problem.sizes=[1024,2048]",
                          "timing.batches=5", *store_args(tmp_path), one_gpu=True)
    assert rc == 0, out
    parents, children = all_runs(tmp_path)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert sorted(c.info.status for c in children) == ["FINISHED"] * 8, out
    assert len({c.data.tags["owner_pid"] for c in children}) == 2      # two job processes
    windows = sorted((float(c.data.tags["gpu_start_unix"]), float(c.data.tags["gpu_end_unix"]))
                     for c in children)
    for (s0, e0), (s1, e1) in zip(windows[:-1], windows[1:], strict=True):
        assert e0 <= s1, f"GPU windows overlap: [{s0}, {e0}] and [{s1}, {e1}]"
    print("GPU windows (s):", [(round(s - windows[0][0], 2), round(e - windows[0][0], 2)) for s, e in windows])


def test_all_gpus_of_the_node(tmp_path):
    """hydra/launcher=gpus: two job processes per GPU, each pinned to one GPU; on each GPU the
    timings never overlap (also as the sweep's summary counts them), and every run names its GPU."""
    from experiments.gpu.worker import gpu_count
    if gpu_count() < 2:
        pytest.skip(f"needs 2 or more GPUs; this node has {gpu_count()}")
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    rc, out = run_gpu_cli(tmp_path, "-m", "hydra/launcher=gpus", "precision=fp16,bf16,int8", "ktile=32,64",
                          "problem.sizes=[1024,2048]", "timing.batches=5", *store_args(tmp_path))
    assert rc == 0, out
    parents, children = all_runs(tmp_path)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert sorted(c.data.tags["outcome"] for c in children) == ["verified"] * 12, out
    by_gpu: dict = {}
    for c in children:
        assert c.data.tags["gpu"] and c.data.tags["pci_bus_id"]
        by_gpu.setdefault(c.data.tags["gpu_uuid"], []).append(
            (float(c.data.tags["gpu_start_unix"]), float(c.data.tags["gpu_end_unix"])))
    assert len(by_gpu) == min(gpu_count(), 6)
    assert "no two runs on one GPU at once" in out and parents[0].data.metrics["gpu_overlaps"] == 0
    for windows in by_gpu.values():
        windows.sort()
        for (s0, e0), (s1, e1) in zip(windows[:-1], windows[1:], strict=True):
            assert e0 <= s1, f"GPU windows overlap: [{s0}, {e0}] and [{s1}, {e1}]"
