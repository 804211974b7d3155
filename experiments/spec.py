"""KernelSpec: one fully resolved, validated point of the ``mma_sync`` ablation space, and the space.

The axes (:func:`~experiments.spec_rules.make_axes`) and their restrictions
(:data:`~experiments.spec_rules.RULES`) are data: :class:`KernelSpec` validates one point with them,
:func:`space` enumerates every point of them (tests, ``--help``: :func:`describe_space`).
An impossible combination stops with a message naming the axis, the value and the valid values.
Facts (types, targets, domains) live in :mod:`experiments.spec_tables`; sources are named there and
in each rule.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from enum import Enum
from math import prod

from .spec_rules import RULES, Axis, Geometry, Rule, choose, make_axes, valid_ktiles
from .spec_tables import (ARCHS, B_LAYOUTS, CACHE_OPS, GROUP_M_RANGE, L2_HINTS, LOADERS, MAX_STAGES,
                          PRECISIONS, ArchLimits, Precision)

__all__ = ["PRECISIONS", "ARCHS", "SpecError", "KernelSpec", "Precision", "ArchLimits", "Axis", "Rule",
           "make_axes", "RULES", "Space", "space", "describe_space", "valid_ktiles", "spec_from_config",
           "resolve_arch", "value"]

_HINT = {"none": "x", "evict_first": "f", "evict_last": "l", "evict_normal": "n"}


class SpecError(ValueError):
    """An axis value that cannot exist; the message names key, value and the valid values."""


@dataclass(frozen=True)
class KernelSpec(Geometry):
    """One kernel of the ``mma_sync_gemm`` family, every axis resolved.

    Build it with :func:`spec_from_config`; direct construction validates too (raises SpecError).
    ``acc="auto"`` resolves to the precision's default accumulator, ``ptx_version=(0, 0)`` to the
    lowest PTX ISA the instructions and the target need.
    """
    precision: str
    ktile: int
    mma_k: int
    bm: int
    bn: int
    warps_m: int
    warps_n: int
    stages: int
    cache_op: str
    arch: str
    ptx_version: tuple = field(default=(0, 0))
    group_m: int = 8
    loader_a: str = "x4"
    loader_b: str = "x2"
    b_layout: str = "col"
    acc: str = "auto"
    l2_hint_a: str = "none"
    l2_hint_b: str = "none"

    def __post_init__(self):
        _validate(self)

    @property
    def entry(self) -> str:
        """PTX entry name, unique per spec and derived from it (DESIGN.md, Kernel contract)."""
        acc = "" if self.acc == self.prec.acc else f"_acc{self.acc}"
        hint = "" if self.l2_hint_a == self.l2_hint_b == "none" else \
            f"_l2{_HINT[self.l2_hint_a]}{_HINT[self.l2_hint_b]}"
        ld = lambda x: "man" if x == "manual" else x  # noqa: E731
        return (f"gemm_{self.precision}_bk{self.ktile}_{self.mma_shape}{acc}_ld{ld(self.loader_a)}"
                f"{ld(self.loader_b)}_{self.cache_op}{hint}_b{self.b_layout}_s{self.stages}"
                f"_{self.bm}x{self.bn}_w{self.warps_m}x{self.warps_n}_g{self.group_m}")

    def as_kwargs(self) -> dict:
        """Constructor arguments (picklable), e.g. to rebuild the spec in the GPU worker."""
        return asdict(self)

    def flat(self) -> dict:
        """Plain dict of the axes (for tracking)."""
        d = asdict(self)
        d["ptx_version"] = "%d.%d" % self.ptx_version
        d["mma"] = self.mma_shape
        return d

    def check_problem(self, m: int, n: int, k: int) -> None:
        """Raise SpecError unless M, N, K fit this kernel: multiples of BM, BN, BK (no tails)
        and below 2^32 bytes per operand and 2^40 bytes of C (32-bit row offsets)."""
        bad = [f"{name}={v} is not a multiple of {name_t}={t}"
               for name, v, name_t, t in (("M", m, "BM", self.bm), ("N", n, "BN", self.bn),
                                          ("K", k, "BK", self.ktile)) if v <= 0 or v % t]
        if bad:
            raise SpecError(f"{self.entry} handles no tails: " + "; ".join(bad)
                            + ". Choose problem sizes that are multiples of the block tile.")
        if max(m, n) * k * self.prec.bits // 8 >= 2 ** 32 or m * n * 4 >= 2 ** 40:
            raise SpecError(f"problem {m}x{n}x{k} is too large for 32-bit offsets in {self.entry}")


_DOMAINS = {"loader_a": ("loader.a", LOADERS), "loader_b": ("loader.b", LOADERS),
            "b_layout": ("b_layout", B_LAYOUTS), "cache_op": ("cache.op", CACHE_OPS),
            "l2_hint_a": ("cache.l2_hint_a", L2_HINTS), "l2_hint_b": ("cache.l2_hint_b", L2_HINTS)}


def _validate(s: KernelSpec) -> None:
    err = (choose("precision", s.precision, list(PRECISIONS)) or choose("target.arch", s.arch, list(ARCHS)))
    if err:
        raise SpecError(err)
    if s.acc == "auto":
        object.__setattr__(s, "acc", s.prec.acc)
    for attr, (key, dom) in _DOMAINS.items():
        if err := choose(key, getattr(s, attr), dom):
            raise SpecError(err)
    if not 1 <= s.stages <= MAX_STAGES:
        raise SpecError(f"pipeline.stages={s.stages} is not valid; valid values: 1 ... {MAX_STAGES} (a "
                        "cp.async.wait_group waits for at most 63 pending groups) that fit shared memory")
    if not GROUP_M_RANGE[0] <= s.group_m <= GROUP_M_RANGE[1]:
        raise SpecError(f"tile.group_m={s.group_m} must be between 1 (row-major) and {GROUP_M_RANGE[1]}")
    for rule in RULES:
        if msg := rule.check(s):
            raise SpecError(msg)
    need = _min_ptx(s)
    if s.ptx_version == (0, 0):
        object.__setattr__(s, "ptx_version", need)
    elif s.ptx_version < need:
        raise SpecError(f"target.ptx_version={'%d.%d' % s.ptx_version} is below {'%d.%d' % need}, the "
                        f"lowest that {s.arch} and mma.{s.mma_shape}.{s.prec.ptx}"
                        f"{' with .L2::cache_hint' if _hinted(s) else ''} need")


def _hinted(s) -> bool:
    return s.l2_hint_a != "none" or s.l2_hint_b != "none"


def _min_ptx(s: KernelSpec) -> tuple:
    """Lowest PTX ISA for the instructions used: cp.async 7.0, ldmatrix 6.5, mma m16n8k16/k32/k64 and
    bf16 7.0, FP8 mma 8.4, createpolicy and .L2::cache_hint 7.4; and for the `.target`."""
    return max((7, 4) if _hinted(s) else (7, 0), s.prec.min_ptx, ARCHS[s.arch].min_ptx)


# ------------------------------------------------------------------------------ the space
class _Point(Geometry):
    """A partial point of the space: the attributes bound so far."""


@dataclass
class Space:
    """The enumerated space. ``cells``: one per valid combination of the shaping axes before
    pipeline.stages, as (arch, value indices of those axes, max_stages), where stages 1..max_stages are
    valid (shared memory grows with stages); ``counts``: per arch, 'valid' and one count per rule name
    of the points it rejects first (points = the whole product, non-shaping axes included)."""
    axes: tuple
    cells: list
    counts: dict

    def spec(self, values: tuple, stages: int, free: tuple = ()) -> KernelSpec:
        """The KernelSpec of a cell's ``values``, ``stages`` and the non-shaping values (indices;
        default: each axis' first value)."""
        kw = {}
        shaping = [a for a in self.axes if a.shaping][:-1]
        rest = [a for a in self.axes if not a.shaping]
        free = free or (0,) * len(rest)
        for ax, i in list(zip(shaping, values, strict=True)) + list(zip(rest, free, strict=True)):
            kw.update(zip(ax.attrs, ax.values[i], strict=True))
        return KernelSpec(stages=stages, **kw)


def space(archs=None, tiles: dict | None = None) -> Space:
    """Enumerate the axes (:func:`make_axes`) and apply the rules (:data:`RULES`) in axis order: a
    point is counted under the first rule that rejects it, at the first axis where that rule can be
    decided. ``archs`` limits target.arch; ``tiles`` replaces the tile presets. Returns a
    :class:`Space`. The rules decided at pipeline.stages must be monotone (stages are counted, not
    walked, past the first that fails)."""
    axes = make_axes(tiles, archs)
    shaping = [a for a in axes if a.shaping]
    free_n = prod(len(a.values) for a in axes if not a.shaping)
    depth = {attr: i for i, ax in enumerate(shaping) for attr in ax.attrs}
    at = [[r for r in RULES if max(depth[a] for a in r.attrs) == i] for i in range(len(shaping))]
    below = [prod(len(a.values) for a in shaping[i + 1:]) * free_n for i in range(len(shaping))]
    last = len(shaping) - 1
    assert all(r.monotone for r in at[last]), "rules decided at pipeline.stages must be monotone"
    cells, counts, pt = [], {}, _Point()

    def walk(i, idx, cnt):
        ax = shaping[i]
        for vi, val in enumerate(ax.values):
            for attr, v in zip(ax.attrs, val, strict=True):
                setattr(pt, attr, v)
            failed = next((r for r in at[i] if r.check(pt)), None)
            if i == last and failed:
                cnt[failed.name] += below[i] * (len(ax.values) - vi)
                if vi:
                    cells.append((pt.arch, idx, vi))
                return
            if failed:
                cnt[failed.name] += below[i]
            elif i < last:
                walk(i + 1, idx + (vi,), cnt)
        if i == last:
            cells.append((pt.arch, idx, len(ax.values)))

    for ai, (arch,) in enumerate(shaping[0].values):
        counts[arch] = Counter()
        pt.arch = arch
        walk(1, (ai,), counts[arch])
    for arch, cnt in counts.items():
        cnt["valid"] = sum(c[2] for c in cells if c[0] == arch) * free_n
    return Space(axes, cells, counts)


def describe_space() -> str:
    """Text for ``--help``: every axis with its values and meaning, then every rule and why."""
    lines = ["Axes (the space enumerates these values):"]
    for ax in make_axes():
        vals = ax.labels if len(ax.labels) < 12 else (*ax.labels[:3], "...", ax.labels[-1])
        lines.append(f"  {ax.key:<18} {', '.join(vals):<48} {ax.meaning}")
    lines.append("Restrictions (checked in this order):")
    lines += [f"  {r.name:<10} {r.why}" for r in RULES]
    return "\n".join(lines)


# ------------------------------------------------------------------------------ from the config
def resolve_arch(arch: str, gpu_cc: int | None) -> str:
    """``auto`` -> the GPU's own ``sm_XY`` (or ``sm_90`` without a GPU); else validate the name.

    Raises SpecError for an unknown architecture, naming the supported ones.
    """
    if arch == "auto":
        arch = f"sm_{gpu_cc}" if gpu_cc else "sm_90"
    if arch not in ARCHS:
        raise SpecError(f"target.arch={arch!r} is not supported; valid: auto, {', '.join(ARCHS)}")
    return arch


def _parse_version(v: str) -> tuple:
    if v == "auto":
        return (0, 0)
    try:
        major, minor = (int(x) for x in str(v).split("."))
    except ValueError:
        raise SpecError(f"target.ptx_version={v!r} must be 'auto' or MAJOR.MINOR, e.g. 7.8") from None
    return (major, minor)


def value(v) -> str:
    """Config value as its plain string (Enum members by name)."""
    return v.name if isinstance(v, Enum) else str(v)


def spec_from_config(cfg, gpu_cc: int | None = None) -> KernelSpec:
    """Build and validate a KernelSpec from the composed Hydra config (see ``experiments.config``).

    ``gpu_cc`` is the compute capability as an int (90 for an H200) or None without a GPU.
    Raises SpecError naming the axis, the value and the valid values.
    """
    p = PRECISIONS.get(value(cfg.precision))
    if p is None:
        raise SpecError(choose("precision", value(cfg.precision), list(PRECISIONS)))
    ktile, mma = int(cfg.ktile), str(cfg.mma)
    if mma == "auto":
        fits = [k for k in p.mma_k if ktile % k == 0]
        if not fits:
            raise SpecError(choose("ktile", ktile, valid_ktiles(p), f"precision={p.name}"))
        mma_k = fits[-1]
    else:
        shapes = {f"m16n8k{k}": k for k in p.mma_k}
        if mma not in shapes:
            raise SpecError(choose("mma", mma, ["auto"] + list(shapes), f"precision={p.name}"))
        mma_k = shapes[mma]
    block, warps = list(cfg.tile.block), list(cfg.tile.warps)
    if len(block) != 2 or len(warps) != 2:
        raise SpecError(f"tile.block={block} and tile.warps={warps} must each be two integers, "
                        "e.g. tile.block=[128,128] tile.warps=[2,4]")
    return KernelSpec(
        precision=p.name, ktile=ktile, mma_k=mma_k, bm=int(block[0]), bn=int(block[1]),
        warps_m=int(warps[0]), warps_n=int(warps[1]), stages=int(cfg.pipeline.stages),
        cache_op=value(cfg.cache.op), arch=resolve_arch(str(cfg.target.arch), gpu_cc),
        ptx_version=_parse_version(str(cfg.target.ptx_version)), group_m=int(cfg.tile.group_m),
        loader_a=value(cfg.loader.a), loader_b=value(cfg.loader.b), b_layout=value(cfg.b_layout),
        acc=value(cfg.acc), l2_hint_a=value(cfg.cache.l2_hint_a), l2_hint_b=value(cfg.cache.l2_hint_b),
    )
