"""A covering subset of the ``mma_sync`` space: few kernels, every value and every pair exercised.

The whole valid space (:func:`.spec.space`) has millions of points; assembling all of them
takes hours. :func:`covering_subset` picks kernels so that
  1. every pair of values of two kernel-shaping axes (target.arch, precision, acc, ktile, mma,
     b_layout, tile, loader.a, loader.b, smem_layout) that occurs together in some valid point occurs
     together in a chosen kernel, and every value of each of them meets each stage class of
     pipeline.stages it allows: 1 to 4, the powers of two and the largest count (the template depends
     on the count only through the one-stage path, the ``cp.async.wait_group`` immediates S-1 and
     S-2, the S unrolled prologue loads and the ring buffer's wrap offset S x stage bytes, so the
     classes reach both ends of every one of them), and
  2. for every (precision, target.arch), every value of every axis (shaping or not: cache.op,
     cache.l2_hint_a/b, tile.group_m) that occurs with them occurs in a chosen kernel with them; of
     pipeline.stages, every class.
The choice is greedy (each step takes, among a few candidate points that cover the rarest open
requirement, the one that covers most open requirements) and deterministic for a given space.
"""
from __future__ import annotations

import itertools
import random
from collections import defaultdict

from .spec import KernelSpec, Space

__all__ = ["covering_subset", "requirements", "stage_classes"]

_CANDIDATES = 24


def _point_tuples(values: tuple, stage: int, stage_axis: int) -> set:
    """Requirements a shaping point meets: pairs ((i, vi), (j, vj)) and (precision, arch, (i, vi))."""
    vals = list(enumerate(values)) + [(stage_axis, stage)]
    out = {(a, b) for a, b in itertools.combinations(vals, 2)}
    arch, prec = values[0], values[1]
    out |= {("pa", arch, prec, v) for v in vals}
    return out


def stage_classes(most: int) -> list[int]:
    """The stage counts the requirements ask of a value whose largest valid count is ``most``: 1 to 4,
    the powers of two and ``most``."""
    return sorted({s for s in (1, 2, 3, 4, 8, 16, 32, 64) if s <= most} | {most})


def requirements(sp: Space) -> set:
    """Every requirement (1. and 2. of the module doc) of the shaping axes that the space can meet."""
    stage_axis = sum(a.shaping for a in sp.axes) - 1
    req, max_s = set(), defaultdict(int)
    for _, values, mx in sp.cells:
        vals = list(enumerate(values))
        req |= {(a, b) for a, b in itertools.combinations(vals, 2)}
        req |= {("pa", values[0], values[1], v) for v in vals}
        for v in vals:
            max_s[v] = max(max_s[v], mx)
        key = ("pa", values[0], values[1])
        max_s[key] = max(max_s[key], mx)
    for v, mx in list(max_s.items()):
        if v[0] == "pa":
            req |= {("pa", v[1], v[2], (stage_axis, s)) for s in stage_classes(mx)}
        else:
            req |= {(v, (stage_axis, s)) for s in stage_classes(mx)}
    return req


def covering_subset(sp: Space, seed: int = 0) -> list[KernelSpec]:
    """Kernels of ``sp`` that meet every requirement of :func:`requirements` and requirement 2. for
    the non-shaping axes (whose values are dealt round-robin within each (precision, arch)).
    Deterministic for a given space and seed."""
    rng = random.Random(seed)
    stage_axis = sum(a.shaping for a in sp.axes) - 1
    open_ = requirements(sp)
    by_value = defaultdict(list)
    for ci, (_, values, _) in enumerate(sp.cells):
        for v in enumerate(values):
            by_value[v].append(ci)

    def candidates(req):
        if req[0] == "pa":
            fixed = [(0, req[1]), (1, req[2])] + ([req[3]] if req[3][0] != stage_axis else [])
            stage = req[3][1] if req[3][0] == stage_axis else 0
        else:
            fixed = [v for v in req if v[0] != stage_axis]
            stage = next((v[1] for v in req if v[0] == stage_axis), 0)
        pool = min((by_value[v] for v in fixed), key=len)
        start = rng.randrange(len(pool))
        found = []
        for ci in itertools.chain(pool[start:], pool[:start]):
            _, values, mx = sp.cells[ci]
            if mx >= stage and all(values[i] == v for i, v in fixed):
                found.append((ci, stage))
                if len(found) == _CANDIDATES:
                    break
        return found

    def best_stage(values, mx):
        open_pa = [s for s in range(mx, 0, -1) if ("pa", values[0], values[1], (stage_axis, s)) in open_]
        return open_pa[0] if open_pa else mx

    chosen = []
    order = sorted(open_, key=lambda r: (-_stage_of(r, stage_axis), str(r)))
    for req in order:
        if req not in open_:
            continue
        best, best_cover, best_size = None, None, 0
        for ci, stage in candidates(req):
            values, mx = sp.cells[ci][1], sp.cells[ci][2]
            st = stage or best_stage(values, mx)
            cover = _point_tuples(values, st, stage_axis) & open_
            size = _size(sp, values)                   # ties: the smaller tile assembles faster
            if best_cover is None or (len(cover), -size) > (len(best_cover), -best_size):
                best, best_cover, best_size = (values, st), cover, size
        assert best is not None, f"no valid point meets {req}"
        chosen.append(best)
        open_ -= best_cover
    return _deal_free(sp, chosen)


def _size(sp: Space, values: tuple) -> int:
    tile = next(i for i, a in enumerate(sp.axes) if a.key == "tile")
    bm, bn, _, _ = sp.axes[tile].values[values[tile]]
    return bm * bn


def _stage_of(req, stage_axis) -> int:
    vals = req[3:] if req[0] == "pa" else req
    return max((v[1] for v in vals if isinstance(v, tuple) and v[0] == stage_axis), default=0)


def _deal_free(sp: Space, chosen: list) -> list[KernelSpec]:
    """Give the chosen points values of the non-shaping axes, round-robin per (precision, arch), adding
    copies of a group's first point until every value occurs in the group."""
    free = [a for a in sp.axes if not a.shaping]
    need = max(len(a.values) for a in free)
    groups = defaultdict(list)
    for values, stage in chosen:
        groups[(values[0], values[1])].append((values, stage))
    out = []
    for pts in groups.values():
        pts = pts + [pts[0]] * max(0, need - len(pts))
        for r, (values, stage) in enumerate(pts):
            idx = tuple((r + r // len(a.values) * k) % len(a.values) for k, a in enumerate(free))
            out.append(sp.spec(values, stage, idx))
    return out
