"""The peak family: this GPU's own ceilings, measured with the same timing as every kernel. The option
``instruction`` says which tensor-core instruction a precision's ceiling is measured with.

``instruction`` mma.sync (the default, :data:`MMA`): a register-only loop (``kernels_ptx/peak_mma.ptx.j2``) in
which every warp keeps ``CHAINS`` independent accumulator chains and issues one ``mma.sync.aligned.m16n8kK``
per chain per iteration (PTX ISA 9.0, 9.7.14.5), 256 threads per block, 4 blocks per SM (the
register-only peak of ``results/h200/README.md``). The loop is written out ``UNROLL`` iterations per
trip: with one iteration per trip the loop's branch after every 8 mma.sync cost 13 % of the rate on an
H200 (fp16 555 against 638 TFLOP/s, int8 1,114 against 1,271 TOP/s, same clocks). The launch does a
fixed amount of work, ``units`` of ``iters`` iterations, spread over the grid's warps (warp w takes
units w, w + W, ...), so :meth:`PeakFamily.flops` does not depend on the GPU's SM count; the amount is
chosen so one launch lasts about 1 ms on an H200. A holds 1 and B 1/K (floats) or 1 (integers), so
every mma adds exactly 1 (floats) or K (integers) to each accumulator and the host knows each result.

``feed=ldmatrix`` (mma.sync, the shape of the largest K): the same instruction fed from shared memory the
way the default GEMM family's main loop feeds it at its 64 x 64 warp tile: per K step a warp issues 8
``ldmatrix.x4`` (PTX ISA 9.7.9.26; 4 for A, 4 for B) and 32 mma.sync, fragments double-buffered in
registers, 8 warps per block and one block per SM (the GEMM's 128 x 256 tile holds 8 such warps), no
global memory and no barrier in the loop. It is the ceiling of that main loop: what a GEMM of this
family can reach at most with 64 x 64 warp tiles, below the register-only peak by what the
shared-memory path costs. Shared memory holds one value for A's elements and another for B's, so the
results are known exactly as for the register-only loop. It is reported beside the peak and never
divides pct_of_peak (:func:`experiments.reports.compare.peak_of` takes register-fed runs only).

``instruction=wgmma`` (sm_90a only): Hopper's warpgroup MMA, the instruction the ``wgmma`` GEMM family
issues (``kernels_ptx/peak_wgmma.ptx.j2``; PTX ISA 9.0, 9.7.15). Each warpgroup issues
``wgmma.mma_async.m64n256kK`` with both operands read from shared memory through matrix descriptors
(K-major, 128-byte swizzle, as ``wgmma_gemm.ptx.j2`` builds them), ``WGMMA_GROUP`` wgmma per
``commit_group`` and ``wait_group WGMMA_WAIT`` after each, so that several are in flight;
``WGMMA_WARPGROUPS`` warpgroups per block, one block per SM. A fixed work of ``units`` x ``iters`` wgmma
(2**21: about 1.1 ms at 990 TFLOP/s fp16, 1980 fp8 / int8) is spread over the grid's warpgroups as
above. Every element of A holds one value and every element of B another (the mma.sync peak's words),
so each wgmma adds exactly 1 (floats) or K (int8) to every accumulator whatever the layout. fp8 wgmma
accumulates in a narrower format than f32 (about 14 significant bits; DeepSeek-V3 technical report,
3.3.2): a running sum of thousands of wgmma would lose the increments, so fp8 restarts its
accumulators (scale-d = false) at the first wgmma of every unit and its result is one unit's exact sum;
the unit count is checked by the other precisions, which run the same loop.

Exact clocks: every mma.sync and wgmma peak kernel records, per warp, ``%clock64`` and ``%globaltimer``
at its start and after its last store, and ``%smid`` (``kernels_ptx/peak_clock.ptx.j2``; PTX ISA 9.0,
10: special registers), into a small device buffer that every launch overwrites. After timing, the
record of the last timed launch gives (:func:`kernel_clock`) the MMA instructions each SM issued per
cycle of its own clock, from integer counts (the instructions each warp issues are known, the cycles
are counted by the SM), so a per-clock comparison does not depend on which clock the GPU ran at, and
the SM clock of that launch (cycles / ns), where NVML's samples during the batches only approximate it.

``precision=copy``: device-to-device copy bandwidth (bytes read + written, GB/s), a vectorised PTX copy
kernel or ``cudaMemcpyAsync``. The problem size M, N, K does not apply and is ignored.
"""
from __future__ import annotations

import math

import numpy as np

from ..dtypes import Accum, DType
from ..hardware import ARCHS
from .base import Build, Family, FamilySpec, Prepared, Rule, SpecError, render_template, sm_of
from .wgmma import ARCH as WGMMA_ARCH
from .wgmma import SWIZZLES
from .wgmma import TYPES as WGMMA_TYPES
from .wgmma import wgmma_types

__all__ = ["PeakFamily", "operand_words", "expected_accumulators", "expected_wgmma",
           "expected_fed", "FEEDS", "wgmma_smem_bytes", "wgmma_restarts", "THREADS", "CHAINS", "INSTRUCTIONS",
           "WGMMA_N", "CLOCK_RECORD", "mma_per_warp", "kernel_clock"]

MMA = "mma_sync"            # instruction mma.sync: its value in params, named as the default family is
INSTRUCTIONS = (MMA, "wgmma")
FEEDS = ("registers", "ldmatrix")
# feed=ldmatrix: (iters = K steps per unit, units): 2**17 x 32 x 32 mma = 1.3e8 mma per launch as the
# register-only loop; one block of THREADS per SM, 32 accumulator tiles (64 x 64) per warp
FED_WORK, FED_TILES = (32, 1 << 17), 32
THREADS, BLOCKS_PER_SM, CHAINS, UNROLL = 256, 4, 8, 16
# (iters, units): ~1.3e8 mma per launch where the type is native. s4 on sm_90 (and, assumed, later
# archs) is emulated by ptxas with integer code, ~50x fewer mma per second (results/h200/README.md):
# ~2e6 mma, one chain step per unit
NATIVE_WORK, EMULATED_WORK = (16, 1 << 20), (1, 1 << 18)
# archs whose SASS of mma.sync .e4m3 is F2FP.F16.E4M3.UNPACK_B + HMMA.16816, no QMMA (ptxas 13.0)
NO_FP8_MMA = (90, 100)
COPY_BYTES, COPY_UNROLL, COPY_BLOCKS_PER_SM, COPY_CACHE = 1 << 30, 8, 2, ("", ".cs")
# instruction=wgmma: m64nNkK per warpgroup; warpgroups per block (one block per SM), wgmma per commit
# group, groups left in flight by wait_group (on an H200 the 36 structures of
# tests/test_families_gpu.py::test_wgmma_peak_structures lie within 4 % of each other, power-capped;
# that test fails when this one is slower than the fastest beyond 3 % and the measured spread);
# (iters = wgmma per unit, units): 2**21 wgmma per launch
WGMMA_N, WGMMA_WARPGROUPS, WGMMA_GROUP, WGMMA_WAIT = 256, 2, 4, 1
WGMMA_WORK = (32, 1 << 16)
WGMMA_SWIZZLE, WGMMA_ALIGN = 128, 1024          # bytes of a shared-memory row; alignment slack
# what each warp of an mma.sync or wgmma peak launch records, one u64 each (kernels_ptx/peak_clock.ptx.j2)
CLOCK_RECORD = ("clock_start", "clock_end", "ns_start", "ns_end", "smid")


def _wgmma_shape(precision: str) -> str:
    return f"m64n{WGMMA_N}k{WGMMA_TYPES[precision].wgmma_k}"


def _mma_rule(precision, p, arch):
    if precision == "copy" or p.get("instruction") == "wgmma":
        return None
    shapes = [f"m16n8k{k}" for k in DType[precision].mma_k]
    if p["mma"] not in shapes:
        return f"mma={p['mma']} is not valid with precision={precision}; valid: auto, {', '.join(shapes)}"
    if sm_of(arch) < DType[precision].min_arch:
        return f"mma.sync with {precision} needs sm_{DType[precision].min_arch} or later, not {arch}"
    if DType[precision].is_fp8 and sm_of(arch) in NO_FP8_MMA:
        folded = ("" if p.get("feed") == "ldmatrix" else ", and with the loop's constant operands it "
                  "computes the product once and adds it in a loop of FADDs")
        return (f"{arch} has no tensor-core instruction for mma.sync on fp8 (ptxas converts to f16 for "
                f"HMMA){folded}: no ceiling to measure; the fp16 peak bounds these kernels")
    return None


def _feed_rule(precision, p, arch):
    if p.get("feed", "registers") == "registers":
        return None
    largest = f"m16n8k{DType[precision].mma_k[-1]}"
    if p["mma"] != largest:
        return (f"feed=ldmatrix uses the shape of the largest K, as the {MMA} GEMMs do: mma={largest} "
                f"(or auto), not {p['mma']}")
    if precision == "int4" and sm_of(arch) >= 90:
        return f"{arch} emulates s4 mma.sync with integer code: no shared-memory feed to measure"
    return None


def _wgmma_rule(precision, p, arch):
    if p.get("instruction") != "wgmma" or arch == WGMMA_ARCH:
        return None
    return (f"instruction=wgmma needs target.arch={WGMMA_ARCH}, not {arch}: wgmma.mma_async exists only for "
            f"the arch-specific target {WGMMA_ARCH} (sm_89 and earlier have no warpgroup MMA, sm_100 and "
            f"later replace it with tcgen05); target.arch auto and sm_90 resolve to {WGMMA_ARCH}")


def operand_words(precision: str, k: int) -> tuple[int, int, float]:
    """(A word, B word, increment): the 32-bit registers of the A and B fragments (one element value
    repeated) and what one m16n8kK mma (or m64nNkK wgmma) adds to each accumulator. Floats: A = 1,
    B = 2**-log2(K), increment 1.0; integers: A = B = 1, increment K. fp8 e4m3 (bias 7, 3 mantissa
    bits): 1.0 = 0x38, 2**-e = (7 - e) << 3; e5m2 (bias 15, 2 mantissa bits): 1.0 = 0x3C,
    2**-e = (15 - e) << 2."""
    d = DType[precision]
    if precision == "fp16":
        one, frac = (int(np.array([v], np.float16).view(np.uint16)[0]) for v in (1.0, 1.0 / k))
    elif precision == "bf16":
        one, frac = (int(np.array([v], np.float32).view(np.uint32)[0]) >> 16 for v in (1.0, 1.0 / k))
    elif d.is_fp8:                              # exponent field bias + e, mantissa 0
        bias = (1 << (d.ebits - 1)) - 1
        one, frac = bias << d.mbits, (bias - int(np.log2(k))) << d.mbits
    else:
        one = frac = 1
    rep = lambda x: sum(x << (d.bits * i) for i in range(32 // d.bits))  # noqa: E731
    inc = 1.0 if d.is_float else float(k)
    return rep(one), rep(frac), inc


def _k(spec: FamilySpec) -> int:
    return int(spec.p["mma"].split("k")[1])


def _acc_dtype(precision: str):
    return Accum[DType[precision].acc].np_dtype


def _units_done(p: dict, workers: int, xp):
    """Units each of ``workers`` warps (warpgroups) does: units w, w + W, ... below p["units"]."""
    w = xp.arange(workers, dtype=np.int64)
    return p["units"] // workers + (w < p["units"] % workers)


def expected_accumulators(spec: FamilySpec, warps: int, xp=np):
    """Exact result of one mma.sync launch with ``warps`` warps: array (32 * warps, 4 * chains) of the
    accumulator dtype; thread t's chain c holds c + (units warp t // 32 did) * iters * increment."""
    p = spec.p
    _, _, inc = operand_words(spec.precision, _k(spec))
    per_warp = _units_done(p, warps, xp) * p["iters"] * int(inc)
    chain = xp.repeat(xp.arange(p["chains"], dtype=np.int64), 4)
    out = xp.repeat(per_warp, 32)[:, None] + chain[None, :]
    return out.astype(_acc_dtype(spec.precision))


def expected_fed(spec: FamilySpec, warps: int, xp=np):
    """Exact result of one feed=ldmatrix launch with ``warps`` warps: array (32 * warps, 4 * 32) of the
    accumulator dtype; thread t's tile i (4 registers) holds i + (units warp t // 32 did) * iters *
    increment (one mma per tile per K step)."""
    p = spec.p
    _, _, inc = operand_words(spec.precision, _k(spec))
    per_warp = _units_done(p, warps, xp) * p["iters"] * int(inc)
    tile = xp.repeat(xp.arange(FED_TILES, dtype=np.int64), 4)
    return (xp.repeat(per_warp, 32)[:, None] + tile[None, :]).astype(_acc_dtype(spec.precision))


def wgmma_restarts(precision: str) -> bool:
    """Whether the wgmma peak restarts its accumulators every unit: fp8 (narrow accumulation)."""
    return DType[precision].narrow_rtol > 0


def expected_wgmma(spec: FamilySpec, warpgroups: int, xp=np):
    """Exact result of one instruction=wgmma launch with ``warpgroups`` warpgroups in the grid: array
    (128 * warpgroups, N / 2) of the accumulator dtype (f32, s32 for int8). Thread t's register i holds
    i + (units warpgroup t // 128 did) * iters * increment; for fp8 (restarted every unit) iters *
    increment where the warpgroup did a unit, else i."""
    p = spec.p
    _, _, inc = operand_words(spec.precision, _k(spec))
    done = xp.repeat(_units_done(p, warpgroups, xp), 128)[:, None]
    reg = xp.arange(WGMMA_N // 2, dtype=np.int64)[None, :]
    unit = p["iters"] * int(inc)
    out = (done > 0) * unit + (done == 0) * reg if wgmma_restarts(spec.precision) else reg + done * unit
    return out.astype(_acc_dtype(spec.precision))


def mma_per_warp(spec: FamilySpec, warps: int, xp=np):
    """MMA instructions each of the ``warps`` warps of one launch issues (int64 array, grid warp
    order): units done x iters x chains (register-only mma.sync), x 32 tiles (feed=ldmatrix); for
    instruction=wgmma (``warps`` = 4 x warpgroups) a warpgroup's wgmma count on its first warp, 0 on
    the other three (a wgmma is one instruction of the warpgroup)."""
    p = spec.p
    if p.get("instruction") == "wgmma":
        out = xp.zeros(warps, dtype=np.int64)
        out[::4] = _units_done(p, warps // 4, xp) * p["iters"]
        return out
    per_iter = FED_TILES if p.get("feed") == "ldmatrix" else p["chains"]
    return _units_done(p, warps, xp) * p["iters"] * per_iter


def kernel_clock(record, mma) -> dict:
    """Exact cycle figures of one launch from its clock record (array (warps, 5) of
    :data:`CLOCK_RECORD`, as the kernel wrote it) and the MMA instructions each warp issued
    (:func:`mma_per_warp`). Per SM, its span is from the first start to the last end of the warps that
    ran there, in that SM's cycles and in ns; the SM's MMAs are its warps' sum. Returns
    ``mma_per_sm_cycle`` (all SMs' MMAs / all SMs' cycles: MMA instructions per SM per cycle of the SM's
    own clock), ``mma_per_sm_cycle_min`` / ``_max`` (of single SMs), ``kernel_cycles`` (the longest
    SM span, cycles), ``kernel_sms`` (SMs that ran warps) and ``sm_clock_mhz_kernel`` (all SMs' cycles
    / all SMs' ns x 1000: the mean SM clock of the launch, MHz; %globaltimer may advance in steps of up
    to 1 us, about 0.1 % of a 1 ms launch). Raises ValueError naming the warps whose record is missing
    (end not after start: the launch did not finish, or the kernel records no clocks)."""
    rec = np.asarray(record).astype(np.int64)
    if rec.ndim != 2 or rec.shape[1] != len(CLOCK_RECORD) or len(rec) != len(mma):
        raise ValueError(f"clock record of shape {rec.shape} for {len(mma)} warps; expected "
                         f"({len(mma)}, {len(CLOCK_RECORD)}): {', '.join(CLOCK_RECORD)}")
    c0, c1, t0, t1, sm = rec.T
    bad = np.flatnonzero((c1 <= c0) | (t1 < t0) | (t0 <= 0))
    if bad.size:
        words = dict(zip(CLOCK_RECORD, rec[bad[0]].tolist(), strict=True))
        raise ValueError(f"{bad.size} of {len(rec)} warps have no clock record (first: warp {bad[0]}, "
                         f"{words}): the launch did not finish or its kernel does not record clocks")
    ids, at = np.unique(sm, return_inverse=True)

    def per_sm(values, ufunc, start):         # ufunc (minimum, maximum, add) over each SM's warps
        out = np.full(len(ids), start, np.int64)
        ufunc.at(out, at, values)
        return out
    big = np.iinfo(np.int64).max
    cycles = per_sm(c1, np.maximum, 0) - per_sm(c0, np.minimum, big)
    ns = per_sm(t1, np.maximum, 0) - per_sm(t0, np.minimum, big)
    issued = per_sm(np.asarray(mma, dtype=np.int64), np.add, 0)
    rate = issued / cycles
    out = {"mma_per_sm_cycle": float(issued.sum() / cycles.sum()), "mma_per_sm_cycle_min": float(rate.min()),
           "mma_per_sm_cycle_max": float(rate.max()), "kernel_cycles": int(cycles.max()),
           "kernel_sms": len(ids)}
    if ns.sum() > 0:
        out["sm_clock_mhz_kernel"] = float(1000.0 * cycles.sum() / ns.sum())
    return out


def wgmma_smem_bytes(spec: FamilySpec) -> int:
    """Dynamic shared memory of an instruction=wgmma block: 1024 (alignment) + A (64 rows per
    warpgroup) + B (N rows), 128 bytes per row."""
    return WGMMA_ALIGN + (64 * spec.p["warpgroups"] + WGMMA_N) * WGMMA_SWIZZLE


def _clock_buffer(spec: FamilySpec, warps: int):
    """(device buffer of the kernel's clock record, zeroed; a function that waits for the device and
    returns :func:`kernel_clock` of the launch that wrote the buffer last)."""
    import cupy
    buf = cupy.zeros((warps, len(CLOCK_RECORD)), dtype=cupy.uint64)

    def read() -> dict:
        cupy.cuda.Device().synchronize()
        return kernel_clock(buf.get(), mma_per_warp(spec, warps))
    return buf, read


def _literal(value: int, acc: str) -> str:
    return f"0f{np.array([value], '>f4').tobytes().hex().upper()}" if acc == "f32" else str(value)


class PeakFamily(Family):
    """``family=peak``: precision = an mma type (``mma`` = its shape, auto = the largest K of mma.sync,
    or m64n256kK with ``instruction=wgmma``) or ``copy`` (``copy`` = kernel or memcpy, auto = kernel)."""
    name = "peak"
    title = "peak measurement"
    axes = {"precision": tuple(DType.__members__) + ("copy",),
            "mma": ("auto", "m16n8k8", "m16n8k16", "m16n8k32", "m16n8k64", "m64n256k16", "m64n256k32"),
            "copy": ("auto", "kernel", "memcpy"),
            "instruction": INSTRUCTIONS,
            "feed": FEEDS}
    defaults = {"mma": "auto", "copy": "auto", "instruction": MMA, "feed": "registers"}
    rules = (Rule("mma", "the shapes mma.sync offers per type; fp8 from sm_89", _mma_rule),
             Rule("feed", "feed=ldmatrix: mma.sync at the largest K, where the type is native", _feed_rule),
             Rule("wgmma", "wgmma.mma_async exists only on sm_90a (auto and sm_90 resolve to it)",
                  _wgmma_rule))
    sized = False
    tensor_cores = True
    data_kinds = ("full",)
    data_why = "its kernels hold fixed operand words (A = 1, B = 1/K or 1) so that every result is known"

    def padding_refusal(self, spec: FamilySpec) -> str:
        """Its grids are sized to the blocks resident at once (launch.blocks_per_sm)."""
        return ("a peak kernel's grid is the blocks that are resident at once (a fixed number per SM, "
                "its clocks measured over them), so a cap would change the work of a wave, not the "
                "occupancy of a fixed launch")

    def spec(self, precision: str, options: dict, arch: str) -> FamilySpec:
        """As :meth:`Family.spec`; with ``instruction=wgmma`` target.arch auto and sm_90 resolve to
        sm_90a (any other arch is refused by the rule ``wgmma``)."""
        opts = dict(options or {})
        if str(opts.get("instruction", MMA)) == "wgmma" and str(arch) in ("auto", "sm_90"):
            arch = WGMMA_ARCH
        return super().spec(precision, opts, arch)

    def threads(self, spec: FamilySpec) -> int:
        """256 (the copy and the mma.sync loop), 128 per warpgroup (wgmma); 0 for memcpy."""
        if spec.p.get("instruction") == "wgmma":
            return 128 * spec.p["warpgroups"]
        return 0 if spec.p.get("copy") == "memcpy" else THREADS

    def dyn_smem(self, spec: FamilySpec) -> int:
        """:func:`wgmma_smem_bytes` for instruction=wgmma, else 0."""
        return wgmma_smem_bytes(spec) if spec.p.get("instruction") == "wgmma" else 0

    def resolve(self, precision, params, arch):
        """Drop the axis that does not apply (mma for copy, copy for mma types; only "auto" is
        accepted there, and instruction for mma.sync and feed for registers, so those specs are as
        before the options existed), resolve "auto" and add the work size (and, for wgmma, the loop's
        structure)."""
        wgmma = params.pop("instruction") == "wgmma"
        if (feed := params.pop("feed")) != "registers" and (wgmma or precision == "copy"):
            why = ("precision=copy has no operands to feed" if precision == "copy" else
                   "instruction=wgmma reads shared memory itself")
            raise SpecError(f"family=peak feed={feed} applies to the mma.sync loop only: {why}; valid here: "
                            "registers")
        if wgmma and precision not in WGMMA_TYPES:
            raise SpecError(f"family=peak instruction=wgmma has no precision={precision}; "
                            f"valid: {', '.join(WGMMA_TYPES)}")
        unused = "mma" if precision == "copy" else "copy"
        if (value := params.pop(unused)) != "auto":
            raise SpecError(f"family=peak {unused}={value} applies to "
                            f"{'the mma types' if unused == 'mma' else 'precision=copy'} only; "
                            f"with precision={precision} valid: auto")
        if precision == "copy":
            return {"copy": "kernel" if params["copy"] == "auto" else params["copy"], "bytes": COPY_BYTES}
        if wgmma:
            shape = _wgmma_shape(precision)
            if params["mma"] not in ("auto", shape):
                raise SpecError(f"family=peak mma={params['mma']} is not valid with instruction=wgmma "
                                f"precision={precision}; valid: auto, {shape}")
            iters, units = WGMMA_WORK
            return {"instruction": "wgmma", "mma": shape, "warpgroups": WGMMA_WARPGROUPS,
                    "group": WGMMA_GROUP, "wait": WGMMA_WAIT, "iters": iters, "units": units}
        if params["mma"] == "auto":
            params["mma"] = f"m16n8k{DType[precision].mma_k[-1]}"
        if feed == "ldmatrix":
            return {"mma": params["mma"], "feed": feed, "iters": FED_WORK[0], "units": FED_WORK[1]}
        emulated = precision == "int4" and sm_of(arch) >= 90
        iters, units = EMULATED_WORK if emulated else NATIVE_WORK
        return {**params, "chains": CHAINS, "iters": iters, "units": units}

    def flops(self, spec: FamilySpec, m: int = 0, n: int = 0, k: int = 0) -> int:
        """Work of one launch, whatever M, N, K: bytes read + written for copy, units * iters * 2 * 64
        * N * K for wgmma, units * iters * 32 tiles * 2 * 16 * 8 * K for feed=ldmatrix, else units * iters
        * chains * 2 * 16 * 8 * K operations."""
        p = spec.p
        if spec.precision == "copy":
            return 2 * p["bytes"]
        if p.get("instruction") == "wgmma":
            return p["units"] * p["iters"] * 2 * 64 * WGMMA_N * _k(spec)
        if p.get("feed") == "ldmatrix":
            return p["units"] * p["iters"] * FED_TILES * 2 * 16 * 8 * _k(spec)
        return p["units"] * p["iters"] * p["chains"] * 2 * 16 * 8 * _k(spec)

    def unit(self, spec: FamilySpec) -> str:
        return "GB/s" if spec.precision == "copy" else super().unit(spec)

    def build(self, spec: FamilySpec) -> Build:
        """The kernel's PTX, no GPU needed: ``peak_mma.ptx.j2`` for the mma.sync loop and the copy,
        ``peak_wgmma.ptx.j2`` for instruction=wgmma (:meth:`_build_wgmma`); kind "none" for memcpy."""
        p = spec.p
        if spec.precision == "copy":
            if p["copy"] == "memcpy":
                return Build("none", "", spec.entry)
            src = render_template("peak_mma.ptx.j2", kind="copy", entry=spec.entry, T=THREADS,
                                  version="%d.%d" % ARCHS[spec.arch].min_ptx, arch=spec.arch,
                                  unroll=COPY_UNROLL, ld_cache=COPY_CACHE[0], st_cache=COPY_CACHE[1],
                                  vec=[[f"%v{4 * j + i}" for i in range(4)] for j in range(COPY_UNROLL)])
            return Build("ptx", src, spec.entry)
        if p.get("instruction") == "wgmma":
            return Build("ptx", self._build_wgmma(spec), spec.entry)
        d = DType[spec.precision]
        ptype, bits, acc, min_ptx = d.ptx, d.bits, d.acc, d.min_ptx
        k = _k(spec)
        a_regs, b_regs = 16 * k * bits // 1024, 8 * k * bits // 1024
        mma_op = f"mma.sync.aligned.{p['mma']}.row.col.{acc}.{ptype}.{ptype}.{acc}"
        version = "%d.%d" % max(min_ptx, ARCHS[spec.arch].min_ptx)
        if p.get("feed") == "ldmatrix":
            src = render_template("peak_mma.ptx.j2", kind="mma_ldmatrix", entry=spec.entry, T=THREADS,
                                  arch=spec.arch, version=version, mma_op=mma_op, acc_reg=acc,
                                  iters=p["iters"], units=p["units"],
                                  init=[_literal(t, acc) for t in range(FED_TILES)])
            return Build("ptx", src, spec.entry)
        src = render_template(
            "peak_mma.ptx.j2", kind="mma", entry=spec.entry, T=THREADS, arch=spec.arch, version=version,
            mma_op=mma_op, acc_reg=acc,
            a_regs=a_regs, b_regs=b_regs, chains=p["chains"],
            init=[_literal(c, acc) for c in range(p["chains"])], iters=p["iters"],
            unroll=math.gcd(p["iters"], UNROLL),
            units=p["units"], a_list=[f"%a{i}" for i in range(a_regs)],
            b_list=[f"%b{i}" for i in range(b_regs)],
            acc_lists=[[f"%d{4 * c + r}" for r in range(4)] for c in range(p["chains"])])
        return Build("ptx", src, spec.entry)

    def _build_wgmma(self, spec: FamilySpec) -> str:
        """PTX of the wgmma loop (PTX ISA 9.0, 9.7.15: wgmma.mma_async with shared-memory matrix
        descriptors, wgmma.fence / commit_group / wait_group; 9.7.13.4: fence.proxy.async). The
        descriptors are the wgmma family's for a 128-byte swizzle (layout 1, SBO 1024 bytes, LBO 1).
        Raises SpecError when ``group`` does not divide ``iters``."""
        p = spec.p
        (types, tail), acc = wgmma_types(spec.precision), WGMMA_TYPES[spec.precision].acc
        if p["iters"] % p["group"]:
            raise SpecError(f"{spec.entry}: group={p['group']} must divide iters={p['iters']}")
        desc_hi = (SWIZZLES[WGMMA_SWIZZLE][1] << 62) | ((8 * WGMMA_SWIZZLE >> 4) << 32) | (1 << 16)
        nacc = WGMMA_N // 2
        return render_template(
            "peak_wgmma.ptx.j2", entry=spec.entry, version="%d.%d" % ARCHS[WGMMA_ARCH].min_ptx,
            arch=WGMMA_ARCH, T=self.threads(spec), warpgroups=p["warpgroups"],
            wgmma_op=f"wgmma.mma_async.sync.aligned.{p['mma']}.{types}", wgmma_tail=tail, acc_t=acc,
            nacc=nacc, init=[_literal(i, acc) for i in range(nacc)],
            a_bytes=64 * p["warpgroups"] * WGMMA_SWIZZLE, b_bytes=WGMMA_N * WGMMA_SWIZZLE,
            desc_hi=f"0x{desc_hi:016X}",
            ksteps=WGMMA_SWIZZLE // 32, iters=p["iters"], group=p["group"], wait=p["wait"],
            restart=wgmma_restarts(spec.precision), units=p["units"])

    def prepare(self, spec: FamilySpec, build: Build, m: int, n: int, k: int, seed: int) -> Prepared:
        """Ignores M, N, K. mma.sync: grid = 4 blocks per SM x SM count, 256 threads (feed=ldmatrix: one
        block per SM, verified against :func:`expected_fed`); wgmma: one block
        of 128 x warpgroups threads per SM. Outputs poisoned, verified exactly against
        :func:`expected_accumulators` / :func:`expected_wgmma` (every accumulator of every thread);
        copy: dst = ~src (every element wrong until copied), src[i] = i * 2654435761 + seed mod 2**32
        (distinct), verified exactly."""
        import cupy

        from . import gpu
        gpu.check_device(spec)
        if spec.precision == "copy":
            return self._prepare_copy(spec, build, seed)
        a_word, b_word, _ = operand_words(spec.precision, _k(spec))
        if spec.p.get("instruction") == "wgmma":
            smem, grid, threads = wgmma_smem_bytes(spec), gpu.sm_count(), self.threads(spec)
            kern = gpu.load_ptx(build, dyn_smem=smem)
            groups = grid * spec.p["warpgroups"]
            out = gpu.poisoned((groups * 128, WGMMA_N // 2), _acc_dtype(spec.precision))
            clocks, read_clocks = _clock_buffer(spec, groups * 4)
            args = (out, np.uint32(a_word), np.uint32(b_word), clocks)
            note = "wgmma.mma_async loop, both operands in shared memory; M, N, K ignored"
            if wgmma_restarts(spec.precision):
                note += ("; fp8 accumulates below f32 precision: the accumulators restart every unit of "
                         f"{spec.p['iters']} wgmma (verified: one unit's sum)")
            return Prepared(lambda: kern((grid, 1, 1), (threads, 1, 1), args, shared_mem=smem),
                            lambda: gpu.exact_check(out, expected_wgmma(spec, groups, cupy)), note=note,
                            clocks=read_clocks)
        fed = spec.p.get("feed") == "ldmatrix"
        grid, kern = (1 if fed else BLOCKS_PER_SM) * gpu.sm_count(), gpu.load_ptx(build)
        warps = grid * THREADS // 32
        tiles = FED_TILES if fed else spec.p["chains"]          # 4 accumulators each per thread
        out = gpu.poisoned((warps * 32, 4 * tiles), _acc_dtype(spec.precision))
        clocks, read_clocks = _clock_buffer(spec, warps)
        args = (out, np.uint32(a_word), np.uint32(b_word), clocks)
        if fed:
            return Prepared(lambda: kern((grid, 1, 1), (THREADS, 1, 1), args),
                            lambda: gpu.exact_check(out, expected_fed(spec, warps, cupy)),
                            note="mma.sync fed by ldmatrix.x4 from shared memory at a 64 x 64 warp tile, one "
                                 "block of 8 warps per SM; M, N, K ignored", clocks=read_clocks)
        note = "register-only mma.sync loop; M, N, K ignored"
        if spec.precision == "int4" and spec.arch == "sm_90":
            note += "; ptxas emulates s4 mma on sm_90 (no IMMA for s4): this is the emulation's peak"
        return Prepared(lambda: kern((grid, 1, 1), (THREADS, 1, 1), args),
                        lambda: gpu.exact_check(out, expected_accumulators(spec, warps, cupy)), note=note,
                        clocks=read_clocks)

    def _prepare_copy(self, spec: FamilySpec, build: Build, seed: int) -> Prepared:
        import cupy

        from . import gpu
        n32 = spec.p["bytes"] // 4
        src = cupy.arange(n32, dtype=cupy.uint32) * cupy.uint32(2654435761) + cupy.uint32(seed % 2 ** 32)
        dst = ~src
        if spec.p["copy"] == "memcpy":
            rt = cupy.cuda.runtime
            launch = lambda: rt.memcpyAsync(dst.data.ptr, src.data.ptr, spec.p["bytes"],  # noqa: E731
                                            rt.memcpyDeviceToDevice, cupy.cuda.get_current_stream().ptr)
        else:
            kern = gpu.load_ptx(build)
            args = (dst, src, np.uint64(spec.p["bytes"] // 16))
            cgrid = COPY_BLOCKS_PER_SM * gpu.sm_count()
            launch = lambda: kern((cgrid, 1, 1), (THREADS, 1, 1), args)  # noqa: E731
        return Prepared(launch, lambda: gpu.exact_check(dst, src),
                        note="bytes read + written; M, N, K ignored")
