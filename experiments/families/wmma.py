"""The WMMA baseline family: CUDA C++ GEMMs through ``nvcuda::wmma``, the study's reference point.

Like the study's baselines (seeds: a double-buffered WMMA kernel per precision, 8 warps in a 2 x 4
grid), each kernel stages A and B through two shared-memory buffers filled with ``cp.async`` while the
other is multiplied. Fragments: m16n16k16 for fp16 (f32 or f16 accumulator), bf16 and int8 (s32);
int4 through the experimental sub-byte API (``wmma::experimental::precision::s4``, m8n8k32, A row-major,
B col-major, s32), which nvcc 13.0 compiles for every supported arch (sm_80 ... sm_120; the header
enables it from sm_73 on), sm_90 included. On sm_90 ptxas has no IMMA for s4 and emulates ``mma.sync``
s4 with integer code (``results/h200/README.md``); the s4 WMMA is expected to take the same route
(cuobjdump's SASS on the GPU node shows it), so the int4 baseline there is an emulation, as the study's
int4 WMMA baseline was. Sources: CUDA C++ Programming Guide, "Warp Matrix Functions" (fragment shapes
and types, "Sub-byte Operations"); PTX ISA 9.0, 9.7.9.25 (cp.async).
"""
from __future__ import annotations

import math

import numpy as np

from .base import Build, Family, FamilySpec, Prepared, Rule, parse_pair, render_template

__all__ = ["WmmaFamily", "f16_accumulation_rtol", "TYPES"]

# precision -> (fragment element type, pointer type for load_matrix_sync, bits, (FM, FN, FK), accumulators)
TYPES = {
    "fp16": ("__half", "__half", 16, (16, 16, 16), ("f32", "f16")),
    "bf16": ("__nv_bfloat16", "__nv_bfloat16", 16, (16, 16, 16), ("f32",)),
    "int8": ("signed char", "signed char", 8, (16, 16, 16), ("s32",)),
    "int4": ("wmma::experimental::precision::s4", "void", 4, (8, 8, 32), ("s32",)),
}
# accumulator -> (C++ type, its zero, NumPy dtype of C)
ACCS = {"f32": ("float", "0.0f", np.float32), "f16": ("__half", "__float2half(0.0f)", np.float16),
        "s32": ("int", "0", np.int32)}
ROW_BYTES = 64        # bytes of one A/B row per stage: BK = 32 (16-bit), 64 (8-bit), 128 (4-bit)


def f16_accumulation_rtol(k: int, rtol: float) -> float:
    """Error bound (relative to (|A| |B|)_ij, as verify.check uses it) for C accumulated in f16.

    The probabilistic bound lambda sqrt(n) u (Higham and Mary, SIAM J. Sci. Comput. 41(5), 2019) with
    n = K / 8 roundings (tensor cores add at least 8 products before rounding), u = 2**-10 (the f16
    unit roundoff 2**-11, doubled to cover round-toward-zero) and lambda = 1, which suffices because
    the partial sums of make_operands' uniform [-1, 1) data are about sqrt(K) times smaller than
    (|A| |B|)_ij. A float64 simulation of K / 8 f16 roundings (65,536 to 262,144 elements per K) gave
    at most 0.54 of this bound with round-toward-zero and 0.11 with round-to-nearest (K = 512 ... 8192).
    The bound still separates a kernel that writes zeros up to K = 2048: the median of
    |C_ref| / (|A| |B|) is 0.04 at K = 512 and 0.02 at K = 2048 against bounds of 0.0078 and 0.0156
    (at K = 8192, 0.01 against 0.031: only the largest elements would flag it). Returns the larger of
    this and ``rtol``.
    """
    return max(rtol, 2.0 ** -10 * math.sqrt(k / 8))


def _geometry(precision: str, p: dict) -> dict:
    frag_t, ptr_t, bits, (fm, fn, fk), _ = TYPES[precision]
    bm, bn = parse_pair(p["block"])
    wm, wn = parse_pair(p["warps"])
    return dict(frag_t=frag_t, ptr_t=ptr_t, bits=bits, FM=fm, FN=fn, FK=fk, BM=bm, BN=bn,
                BK=ROW_BYTES * 8 // bits, WM=wm, WN=wn, WTM=bm // wm, WTN=bn // wn, T=32 * wm * wn,
                FRM=bm // wm // fm, FRN=bn // wn // fn, RB=ROW_BYTES, CPR=ROW_BYTES // 16, FKB=fk * bits // 8)


def _acc_rule(precision, p, arch):
    accs = TYPES[precision][4]
    if p["acc"] not in accs:
        return f"acc={p['acc']} is not valid with precision={precision}; valid: {', '.join(accs)}"
    return None


def _tile_rule(precision, p, arch):
    g = _geometry(precision, p)
    if g["WTM"] % g["FM"] or g["WTN"] % g["FN"] or g["BM"] % g["WM"] or g["BN"] % g["WN"]:
        return (f"block={p['block']} with warps={p['warps']} gives a {g['WTM']}x{g['WTN']} warp tile, "
                f"not a multiple of the {g['FM']}x{g['FN']} fragment")
    if (g["BM"] + g["BN"]) * g["CPR"] % g["T"]:
        return (f"block={p['block']} with warps={p['warps']}: {(g['BM'] + g['BN']) * g['CPR']} copy "
                f"chunks per stage do not divide among {g['T']} threads")
    return None


class WmmaFamily(Family):
    """``family=wmma``: axes precision, acc (auto = f32 for floats, s32 for integers), block (BM x BN),
    warps (WM x WN). Sizes must be multiples of BM, BN and BK (BK = 64 bytes of K)."""
    name = "wmma"
    title = "WMMA GEMM"
    axes = {"precision": tuple(TYPES), "acc": ("auto", "f32", "f16", "s32"),
            "block": ("128x128", "64x64"), "warps": ("2x4", "2x2")}
    defaults = {"acc": "auto", "block": "128x128", "warps": "2x4"}
    tensor_cores = True
    rules = (Rule("acc", "the accumulators WMMA offers per type (f16 only with fp16)", _acc_rule),
             Rule("tile", "warp tile a multiple of the fragment; copy chunks divide among threads",
                  _tile_rule))

    def resolve(self, precision, params, arch):
        if params["acc"] == "auto":
            params["acc"] = TYPES[precision][4][0]
        params["bk"] = ROW_BYTES * 8 // TYPES[precision][2]
        return params

    def multiples(self, spec: FamilySpec) -> tuple[int, int, int]:
        """(BM, BN, BK) of the block tile."""
        g = _geometry(spec.precision, spec.p)
        return g["BM"], g["BN"], g["BK"]

    def threads(self, spec: FamilySpec) -> int:
        """32 x WM x WN."""
        return _geometry(spec.precision, spec.p)["T"]

    def build(self, spec: FamilySpec) -> Build:
        g = _geometry(spec.precision, spec.p)
        acc_t, zero, _ = ACCS[spec.p["acc"]]
        src = render_template("wmma_gemm.cu.j2", entry=spec.entry, precision=spec.precision,
                              acc=spec.p["acc"], acc_t=acc_t, zero=zero, **g)
        return Build("cuda", src, spec.entry)     # NVRTC's default C++ dialect suffices

    def prepare(self, spec: FamilySpec, build: Build, m: int, n: int, k: int, seed: int,
                *, rtol: float = 1e-3) -> Prepared:
        """Operands as verify.make_operands makes them, C poisoned, kernel compiled with NVRTC.
        Floats are checked within ``rtol`` (f32 accumulator) or :func:`f16_accumulation_rtol`."""
        from ..verify import check, make_operands
        from . import gpu
        gpu.check_device(spec)
        self.check_problem(spec, m, n, k)
        g = _geometry(spec.precision, spec.p)
        acc = spec.p["acc"]
        ops = make_operands(spec.precision, m, n, k, seed)
        c = gpu.poisoned((m, n), ACCS[acc][2])
        kern = gpu.compile_cuda(build)
        grid, block = (n // g["BN"], m // g["BM"], 1), (g["T"], 1, 1)
        args = (ops.a, ops.b, c, np.uint32(m), np.uint32(n), np.uint32(k))
        is_float = acc != "s32"
        tol = f16_accumulation_rtol(k, rtol) if acc == "f16" else rtol
        notes = []
        if acc == "f16":
            notes.append(f"C accumulated and stored in f16 (verified within rtol={tol:.3g})")
        if spec.precision == "int4" and spec.arch == "sm_90":
            notes.append("ptxas emulates s4 MMA on sm_90 (no IMMA for s4)")
        return Prepared(launch=lambda: kern(grid, block, args),
                        verify=lambda: check(c, ops, is_float, tol), note="; ".join(notes))
