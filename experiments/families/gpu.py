"""Worker-side helpers the families share: device check, compilation, poisoned outputs, exact checks.

Everything here needs CuPy and a GPU and is imported lazily by ``prepare``. CUDA C++ goes through
NVRTC (``cupy.RawModule(code=...)``, compiled for the current device); PTX goes through the driver's
JIT (:func:`experiments.gpu.launch.load_kernel`, which reports the driver's log on failure).
"""
from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path

import numpy as np

from ..spec import SpecError
from .base import Build, FamilySpec, sm_of

__all__ = ["device_sm", "sm_count", "max_active_clusters", "check_device", "cuda_include_dirs",
           "compile_cuda", "load_ptx", "allow_smem", "max_active_blocks", "poisoned", "exact_check"]

_CHUNK = 1 << 24     # elements per step of exact_check (bounded temporary memory)


def device_sm() -> int:
    """Compute capability of the current device as an int (90 for an H200)."""
    import cupy
    return int(cupy.cuda.Device().compute_capability)


def sm_count() -> int:
    """Streaming multiprocessors of the current device."""
    import cupy
    return int(cupy.cuda.Device().attributes["MultiProcessorCount"])


def max_active_clusters(kern, threads: int, dyn_smem: int, cluster: int) -> int:
    """Clusters of ``cluster`` CTAs of ``kern`` (a CuPy RawKernel whose PTX sets .reqnctapercluster)
    that the current device runs at once, with ``threads`` per CTA and ``dyn_smem`` bytes of dynamic
    shared memory (CUDA Driver API, Occupancy: cuOccupancyMaxActiveClusters). A cluster's CTAs share one
    GPC, so this can be fewer than SMs / cluster: an H200's 132 SMs hold 66 clusters of 2 but fewer of 4.
    Raises RuntimeError with the CUresult when the driver refuses the query."""
    import ctypes
    u32 = ctypes.c_uint

    class LaunchConfig(ctypes.Structure):        # CUlaunchConfig
        _fields_ = [("grid", u32 * 3), ("block", u32 * 3), ("shared_mem_bytes", u32),
                    ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p), ("num_attrs", u32)]

    cfg = LaunchConfig((u32 * 3)(cluster, 1, 1), (u32 * 3)(threads, 1, 1), dyn_smem, None, None, 0)
    count = ctypes.c_int()
    func = getattr(kern, "kernel", kern).ptr
    rc = ctypes.CDLL("libcuda.so.1").cuOccupancyMaxActiveClusters(
        ctypes.byref(count), ctypes.c_void_p(func), ctypes.byref(cfg))
    if rc:
        raise RuntimeError(f"cuOccupancyMaxActiveClusters(cluster {cluster}, {threads} threads, "
                           f"{dyn_smem} bytes of shared memory) returned CUresult {rc}")
    return count.value


def max_active_blocks(kern, threads: int, dyn_smem: int) -> int:
    """Blocks of ``kern`` (a CuPy RawKernel) of ``threads`` threads and ``dyn_smem`` bytes of dynamic
    shared memory that one SM of the current device holds at once, as the driver's occupancy
    calculator says (CUDA Driver API, Occupancy: cuOccupancyMaxActiveBlocksPerMultiprocessor).
    Raises RuntimeError with the CUresult when the driver refuses the query."""
    import ctypes
    count = ctypes.c_int()
    func = getattr(kern, "kernel", kern).ptr
    rc = ctypes.CDLL("libcuda.so.1").cuOccupancyMaxActiveBlocksPerMultiprocessor(
        ctypes.byref(count), ctypes.c_void_p(func), ctypes.c_int(threads), ctypes.c_size_t(dyn_smem))
    if rc:
        raise RuntimeError(f"cuOccupancyMaxActiveBlocksPerMultiprocessor({threads} threads, {dyn_smem} bytes "
                           f"of shared memory) returned CUresult {rc}")
    return count.value


def check_device(spec: FamilySpec) -> None:
    """Raise SpecError when ``spec.arch`` is newer than the current device (its code cannot run here)."""
    have = device_sm()
    if sm_of(spec.arch) > have:
        raise SpecError(f"{spec.entry} targets {spec.arch} but this GPU is sm_{have}; "
                        f"set target.arch=auto or sm_{have}")


def cuda_include_dirs() -> list[str]:
    """CUDA include folders that hold ``mma.h``: $CUDA_PATH, $CUDA_HOME, /usr/local/cuda and the
    include folders of NVIDIA's pip wheels (nvidia-cuda-runtime / nvidia-cuda-nvcc, cu12 and cu13)."""
    roots = [os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"]
    out = [str(Path(r) / "include") for r in roots if r]
    for mod in ("nvidia.cu13", "nvidia.cuda_runtime", "nvidia.cuda_nvcc"):
        try:
            found = importlib.util.find_spec(mod)
        except (ImportError, ValueError):
            found = None
        for loc in (found.submodule_search_locations or []) if found else []:
            out.append(str(Path(loc) / "include"))
    seen = []
    for d in out:
        if (Path(d) / "mma.h").is_file() and d not in seen:
            seen.append(d)
    return seen


def compile_cuda(build: Build):
    """Compile CUDA C++ with NVRTC for the current device and return ``build.entry`` (a RawKernel).

    CuPy picks the device's own architecture; the spec's arch is what the CPU-side checks compile for.

    First with CuPy's own include path; when a header is not found, again with
    :func:`cuda_include_dirs`. Raises cupy's CompileException with NVRTC's log, or RuntimeError
    naming the missing toolkit headers.
    """
    import cupy
    from cupy.cuda.compiler import CompileException

    def get(options):
        kern = cupy.RawModule(code=build.source, options=options).get_function(build.entry)
        _ = kern.num_regs       # compile and load now, not at the first launch
        return kern

    try:
        return get(tuple(build.options))
    except CompileException as exc:
        if "cannot open source file" not in str(exc):
            raise
        extra = tuple(f"-I{d}" for d in cuda_include_dirs())
        if not extra:
            raise RuntimeError(f"NVRTC cannot find the CUDA headers {build.entry} includes (mma.h): "
                               "install the CUDA toolkit or set CUDA_PATH") from exc
        return get(tuple(build.options) + extra)


def load_ptx(build: Build, dyn_smem: int = 0):
    """JIT-load PTX text through the driver; returns the kernel ``build.entry``.

    Raises experiments.gpu.launch.PtxJitError with the driver's log when the PTX is rejected.
    """
    from ..gpu.launch import load_kernel
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{build.entry}.ptx"
        path.write_text(build.source)
        return load_kernel(build.source, str(path), build.entry, dyn_smem)


def allow_smem(kern, dyn_smem: int) -> int:
    """Let ``kern`` (a CuPy RawKernel) launch with ``dyn_smem`` bytes of dynamic shared memory per block
    (above 48 KiB the driver needs the opt-in attribute, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
    and return ``dyn_smem``: the launch of a family's kernel with launch.blocks_per_sm's padding added.
    Raises experiments.gpu.launch.LaunchConfigError above the device's opt-in maximum."""
    import cupy

    from ..gpu.launch import LaunchConfigError
    limit = cupy.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"]
    if dyn_smem + kern.shared_size_bytes > limit:
        raise LaunchConfigError(f"{dyn_smem} bytes of dynamic and {kern.shared_size_bytes} of static shared "
                                f"memory per block exceed this GPU's {limit}")
    if dyn_smem > 48 * 1024:
        kern.max_dynamic_shared_size_bytes = dyn_smem
    return dyn_smem


def poisoned(shape, dtype):
    """A new device array that no correct kernel leaves as it is: NaN for float types,
    INT32_MIN for int32 (:func:`experiments.gpu.verify.poison`)."""
    import cupy

    from ..gpu.verify import poison
    out = cupy.empty(shape, dtype=dtype)
    if out.dtype.kind == "f":
        out.fill(np.nan)
    else:
        poison(out)
    return out


def exact_check(got, expected):
    """Compare two device arrays of one shape element for element (exactly; NaN never matches).

    Returns an :class:`experiments.gpu.verify.VerifyResult` with tolerance 0: mismatches, the largest
    |got - expected| (inf where got is not finite) and where it is, as (row, column) of the array
    seen as 2-D (rows = first axis). Works in chunks of 2**24 elements. Raises ValueError for
    different shapes.
    """
    import cupy

    from ..gpu.verify import VerifyResult
    if got.shape != expected.shape:
        raise ValueError(f"shapes differ: got {got.shape}, expected {expected.shape}")
    g, e = got.reshape(-1), expected.reshape(-1)
    cols = int(np.prod(got.shape[1:])) if got.ndim > 1 else g.size
    bad, worst, at = 0, 0.0, 0
    for lo in range(0, g.size, _CHUNK):
        gc, ec = g[lo:lo + _CHUNK], e[lo:lo + _CHUNK]
        bad += int(cupy.count_nonzero(gc != ec))
        diff = cupy.abs(gc.astype(np.float64) - ec.astype(np.float64))
        diff = cupy.where(cupy.isnan(diff), np.inf, diff)
        i = int(diff.argmax())
        if float(diff[i]) > worst or lo == 0:
            worst, at = float(diff[i]), lo + i
    row, col = divmod(at, cols)
    return VerifyResult(bad == 0, worst, (row, col), g[at].item(), e[at].item(), bad, 0.0)
