"""The DP4A family: the study's scalar int8 GEMM, without tensor cores.

Each ``__dp4a`` multiplies four int8 pairs and adds them to an int32 (CUDA Math API, "Integer
Intrinsics"; SASS IDP.4A), so a K-deep dot product takes K / 4 instructions per output where one
``mma.sync.m16n8k32`` does 4,096 multiply-adds. The kernel tiles A and B through shared memory
(``kernels_ptx/dp4a_gemm.cu.j2``: 256 threads, register prefetch of the next K tile). It is the
study's int8_dp4a point (seeds: "never competitive"), here as a floor under the tensor-core kernels.
"""
from __future__ import annotations

import numpy as np

from .base import Build, Family, FamilySpec, Prepared, parse_pair, render_template

__all__ = ["Dp4aFamily", "BK"]

BK = 32          # K elements (bytes) per shared-memory tile
THREADS = 256


class Dp4aFamily(Family):
    """``family=dp4a``: precision int8 only; block (BM x BN) 128x128 (8 x 8 outputs per thread) or
    64x64 (4 x 4). Sizes must be multiples of BM, BN and 32."""
    name = "dp4a"
    title = "DP4A GEMM"
    axes = {"precision": ("int8",), "block": ("128x128", "64x64")}
    defaults = {"block": "128x128"}
    pads_launch = True

    def multiples(self, spec: FamilySpec) -> tuple[int, int, int]:
        """(BM, BN, BK) of the block tile."""
        return (*parse_pair(spec.p["block"]), BK)

    def threads(self, spec: FamilySpec) -> int:
        return THREADS

    def build(self, spec: FamilySpec) -> Build:
        bm, bn = parse_pair(spec.p["block"])
        src = render_template("dp4a_gemm.cu.j2", entry=spec.entry, BM=bm, BN=bn, TM=bm // 16,
                              TN=bn // 16, NL=(bm + bn) * 2 // THREADS)
        return Build("cuda", src, spec.entry)     # NVRTC's default C++ dialect suffices

    def prepare(self, spec: FamilySpec, build: Build, m: int, n: int, k: int, seed: int,
                *, smem_pad: int = 0, data: str = "full") -> Prepared:
        """Operands as verify.make_operands draws them for ``data``, C (int32) poisoned, checked exactly;
        launched with ``smem_pad`` bytes of dynamic shared memory (launch.blocks_per_sm; its own is
        static)."""
        from ..gpu.verify import check, make_operands
        from . import gpu
        gpu.check_device(spec)
        self.check_problem(spec, m, n, k)
        bm, bn = parse_pair(spec.p["block"])
        ops = make_operands("int8", m, n, k, seed, data=data)
        c = gpu.poisoned((m, n), np.int32)
        kern = gpu.compile_cuda(build)
        grid, block = (n // bn, m // bm, 1), (THREADS, 1, 1)
        args = (ops.a, ops.b, c, np.uint32(m), np.uint32(n), np.uint32(k))
        smem = gpu.allow_smem(kern, smem_pad)
        return Prepared(launch=lambda: kern(grid, block, args, shared_mem=smem),
                        verify=lambda: check(c, ops, False, 0.0),
                        note="scalar __dp4a on the CUDA cores, no tensor cores")
