import shutil

import pytest

from experiments.worker import nvml_gpu


def _gpu_reason():
    if nvml_gpu() is None:
        return "no NVIDIA GPU found (NVML)"
    try:
        import cupy  # noqa: F401
    except ImportError:
        return "CuPy is not installed (pip install -e '.[cuda13]' or '.[cuda12]')"
    return None


_REASON = _gpu_reason()


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per CPU core without a GPU; none (tests one after another) with one,
    so that two tests never time kernels on the same GPU at once."""
    return 0 if nvml_gpu() is not None else None


def pytest_collection_modifyitems(config, items):
    if _REASON is None:
        return
    skip = pytest.mark.skip(reason=f"gpu test: {_REASON}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def need_ptxas():
    from experiments.assemble import find_ptxas
    if find_ptxas() is None:
        pytest.skip("ptxas not found (CUDA toolkit or pip install nvidia-cuda-nvcc)")
    return shutil.which("ptxas")
