"""What every kernel family's spec shares: the error type, the no-tails check and the message for sizes
that do not fit, target.arch and PTX version parsing, config values, and tile=auto's SM counts and
wave cost (a family's own spec type lives with the family: ``experiments.families``).
An impossible combination stops with a message naming the axis, the value and the valid values.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from .hardware import ARCHS, DEFAULT_SMS, SM_COUNTS

__all__ = ["SpecError", "case_match", "did_you_mean", "resolve_arch", "value", "misfit_message",
           "check_no_tails", "NO_TAILS_ADVICE", "AutoTile", "sm_count", "waves_cost", "AUTO_GLOBAL_COST",
           "AUTO_SHARED_COST"]


class SpecError(ValueError):
    """An axis value that cannot exist; the message names key, value and the valid values."""


def case_match(value, valid) -> str | None:
    """The one of the ``valid`` values that ``value`` differs from only in case (``M16N8K16``:
    m16n8k16), or None (none, or several)."""
    same = [str(v) for v in valid if str(v).lower() == str(value).lower() and str(v) != str(value)]
    return same[0] if len(same) == 1 else None


def did_you_mean(key: str, value, valid) -> str:
    """``"; did you mean KEY=V?"`` for V = :func:`case_match` (``mma=M16N8K16``: m16n8k16;
    ``tile=256X128``: 256x128), else ''. Appended to the messages that name the valid values, so that
    the fix can be pasted."""
    same = case_match(value, valid)
    return f"; did you mean {key}={same}?" if same else ""


NO_TAILS_ADVICE = ". Choose problem sizes that are multiples of the block tile."


def check_no_tails(entry: str, size: tuple, tile: tuple) -> None:
    """Raise SpecError unless M, N, K (``size``) are positive multiples of BM, BN, BK (``tile``): the
    kernels handle no tails. The message names each dimension that does not fit."""
    bad = [f"{d}={v} is not a multiple of B{d}={t}" for d, v, t in zip("MNK", size, tile, strict=True)
           if v <= 0 or v % t]
    if bad:
        raise SpecError(f"{entry} handles no tails: " + "; ".join(bad) + NO_TAILS_ADVICE)


def misfit_message(entry: str, shapes: list, bad: list, multiples: tuple | None = None,
                   fits=None) -> str:
    """One message for the problem sizes ``bad`` ([(M, N, K), reason]) of ``shapes`` that kernel
    ``entry`` cannot run: each size with its reason (the kernel's name and the advice said once),
    then, given the kernel's ``multiples`` (what M, N, K must be multiples of: BM, BN, BK, or a
    cluster's tiles), the square sizes that fit: multiples of their least common multiple L, each
    requested size rounded up to one, or, where ``fits`` (square size N -> whether the kernel takes
    N x N x N, e.g. below its 32-bit offset limit) refuses that, down to the largest one it takes."""
    lines = []
    for (m, n, k), why in bad:
        why = str(why).removeprefix(f"{entry} handles no tails: ").removesuffix(NO_TAILS_ADVICE)
        lines.append(f"{m}x{n}x{k} ({why})")
    text = f"{len(bad)} of {len(shapes)} problem sizes do not fit {entry}: " + "; ".join(lines)
    if multiples:
        lcm = math.lcm(*multiples)
        fit = sorted({f for shape in shapes if (f := _square_fit(max(shape), lcm, fits))})
        tile = ", ".join(map(str, multiples))
        text += f". Square sizes must be multiples of {lcm} (M, N, K: multiples of {tile})"
        if fits is not None and any(not fits(-(-max(shape) // lcm) * lcm) for shape in shapes):
            text += f" and at most {_square_fit(1 << 62, lcm, fits)} (the largest this kernel takes)"
        text += f", e.g. 'problem.sizes=[{','.join(map(str, fit))}]'" if fit else ""
    return text


def _square_fit(n: int, lcm: int, fits) -> int | None:
    """``n`` rounded up to a multiple of ``lcm``; where ``fits`` refuses that, the largest multiple
    of ``lcm`` it takes (a binary search: ``fits`` holds up to a limit), or None when it takes none."""
    up = -(-n // lcm)
    if fits is None or fits(up * lcm):
        return up * lcm
    lo, hi = 0, up                       # fits(lo * lcm) (or lo = 0), not fits(hi * lcm)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid * lcm) else (lo, mid)
    return lo * lcm or None



# ------------------------------------------------------------------------------ from the config
def resolve_arch(arch: str, gpu_cc: int | None) -> str:
    """``auto`` -> the GPU's own ``sm_XY`` (or ``sm_90`` without a GPU); else validate the name.

    Raises SpecError for an unknown architecture, naming the supported ones.
    """
    if arch == "auto":
        arch = f"sm_{gpu_cc}" if gpu_cc else "sm_90"
    if arch not in ARCHS:
        raise SpecError(f"target.arch={arch!r} is not supported; valid: auto, {', '.join(ARCHS)}"
                        + did_you_mean("target.arch", arch, ARCHS))
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


# ------------------------------------------------------------------------------ tile=auto
# the cost of moving one operand element, in MMA work of one C element (see tile_cost): an H200's
# mma.sync peak over its L2 bandwidth (about 630 TFLOP/s / 10 TB/s, per 2-byte element and 2 FLOP)
# and over its shared-memory bandwidth (132 SMs x 128 B/clk x 1.98 GHz = 33 TB/s), rounded
AUTO_GLOBAL_COST = 64.0
AUTO_SHARED_COST = 16.0


def sm_count(gpu_name: str | None = None, reported: int | None = None,
             given: int | None = None) -> tuple[int, str]:
    """SMs of the GPU tile=auto plans for, and where the number comes from: ``given`` (tile.sms) when
    set, else ``reported`` (the GPU's own count, CUDA's multiProcessorCount), else :data:`SM_COUNTS`
    by ``gpu_name``, else :data:`DEFAULT_SMS` (an H100 SXM or H200), saying so and how to set it.
    Returns (SMs, source text). Raises SpecError for a ``given`` count below 1."""
    if given is not None:
        if int(given) < 1:
            raise SpecError(f"tile.sms={given} is not valid: the SM count of the GPU to plan for, at least 1")
        return int(given), "tile.sms"
    if reported:
        return int(reported), "from the GPU"
    for key, sms in SM_COUNTS.items():
        if gpu_name and key in gpu_name:
            return sms, f"table entry {key!r}"
    return DEFAULT_SMS, (f"{gpu_name!r} not in the table" if gpu_name else "no GPU") + \
        f": assumed {DEFAULT_SMS} (H100/H200); tile.sms=N plans for another GPU"


def waves_cost(bm: int, bn: int, blocks: int, sms: int, b: int = 1, shared: float = 0.0) -> float:
    """The estimate of :func:`tile_cost` (in units of one C element's MMA work per K step) for
    ``blocks`` blocks of BM x BN on ``sms`` SMs holding ``b`` blocks each: ceil(ceil(blocks / SMs) / b)
    waves x min(b, ceil(blocks / SMs)) blocks sharing an SM x BM BN (1 + G (1/BM + 1/BN) + shared),
    ``shared`` the shared -> register term (0 where the operands stay in shared memory: wgmma)."""
    per_sm = -(-blocks // sms)
    block = bm * bn * (1 + AUTO_GLOBAL_COST * (1 / bm + 1 / bn) + shared)
    return -(-per_sm // b) * min(b, per_sm) * block



@dataclass(frozen=True)
class AutoTile:
    """tile=auto's choice for one problem size: the preset's name, its spec, the estimated time
    (:func:`tile_cost`), blocks per SM and blocks; ``note``: what the estimate assumed that the user
    should know (the planning line shows it), or ''."""
    name: str
    spec: object
    cost: float
    blocks_per_sm: int
    blocks: int
    note: str = ""

