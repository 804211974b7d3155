"""``python -m experiments.families --axes-markdown``: every family's axes, values and rules as Markdown,
generated from the code (docs/axes.md is this output; tests/test_docs.py checks it is up to date).

Each family writes its own section (``Family.axes_markdown``): the default family's axes are the root
keys, every other family's are its ``axes``, ``defaults`` and ``rules``.
"""
from __future__ import annotations

import sys

from . import get, names

HEADER = """# Axes of every family

Generated from the code by `python -m experiments.families --axes-markdown > docs/axes.md`; do not
edit by hand. `python run.py --help` (and `python run.py family=NAME --help`) lists the same keys with
their defaults; under each family's table, what each key changes in the kernel.
"""


def axes_markdown() -> str:
    """The Markdown text of docs/axes.md: one section per family in registry order (the default
    first), a table of its keys and values, then its rules in the order they are checked."""
    out = [HEADER]
    for name in names():
        out += [""] * (len(out) > 1) + get(name).axes_markdown()
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
