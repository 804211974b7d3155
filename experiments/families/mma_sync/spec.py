"""The default family's spec: one fully resolved, validated point of its ablation space, and the space.

The axes (:func:`~.rules.make_axes`) and their restrictions (:data:`~.rules.RULES`) are data:
:class:`KernelSpec` validates one point with them, :func:`space` enumerates every point of them
(tests, ``--help``: :func:`describe_space`). An impossible combination stops with a message naming the
axis, the value and the valid values. Facts live in :mod:`experiments.spec_tables` (types, targets)
and :mod:`.domains` (the other axes' domains); sources are named there and in each rule.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from math import prod

from ...build.assemble import theoretical_occupancy
from ...spec import AUTO_SHARED_COST, AutoTile, SpecError, check_no_tails, resolve_arch, value, waves_cost
from ...spec import _parse_version
from ...spec_tables import ARCHS, PRECISIONS
from .domains import (B_LAYOUTS, CACHE_OPS, GROUP_M_RANGE, L2_HINTS, L2_PREFETCHES, LOADERS, MAX_STAGES,
                      SMEM_LAYOUTS, tile_group_m)
from .rules import RULES, Geometry, choose, make_axes, preset_tiles, valid_ktiles

__all__ = ["NAME", "KernelSpec", "Space", "space", "describe_space", "spec_from_config", "auto_tile",
           "tile_cost"]

NAME = "mma_sync"          # the family's name in the registry, its runs' ``family`` param
_COPY_HINT = " (copy is the peak family's copy bandwidth: family=peak precision=copy)"
_HINT = {"none": "x", "evict_first": "f", "evict_last": "l", "evict_normal": "n"}


@dataclass(frozen=True)
class KernelSpec(Geometry):
    """One kernel of the ``mma_sync_gemm`` template, every axis resolved.

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
    smem_layout: str = "padded"
    l2_prefetch: str = "none"

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
                f"{ld(self.loader_b)}_{self.cache_op}{hint}"
                f"{'' if self.l2_prefetch == 'none' else '_pf' + self.l2_prefetch}"
                f"{'_sw' * (self.smem_layout == 'swizzled')}"
                f"_b{self.b_layout}_s{self.stages}"
                f"_{self.bm}x{self.bn}_w{self.warps_m}x{self.warps_n}_g{self.group_m}")

    @property
    def family(self) -> str:
        """The family's name (as :attr:`experiments.families.FamilySpec.family`)."""
        return NAME

    @property
    def params(self) -> tuple:
        """Sorted (field, value) pairs of every field besides precision and arch (the worker's copy)."""
        return tuple(sorted((k, v) for k, v in asdict(self).items() if k not in ("precision", "arch")))

    @property
    def p(self) -> dict:
        """params as a dict."""
        return dict(self.params)

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
        check_no_tails(self.entry, (m, n, k), (self.bm, self.bn, self.ktile))
        if max(m, n) * k * self.prec.bits // 8 >= 2 ** 32 or m * n * 4 >= 2 ** 40:
            raise SpecError(f"problem {m}x{n}x{k} is too large for 32-bit offsets in {self.entry}: A and B "
                            "must each stay below 2^32 bytes, C below 2^40 bytes")


_DOMAINS = {"loader_a": ("loader.a", LOADERS), "loader_b": ("loader.b", LOADERS),
            "b_layout": ("b_layout", B_LAYOUTS), "cache_op": ("cache.op", CACHE_OPS),
            "l2_hint_a": ("cache.l2_hint_a", L2_HINTS), "l2_hint_b": ("cache.l2_hint_b", L2_HINTS),
            "smem_layout": ("smem_layout", SMEM_LAYOUTS), "l2_prefetch": ("cache.l2_prefetch", L2_PREFETCHES)}


def _validate(s: KernelSpec) -> None:
    err = (choose("precision", s.precision, list(PRECISIONS)) or choose("target.arch", s.arch, list(ARCHS)))
    if err:
        raise SpecError(err + _COPY_HINT * (s.precision == "copy"))
    if s.acc == "auto":
        object.__setattr__(s, "acc", s.prec.acc)
    for attr, (key, dom) in _DOMAINS.items():
        if err := choose(key, getattr(s, attr), dom):
            raise SpecError(err)
    if not 1 <= s.stages <= MAX_STAGES:
        raise SpecError(f"pipeline.stages={s.stages} is not valid; valid values: 1 ... {MAX_STAGES} that fit "
                        f"shared memory (the main loop of S stages waits with cp.async.wait_group S - 2, and "
                        "its counter holds at most 63 pending groups)")
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
                        f"{' with .L2::cache_hint' if _hinted(s) else ''}"
                        f"{' with .L2::' + s.l2_prefetch if s.l2_prefetch != 'none' else ''} need")


def _hinted(s) -> bool:
    return s.l2_hint_a != "none" or s.l2_hint_b != "none"


def _qualified(s) -> bool:
    """An L2 qualifier of cp.async (cache hint or prefetch size), both PTX ISA 7.4."""
    return _hinted(s) or s.l2_prefetch != "none"


def _min_ptx(s: KernelSpec) -> tuple:
    """Lowest PTX ISA for the instructions used: cp.async 7.0, ldmatrix 6.5, mma m16n8k16/k32/k64 and
    bf16 7.0, FP8 mma 8.4, createpolicy, .L2::cache_hint and .L2::<size> 7.4; and for the `.target`."""
    return max((7, 4) if _qualified(s) else (7, 0), s.prec.min_ptx, ARCHS[s.arch].min_ptx)


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


def spec_from_config(cfg, gpu_cc: int | None = None) -> KernelSpec:
    """Build and validate a KernelSpec from the composed Hydra config (see ``experiments.config``).

    ``gpu_cc`` is the compute capability as an int (90 for an H200) or None without a GPU.
    Raises SpecError naming the axis, the value and the valid values.
    """
    p = PRECISIONS.get(value(cfg.precision))
    if p is None:
        raise SpecError(choose("precision", value(cfg.precision), list(PRECISIONS))
                        + _COPY_HINT * (value(cfg.precision) == "copy"))
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
    lists = {"tile.block": (block, "BM, BN", "[128,128]"),
             "tile.warps": (warps, "warps along M and N", "[2,4]")}
    if bad := [key for key, (v, _, _) in lists.items() if len(v) != 2]:
        raise SpecError("; ".join(f"{key}={lists[key][0]} must be two integers ({lists[key][1]}), e.g. "
                                  f"{key}={lists[key][2]}" for key in bad))
    return KernelSpec(
        precision=p.name, ktile=ktile, mma_k=mma_k, bm=int(block[0]), bn=int(block[1]),
        warps_m=int(warps[0]), warps_n=int(warps[1]), stages=int(cfg.pipeline.stages),
        cache_op=value(cfg.cache.op), arch=resolve_arch(str(cfg.target.arch), gpu_cc),
        ptx_version=_parse_version(str(cfg.target.ptx_version)), group_m=int(cfg.tile.group_m),
        loader_a=value(cfg.loader.a), loader_b=value(cfg.loader.b), b_layout=value(cfg.b_layout),
        acc=value(cfg.acc), l2_hint_a=value(cfg.cache.l2_hint_a), l2_hint_b=value(cfg.cache.l2_hint_b),
        smem_layout=value(cfg.smem_layout),
        l2_prefetch=value(cfg.cache.get("l2_prefetch", "none")),     # configs tracked before it: none
    )


def _registers(s: KernelSpec) -> int:
    """Registers per thread estimated from the spec: accumulators and two fragment sets (rule
    ``registers``) plus 32 for addresses and loop state (ptxas 13.0 on sm_90: 224 for the 64x64 fp16
    warp tile), capped at 255 and at what ``.reqntid`` leaves each thread of the block."""
    wm, wn = s.warp_tile
    need = (wm // 16) * (wn // 8) * s.accum.regs_per_tile + 2 * ((wm // 16) * 4 + (wn // 8) * 2) + 32
    lim = ARCHS[s.arch]
    return min(need, lim.max_regs_thread, lim.regs_sm // s.threads // 8 * 8)


def tile_cost(s: KernelSpec, m: int, n: int, sms: int) -> tuple[float, int, int]:
    """Estimated time of ``s`` on an M x N output (any K) over ``sms`` SMs, in units of one C
    element's MMA work per K step, with the blocks per SM and the blocks:

    - blocks = ceil(M/BM) * ceil(N/BN); b = blocks one SM holds at once (theoretical occupancy from
      the spec's threads, shared memory and estimated registers);
    - the busiest SM gets ceil(blocks / SMs) blocks and runs them in ceil(that / b) waves of at
      most b blocks sharing the SM: time = waves * min(b, ceil(blocks / SMs)) * cost of one block;
    - one block's cost = BM * BN * (1 + G (1/BM + 1/BN) + S (1/WTM + 1/WTN)): its MMA work plus the
      global -> shared copies (BM + BN rows per K step) and the shared -> register loads of its warp
      tiles (WTM x WTN), G = :data:`AUTO_GLOBAL_COST`, S = :data:`AUTO_SHARED_COST`: larger tiles
      cost less per FLOP.
    Returns (time, b, blocks); b is 0 when one block does not fit an SM (time: infinity)."""
    blocks = -(-m // s.bm) * -(-n // s.bn)
    b = theoretical_occupancy(s.arch, s.threads, _registers(s), s.smem_bytes)[1]
    if b < 1:
        return float("inf"), 0, blocks
    wm, wn = s.warp_tile
    return waves_cost(s.bm, s.bn, blocks, sms, b, AUTO_SHARED_COST * (1 / wm + 1 / wn)), b, blocks


def auto_tile(cfg, m: int, n: int, k: int, sms: int, gpu_cc: int | None = None,
              tiles: dict | None = None) -> AutoTile:
    """tile=auto: the block tile and warps of the composed config ``cfg`` for an M x N x K problem on a
    GPU of ``sms`` SMs, among ``tiles`` (name -> (BM, BN, WM, WN); default the presets of conf/tile/,
    each with its own ``group_m`` where the preset sets one, as ``tile=<preset>`` would): of the presets
    that make a valid kernel with the config's other keys and fit the size (multiples of BM, BN; no
    tails), the one of least :func:`tile_cost`; ties go to the larger tile, then the wider (BN: on an
    H200 128 x 256 beat 256 x 128 at 2048 for fp16, bf16 and int8 by 0.6-2.3 %, and it is the fastest
    tile at 8192; results/h200/performance.md), then fewer threads, then the name.

    Raises SpecError when no preset fits, with each preset's reason."""
    from omegaconf import OmegaConf
    fits, why, sizes = [], [], []
    group_m = tile_group_m()
    for name, (bm, bn, wm, wn) in (tiles or preset_tiles()).items():
        c = OmegaConf.merge(cfg, {"tile": {"block": [bm, bn], "warps": [wm, wn],
                                           **({"group_m": group_m[name]} if name in group_m else {})}})
        try:
            s = spec_from_config(c, gpu_cc)
        except SpecError as exc:
            why.append(f"{name}: {exc}")
            continue
        try:
            s.check_problem(m, n, k)
        except SpecError:
            sizes.append((math.lcm(s.bm, s.bn, s.ktile), name))
            continue
        cost, b, blocks = tile_cost(s, m, n, sms)
        if b:
            fits.append(AutoTile(name, s, cost, b, blocks))
        else:
            why.append(f"{name}: one block does not fit an SM")
    if not fits and sizes:
        lcm, name = min(sizes)
        raise SpecError(f"tile=auto: no tile preset fits {m}x{n}x{k}: M and N must be multiples of a "
                        "preset's BM and BN, and K of BK; the smallest square sizes a preset takes are "
                        f"multiples of {lcm} ({name}), e.g. "
                        f"'problem.sizes=[{-(-max(m, n, k) // lcm) * lcm}]'")
    if not fits:
        raise SpecError(f"tile=auto: no tile preset fits {m}x{n}x{k} with this configuration: "
                        + " | ".join(why))
    return min(fits, key=lambda t: (round(t.cost, 6), -t.spec.bm * t.spec.bn, -t.spec.bn, t.spec.threads,
                                    t.name))
