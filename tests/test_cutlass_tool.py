"""tools/cutlass_sm80/build.sh: what it does before it compiles (no nvcc, no download needed)."""
import os
import subprocess
from pathlib import Path

BUILD = Path(__file__).resolve().parent.parent / "tools" / "cutlass_sm80" / "build.sh"


def _run(*args, **env):
    return subprocess.run(["bash", str(BUILD), *args], capture_output=True, text=True, timeout=30,
                          env={**os.environ, **env})


def test_help_prints_the_usage_and_builds_nothing():
    proc = _run("--help")
    assert proc.returncode == 0 and "CUTLASS's Ampere-style" in proc.stdout, proc.stderr
    assert "nvcc -O3" not in proc.stderr                   # set -x would print the compile line


def test_an_argument_is_refused():
    proc = _run("foo")
    assert proc.returncode == 2
    assert "build.sh takes no arguments (settings: CUTLASS_DIR, ARCH)" in proc.stderr


def test_a_cutlass_dir_without_cutlass_is_refused_instead_of_downloading(tmp_path):
    proc = _run(CUTLASS_DIR=str(tmp_path))
    assert proc.returncode == 2
    assert f"CUTLASS_DIR={tmp_path} has no include/cutlass/gemm/device/gemm.h" in proc.stderr
    assert "fetching" not in proc.stderr
