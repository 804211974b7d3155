"""The documentation as a newcomer reads it: README.md short, with the set-up, main-job, UI and test
commands on its first screen (the test command the one CI runs), every link and named file present,
and docs/axes.md the text the families' code generates."""
import re
import shlex

import pytest
from test_cli import ROOT

from experiments.families.__main__ import axes_markdown, main

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "results" / "h200" / "README.md"]
SETUP = 'pip install -e ".[dev]" && '
MAIN_JOB = "python run.py -m precision=int4,int8 ktile=32,64"
TESTS = "python -m pytest -n auto --dist loadfile --no-loadscope-reorder"


def test_axes_md_is_generated_from_the_families():
    """docs/axes.md is hand-edited or stale: regenerate it with the command its header names."""
    text = axes_markdown()
    assert (ROOT / "docs" / "axes.md").read_text() == text, \
        "docs/axes.md is stale: python -m experiments.families --axes-markdown > docs/axes.md"
    # every family and every axis is there, with values from the code
    assert "| `family.stages` | `4`, `2`, `3`, `5`, `6`, `7`, `8` |" in text       # wgmma: default first
    assert "| `loader.b` | `x1`, `x2`, `x4`, `manual` |" in text
    for name in ("mma_sync", "wmma", "dp4a", "cublas", "peak", "wgmma"):
        assert f"## family={name}" in text


def test_what_each_axis_changes_is_generated_not_written_in_design_md():
    """Every axis of mma_sync (the root keys) and of wgmma says what it changes in axes.md, from the
    families' axis_docs; docs/DESIGN.md has no table of its own that would go stale beside it."""
    from experiments.families.mma_sync.rules import make_axes
    text = axes_markdown()
    section = text.split("## family=wmma")[0]
    documented = {k for line in section.splitlines() if line.startswith("- `")
                  for k in re.findall(r"`([^`]+)`", line.split(": ", 1)[0])}
    assert {a.key for a in make_axes()} - {"tile.group_m"} <= documented
    assert "- `family.cluster`: 2: two CTAs of adjacent tile rows form a cluster" in text
    assert "- `family.bn`: BN = the wgmma N" in text
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    assert "| key | what it changes" not in design and "| axis (`family.*`)" not in design


def test_axes_markdown_command(capsys):
    assert main(["--axes-markdown"]) == 0 and capsys.readouterr().out == axes_markdown()
    assert main([]) == 2
    assert capsys.readouterr().err.strip() == "usage: python -m experiments.families --axes-markdown > docs/axes.md"


def test_readme_first_screen_has_the_set_up_main_job_ui_and_tests():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 250
    first = "\n".join(lines[:40])
    assert SETUP + MAIN_JOB in first and SETUP + TESTS in first
    assert 'mlflow ui --backend-store-uri "sqlite:///$PWD/outputs/mlflow.db"' in first
    ci = (ROOT / ".ci" / "run").read_text()                   # CI runs the README's two set-up commands
    assert "python3 -m pip install -q -e \".[dev]\"" in ci and f"python3 {TESTS.removeprefix('python ')}" in ci


def _links(path):
    """Relative link targets of a Markdown file: [text](target) and the paths it names in backquotes."""
    text = path.read_text()
    targets = [t for t in re.findall(r"\]\(([^)\s#]+)", text) if "://" not in t]
    named = re.findall(r"`((?:docs|results|conf|experiments|analysis|kernels_ptx|tools|tests)/[^`\s<>*{}]+)`", text)
    return [(path.parent / t) for t in targets] + [ROOT / n.rstrip("/.,:;") for n in named]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_and_named_file_exists(doc):
    missing = [str(p) for p in _links(doc) if not p.exists()]
    assert missing == [], f"{doc.relative_to(ROOT)} links to files that do not exist: {missing}"


def test_readme_commands_name_real_presets_and_modules():
    """Every `python run.py ...` line of the README parses and names presets that exist; every
    `python -m module` names a module of this project (or pytest)."""
    text = (ROOT / "README.md").read_text()
    groups = {"experiment", "variant", "family", "tile", "problem"}
    for line in re.findall(r"^(python (?:run\.py|-m) [^#\n]*)", text, re.M):
        words = shlex.split(line.rstrip("\\ "))
        if words[1] == "-m":
            module = words[2]
            path = ROOT / module.replace(".", "/")
            assert module in ("pytest", "pip") or path.with_suffix(".py").exists() \
                or (path / "__main__.py").exists(), line
            continue
        for w in words[2:]:
            key, _, values = w.partition("=")
            if key in groups:
                for v in values.split(","):
                    assert (ROOT / "conf" / key / f"{v}.yaml").exists(), (line, v)
