"""Render a KernelSpec to PTX text with the Jinja2 template of its kernel family.

The fragment plan (which load fills which register, which registers feed which mma.sync) and the
per-lane shared-memory addresses are computed here as data and printed by the template. Layouts follow
PTX ISA 9.0, 9.7.14.5.8-9.7.14.5.11 (m16n8k8/k16/k32/k64 fragments) and 9.7.14.5.15 (ldmatrix: lane l
supplies the address of row l % 8 of matrix l / 8; without .trans thread t receives 32-bit word t % 4 of
row t / 4 of each matrix, with .trans the 16-bit elements (2(t % 4), t / 4) and (2(t % 4) + 1, t / 4)).
"""
from __future__ import annotations

from functools import lru_cache

import jinja2

from ..base import TEMPLATE_DIR
from .spec import KernelSpec

FAMILY_TEMPLATE = "mma_sync_gemm.ptx.j2"

__all__ = ["render", "template_context", "lane_bases", "fragment_plan", "lane_address"]


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)), trim_blocks=True, lstrip_blocks=True,
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


def _base(name, stride, region, row, col, row_warp=None, col_warp=None, comment="", xor=()):
    """A per-lane shared-memory address: smem + region + (row(lane) + row_warp) * stride + (col(lane)
    ^ xor(lane)) + col_warp, with row/col/xor = sums of ((lane >> shift) & mask) * mul and *_warp =
    (register, mul). ``xor`` (swizzled layout) permutes the 16-byte chunks of a row."""
    return dict(name=name, stride=stride, region=region, row=row, col=col, row_warp=row_warp,
                col_warp=col_warp, comment=comment, xor=list(xor))


def lane_bases(s: KernelSpec) -> dict:
    """The per-lane base addresses each loader of ``s`` reads from (stage 0), by operand: 'a', 'b'."""
    wtm, wtn = s.warp_tile
    bits = s.prec.bits
    out = {}
    if s.loader_a == "manual":                          # row groupID, K bytes 4 * (lane % 4)
        out["a"] = _base("%lr_a", s.smem_stride, 0, [(2, 7, 1)], [(0, 3, 4)], ("%warp_m", wtm),
                         comment="A scalar loads: row groupID, K bytes 4*(lane%4)")
    elif s.swizzle:                                     # row % 8 = lane % 8 (rows in steps of 8)
        sh, mask = s.swizzle
        out["a"] = _base("%lr_a", s.smem_stride, 0, [(0, 15, 1)], [(4, 1, 16)], ("%warp_m", wtm),
                         comment="A ldmatrix, swizzled: lane l -> row l%16, K bytes "
                                 f"16*((l/16) ^ ((l>>{sh})&{mask}))",
                         xor=[(sh, mask, 16)])
    elif s.row_bytes == 16:
        out["a"] = _base("%lr_a", 16, 0, [(0, 31, 1)], [], ("%warp_m", wtm),
                         comment="A ldmatrix, 16-byte rows: lane l -> row l")
    else:
        out["a"] = _base("%lr_a", s.smem_stride, 0, [(0, 15, 1)], [(4, 1, 16)], ("%warp_m", wtm),
                         comment="A ldmatrix: lane l -> row l%16, K bytes 16*(l/16)")
    b0 = s.bm * s.smem_stride
    if s.b_layout == "row":
        if s.loader_b == "manual":                      # K rows E*(lane%4).., column groupID
            gcol = [(3, 3, 1)] if bits == 4 else [(2, 7, bits // 8)]
            out["b"] = _base("%lr_b", s.b_stride, b0, [(0, 3, 32 // bits)], gcol,
                             col_warp=("%warp_n", wtn * bits // 8),
                             comment="B (K x N) scalar loads: K rows (32/bits)*(lane%4).., column groupID")
        else:
            out["b"] = _base("%lr_b", s.b_stride, b0, [(0, 15, 1)], [(4, 1, 16)],
                             col_warp=("%warp_n", wtn * 2),
                             comment="B (K x N) ldmatrix.trans: lane l -> K row l%16, N + 8*(l/16)")
    elif s.loader_b == "manual":
        out["b"] = _base("%lr_b", s.smem_stride, b0, [(2, 7, 1)], [(0, 3, 4)], ("%warp_n", wtn),
                         comment="B scalar loads: column groupID, K bytes 4*(lane%4)")
    elif s.swizzle:
        sh, mask = s.swizzle
        out["b"] = _base("%lr_b", s.smem_stride, b0, [(0, 7, 1), (4, 1, 8)], [(3, 1, 16)], ("%warp_n", wtn),
                         comment="B ldmatrix, swizzled: lane l -> column l%8 + 8*(l/16), K bytes "
                                 f"16*(((l/8)%2) ^ ((l>>{sh})&{mask}))", xor=[(sh, mask, 16)])
    elif s.row_bytes == 16:
        out["b"] = _base("%lr_b", 16, b0, [(0, 31, 1)], [], ("%warp_n", wtn),
                         comment="B ldmatrix, 16-byte rows: lane l -> column l")
    else:
        out["b"] = _base("%lr_b", s.smem_stride, b0, [(0, 7, 1), (4, 1, 8)], [(3, 1, 16)], ("%warp_n", wtn),
                         comment="B ldmatrix: lane l -> column l%8 + 8*(l/16), K bytes 16*((l/8)%2)")
    return out


def lane_address(base: dict, lane: int, warp_m: int = 0, warp_n: int = 0) -> int:
    """Byte offset in shared memory of ``base`` (see :func:`lane_bases`) for one lane and warp:
    the same arithmetic the template prints."""
    term = lambda terms: sum(((lane >> sh) & mask) * mul for sh, mask, mul in terms)  # noqa: E731
    warps = {"%warp_m": warp_m, "%warp_n": warp_n}
    row = term(base["row"]) + (warps[base["row_warp"][0]] * base["row_warp"][1] if base["row_warp"] else 0)
    col = (term(base["col"]) ^ term(base["xor"])) + (warps[base["col_warp"][0]] * base["col_warp"][1]
                                                   if base["col_warp"] else 0)
    return base["region"] + row * base["stride"] + col


def _ldsm(regs, off, base, trans=False):
    return dict(kind="ldsm", num=f"x{len(regs)}", trans=".trans" if trans else "", regs=regs,
                base=base, off=off)


def _group(mats, n, base, trans=False):
    """ldmatrix.xN instructions over an ordered list of (register, offset) matrices."""
    return [_ldsm([r for r, _ in mats[i:i + n]], mats[i][1], base, trans) for i in range(0, len(mats), n)]


def _scalar(reg, offs, base, bits):
    """Scalar loads at ``offs`` packed into ``reg``: pack16 (2 halves), pack8 (4 bytes), nib (8 nibbles)."""
    kind = {16: "pack16", 8: "pack8"}.get(bits, "pack8") if len(offs) <= 4 else "nib"
    return dict(kind=kind, reg=reg, base=base, offs=offs)


def fragment_plan(s: KernelSpec, rset: int) -> list[dict]:
    """Per K chunk of one stage: the loads of A and B fragments and the mma.sync operands.

    A chunk is 32 bytes of K when a row holds a multiple of 32 (each m16 tile then takes 4 registers,
    a0..a3 = (rows 0-7, K bytes 0-15), (8-15, 0-15), (0-7, 16-31), (8-15, 16-31); each n8 tile 2,
    b0, b1 = K bytes 0-15, 16-31): one 32-byte-K MMA, or two 16-byte-K MMAs on (a0, a1, b0) and
    (a2, a3, b1). With 16-byte rows the chunk is the whole stage and tiles take 2 and 1 registers.
    ``rset`` (0 or 1) names the register set, so one chunk is read while the previous one is
    multiplied. Every loader fills the same registers with the same bits.
    """
    mt_n, nt_n = s.warp_tile[0] // 16, s.warp_tile[1] // 8
    a = lambda mt, i: f"%a{rset}m{mt}_{i}"  # noqa: E731
    b = lambda nt, i: f"%b{rset}n{nt}_{i}"  # noqa: E731
    accn = s.accum.regs_per_tile
    acc = lambda mt, nt: [f"%acc{mt}_{nt}_{i}" for i in range(accn)]  # noqa: E731
    sa, sb, bits = s.smem_stride, s.b_stride, s.prec.bits
    wide = s.row_bytes % 32 == 0
    # swizzled: chunk c's addresses are the lane bases XOR 32 c (the 16-byte chunk index XOR 2 c; rows,
    # stages and regions are multiples of the row bytes, so the XOR only permutes chunks inside a row),
    # one xor.b32 per operand and chunk (%sw_a, %sw_b)
    swz = 32 if s.swizzle else 0
    chunk_bytes = 32 if wide else 16
    per_reg = 32 // bits                                 # elements per 32-bit fragment register
    chunks = []
    for c in range(s.row_bytes // chunk_bytes):
        k0 = c * chunk_bytes * 8 // bits                 # first K element of the chunk
        loads = []
        # ---- A: matrices (register, offset) in ldmatrix order, or scalar words
        if wide:
            mats = [(a(mt, i), mt * 16 * sa + (i % 2) * 8 * sa + (i // 2) * 16 + (c * 32 if not swz else 0))
                    for mt in range(mt_n) for i in range(4)]
        else:
            mats = [(a(mt, i), mt * 16 * 16 + i * 8 * 16) for mt in range(mt_n) for i in range(2)]
        if s.loader_a == "manual":
            step = 2 if bits == 16 else 1
            loads += [_scalar(r, [o + j * step for j in range(4 // step)], "%rd_a", bits) for r, o in mats]
        else:
            loads += _group(mats, int(s.loader_a[1]), "%rd_a")
        # ---- B
        nregs = 2 if wide else 1
        if s.b_layout == "row" and s.loader_b == "manual":
            col = lambda nt: nt * 8 * bits // 8  # noqa: E731
            for nt in range(nt_n):
                for i in range(nregs):
                    kr = k0 + i * 4 * per_reg
                    loads.append(_scalar(b(nt, i), [(kr + j) * sb + col(nt) for j in range(per_reg)],
                                         "%rd_b", bits))
        elif s.b_layout == "row":
            mats = [(b(nt, i), (k0 + 8 * i) * sb + nt * 16) for nt in range(nt_n) for i in range(2)]
            loads += _group(mats, int(s.loader_b[1]), "%rd_b", trans=True)
        else:
            if wide:
                mats = [(b(nt, i), nt * 8 * sb + i * 16 + (c * 32 if not swz else 0))
                        for nt in range(nt_n) for i in range(2)]
            else:
                mats = [(b(nt, 0), nt * 8 * 16) for nt in range(nt_n)]
            if s.loader_b == "manual":
                step = 2 if bits == 16 else 1
                loads += [_scalar(r, [o + j * step for j in range(4 // step)], "%rd_b", bits)
                          for r, o in mats]
            else:
                loads += _group(mats, int(s.loader_b[1]), "%rd_b")
        # ---- MMAs, in an order that does not depend on the loaders
        subs = 32 // s.mma_k_bytes if wide else 1
        mmas = []
        for sub in range(subs):
            for mt in range(mt_n):
                for nt in range(nt_n):
                    if wide and subs == 1:
                        ar, br = [a(mt, i) for i in range(4)], [b(nt, 0), b(nt, 1)]
                    else:
                        ar, br = [a(mt, 2 * sub), a(mt, 2 * sub + 1)], [b(nt, sub)]
                    mmas.append((acc(mt, nt), ar, br))
        xors = []
        if swz and c:
            xors = [("%sw_a", "%rd_a", swz * c), ("%sw_b", "%rd_b", swz * c)]
            for ld in loads:
                ld.update(base=ld["base"].replace("%rd_", "%sw_"), xor=swz * c)
        chunks.append({"loads": loads, "mmas": mmas, "xors": xors})
    return chunks


def _copy(s: KernelSpec, operand: str) -> dict:
    """cp.async plan of one operand per stage: 16-byte chunks of rows, thread t copies chunk
    j * T + t in pass j; the last pass is predicated when the chunks are not a multiple of T; ``swz``:
    the spec's swizzle (shift, mask) of the chunk index, or None for padded rows."""
    t = s.threads
    if operand == "a" or s.b_layout == "col":
        rows, row_bytes, stride = (s.bm if operand == "a" else s.bn), s.row_bytes, s.smem_stride
    else:
        rows, row_bytes, stride = s.ktile, s.b_row_bytes, s.b_stride
    cpr = row_bytes // 16
    chunks = rows * cpr
    full, part = divmod(chunks, t)
    rpp = t // cpr
    hint = getattr(s, f"l2_hint_{operand}")
    passes = [(j * rpp * stride, j == full) for j in range(full + (part > 0))]
    cop = (f"cp.async.{s.cache_op}.shared.global" + (".L2::cache_hint" if hint != "none" else "")
           + (f".L2::{s.l2_prefetch}" if s.l2_prefetch != "none" else ""))
    return dict(cpr=cpr, rows_per_pass=rpp, passes=passes, part=part, stride=stride, row_bytes=row_bytes,
                hint=hint, cop=cop, policy=L2_POLICY.get(hint), swz=s.swizzle)


# The 64-bit cache-policy operand of ``.L2::cache_hint`` for an eviction priority over the whole
# access (fraction 1.0): the values ``createpolicy.fractional.L2::<priority>.b64 p, 1.0`` yields, as
# CUTLASS spells them (cute/arch/copy_sm90_desc.hpp, CacheHintSm90); ptxas 13.0 turns that
# createpolicy into these same constants for sm_80 and sm_90. The template moves them into a register.
L2_POLICY = {"evict_normal": "0x1000000000000000", "evict_first": "0x12F0000000000000",
             "evict_last": "0x14F0000000000000"}


def template_context(s: KernelSpec) -> dict:
    """The template's parameter contract (see the header of ``mma_sync_gemm.ptx.j2``)."""
    p, acc = s.prec, s.accum
    wtm, wtn = s.warp_tile
    cpa, cpb = _copy(s, "a"), _copy(s, "b")
    chunks = [fragment_plan(s, 0), fragment_plan(s, 1)]
    nregs_a, nregs_b = (4, 2) if s.row_bytes % 32 == 0 else (2, 1)
    kinds = {ld["kind"] for ch in chunks[0] for ld in ch["loads"]}
    return dict(
        entry=s.entry, version="%d.%d" % s.ptx_version, arch=s.arch, T=s.threads,
        BM=s.bm, BN=s.bn, BK=s.ktile, WM=s.warps_m, WN=s.warps_n, WTM=wtm, WTN=wtn,
        MT=wtm // 16, NT=wtn // 8, RB=s.row_bytes, LOG_BK=s.ktile.bit_length() - 1,
        KBYTES_SHIFT={16: "shl.b32", 8: "", 4: "shr.u32"}[p.bits], STRIDE=s.smem_stride,
        STAGE=s.stage_bytes, S=s.stages, GROUP_M=s.group_m, ca=cpa, cb=cpb, b_layout=s.b_layout,
        bases=lane_bases(s), chunks=chunks, nib=p.bits == 4 and "nib" in kinds,
        manual=bool(kinds & {"pack8", "pack16", "nib"}),
        frag_moves=[(f"%a0m{mt}_{i}", f"%a1m{mt}_{i}") for mt in range(wtm // 16) for i in range(nregs_a)]
        + [(f"%b0n{nt}_{i}", f"%b1n{nt}_{i}") for nt in range(wtn // 8) for i in range(nregs_b)],
        mma_op=f"mma.sync.aligned.{s.mma_shape}.row.col.{acc.ptx}.{p.ptx}.{p.ptx}.{acc.ptx}",
        mma_shape=s.mma_shape, mma_k=s.mma_k, acc_type=acc.ptx, acc_regs=acc.regs_per_tile,
        c_bytes=acc.c_bytes, ptype=p.ptx, bits=p.bits, loader_a=s.loader_a, loader_b=s.loader_b,
        cache=s.cache_op, swz=s.swizzle,
    )


def render(s: KernelSpec) -> str:
    """PTX text (str, ASCII) of the kernel ``s.entry``; its parameters are
    ``(.u64 A, .u64 B, .u64 C, .u32 M, .u32 N, .u32 K)``.

    Raises jinja2.TemplateError only on a template bug (the spec is validated already).
    """
    return _env().get_template(FAMILY_TEMPLATE).render(**template_context(s))

