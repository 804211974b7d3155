"""The peak family: this GPU's own ceilings, measured with the same timing as every kernel. ``precision`` =
an ``mma.sync`` type: a register-only loop (``kernels_ptx/peak_mma.ptx.j2``) in which every warp keeps
``CHAINS`` independent accumulator chains and issues one ``mma.sync.aligned.m16n8kK`` per chain per
iteration (PTX ISA 9.0, 9.7.14.5), 256 threads per block, 4 blocks per SM (the register-only peak of
``reference/h200/README.md``). The loop is written out ``UNROLL`` iterations per trip: with one iteration
per trip the loop's branch after every 8 mma.sync cost 13 % of the rate on an H200 (fp16 555 against 638
TFLOP/s, int8 1,114 against 1,271 TOP/s, same clocks). The launch does a fixed amount of work, ``units``
of ``iters`` iterations, spread over the grid's warps (warp w takes units w, w + W, ...), so
:meth:`PeakFamily.flops` does not depend on the GPU's SM count; the amount is chosen so one launch lasts
about 1 ms on an H200. A holds 1 and B 1/K (floats) or 1 (integers), so every mma adds exactly 1 (floats)
or K (integers) to each accumulator and the host knows each result exactly.
``precision=copy``: device-to-device copy bandwidth (bytes read + written, GB/s), a vectorised PTX
copy kernel or ``cudaMemcpyAsync``. The problem size M, N, K does not apply and is ignored.
"""
from __future__ import annotations

import math

import numpy as np

from ..spec import ARCHS
from .base import Build, Family, FamilySpec, Prepared, Rule, SpecError, render_template, sm_of

__all__ = ["PeakFamily", "MMA_TYPES", "operand_words", "expected_accumulators", "THREADS", "CHAINS"]

# precision -> (PTX type, bits, accumulator, K of the m16n8kK shapes, lowest sm, lowest PTX ISA)
MMA_TYPES = {
    "fp16": ("f16", 16, "f32", (8, 16), 80, (7, 0)),
    "bf16": ("bf16", 16, "f32", (8, 16), 80, (7, 0)),
    "int8": ("s8", 8, "s32", (16, 32), 80, (7, 0)),
    "int4": ("s4", 4, "s32", (32, 64), 80, (7, 0)),
    "fp8_e4m3": ("e4m3", 8, "f32", (32,), 89, (8, 4)),
}
THREADS, BLOCKS_PER_SM, CHAINS, UNROLL = 256, 4, 8, 16
# (iters, units): ~1.3e8 mma per launch where the type is native. s4 on sm_90 (and, assumed, later
# archs) is emulated by ptxas with integer code, ~50x fewer mma per second (reference/h200/README.md):
# ~2e6 mma, one chain step per unit
NATIVE_WORK, EMULATED_WORK = (16, 1 << 20), (1, 1 << 18)
# archs whose SASS of mma.sync .e4m3 is F2FP.F16.E4M3.UNPACK_B + HMMA.16816, no QMMA (ptxas 13.0)
NO_FP8_MMA_SYNC = (90, 100)
COPY_BYTES, COPY_UNROLL, COPY_BLOCKS_PER_SM, COPY_CACHE = 1 << 30, 8, 2, ("", ".cs")


def _mma_rule(precision, p, arch):
    if precision == "copy":
        return None
    shapes = [f"m16n8k{k}" for k in MMA_TYPES[precision][3]]
    if p["mma"] not in shapes:
        return f"mma={p['mma']} is not valid with precision={precision}; valid: auto, {', '.join(shapes)}"
    if sm_of(arch) < MMA_TYPES[precision][4]:
        return f"mma.sync with {precision} needs sm_{MMA_TYPES[precision][4]} or later, not {arch}"
    if precision.startswith("fp8") and sm_of(arch) in NO_FP8_MMA_SYNC:
        return (f"{arch} has no tensor-core instruction for mma.sync on fp8 (ptxas converts to f16 for "
                "HMMA), and with the loop's constant operands it computes the product once and adds it in "
                "a loop of FADDs: no ceiling to measure; the fp16 peak bounds these kernels")
    return None


def operand_words(precision: str, k: int) -> tuple[int, int, float]:
    """(A word, B word, increment): the 32-bit registers of the A and B fragments (one element value
    repeated) and what one m16n8kK mma adds to each accumulator. Floats: A = 1, B = 2**-log2(K),
    increment 1.0; integers: A = B = 1, increment K. fp8 e4m3: 1.0 = 0x38, 2**-e = (7 - e) << 3."""
    bits = MMA_TYPES[precision][1]
    if precision == "fp16":
        one, frac = (int(np.array([v], np.float16).view(np.uint16)[0]) for v in (1.0, 1.0 / k))
    elif precision == "bf16":
        one, frac = (int(np.array([v], np.float32).view(np.uint32)[0]) >> 16 for v in (1.0, 1.0 / k))
    elif precision == "fp8_e4m3":
        one, frac = 7 << 3, (7 - int(np.log2(k))) << 3
    else:
        one = frac = 1
    rep = lambda x: sum(x << (bits * i) for i in range(32 // bits))  # noqa: E731
    inc = 1.0 if MMA_TYPES[precision][2] == "f32" else float(k)
    return rep(one), rep(frac), inc


def expected_accumulators(spec: FamilySpec, warps: int, xp=np):
    """Exact result of one mma launch with ``warps`` warps: array (32 * warps, 4 * chains) of the
    accumulator dtype; thread t's chain c holds c + (units warp t // 32 did) * iters * increment."""
    p = spec.p
    _, _, inc = operand_words(spec.precision, int(p["mma"].split("k")[1]))
    w = xp.arange(warps, dtype=np.int64)
    done = p["units"] // warps + (w < p["units"] % warps)
    per_warp = done * p["iters"] * int(inc)
    chain = xp.repeat(xp.arange(p["chains"], dtype=np.int64), 4)
    out = xp.repeat(per_warp, 32)[:, None] + chain[None, :]
    return out.astype(np.float32 if MMA_TYPES[spec.precision][2] == "f32" else np.int32)


class PeakFamily(Family):
    """``family=peak``: precision = an mma.sync type (``mma`` = its shape, auto = the largest K) or
    ``copy`` (``copy`` = kernel or memcpy, auto = kernel)."""
    name = "peak"
    title = "peak measurement"
    axes = {"precision": tuple(MMA_TYPES) + ("copy",),
            "mma": ("auto", "m16n8k8", "m16n8k16", "m16n8k32", "m16n8k64"),
            "copy": ("auto", "kernel", "memcpy")}
    defaults = {"mma": "auto", "copy": "auto"}
    rules = (Rule("mma", "the shapes mma.sync offers per type; fp8 from sm_89", _mma_rule),)
    sized = False
    tensor_cores = True

    def threads(self, spec: FamilySpec) -> int:
        """256 (the copy and the mma loop); 0 for memcpy."""
        return 0 if spec.p.get("copy") == "memcpy" else THREADS

    def resolve(self, precision, params, arch):
        """Drop the axis that does not apply (mma for copy, copy for mma types; only "auto" is
        accepted there), resolve "auto" and add the work size."""
        unused = "mma" if precision == "copy" else "copy"
        if (value := params.pop(unused)) != "auto":
            raise SpecError(f"family=peak {unused}={value} applies to "
                            f"{'the mma types' if unused == 'mma' else 'precision=copy'} only; "
                            f"with precision={precision} valid: auto")
        if precision == "copy":
            return {"copy": "kernel" if params["copy"] == "auto" else params["copy"], "bytes": COPY_BYTES}
        if params["mma"] == "auto":
            params["mma"] = f"m16n8k{MMA_TYPES[precision][3][-1]}"
        emulated = precision == "int4" and sm_of(arch) >= 90
        iters, units = EMULATED_WORK if emulated else NATIVE_WORK
        return {**params, "chains": CHAINS, "iters": iters, "units": units}

    def flops(self, spec: FamilySpec, m: int = 0, n: int = 0, k: int = 0) -> int:
        """Work of one launch, whatever M, N, K: bytes read + written for copy, else
        units * iters * chains * 2 * 16 * 8 * K operations."""
        p = spec.p
        if spec.precision == "copy":
            return 2 * p["bytes"]
        return p["units"] * p["iters"] * p["chains"] * 2 * 16 * 8 * int(p["mma"].split("k")[1])

    def unit(self, spec: FamilySpec) -> str:
        return "GB/s" if spec.precision == "copy" else super().unit(spec)

    def build(self, spec: FamilySpec) -> Build:
        p = spec.p
        if spec.precision == "copy":
            if p["copy"] == "memcpy":
                return Build("none", "", spec.entry)
            src = render_template("peak_mma.ptx.j2", kind="copy", entry=spec.entry, T=THREADS,
                                  version="%d.%d" % ARCHS[spec.arch].min_ptx, arch=spec.arch,
                                  unroll=COPY_UNROLL, ld_cache=COPY_CACHE[0], st_cache=COPY_CACHE[1],
                                  vec=[[f"%v{4 * j + i}" for i in range(4)] for j in range(COPY_UNROLL)])
            return Build("ptx", src, spec.entry)
        ptype, bits, acc, _, _, min_ptx = MMA_TYPES[spec.precision]
        k = int(p["mma"].split("k")[1])
        a_regs, b_regs = 16 * k * bits // 1024, 8 * k * bits // 1024
        init = [f"0f{np.array([c], '>f4').tobytes().hex().upper()}" if acc == "f32" else str(c)
                for c in range(p["chains"])]
        src = render_template(
            "peak_mma.ptx.j2", kind="mma", entry=spec.entry, T=THREADS, arch=spec.arch,
            version="%d.%d" % max(min_ptx, ARCHS[spec.arch].min_ptx),
            mma_op=f"mma.sync.aligned.{p['mma']}.row.col.{acc}.{ptype}.{ptype}.{acc}", acc_reg=acc,
            a_regs=a_regs, b_regs=b_regs, chains=p["chains"], init=init, iters=p["iters"],
            unroll=math.gcd(p["iters"], UNROLL),
            units=p["units"], a_list=[f"%a{i}" for i in range(a_regs)],
            b_list=[f"%b{i}" for i in range(b_regs)],
            acc_lists=[[f"%d{4 * c + r}" for r in range(4)] for c in range(p["chains"])])
        return Build("ptx", src, spec.entry)

    def prepare(self, spec: FamilySpec, build: Build, m: int, n: int, k: int, seed: int) -> Prepared:
        """Ignores M, N, K. Grid = 4 blocks per SM x SM count, 256 threads. mma: outputs poisoned,
        verified exactly against :func:`expected_accumulators`; copy: dst = ~src (every element wrong
        until copied), src[i] = i * 2654435761 + seed mod 2**32 (distinct), verified exactly."""
        import cupy

        from . import gpu
        gpu.check_device(spec)
        grid = BLOCKS_PER_SM * gpu.sm_count()
        if spec.precision == "copy":
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
        kern = gpu.load_ptx(build)
        a_word, b_word, _ = operand_words(spec.precision, int(spec.p["mma"].split("k")[1]))
        warps = grid * THREADS // 32
        out = gpu.poisoned((warps * 32, 4 * spec.p["chains"]),
                           np.float32 if MMA_TYPES[spec.precision][2] == "f32" else np.int32)
        args = (out, np.uint32(a_word), np.uint32(b_word))
        note = "register-only mma.sync loop; M, N, K ignored"
        if spec.precision == "int4" and spec.arch == "sm_90":
            note += "; ptxas emulates s4 mma on sm_90 (no IMMA for s4): this is the emulation's peak"
        return Prepared(lambda: kern((grid, 1, 1), (THREADS, 1, 1), args),
                        lambda: gpu.exact_check(out, expected_accumulators(spec, warps, cupy)), note=note)
