"""Render a KernelSpec to PTX text with the Jinja2 template of its kernel family.

The fragment plan (which ldmatrix fills which register, which registers feed which mma.sync)
is computed here and printed by the template; the layouts follow PTX ISA 9.0, section
9.7.14.5.8-9.7.14.5.11 (m16n8k8/k16/k32/k64 fragments) and 9.7.14.5.15 (ldmatrix).
"""
from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

import jinja2

from .spec import KernelSpec

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "kernels_ptx"
FAMILY_TEMPLATE = "mma_sync_gemm.ptx.j2"

__all__ = ["render", "template_context", "ptx_sha256"]


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)), trim_blocks=True, lstrip_blocks=True,
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


def _fragment_plan(s: KernelSpec, rset: int) -> list[dict]:
    """Per K chunk of one stage: ldmatrix loads for A and B and the mma.sync operands.

    Wide mode (row bytes a multiple of 32): one chunk = 32 bytes of K. ``ldmatrix.x4`` per m16 tile
    gives registers r0..r3 = (rows 0-7, K bytes 0-15), (rows 8-15, 0-15), (rows 0-7, 16-31),
    (rows 8-15, 16-31), which is the A fragment a0..a3 of a 32-byte-K MMA (k16 f16, k32 s8, k64 s4),
    or (r0, r1) and (r2, r3) of two 16-byte-K MMAs. ``ldmatrix.x2`` per n8 tile gives
    b0 = K bytes 0-15, b1 = 16-31 of columns 0-7.
    Narrow mode (16-byte rows): one chunk = the whole stage; ``.x4`` covers two m16 tiles
    ((r0, r1) for the first, (r2, r3) for the second) and ``.x2`` two n8 tiles.
    ``rset`` (0 or 1) names the fragment register set, so that one chunk can be read while the
    previous one is multiplied.
    """
    mt_n, nt_n = s.warp_tile[0] // 16, s.warp_tile[1] // 8
    a = lambda mt, i: f"%a{rset}m{mt}_{i}"  # noqa: E731
    b = lambda nt, i: f"%b{rset}n{nt}_{i}"  # noqa: E731
    acc = lambda mt, nt: [f"%acc{mt}_{nt}_{i}" for i in range(4)]  # noqa: E731
    stride = s.smem_stride
    chunks = []
    if s.row_bytes % 32 == 0:
        subs = 32 // s.mma_k_bytes                      # MMAs per 32-byte chunk: 1 or 2
        for c in range(s.row_bytes // 32):
            lda = [([a(mt, i) for i in range(4)], mt * 16 * stride + c * 32) for mt in range(mt_n)]
            ldb = [([b(nt, 0), b(nt, 1)], nt * 8 * stride + c * 32) for nt in range(nt_n)]
            mmas = []
            for sub in range(subs):
                for mt in range(mt_n):
                    for nt in range(nt_n):
                        if subs == 1:
                            ar, br = [a(mt, i) for i in range(4)], [b(nt, 0), b(nt, 1)]
                        else:
                            ar, br = [a(mt, 2 * sub), a(mt, 2 * sub + 1)], [b(nt, sub)]
                        mmas.append((acc(mt, nt), ar, br))
            chunks.append({"lda": lda, "ldb": ldb, "mmas": mmas})
    else:                                               # 16-byte rows, 16-byte-K MMAs
        lda = [([a(2 * p, 0), a(2 * p, 1), a(2 * p + 1, 0), a(2 * p + 1, 1)], p * 32 * 16)
               for p in range(mt_n // 2)]
        ldb = [([b(2 * q, 0), b(2 * q + 1, 0)], q * 16 * 16) for q in range(nt_n // 2)]
        mmas = [(acc(mt, nt), [a(mt, 0), a(mt, 1)], [b(nt, 0)])
                for mt in range(mt_n) for nt in range(nt_n)]
        chunks.append({"lda": lda, "ldb": ldb, "mmas": mmas})
    return chunks


def template_context(s: KernelSpec) -> dict:
    """The template's parameter contract (see the header of ``mma_sync_gemm.ptx.j2``)."""
    p = s.prec
    cpr = s.row_bytes // 16
    t = s.threads
    wtm, wtn = s.warp_tile
    a_chunks, b_chunks = s.bm * cpr, s.bn * cpr
    mma_op = (f"mma.sync.aligned.{s.mma_shape}.row.col.{p.acc}.{p.ptx}.{p.ptx}.{p.acc}")
    return dict(
        entry=s.entry, version="%d.%d" % s.ptx_version, arch=s.arch, T=t,
        BM=s.bm, BN=s.bn, BK=s.ktile, WM=s.warps_m, WN=s.warps_n, WTM=wtm, WTN=wtn,
        MT=wtm // 16, NT=wtn // 8, RB=s.row_bytes, CPR=cpr, LOG_CPR=cpr.bit_length() - 1,
        LOG_BK=s.ktile.bit_length() - 1,
        KBYTES_SHIFT={16: "shl.b32", 8: "", 4: "shr.u32"}[p.bits],
        STRIDE=s.smem_stride, STAGE=s.stage_bytes, S=s.stages, GROUP_M=s.group_m, cache=s.cache_op,
        a_copies=max(1, a_chunks // t), b_copies=max(1, b_chunks // t),
        a_pred=a_chunks < t, b_pred=b_chunks < t, ROWS_PER_PASS=t // cpr,
        wide=s.row_bytes % 32 == 0, chunks=[_fragment_plan(s, 0), _fragment_plan(s, 1)],
        frag_moves=[(f"%a0m{mt}_{i}", f"%a1m{mt}_{i}") for mt in range(wtm // 16) for i in range(4)]
        + [(f"%b0n{nt}_{i}", f"%b1n{nt}_{i}") for nt in range(wtn // 8) for i in range(2)],
        mma_op=mma_op,
        mma_shape=s.mma_shape, mma_k=s.mma_k, acc_type=p.acc, ptype=p.ptx, bits=p.bits,
        a_regs=s.mma_k_bytes // 8, b_regs=s.mma_k_bytes // 16,
    )


def render(s: KernelSpec) -> str:
    """PTX text (str, ASCII) of the kernel ``s.entry``; its parameters are
    ``(.u64 A, .u64 B, .u64 C, .u32 M, .u32 N, .u32 K)``.

    Raises jinja2.TemplateError only on a template bug (the spec is validated already).
    """
    return _env().get_template(FAMILY_TEMPLATE).render(**template_context(s))


def ptx_sha256(ptx: str) -> str:
    """Hex sha256 of the PTX text, the cache and tracking key of a rendered kernel."""
    return hashlib.sha256(ptx.encode()).hexdigest()
