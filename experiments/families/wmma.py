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

import numpy as np

from ..dtypes import Accum, DType
from .base import Build, Family, FamilySpec, Prepared, Rule, parse_pair, render_template

__all__ = ["WmmaFamily", "TYPES", "FRAGMENTS"]

# the element types WMMA takes, with their accumulators (the first is acc=auto); fragment shapes
# (FM, FN, FK) and, where the type has no C++ type of its own, the fragment type and the pointer type of
# load_matrix_sync (CUDA C++ Programming Guide, "Warp Matrix Functions", "Sub-byte Operations")
TYPES = {d.name: d for d in (DType.fp16, DType.bf16, DType.int8, DType.int4)}
FRAGMENTS = {"fp16": (16, 16, 16), "bf16": (16, 16, 16), "int8": (16, 16, 16), "int4": (8, 8, 32)}
_SUB_BYTE = {"int4": ("wmma::experimental::precision::s4", "void")}
ROW_BYTES = 64        # bytes of one A/B row per stage: BK = 32 (16-bit), 64 (8-bit), 128 (4-bit)


def _geometry(precision: str, p: dict) -> dict:
    d = TYPES[precision]
    frag_t, ptr_t = _SUB_BYTE.get(precision, (d.c_type, d.c_type))
    bits, (fm, fn, fk) = d.bits, FRAGMENTS[precision]
    bm, bn = parse_pair(p["block"])
    wm, wn = parse_pair(p["warps"])
    return dict(frag_t=frag_t, ptr_t=ptr_t, bits=bits, FM=fm, FN=fn, FK=fk, BM=bm, BN=bn,
                BK=ROW_BYTES * 8 // bits, WM=wm, WN=wn, WTM=bm // wm, WTN=bn // wn, T=32 * wm * wn,
                FRM=bm // wm // fm, FRN=bn // wn // fn, RB=ROW_BYTES, CPR=ROW_BYTES // 16, FKB=fk * bits // 8)


def _acc_rule(precision, p, arch):
    accs = TYPES[precision].accs
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
    pads_launch = True
    rules = (Rule("acc", "the accumulators WMMA offers per type (f16 only with fp16)", _acc_rule),
             Rule("tile", "warp tile a multiple of the fragment; copy chunks divide among threads",
                  _tile_rule))

    def resolve(self, precision, params, arch):
        if params["acc"] == "auto":
            params["acc"] = TYPES[precision].acc
        params["bk"] = ROW_BYTES * 8 // TYPES[precision].bits
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
        acc = Accum[spec.p["acc"]]
        acc_t, zero = acc.c_type, acc.c_zero
        src = render_template("wmma_gemm.cu.j2", entry=spec.entry, precision=spec.precision,
                              acc=spec.p["acc"], acc_t=acc_t, zero=zero, **g)
        return Build("cuda", src, spec.entry)     # NVRTC's default C++ dialect suffices

    def prepare(self, spec: FamilySpec, build: Build, m: int, n: int, k: int, seed: int,
                *, rtol: float = 1e-3, smem_pad: int = 0, data: str = "full") -> Prepared:
        """Operands as verify.make_operands draws them for ``data``, C poisoned, kernel compiled with
        NVRTC, launched with ``smem_pad`` bytes of dynamic shared memory (launch.blocks_per_sm; its own
        is static). C is checked within the accumulation's bound (:meth:`tolerance`): exactly for s32
        (and data=zeros), within ``rtol`` for f32, within the f16 accumulation's bound for f16."""
        from ..gpu.verify import check, data_tolerance, make_operands
        from . import gpu
        gpu.check_device(spec)
        self.check_problem(spec, m, n, k)
        g = _geometry(spec.precision, spec.p)
        acc = Accum[spec.p["acc"]]
        ops = make_operands(spec.precision, m, n, k, seed, data=data)
        c = gpu.poisoned((m, n), acc.np_dtype)
        kern = gpu.compile_cuda(build)
        grid, block = (n // g["BN"], m // g["BM"], 1), (g["T"], 1, 1)
        args = (ops.a, ops.b, c, np.uint32(m), np.uint32(n), np.uint32(k))
        is_float = not acc.exact
        tol = data_tolerance(data, self.tolerance(spec, k, rtol))
        notes = []
        if acc is Accum.f16:
            notes.append(f"C accumulated and stored in f16 (verified within rtol={tol:.3g})")
        if spec.precision == "int4" and spec.arch == "sm_90":
            notes.append("ptxas emulates s4 MMA on sm_90 (no IMMA for s4)")
        smem = gpu.allow_smem(kern, smem_pad)
        return Prepared(launch=lambda: kern(grid, block, args, shared_mem=smem),
                        verify=lambda: check(c, ops, is_float, tol), note="; ".join(notes))
