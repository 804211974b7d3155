"""The axes of the ``mma_sync`` space and their restrictions, as data.

:data:`RULES` are the restrictions in the order :class:`~.spec.KernelSpec` checks them;
each reads only the fields it names, so :func:`~.spec.space` can decide it as soon as
those are enumerated. Sources: PTX ISA 9.0, 9.7.14.5 (mma shapes, fragments), 9.7.14.5.15
(ldmatrix .x1/.x2/.x4 and .trans), 9.7.9.25.3.1 (cp.async); CUDA Programming Guide (limits).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...dtypes import DType
from ...spec import did_you_mean
from ...spec_tables import ACCUMULATORS, ARCHS, PRECISIONS
from .domains import (B_LAYOUTS, CACHE_OPS, KTILES, L2_HINTS, L2_PREFETCHES, LOADERS, MAX_STAGES,
                      SMEM_LAYOUTS, tile_presets)

__all__ = ["Geometry", "Axis", "Rule", "RULES", "make_axes", "valid_ktiles", "choose", "preset_tiles"]


class Geometry:
    """Numbers derived from the axes (shared by KernelSpec and the partial points of :func:`space`)."""

    @property
    def prec(self) -> DType:
        return PRECISIONS[self.precision]

    @property
    def accum(self):
        return ACCUMULATORS[self.acc]

    @property
    def mma_shape(self) -> str:
        return f"m16n8k{self.mma_k}"

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    @property
    def warp_tile(self) -> tuple[int, int]:
        """(rows, cols) of C computed by one warp."""
        return self.bm // self.warps_m, self.bn // self.warps_n

    @property
    def row_bytes(self) -> int:
        """Bytes of one A row (and one B column for b_layout=col) in one K stage."""
        return self.ktile * self.prec.bits // 8

    @property
    def mma_k_bytes(self) -> int:
        """Bytes of K consumed by one mma.sync (16 or 32)."""
        return self.mma_k * self.prec.bits // 8

    @property
    def smem_stride(self) -> int:
        """Shared-memory pitch of A rows in bytes. 16-byte rows pack 8 rows into 128 B (conflict-free);
        longer rows get 16 B of padding so 8 ldmatrix row addresses fall in 8 different bank groups,
        except with smem_layout=swizzled (no padding: the chunks are permuted instead, see swizzle)."""
        return self.row_bytes if self.smem_layout == "swizzled" else _pitch(self.row_bytes)

    @property
    def swizzle(self) -> tuple[int, int] | None:
        """smem_layout=swizzled: (shift, mask) such that 16-byte chunk j of shared-memory row r is stored
        at chunk j ^ ((r >> shift) & mask): rows of 32, 64, 128 and 256 bytes get (2, 1), (1, 3), (0, 7)
        and (0, 7), the patterns of TMA's 32B, 64B and 128B swizzles (CUDA Driver API,
        CUtensorMapSwizzle). The 8 rows an ldmatrix reads then fall in 8 different 16-byte bank
        groups. None for padded rows."""
        if self.smem_layout != "swizzled":
            return None
        return {32: (2, 1), 64: (1, 3)}.get(self.row_bytes, (0, 7))

    @property
    def b_row_bytes(self) -> int:
        """b_layout=row: bytes of one K row of the B tile (BN elements)."""
        return self.bn * self.prec.bits // 8

    @property
    def b_stride(self) -> int:
        """Shared-memory pitch of B rows: N rows of K (col) or K rows of N (row), padded as for A."""
        return self.smem_stride if self.b_layout == "col" else _pitch(self.b_row_bytes)

    @property
    def stage_bytes(self) -> int:
        """One stage: A (BM rows), then B (BN rows for col, BK rows for row)."""
        b_rows = self.bn if self.b_layout == "col" else self.ktile
        return self.bm * self.smem_stride + b_rows * self.b_stride

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory per block, bytes."""
        return self.stages * self.stage_bytes


def _pitch(row: int) -> int:
    return 16 if row == 16 else row + 16


@dataclass(frozen=True)
class Axis:
    """One axis of the space: its config key, the KernelSpec fields it sets, the values the space
    enumerates (tuples aligned with ``attrs``; ``labels`` name them) and whether it shapes the kernel
    (changes its instruction structure) or only an operator suffix or an immediate."""
    key: str
    attrs: tuple
    values: tuple
    labels: tuple
    shaping: bool
    meaning: str


@dataclass(frozen=True)
class Rule:
    """A restriction: ``check(point)`` returns the error message or None; it reads ``attrs`` only.
    ``monotone``: once it fails for some pipeline.stages it fails for every larger one."""
    name: str
    attrs: tuple
    check: Callable
    why: str
    monotone: bool = False


def _axis(key, attrs, values, meaning, shaping=True, labels=None):
    vals = tuple(v if isinstance(v, tuple) else (v,) for v in values)
    return Axis(key, attrs, vals, tuple(labels or (str(v[0]) for v in vals)), shaping, meaning)


def make_axes(tiles: dict | None = None, archs=None) -> tuple:
    """The axes in enumeration order (the shaping ones first, pipeline.stages last of them);
    ``tiles`` (name -> (BM, BN, WM, WN)) defaults to conf/tile/ (without ``auto``, which chooses
    among the others), ``archs`` to every target."""
    tiles = tiles or preset_tiles()
    return (
        _axis("target.arch", ("arch",), tuple(archs or ARCHS), "GPU target (`.target`), with its limits"),
        _axis("precision", ("precision",), tuple(PRECISIONS), "A/B element type"),
        _axis("acc", ("acc",), tuple(ACCUMULATORS), "accumulator and C type"),
        _axis("ktile", ("ktile",), KTILES, "BK, K elements per shared-memory stage"),
        _axis("mma", ("mma_k",), (8, 16, 32, 64), "mma.sync shape m16n8kK",
              labels=("m16n8k8", "m16n8k16", "m16n8k32", "m16n8k64")),
        _axis("b_layout", ("b_layout",), B_LAYOUTS, "B in memory: col = N x K, row = K x N"),
        _axis("tile", ("bm", "bn", "warps_m", "warps_n"), tuple(tiles.values()),
              "block tile BM x BN and warp grid (presets of conf/tile/)", labels=tuple(tiles)),
        _axis("loader.a", ("loader_a",), LOADERS, "shared -> register loader of A"),
        _axis("loader.b", ("loader_b",), LOADERS, "shared -> register loader of B"),
        _axis("smem_layout", ("smem_layout",), SMEM_LAYOUTS, "shared-memory rows: padded, or unpadded with "
              "XOR-swizzled 16-byte chunks"),
        _axis("pipeline.stages", ("stages",), range(1, MAX_STAGES + 1), "cp.async stages in flight"),
        _axis("cache.op", ("cache_op",), CACHE_OPS, "cp.async cache operator", shaping=False),
        _axis("cache.l2_hint_a", ("l2_hint_a",), L2_HINTS, "L2 eviction priority of A", shaping=False),
        _axis("cache.l2_hint_b", ("l2_hint_b",), L2_HINTS, "L2 eviction priority of B", shaping=False),
        _axis("tile.group_m", ("group_m",), (1, 8), "block rows per rasterization group (1..64; the "
              "space takes 1 and 8, the two template branches)", shaping=False),
        _axis("cache.l2_prefetch", ("l2_prefetch",), L2_PREFETCHES, "bytes L2 reads from DRAM on a miss of a "
              "cp.async", shaping=False),
    )


def preset_tiles() -> dict:
    """The block tiles of conf/tile/ (name -> (BM, BN, WM, WN)), without ``auto`` (tile=auto picks
    one of these per problem size: :func:`.spec.auto_tile`)."""
    return {name: t for name, t in tile_presets().items() if name != "auto"}


def choose(key: str, value, valid, given: str = "") -> str | None:
    """None for a ``value`` of ``valid``, else the message: key, value, ``given`` (what it is not valid
    with), the valid values and, for a value that differs from one only in case, that one."""
    if value in valid:
        return None
    return (f"{key}={value} is not valid{' with ' + given if given else ''}; valid values: "
            + ", ".join(str(v) for v in valid) + did_you_mean(key, value, valid))


def valid_ktiles(prec: DType) -> list[int]:
    """K-tile depths (elements) this template accepts for a precision: a stage row of
    ``ktile * bits / 8`` bytes is copied in 16-byte cp.async chunks and read in 16-byte ldmatrix rows,
    so it must be a power of two of at least 16 bytes, and a multiple of the smallest MMA K."""
    return [k for k in KTILES if k * prec.bits // 8 >= 16 and k % prec.mma_k[0] == 0]


def _r_arch(s):
    p = s.prec
    if ARCHS[s.arch].sm < p.min_arch:
        ok = [a for a, lim in ARCHS.items() if lim.sm >= p.min_arch]
        return (f"precision={s.precision} needs target.arch sm_{p.min_arch} or later (mma.sync with "
                f".{p.ptx}, PTX ISA {'%d.%d' % p.min_ptx}); valid target.arch: {', '.join(ok)}")


def _r_mma(s):
    shapes = [f"m16n8k{k}" for k in s.prec.mma_k]
    return choose("mma", s.mma_shape, shapes, f"precision={s.precision}")


def _r_divides(s):
    if s.ktile % s.mma_k:
        ok = [f"m16n8k{k}" for k in s.prec.mma_k if s.ktile % k == 0]
        return (f"mma={s.mma_shape} does not divide ktile={s.ktile}: ktile must be a multiple of the "
                f"MMA's K; valid mma for ktile={s.ktile}: {', '.join(ok) or 'none'}")


def _r_warp_tile(s):
    for key, v in (("tile.block", (s.bm, s.bn)), ("tile.warps", (s.warps_m, s.warps_n))):
        if min(v) <= 0:
            return f"{key}={list(v)} must be positive"
    bad = [f"{b}={v} is not divisible by {w}={n}" for b, v, w, n in
           (("BM", s.bm, "WM", s.warps_m), ("BN", s.bn, "WN", s.warps_n)) if v % n]
    if bad:
        return (f"tile.block={[s.bm, s.bn]} cannot be split over tile.warps={[s.warps_m, s.warps_n]}: "
                + " and ".join(bad) + "; each warp computes BM/WM x BN/WN of C. Valid examples: "
                "block [128,128] warps [2,4]; [64,64] [2,2].")
    wm, wn = s.warp_tile
    if wm % 16 or wn % 8:
        return (f"tile.block={[s.bm, s.bn]} with tile.warps={[s.warps_m, s.warps_n]} gives a warp tile "
                f"of {s.bm / s.warps_m:g}x{s.bn / s.warps_n:g}; it must be a multiple of 16x8 "
                "(m16n8 MMA tiles). Valid examples: block [128,128] warps [2,4]; [64,64] [2,2].")
    if s.threads > 1024:
        return f"tile.warps={[s.warps_m, s.warps_n]} gives {s.threads} threads; at most 1024"


def _r_b_row(s):
    if s.b_layout == "row" and s.b_row_bytes % 16:
        return (f"b_layout=row copies K rows of BN={s.bn} {s.precision} elements ({s.b_row_bytes} "
                "bytes) in 16-byte cp.async chunks: BN * bits / 8 must be a multiple of 16. "
                "Use a wider tile.block or b_layout=col.")


def _r_copy(s):
    for op, row in (("A", s.row_bytes), ("B", s.row_bytes if s.b_layout == "col" else s.b_row_bytes)):
        if s.threads % (row // 16):
            return (f"{op} rows of {row} bytes are {row // 16} cp.async chunks, which do not divide the "
                    f"{s.threads} threads of tile.warps={[s.warps_m, s.warps_n]}; use a power-of-two tile.")


def _r_trans(s):
    if s.b_layout == "row" and s.prec.bits != 16 and s.loader_b != "manual":
        return (f"loader.b={s.loader_b} is not valid with b_layout=row and precision={s.precision}: "
                "ldmatrix.m8n8 .trans transposes 16-bit elements only (PTX ISA 9.7.14.5.15), so "
                f"{s.prec.bits}-bit B stored K x N is gathered by scalar loads; valid values: manual")


def _loader_fit(s, operand: str, loader: str) -> str | None:
    """ldmatrix.xN reads N 8x8 (b16) matrices; one m16 tile of A holds 4 per 32-byte K chunk (2 for
    16-byte rows), one n8 tile of B 2 (1 for 16-byte col rows); N must cover whole tiles."""
    if loader == "manual":
        return None
    per = (4 if operand == "a" else 2) // (2 if s.row_bytes == 16 else 1)
    if operand == "b" and s.b_layout == "row":
        per = 2                                   # 16-bit K x N: two k8 matrices per 32-byte chunk
    tiles = s.warp_tile[0] // 16 if operand == "a" else s.warp_tile[1] // 8
    need = max(1, int(loader[1]) // per)
    if tiles % need:
        return (f"loader.{operand}={loader} reads {loader[1]} 8x8 matrices at once, {need} "
                f"{'m16' if operand == 'a' else 'n8'} tiles of {per} each (ktile={s.ktile}, "
                f"{s.row_bytes}-byte rows), but the warp tile {s.warp_tile[0]}x{s.warp_tile[1]} has "
                f"{tiles}; valid loader.{operand} here: "
                + ", ".join(x for x in LOADERS if x == "manual" or tiles % max(1, int(x[1]) // per) == 0))


def _r_swizzle(s):
    if s.smem_layout != "swizzled":
        return None
    why = []
    if s.row_bytes < 32:
        ok = [k for k in valid_ktiles(s.prec) if k * s.prec.bits // 8 >= 32]
        why.append(f"rows of at least 32 bytes (ktile={s.ktile} gives {s.row_bytes}, which pack 8 rows into "
                   f"128 bytes without conflicts already; valid ktile for {s.precision}: "
                   f"{', '.join(map(str, ok))})")
    if s.b_layout != "col":
        why.append("b_layout=col (B rows of K, like A's)")
    if (s.loader_a, s.loader_b) != ("x4", "x4"):
        why.append("loader.a=x4 and loader.b=x4 (each ldmatrix.x4 reads two whole 16-byte chunks of K)")
    rows_per_pass = s.threads // max(1, s.row_bytes // 16)
    if s.row_bytes >= 32 and rows_per_pass % 8:
        why.append(f"copy passes of whole groups of 8 rows ({s.threads} threads copy {rows_per_pass} rows of "
                   f"{s.row_bytes} bytes per pass; use more warps or a smaller ktile)")
    if why:
        return ("smem_layout=swizzled (16-byte chunk j of row r stored at j ^ f(r)) needs " + "; ".join(why)
                + ". Use smem_layout=padded otherwise.")


def _r_registers(s):
    wm, wn = s.warp_tile
    acc = (wm // 16) * (wn // 8) * s.accum.regs_per_tile
    frags = 2 * ((wm // 16) * 4 + (wn // 8) * 2)
    if acc + frags > 224:
        return (f"warp tile {wm}x{wn} needs {acc} accumulator and {frags} fragment registers "
                "per thread; more than 224 leave too few of the 255 for addresses. Use more warps.")


def _r_smem(s):
    lim = ARCHS[s.arch]
    if s.smem_bytes > lim.max_smem_block:
        return (f"{getattr(s, 'entry', 'the kernel')} needs {s.smem_bytes} bytes "
                f"of shared memory per block ({s.stages} stages x {s.stage_bytes} B); {s.arch} allows "
                f"{lim.max_smem_block}: valid pipeline.stages here: 1..{lim.max_smem_block // s.stage_bytes} "
                "(or reduce ktile or tile.block).")


RULES = (
    Rule("arch", ("precision", "arch"), _r_arch, "FP8 mma.sync needs sm_89 and PTX ISA 8.4"),
    Rule("acc", ("precision", "acc"), lambda s: choose("acc", s.acc, s.prec.accs, f"precision={s.precision}"),
         "f16 accumulation exists for fp16 only (bf16, fp8 here: f32; integers: s32)"),
    Rule("ktile", ("precision", "ktile"),
         lambda s: choose("ktile", s.ktile, valid_ktiles(s.prec), f"precision={s.precision}"),
         "a stage row is at least one 16-byte cp.async chunk"),
    Rule("mma", ("precision", "mma_k"), _r_mma, "native m16n8kK shapes of the type (PTX ISA 9.7.14.5)"),
    Rule("mma_k", ("ktile", "mma_k"), _r_divides, "ktile is a multiple of the MMA's K"),
    Rule("b_row", ("precision", "b_layout", "bm", "bn", "warps_m", "warps_n"), _r_b_row,
         "B rows of K x N copy in 16-byte chunks"),
    Rule("warp_tile", ("bm", "bn", "warps_m", "warps_n"), _r_warp_tile,
         "warp tile of whole m16n8 tiles, at most 1024 threads"),
    Rule("copy", ("precision", "ktile", "b_layout", "bm", "bn", "warps_m", "warps_n"), _r_copy,
         "16-byte chunks of a row divide the threads"),
    # before the loader rules: its message names every requirement of the swizzled layout at once
    Rule("swizzle", ("precision", "ktile", "b_layout", "bm", "bn", "warps_m", "warps_n", "loader_a",
                     "loader_b", "smem_layout"), _r_swizzle,
         "XOR swizzle: rows >= 32 bytes of A and B (col), ldmatrix.x4, whole 8-row passes"),
    Rule("b_trans", ("precision", "b_layout", "loader_b"), _r_trans, "ldmatrix .trans moves 16-bit elements"),
    Rule("loader_a", ("precision", "ktile", "bm", "bn", "warps_m", "warps_n", "loader_a"),
         lambda s: _loader_fit(s, "a", s.loader_a), "ldmatrix.xN covers whole m16 tiles"),
    Rule("loader_b", ("precision", "ktile", "b_layout", "bm", "bn", "warps_m", "warps_n", "loader_b"),
         lambda s: _loader_fit(s, "b", s.loader_b), "ldmatrix.xN covers whole n8 tiles"),
    Rule("registers", ("bm", "bn", "warps_m", "warps_n", "acc"), _r_registers,
         "accumulators + two fragment sets <= 224 of 255 registers"),
    Rule("smem", ("precision", "ktile", "b_layout", "bm", "bn", "warps_m", "warps_n", "smem_layout", "stages",
                  "arch"),
         _r_smem, "stages x stage bytes <= the target's shared memory per block", monotone=True),
)
