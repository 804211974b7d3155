"""Fingerprint of every kernel the families define: the PTX (or CUDA C++) source, the entry name, the
run name and the run-key identity of each point, hashed per family.

A change to the code that must not change what the store holds (a refactoring) leaves every digest
equal: run it before and after and compare the lines.

    python tools/fingerprint.py                 # every point (a few minutes on one core)
    python tools/fingerprint.py --stride 20     # every 20th point of each family (quick check)
    python tools/fingerprint.py --no-names      # without the run names (a change that renames runs on
                                                # purpose must still leave sources, entries and keys equal)

mma_sync: every shaping cell of its pruning walker (``space``) at its largest stage count and at one
stage, the non-shaping axes (cache.op, L2 hints, tile.group_m) rotated over the cells so that every value
of each occurs; a non-shaping axis added later (its fields in the family's key_defaults) at the value runs
tracked before it had. Other families: every point of ``Family.space(arch)`` for every arch.
Prints one line per family: name, points, sha256 of the records (in enumeration order).
"""
from __future__ import annotations

import argparse
import hashlib
import sys
from math import prod
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments import families
from experiments.store import record  # noqa: E402
from experiments.families.base import ptx_sha256  # noqa: E402
from experiments.families.mma_sync.spec import space  # noqa: E402
from experiments.hardware import ARCHS  # noqa: E402

SIZE = (4096, 4096, 4096)


def _pinned(ax, key_defaults: dict):
    """The index of a non-shaping axis added after runs were tracked (every field in the family's
    key_defaults) at the value those runs had, or None: such an axis is not rotated, so the points and
    the digest of what was there before stay the same."""
    if not all(a in key_defaults for a in ax.attrs):
        return None
    return ax.values.index(tuple(key_defaults[a] for a in ax.attrs))


def _mma_sync_points(stride: int):
    sp = space()
    key_defaults = families.get("mma_sync").key_defaults
    rest = [a for a in sp.axes if not a.shaping]
    pins = [_pinned(a, key_defaults) for a in rest]
    n_free = prod(len(a.values) for a, pin in zip(rest, pins, strict=True) if pin is None)
    for i, (_, values, max_stages) in enumerate(sp.cells):
        if i % stride:
            continue
        j, free = i % n_free, []
        for ax, pin in zip(rest, pins, strict=True):
            if pin is not None:
                free.append(pin)
                continue
            free.append(j % len(ax.values))
            j //= len(ax.values)
        for stages in sorted({max_stages, 1}):
            yield sp.spec(values, stages, tuple(free))


def mma_sync_records(stride: int):
    """(entry, source sha256, identity, run names) of the mma_sync points."""
    fam = families.get("mma_sync")
    for spec in _mma_sync_points(stride):
        sha = ptx_sha256(fam.build(spec).source)
        yield (spec.entry, sha, str((fam.identity(spec), sha)),
               record.run_name(fam, spec, SIZE), record.run_name(fam, spec, None))


def family_records(name: str, stride: int):
    """(entry, source sha256, identity, run names) of a registered family's points."""
    fam = families.get(name)
    i = 0
    for arch in ARCHS:
        for spec in fam.space(arch):
            i += 1
            if (i - 1) % stride:
                continue
            sha = ptx_sha256(fam.build(spec).source)
            yield (spec.entry, sha, str((fam.identity(spec), sha)),
                   record.run_name(fam, spec, SIZE), record.run_name(fam, spec, None))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stride", type=int, default=1, help="every Nth point only (default 1: all)")
    ap.add_argument("--family", action="append", help="only this family (repeatable)")
    ap.add_argument("--no-names", action="store_true",
                    help="leave the run names out of the records: sources, entry names and run keys only")
    args = ap.parse_args(argv)
    wanted = args.family or list(families.names())
    for name in wanted:
        recs = mma_sync_records(args.stride) if name == "mma_sync" else family_records(name, args.stride)
        h, n = hashlib.sha256(), 0
        for rec in recs:
            h.update(repr(rec[:3] if args.no_names else rec).encode())
            n += 1
        print(f"{name:10} {n:8d} {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
