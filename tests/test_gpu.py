"""GPU tests: every loader, B layout, cache operator, L2 hint, accumulator and FP8 format verifies;
loader, layout and cache variants of one kernel give bit-identical C; int4 nibble order, pipeline
depths up to the shared-memory limit, JIT log, fault isolation, the CLI.

Kernels are built for the GPU's own architecture (sm_90 on an H200). Every check runs at a small
size (a few blocks in each direction, several K tiles), so the whole file takes about 2 minutes.
"""
import dataclasses
import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from experiments.hardware import ARCHS
from experiments.spec import SpecError
from experiments.families.mma_sync.spec import KernelSpec
from experiments.families.mma_sync.domains import LOADERS, MAX_STAGES

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def arch():
    import cupy
    name = f"sm_{int(cupy.cuda.Device().compute_capability)}"
    if name not in ARCHS:
        pytest.skip(f"{name} is not a target of the mma_sync family ({', '.join(ARCHS)})")
    return name


def _spec(arch, **kw) -> KernelSpec:
    base = dict(precision="fp16", ktile=32, mma_k=16, bm=64, bn=64, warps_m=2, warps_n=2, stages=2,
                cache_op="cg", arch=arch)
    try:
        return KernelSpec(**{**base, **kw})
    except SpecError as exc:
        pytest.skip(f"not valid on {arch}: {exc}")


def _family_call(spec, ptx: str) -> dict:
    """The kwargs of the worker's ``measure_family`` for ``spec`` with the PTX text ``ptx``, as the
    runner makes them (experiments.runner.kernel.make_kernel)."""
    return {"family": spec.family, "precision": spec.precision, "arch": spec.arch,
            "params": [list(p) for p in spec.params],
            "build": {"kind": "ptx", "source": ptx, "entry": spec.entry, "options": []}}


def _run(spec, m, n, k, seed, tmp_path, ptx=None, rtol=1e-3):
    """Launch once on fresh operands (B stored as the spec says); returns (C, operands, VerifyResult)."""
    import cupy

    from experiments.gpu.launch import GemmLaunch, load_kernel
    from experiments.dtypes import tolerance
    from experiments.families.mma_sync.render import render
    from experiments.gpu.verify import check, make_operands, poison
    ptx = ptx or render(spec)
    path = tmp_path / f"{spec.entry}.ptx"
    path.write_text(ptx)
    kern = load_kernel(ptx, str(path), spec.entry, spec.smem_bytes)
    ops = make_operands(spec.precision, m, n, k, seed, b_layout=spec.b_layout)
    c = cupy.empty((m, n), dtype=np.dtype(spec.accum.c_dtype))
    poison(c)
    GemmLaunch(kern, spec, ops.a, ops.b, c, m, n, k)()
    cupy.cuda.Device().synchronize()
    tol = tolerance(spec.precision, spec.acc, k, rtol)
    return c, ops, check(c, ops, spec.prec.is_float, tol)


def _same_bits(c0, c1) -> bool:
    import cupy
    view = {2: np.uint16, 4: np.uint32}[c0.dtype.itemsize]
    return bool(cupy.array_equal(c0.view(view), c1.view(view)))


def _variants(arch, base, loaders_b=LOADERS):
    """Every loader pair and B layout the rules allow for ``base`` (kwargs of KernelSpec)."""
    out = []
    for la in LOADERS:
        for lb in loaders_b:
            for layout in ("col", "row"):
                try:
                    out.append(KernelSpec(**{**base, "arch": arch, "loader_a": la, "loader_b": lb,
                                             "b_layout": layout}))
                except SpecError:
                    pass
    return out


# (precision, ktile, mma_k, tile): 32- and 16-byte K chunks, one and two m16 tiles per warp, every type
LOADER_GROUPS = {
    "fp16_k16_bk32_64x64": dict(precision="fp16", ktile=32, mma_k=16, bm=64, bn=64, warps_m=2, warps_n=2),
    "bf16_k8_bk16_32x64": dict(precision="bf16", ktile=16, mma_k=8, bm=32, bn=64, warps_m=2, warps_n=4),
    "fp16_f16acc_k16_bk64_64x64": dict(precision="fp16", ktile=64, mma_k=16, bm=64, bn=64, warps_m=2,
                                       warps_n=2, acc="f16"),
    "int8_k16_bk16_64x64": dict(precision="int8", ktile=16, mma_k=16, bm=64, bn=64, warps_m=2, warps_n=2),
    "int8_k32_bk64_32x64": dict(precision="int8", ktile=64, mma_k=32, bm=32, bn=64, warps_m=2, warps_n=4),
    "int4_k32_bk32_64x64": dict(precision="int4", ktile=32, mma_k=32, bm=64, bn=64, warps_m=2, warps_n=2),
    "int4_k64_bk128_32x64": dict(precision="int4", ktile=128, mma_k=64, bm=32, bn=64, warps_m=2, warps_n=4),
    "e4m3_bk32_64x64": dict(precision="fp8_e4m3", ktile=32, mma_k=32, bm=64, bn=64, warps_m=2, warps_n=2),
    "e5m2_bk64_32x64": dict(precision="fp8_e5m2", ktile=64, mma_k=32, bm=32, bn=64, warps_m=2, warps_n=4),
}


@pytest.mark.parametrize("group", LOADER_GROUPS)
def test_every_loader_and_layout_verifies_bit_identically(group, arch, tmp_path):
    """All loader pairs (x1/x2/x4/manual for A and for B) and both B layouts of one kernel verify, and
    their C are bit-identical: every loader fills the same registers and the MMA order is fixed."""
    base = dict(LOADER_GROUPS[group], stages=2, cache_op="cg")
    if ARCHS[arch].sm < 89 and base["precision"].startswith("fp8"):
        pytest.skip(f"{base['precision']} needs sm_89")
    specs = _variants(arch, base)
    # 16-bit: 4 x 4 loaders x 2 layouts; 8-/4-bit: 4 x 4 with B stored N x K, 4 x manual with K x N
    assert len(specs) == (32 if base["precision"] in ("fp16", "bf16") else 20)
    m, n, k = 2 * base["bm"], 3 * base["bn"], 6 * base["ktile"]
    first = None
    for s in specs:
        c, _, res = _run(s, m, n, k, 1234, tmp_path)
        assert res.ok, f"{s.entry}: {res.message()}"
        if not s.prec.is_float:
            assert res.max_error == 0.0
        if first is None:
            first = (s.entry, c)
        else:
            assert _same_bits(first[1], c), f"{s.entry} differs from {first[0]}"


def test_cache_operators(arch, tmp_path):
    """.ca and .cg verify and give bit-identical C."""
    first = None
    for op in ("cg", "ca"):
        s = _spec(arch, precision="bf16", cache_op=op, stages=3)
        c, _, res = _run(s, 128, 192, 256, 7, tmp_path)
        assert res.ok, f"{s.entry}: {res.message()}"
        first = first or (s.entry, c)
        assert _same_bits(first[1], c), f"{s.entry} differs from {first[0]}"


@pytest.mark.parametrize("precision, ktile, mma_k, tile", [
    ("fp16", 64, 16, (128, 256, 2, 4)),      # 128-byte rows (swizzle 0, 7), the H200 preset's kernel
    ("bf16", 128, 16, (64, 64, 2, 2)),       # 256-byte rows
    ("int8", 64, 32, (32, 64, 2, 4)),        # 64-byte rows (swizzle 1, 3)
    ("int8", 128, 32, (128, 256, 2, 4)),
    ("fp8_e4m3", 32, 32, (64, 64, 2, 2)),    # 32-byte rows (swizzle 2, 1)
    ("int4", 128, 64, (64, 64, 2, 2)),
])
def test_swizzled_shared_memory_verifies_bit_identically(arch, tmp_path, precision, ktile, mma_k, tile):
    """smem_layout=swizzled verifies (integers exactly) and gives the same bits in C as padded rows,
    three block rows and columns and six K tiles through a 3-stage ring."""
    bm, bn, wm, wn = tile
    out = []
    for layout in ("padded", "swizzled"):
        s = _spec(arch, precision=precision, ktile=ktile, mma_k=mma_k, bm=bm, bn=bn, warps_m=wm, warps_n=wn,
                  stages=3, loader_a="x4", loader_b="x4", smem_layout=layout)
        c, _, res = _run(s, 3 * bm, 3 * bn, 6 * ktile, 99, tmp_path)
        assert res.ok, f"{s.entry}: {res.message()}"
        if not s.prec.is_float:
            assert res.max_error == 0.0
        out.append((s.entry, c))
    assert _same_bits(out[0][1], out[1][1]), f"{out[1][0]} differs from {out[0][0]}"


def test_l2_hints(arch, tmp_path):
    """Every L2 eviction priority for A and for B verifies, through 1..4 stages. Each kernel runs in the
    GPU worker process, so that a fault fails this test only. (The 3-stage kernels raised
    cudaErrorIllegalInstruction on an H200 before the template kept its refill address per thread:
    see test_assemble.FAULTING_SASS.)"""
    from experiments.families.mma_sync.render import render
    from experiments.gpu.worker import GpuWorker
    worker = GpuWorker()
    timing = dict(warmup=1, batches=1, min_batch_ms=0.1, max_launches=1, cuda_graph=False, l2_flush=False)
    try:
        for (op, ha, hb), stages in itertools.product(
                [("cg", "evict_first", "evict_last"), ("ca", "evict_last", "evict_first"),
                 ("cg", "evict_normal", "none"), ("ca", "none", "evict_normal")], (1, 2, 3, 4)):
            s = _spec(arch, precision="bf16", cache_op=op, l2_hint_a=ha, l2_hint_b=hb, stages=stages)
            ptx = render(s)
            path = tmp_path / f"{s.entry}.ptx"
            path.write_text(ptx)
            res = worker.call("measure_family", timeout=120, **_family_call(s, ptx),
                              m=128, n=192, k=256, timing=timing, rtol=1e-3, seed=7)
            assert res["verified"], f"{s.entry}: {res['verify_message']}"
    finally:
        worker.stop()


@pytest.mark.parametrize("mma_k, ktile, k", [(16, 32, 256), (8, 16, 1024)])
def test_f16_accumulation(arch, tmp_path, mma_k, ktile, k):
    """acc=f16: C is fp16 in memory and within the f16-accumulation bound of dtypes.tolerance."""
    from experiments.dtypes import tolerance
    s = _spec(arch, ktile=ktile, mma_k=mma_k, acc="f16")
    c, ops, res = _run(s, 128, 128, k, 3, tmp_path)
    assert c.dtype == np.float16
    assert res.ok and res.tolerance == tolerance("fp16", "f16", k, 1e-3), res.message()
    assert res.max_error > 0      # f16 rounding is visible: this is not the f32 kernel


@pytest.mark.parametrize("precision", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_verifies_against_exact_decoding(arch, tmp_path, precision):
    """Operands are random finite FP8 bit patterns, the reference their exact values (verify.fp8_values)."""
    if ARCHS[arch].sm < 89:
        pytest.skip("FP8 mma.sync needs sm_89")
    s = _spec(arch, precision=precision, ktile=64, mma_k=32, bm=128, bn=128, warps_m=2, warps_n=4, stages=3)
    _, ops, res = _run(s, 256, 384, 512, 11, tmp_path)
    assert res.ok, res.message()
    assert float(abs(ops.a_ref).max()) > 100          # large and small magnitudes both occur


def test_stages_up_to_the_shared_memory_limit(arch, tmp_path):
    """Pipeline depths 1, 2, 3, 7 and the largest that fits (or 65) give bit-identical C; K holds more
    K tiles than the deepest pipeline, so the stage ring wraps."""
    probe = _spec(arch, ktile=16, mma_k=16, stages=1)
    deepest = min(MAX_STAGES, ARCHS[arch].max_smem_block // probe.stage_bytes)
    first = None
    for stages in sorted({1, 2, 3, 7, deepest}):
        s = dataclasses.replace(probe, stages=stages, ptx_version=(0, 0))
        c, _, res = _run(s, 128, 128, 16 * (deepest + 5), 21, tmp_path)
        assert res.ok, f"{s.entry}: {res.message()}"
        first = first or (s.entry, c)
        assert _same_bits(first[1], c), f"{s.entry} differs from {first[0]}"


def test_measure_in_the_worker_with_row_b_and_f16_c(arch, tmp_path):
    """worker.measure_family (the default family's prepare) lays B out as the spec says and allocates C
    in the accumulator's dtype."""
    from experiments.dtypes import tolerance
    from experiments.families.mma_sync.render import render
    from experiments.gpu.worker import GpuWorker
    s = _spec(arch, b_layout="row", loader_b="x4", acc="f16")
    ptx = render(s)
    (tmp_path / "k.ptx").write_text(ptx)
    timing = dict(warmup=1, batches=3, min_batch_ms=1.0, max_launches=10, cuda_graph=True, l2_flush=False)
    w = GpuWorker()
    try:
        res = w.call("measure_family", 120, **_family_call(s, ptx),
                     m=128, n=128, k=512, timing=timing, rtol=1e-3, seed=5)
    finally:
        w.stop()
    assert res["verified"], res["verify_message"]
    assert res["verify_rtol"] == tolerance("fp16", "f16", 512, 1e-3)
    assert res["timing"]["median_us"] > 0


def test_a_small_kernel_times_the_same_whatever_the_process_ran_before(arch, tmp_path):
    """Five timings of one 512 x 512 x 512 kernel in one process, each after a direct launch (as
    verification makes): the medians agree within 1 %. Warming up by direct launches on the timing
    stream made every timing after the first about 0.17 us per launch slower on an H200 (+3.5 %
    for a 5 us kernel), so one-process and parallel sweeps disagreed on small kernels."""
    import cupy

    from experiments.gpu.launch import GemmLaunch, load_kernel
    from experiments.families.mma_sync.render import render
    from experiments.gpu.timing import time_launches
    from experiments.gpu.verify import make_operands
    s = _spec(arch, bm=64, bn=64)
    ptx = render(s)
    (tmp_path / "k.ptx").write_text(ptx)
    kern = load_kernel(ptx, str(tmp_path / "k.ptx"), s.entry, s.smem_bytes)
    ops = make_operands(s.precision, 512, 512, 512, 1)
    c = cupy.empty((512, 512), dtype=np.float32)
    launch = GemmLaunch(kern, s, ops.a, ops.b, c, 512, 512, 512)
    medians = []
    for _ in range(5):
        launch()
        cupy.cuda.Device().synchronize()
        medians.append(time_launches(launch, warmup=3, batches=5, min_batch_ms=10.0)["median_us"])
    assert max(medians) / min(medians) - 1 < 0.01, medians


def test_the_hosts_enqueue_time_is_not_timed_and_a_gate_that_timed_out_refuses_the_batch(arch,
                                                                                        monkeypatch):
    """The gate holds a stream until released. A host that takes 0.2 s to enqueue each batch (the
    gate released late) leaves the per-launch median as it was (without the gate the 0.2 s would be
    part of the batch, +0.2 s / L per launch); when the gate's timeout (here 0.05 s) passes first,
    the batch is refused with the reason."""
    import time

    import cupy

    from experiments.gpu import timing
    gate, stream, after = timing._Gate.get(), cupy.cuda.Stream(non_blocking=True), cupy.cuda.Event()
    gate.hold(stream)
    after.record(stream)
    time.sleep(0.1)
    assert not after.done                       # the stream waits behind the closed gate
    gate.release()
    after.synchronize()
    assert not gate.timed_out()
    out = cupy.zeros(1 << 20, dtype=cupy.float32)
    launch = lambda: out.fill(1)  # noqa: E731
    kw = dict(warmup=2, batches=3, min_batch_ms=2.0)
    quick = timing.time_launches(launch, **kw)
    release = timing._Gate.release
    monkeypatch.setattr(timing._Gate, "release", lambda self: (time.sleep(0.2), release(self))[1])
    slow = timing.time_launches(launch, **kw)
    assert slow["median_us"] < 1.2 * quick["median_us"], (quick, slow)
    assert 0.2e6 / slow["launches_per_batch"] > 10 * quick["median_us"]     # what it would have added
    monkeypatch.setattr(timing, "GATE_TIMEOUT_S", 0.05)
    monkeypatch.setattr(timing._Gate, "_by_device", {})
    with pytest.raises(RuntimeError, match="took more than 0.05 s to enqueue one timed batch of 16 launches"):
        timing.time_launches(launch, **kw)


def test_a_graph_that_blocks_its_launch_behind_the_gate_is_timed_with_fewer_launches(arch):
    """cuBLAS int8 at 2048 on an H200: its CUDA graph of ~1,300 launches blocked the host behind the closed
    gate until the gate's 2 s timeout, so the run failed in every generations sweep; it is timed with a
    quarter of the launches instead, and verifies exactly."""
    from experiments import families
    from experiments.gpu.timing import time_launches
    fam = families.get("cublas")
    spec = fam.spec("int8", {}, arch)
    prep = fam.prepare(spec, fam.build(spec), 2048, 2048, 2048, seed=1)
    res = time_launches(prep.launch, batches=3)
    assert res["batches"] == 3 and len(res["batch_us"]) == 3 and 0 < res["median_us"] < 1000
    assert prep.verify().ok and prep.verify().max_error == 0


def test_warm_up_pays_the_first_call_costs_under_the_gpu_lock(tmp_path, monkeypatch):
    """worker.warm_up answers the device and leaves the GPU's lock free; it waits for a holder."""
    import tempfile
    import threading
    import time

    from experiments.gpu.worker import GpuWorker, gpu_lock, nvml_gpu
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))      # locks of this test only (here
    monkeypatch.setenv("TMPDIR", str(tmp_path))                   # and in the worker it spawns)
    bus = nvml_gpu()["pci_bus_id"]
    w = GpuWorker()
    try:
        held = threading.Event()

        def hold():
            with gpu_lock(bus):
                held.set()
                time.sleep(1.5)
        t = threading.Thread(target=hold)
        t.start()
        held.wait(10)
        t0 = time.time()
        w.submit("warm_up", pci_bus_id=bus)
        info = w.wait("warm_up", 120)
        waited = time.time() - t0
        t.join()
    finally:
        w.stop()
    assert info["sm_count"] > 0 and info["pci_bus_id"]
    assert waited > 1.0                 # it took the lock after the holder (1.5 s) let it go
    with gpu_lock(bus):                 # and let it go itself
        pass


def test_int4_nibble_order_pairs_equal_k(arch, tmp_path):
    """A nonzero only at even k, B only at odd k: C must be exactly 0; same parity: not 0."""
    import cupy
    from experiments.gpu.launch import GemmLaunch, load_kernel
    from experiments.families.mma_sync.render import render
    from experiments.gpu.verify import pack_int4
    spec = KernelSpec("int4", 64, 64, 128, 128, 2, 4, 2, "cg", arch)
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


def test_jit_failure_shows_driver_log(arch, tmp_path):
    from experiments.gpu.launch import PtxJitError, load_kernel
    from experiments.families.mma_sync.render import render
    spec = _spec(arch)
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


def test_worker_survives_a_faulting_kernel(arch, tmp_path):
    from experiments.families.mma_sync.render import render
    from experiments.gpu.worker import GpuWorker, WorkerError
    spec = KernelSpec("int8", 64, 32, 128, 128, 2, 4, 2, "cg", arch)
    timing = dict(warmup=1, batches=3, min_batch_ms=1.0, max_launches=10, cuda_graph=True, l2_flush=False)
    fault = FAULT_PTX.format(entry=spec.entry).replace(".target sm_90", f".target {arch}").replace(
        ".version 7.8", ".version %d.%d" % spec.ptx_version)
    (tmp_path / "fault.ptx").write_text(fault)
    good = render(spec)
    (tmp_path / "good.ptx").write_text(good)
    w = GpuWorker()
    try:
        with pytest.raises(WorkerError, match="(?i)illegal|address|fault"):
            w.call("measure_family", 120, **_family_call(spec, fault),
                   m=256, n=256, k=256, timing=timing, rtol=1e-3, seed=1)
        res = w.call("measure_family", 120, **_family_call(spec, good),
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
def test_rasterization_groups_cover_every_block(group_m, arch, tmp_path):
    """5 x 3 blocks: the last group of block rows is partial for group_m 2, 3 and 8."""
    spec = KernelSpec("int8", 32, 32, 64, 64, 2, 2, 2, "cg", arch, group_m=group_m)
    _, _, res = _run(spec, 5 * 64, 3 * 64, 256, 99, tmp_path)
    assert res.ok and res.max_error == 0, res.message()


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_k_shorter_than_the_pipeline(stages, arch, tmp_path):
    """K = one K tile: the prologue must not copy tiles past K for any stage count."""
    spec = KernelSpec("fp16", 32, 16, 64, 64, 2, 2, stages, "cg", arch)
    _, _, res = _run(spec, 128, 64, 32, 5, tmp_path)
    assert res.ok, res.message()
