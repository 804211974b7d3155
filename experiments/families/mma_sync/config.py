"""The default family's config schema: its root keys (ktile, mma, acc, b_layout, smem_layout, tile.*,
loader.*, pipeline.*, cache.*), their Enums made from the domains in :mod:`.domains` and
their sections. :func:`root_fields` is what ``experiments.config.Config`` takes from this family
(:meth:`MmaSyncFamily.root_fields`); the classes keep this module as their pickled path (joblib, submitit,
the composition cache of :func:`experiments.runner.sweep.compose_once`) and are re-exported by
``experiments.config``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import List, Optional

from ...dtypes import Accum
from .domains import B_LAYOUTS, CACHE_OPS, L2_HINTS, L2_PREFETCHES, LOADERS, SMEM_LAYOUTS

__all__ = ["Acc", "Loader", "CacheOp", "L2Hint", "L2Prefetch", "BLayout", "SmemLayout", "TileConf",
           "PipelineConf",
           "LoaderConf", "CacheConf", "root_fields"]


def _enum(name: str, values) -> type:
    return Enum(name, {str(v): str(v) for v in values}, module=__name__)


# acc: auto = f32 for float types, s32 for integers; f16 with fp16 only (C fp16 in memory)
Acc = _enum("Acc", ("auto", *(a.name for a in Accum)))
Loader = _enum("Loader", LOADERS)           # shared -> register loader (domains.LOADERS)
CacheOp = _enum("CacheOp", CACHE_OPS)       # cp.async.ca: L1 and L2; .cg: L2 only (16-byte copies)
L2Hint = _enum("L2Hint", L2_HINTS)          # .L2::cache_hint eviction priority (none: no hint)
L2Prefetch = _enum("L2Prefetch", L2_PREFETCHES)   # .L2::<size> DRAM read size on a miss (none: no qualifier)
BLayout = _enum("BLayout", B_LAYOUTS)       # col: B stored N x K (K contiguous); row: K x N
SmemLayout = _enum("SmemLayout", SMEM_LAYOUTS)   # padded or swizzled rows (domains.SMEM_LAYOUTS)


@dataclass
class TileConf:
    block: List[int] = field(default_factory=lambda: [256, 128])   # BM, BN
    warps: List[int] = field(default_factory=lambda: [4, 2])       # warps along M, along N
    group_m: int = 8            # block rasterization: block rows per group (1 = row-major)
    auto: bool = False          # tile=auto: block and warps chosen per problem size (the family's auto_tile)
    sms: Optional[int] = None   # tile=auto plans for this many SMs (default: the GPU's own count)


@dataclass
class PipelineConf:
    stages: int = 3             # cp.async stages in flight (1 = load, wait, compute); at most what
                                # shared memory allows on the target, and 65


@dataclass
class LoaderConf:
    a: Loader = Loader.x4       # shared -> register loader of A fragments
    b: Loader = Loader.x2       # ... of B fragments (b_layout=row with 8-/4-bit types: manual)


@dataclass
class CacheConf:
    op: CacheOp = CacheOp.cg            # cp.async cache operator
    l2_hint_a: L2Hint = L2Hint.none     # L2 eviction priority of A's copies
    l2_hint_b: L2Hint = L2Hint.none     # ... of B's copies
    l2_prefetch: L2Prefetch = L2Prefetch.none   # bytes L2 reads from DRAM on a miss of A's and B's copies


def root_fields() -> list:
    """The config's root keys of this family as ``(name, type, dataclasses.field)`` for
    :func:`dataclasses.make_dataclass`, new fields on each call, in the order ``Config`` shows them (the
    scalars after ``precision``, the sections before the shared ones)."""
    return [
        ("ktile", int, field(default=32)),
        ("mma", str, field(default="auto")),      # auto = largest native m16n8kK whose K divides ktile
        ("acc", Acc, field(default=Acc.auto)),
        ("b_layout", BLayout, field(default=BLayout.col)),
        ("smem_layout", SmemLayout, field(default=SmemLayout.padded)),
        ("tile", TileConf, field(default_factory=TileConf)),
        ("loader", LoaderConf, field(default_factory=LoaderConf)),
        ("pipeline", PipelineConf, field(default_factory=PipelineConf)),
        ("cache", CacheConf, field(default_factory=CacheConf)),
    ]
