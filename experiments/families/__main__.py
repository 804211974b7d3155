"""``python -m experiments.families --axes-markdown``: every family's axes, values and rules as Markdown,
generated from the code (docs/axes.md is this output; tests/test_docs.py checks it is up to date).

The mma_sync family's axes are the root keys (:func:`experiments.spec_rules.make_axes`, its rules
:data:`experiments.spec_rules.RULES`); every other family's are its ``axes``, ``defaults`` and ``rules``.
"""
from __future__ import annotations

import sys

from ..config import MMA_SYNC
from ..spec import RULES, make_axes
from . import get, names

HEADER = """# Axes of every family

Generated from the code by `python -m experiments.families --axes-markdown > docs/axes.md`; do not
edit by hand. `python run.py --help` (and `python run.py family=NAME --help`) lists the same keys with
their defaults; docs/DESIGN.md says what each axis changes in the kernel.
"""


def _cell(values) -> str:
    return ", ".join(f"`{v}`" for v in values)


def axes_markdown() -> str:
    """The Markdown text of docs/axes.md: one section per family (mma_sync first), a table of its keys
    and values, then its rules in the order they are checked."""
    out = [HEADER, f"## family={MMA_SYNC} (the default): the root keys", "",
           "| key | values the space enumerates | meaning |", "| --- | --- | --- |"]
    for ax in make_axes():
        vals = ax.labels if len(ax.labels) < 12 else (*ax.labels[:3], "...", ax.labels[-1])
        out.append(f"| `{ax.key}` | {_cell(vals)} | {ax.meaning} |")
    out += ["", "Rules, in the order they are checked:", ""]
    out += [f"- `{r.name}`: {r.why}" for r in RULES]
    for name in names():
        fam = get(name)
        out += ["", f"## family={name}: {fam.title}", "",
                "| key | values (of `family.*`: the default first) |", "| --- | --- |"]
        for key, values in fam.axes.items():
            if key == "precision":
                out.append(f"| `precision` | {_cell(values)} |")
                continue
            default = fam.defaults.get(key, values[0])
            ordered = [default, *(v for v in values if str(v) != str(default))]
            out.append(f"| `family.{key}` | {_cell(ordered)} |")
        if fam.rules:
            out += ["", "Rules:", ""] + [f"- `{r.name}`: {r.why}" for r in fam.rules]
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    """Print :func:`axes_markdown` for ``--axes-markdown``; exit status 2 with the usage otherwise."""
    if argv != ["--axes-markdown"]:
        print("usage: python -m experiments.families --axes-markdown > docs/axes.md", file=sys.stderr)
        return 2
    sys.stdout.write(axes_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
