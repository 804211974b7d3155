"""Facts the default family (``experiments.families.DEFAULT``) is built from, each in one table: the
element types and accumulators it takes (a selection of :mod:`experiments.dtypes`) and the target
architectures (:mod:`experiments.hardware`); the sources are named in those modules. The domains of its
other axes are its own, in its package.
"""
from __future__ import annotations

from .dtypes import Accum, DType
from .hardware import ARCHS, ArchLimits

__all__ = ["PRECISIONS", "ACCUMULATORS", "ArchLimits", "ARCHS"]


# element types and accumulators: selections of the one table (experiments.dtypes), in the order of the
# precision and acc axes (the enumeration order of the space)
PRECISIONS = {p.name: p for p in DType}
ACCUMULATORS = {a.name: a for a in (Accum.f32, Accum.s32, Accum.f16)}

