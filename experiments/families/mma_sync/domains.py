"""The domains of the default family's axes besides precision and target (those are shared:
:mod:`experiments.spec_tables`), each in one table; the rules (:mod:`.rules`), the spec (:mod:`.spec`) and
the config schema (:mod:`.config`) are made from them.

Sources: PTX ISA 9.0, section 9.7.14.5.15 (``ldmatrix``), 9.7.9.25.3.1 (``cp.async``, ``.L2::cache_hint``
and ``.L2::<size>`` prefetch
since PTX ISA 7.4), 9.7.9.18 (``createpolicy``, PTX ISA 7.4, sm_80). Every minimum was also checked with
``ptxas 13.0``, which names the version or target a feature needs when it is missing.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

__all__ = ["KTILES", "LOADERS", "CACHE_OPS", "L2_HINTS", "L2_PREFETCHES", "B_LAYOUTS", "SMEM_LAYOUTS",
           "MAX_STAGES",
           "GROUP_M_RANGE", "tile_presets", "tile_group_m"]


KTILES = (16, 32, 64, 128)
# shared -> register loader of one operand: ldmatrix with 1, 2 or 4 8x8 matrices, or scalar ld.shared
# of single elements (bytes for 4-bit types) packed into the fragment registers
LOADERS = ("x1", "x2", "x4", "manual")
CACHE_OPS = ("ca", "cg")
L2_HINTS = ("none", "evict_first", "evict_last", "evict_normal")
# cp.async's .L2::64B/.L2::128B/.L2::256B: on an L2 miss, DRAM is read in blocks of this size around the
# 16-byte chunk (PTX ISA 9.0, 9.7.9.25.3.1, .level::prefetch_size, PTX ISA 7.4); none: no qualifier
L2_PREFETCHES = ("none", "64B", "128B", "256B")
B_LAYOUTS = ("col", "row")
# shared-memory rows of a stage: "padded" (16 bytes after each row, so the 8 row addresses of an ldmatrix
# fall in 8 bank groups) or "swizzled" (no padding, the 16-byte chunk index XORed with bits of the row:
# the patterns of TMA's 32B/64B/128B swizzles, Geometry.swizzle; conflict-free too, and no row straddles
# a 128-byte line)
SMEM_LAYOUTS = ("padded", "swizzled")
# cp.async.wait_group N compiles to `DEPBAR.LE SB0, N`, whose counter holds at most 63 (ptxas 13.0
# clamps larger N to 63): S stages wait with N = S - 2, so at most 65 stages can be in flight.
MAX_STAGES = 65
GROUP_M_RANGE = (1, 64)

_TILE_DIR = Path(__file__).resolve().parents[3] / "conf" / "tile"


@lru_cache(maxsize=1)
def tile_presets() -> dict:
    """The presets of ``conf/tile/*.yaml``: name -> (BM, BN, warps along M, warps along N)."""
    from omegaconf import OmegaConf
    out = {}
    for path in sorted(_TILE_DIR.glob("*.yaml")):
        c = OmegaConf.load(path)
        out[path.stem] = (int(c.block[0]), int(c.block[1]), int(c.warps[0]), int(c.warps[1]))
    return out


def tile_group_m() -> dict:
    """The presets of ``conf/tile/*.yaml`` that set ``group_m``: name -> group_m (e.g. l4_32x64: 1)."""
    from omegaconf import OmegaConf
    return {path.stem: int(c.group_m) for path in sorted(_TILE_DIR.glob("*.yaml"))
            if "group_m" in (c := OmegaConf.load(path))}
