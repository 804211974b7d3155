"""GPU tests: kernels verified exactly / within tolerance, int4 nibble order, JIT log, fault isolation."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from experiments.spec import KernelSpec, valid_ktiles, PRECISIONS

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parent.parent


def _specs():
    out = []
    for prec, p in PRECISIONS.items():
        for ktile in valid_ktiles(p):
            for mma_k in p.mma_k:
                if ktile % mma_k:
                    continue
                for (bm, bn, wm, wn) in ((128, 128, 2, 4), (64, 64, 2, 2)):
                    for stages in (1, 2, 3, 4):
                        cache = "ca" if stages % 2 else "cg"
                        try:
                            out.append(KernelSpec(prec, ktile, mma_k, bm, bn, wm, wn, stages, cache, "sm_90"))
                        except ValueError:
                            pass
    return out


SPECS = _specs()


def _run(spec, m, n, k, seed, tmp_path, ptx=None):
    import cupy
    from experiments.launch import GemmLaunch, load_kernel
    from experiments.render import render
    from experiments.verify import check, make_operands, poison
    ptx = ptx or render(spec)
    path = tmp_path / f"{spec.entry}.ptx"
    path.write_text(ptx)
    kern = load_kernel(ptx, str(path), spec.entry, spec.smem_bytes)
    ops = make_operands(spec.precision, m, n, k, seed)
    c = cupy.empty((m, n), dtype=np.float32 if spec.prec.is_float else np.int32)
    poison(c)
    GemmLaunch(kern, spec, ops.a, ops.b, c, m, n, k)()
    return c, ops, check(c, ops, spec.prec.is_float, 1e-3)


@pytest.mark.parametrize("spec", SPECS, ids=[s.entry for s in SPECS])
def test_kernel_matches_reference(spec, tmp_path):
    # non-square, several blocks in each direction, K with >= 4 tiles for every stage count
    m, n, k = 2 * spec.bm, 3 * spec.bn, 4 * spec.ktile * 2
    c, ops, res = _run(spec, m, n, k, 1234, tmp_path)
    assert res.ok, res.message()
    if not spec.prec.is_float:
        assert res.max_error == 0.0
    else:
        assert res.max_error < 1e-4  # f32 accumulation of K <= 1024 products (typ. 1e-6)


def test_int4_nibble_order_pairs_equal_k(tmp_path):
    """A nonzero only at even k, B only at odd k: C must be exactly 0; same parity: not 0."""
    import cupy
    from experiments.launch import GemmLaunch, load_kernel
    from experiments.render import render
    from experiments.verify import pack_int4
    spec = KernelSpec("int4", 64, 64, 128, 128, 2, 4, 2, "cg", "sm_90")
    m = n = k = 256
    rs = np.random.RandomState(7)
    a = rs.randint(-8, 8, (m, k)).astype(np.int8)
    b = rs.randint(-8, 8, (n, k)).astype(np.int8)
    a_even, b_odd, b_even = a.copy(), b.copy(), b.copy()
    a_even[:, 1::2] = 0
    b_odd[:, 0::2] = 0
    b_even[:, 1::2] = 0
    ptx = render(spec)
    path = tmp_path / "k.ptx"
    path.write_text(ptx)
    kern = load_kernel(ptx, str(path), spec.entry, spec.smem_bytes)
    for bb, expect in ((b_odd, np.zeros((m, n), np.int64)),
                       (b_even, a_even.astype(np.int64) @ b_even.astype(np.int64).T)):
        c = cupy.full((m, n), -1, dtype=np.int32)
        GemmLaunch(kern, spec, cupy.asarray(pack_int4(a_even)), cupy.asarray(pack_int4(bb)), c, m, n, k)()
        np.testing.assert_array_equal(cupy.asnumpy(c).astype(np.int64), expect)
    assert np.abs(expect).sum() > 0


def test_jit_failure_shows_driver_log(tmp_path):
    from experiments.launch import PtxJitError, load_kernel
    spec = SPECS[0]
    from experiments.render import render
    bad = render(spec).replace("mma.sync.aligned", "mma.sync.bogus", 1)
    path = tmp_path / "bad.ptx"
    path.write_text(bad)
    with pytest.raises(PtxJitError) as err:
        load_kernel(bad, str(path), spec.entry, spec.smem_bytes)
    text = str(err.value)
    assert str(path) in text and "line" in text.lower()


FAULT_PTX = """
.version 7.8
.target sm_90
.address_size 64
.visible .entry {entry}(.param .u64 A, .param .u64 B, .param .u64 C, .param .u32 M, .param .u32 N, .param .u32 K)
{{
    .reg .b64 %p;
    .reg .b32 %v;
    mov.b64 %p, 0x10;
    mov.b32 %v, 1;
    st.global.u32 [%p], %v;
    ret;
}}
"""


def test_worker_survives_a_faulting_kernel(tmp_path):
    from experiments.render import render
    from experiments.worker import GpuWorker, WorkerError
    spec = KernelSpec("int8", 64, 32, 128, 128, 2, 4, 2, "cg", "sm_90")
    timing = dict(warmup=1, batches=3, min_batch_ms=1.0, max_launches=10, cuda_graph=True, l2_flush=False)
    fault = FAULT_PTX.format(entry=spec.entry)
    (tmp_path / "fault.ptx").write_text(fault)
    good = render(spec)
    (tmp_path / "good.ptx").write_text(good)
    w = GpuWorker()
    try:
        with pytest.raises(WorkerError, match="(?i)illegal|address|fault"):
            w.call("measure", 120, ptx=fault, ptx_path=str(tmp_path / "fault.ptx"), spec=spec.as_kwargs(),
                   m=256, n=256, k=256, timing=timing, rtol=1e-3, seed=1)
        res = w.call("measure", 120, ptx=good, ptx_path=str(tmp_path / "good.ptx"), spec=spec.as_kwargs(),
                     m=256, n=256, k=256, timing=timing, rtol=1e-3, seed=1)
    finally:
        w.stop()
    assert res["verified"] and res["verify_max_error"] == 0
    t = res["timing"]
    assert t["min_us"] <= t["median_us"] <= t["max_us"] and t["batches"] == 3 and t["median_us"] > 0


def test_cli_small_sweep_on_gpu(tmp_path):
    db = tmp_path / "mlflow.db"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "-m", "precision=fp16,int8", "ktile=32", "problem=small",
         f"tracking.uri=sqlite:///{db}", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import mlflow
    client = mlflow.MlflowClient(f"sqlite:///{db}")
    exp = client.get_experiment_by_name("tensor-core-ablations")
    runs = client.search_runs([exp.experiment_id], "tags.backend = 'gpu'")
    assert len(runs) == 4
    for r in runs:
        assert r.info.status == "FINISHED", r.data.tags.get("error")
        assert r.data.tags["verified"] == "true" and r.data.metrics["throughput"] > 0
        assert r.data.metrics["min_us"] <= r.data.metrics["median_us"] <= r.data.metrics["max_us"]


@pytest.mark.parametrize("group_m", [1, 2, 3, 8])
def test_rasterization_groups_cover_every_block(group_m, tmp_path):
    """5 x 3 blocks: the last group of block rows is partial for group_m 2, 3 and 8."""
    spec = KernelSpec("int8", 32, 32, 64, 64, 2, 2, 2, "cg", "sm_90", group_m=group_m)
    _, _, res = _run(spec, 5 * 64, 3 * 64, 256, 99, tmp_path)
    assert res.ok and res.max_error == 0, res.message()


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_k_shorter_than_the_pipeline(stages, tmp_path):
    """K = one K tile: the prologue must not copy tiles past K for any stage count."""
    spec = KernelSpec("fp16", 32, 16, 64, 64, 2, 2, stages, "cg", "sm_90")
    _, _, res = _run(spec, 128, 64, 32, 5, tmp_path)
    assert res.ok, res.message()
