"""Load rendered PTX with CuPy (the driver JIT-compiles it) and launch the kernel.

No nvcc at run time: ``cupy.RawModule(path=...ptx)`` hands the PTX to ``cuModuleLoad``. When the
driver rejects it, :func:`driver_jit_log` asks the driver again through ``cuModuleLoadDataEx`` with
an error-log buffer (CUDA Driver API, "Module Management", CU_JIT_ERROR_LOG_BUFFER) so the user sees
the line and the reason, not only CUDA_ERROR_INVALID_PTX.
"""
from __future__ import annotations

import ctypes

import numpy as np

__all__ = ["KERNEL_PARAMS", "PtxJitError", "LaunchConfigError", "pack_args", "load_kernel",
           "driver_jit_log", "GemmLaunch"]

# The kernel contract: (.u64 A, .u64 B, .u64 C, .u32 M, .u32 N, .u32 K)
KERNEL_PARAMS = (("A", "u64"), ("B", "u64"), ("C", "u64"), ("M", "u32"), ("N", "u32"), ("K", "u32"))
_RANGES = {"u32": (0, 2**32 - 1, np.uint32), "s32": (-2**31, 2**31 - 1, np.int32),
           "u64": (0, 2**64 - 1, np.uint64)}


class PtxJitError(RuntimeError):
    """The driver refused the PTX; the message holds the driver's log and the PTX file path."""


class LaunchConfigError(ValueError):
    """A launch parameter is outside what the GPU or the .param type allows; names the numbers."""


def pack_args(values: dict, params=KERNEL_PARAMS) -> tuple:
    """Convert launch arguments to their ``.param`` types, in the kernel's order.

    values: name -> cupy.ndarray (for .u64 pointers) or Python int (for scalars).
    Raises LaunchConfigError naming the parameter for a missing value, a non-integer or a value
    outside the type's range (e.g. 2**32 into .u32).
    """
    out = []
    for name, ptype in params:
        if name not in values:
            raise LaunchConfigError(f"kernel parameter {name} (.{ptype}) has no value")
        v = values[name]
        if ptype == "u64" and hasattr(v, "data"):
            out.append(v)
            continue
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise LaunchConfigError(f"kernel parameter {name} (.{ptype}) needs an integer, got {v!r}")
        lo, hi, typ = _RANGES[ptype]
        if not lo <= int(v) <= hi:
            raise LaunchConfigError(
                f"kernel parameter {name} (.{ptype}) = {int(v)} is outside [{lo}, {hi}]")
        out.append(typ(v))
    return tuple(out)


def driver_jit_log(ptx: str) -> str:
    """The driver's JIT error log for PTX text ('' when it loads). Needs a current CUDA context."""
    lib = ctypes.CDLL("libcuda.so.1")
    size = 1 << 16
    err, info = ctypes.create_string_buffer(size), ctypes.create_string_buffer(size)
    # CUjit_option: 3 INFO_LOG_BUFFER, 4 INFO_LOG_BUFFER_SIZE_BYTES, 5 ERROR_LOG_BUFFER, 6 ..._SIZE_BYTES
    opts = (ctypes.c_int * 4)(5, 6, 3, 4)
    vals = (ctypes.c_void_p * 4)(ctypes.cast(err, ctypes.c_void_p).value, size,
                                 ctypes.cast(info, ctypes.c_void_p).value, size)
    module = ctypes.c_void_p()
    rc = lib.cuModuleLoadDataEx(ctypes.byref(module), ctypes.c_char_p(ptx.encode() + b"\0"),
                                4, opts, vals)
    if rc == 0:
        lib.cuModuleUnload(module)
        return ""
    return (err.value or info.value).decode(errors="replace") or f"CUresult {rc}"


def load_kernel(ptx: str, ptx_path: str, entry: str, dyn_smem: int):
    """JIT-load ``entry`` from the PTX file and allow ``dyn_smem`` bytes of dynamic shared memory.

    Returns a ``cupy.RawKernel``. Raises PtxJitError (driver log + PTX path) when the driver
    rejects the PTX, LaunchConfigError when ``dyn_smem`` exceeds the device's opt-in maximum.
    """
    import cupy
    dev = cupy.cuda.Device()
    limit = dev.attributes["MaxSharedMemoryPerBlockOptin"]
    if dyn_smem > limit:
        raise LaunchConfigError(f"{entry} needs {dyn_smem} bytes of dynamic shared memory per block; "
                                f"this GPU allows {limit}. Reduce pipeline.stages, ktile or tile.block.")
    try:
        kern = cupy.RawModule(path=ptx_path).get_function(entry)
        _ = kern.num_regs  # forces cuModuleLoad + cuModuleGetFunction now
    except cupy.cuda.driver.CUDADriverError as exc:
        raise PtxJitError(f"the driver could not load {ptx_path}: {exc}\n"
                          f"driver JIT log:\n{driver_jit_log(ptx)}") from None
    if dyn_smem > 48 * 1024:
        kern.max_dynamic_shared_size_bytes = dyn_smem
    return kern


class GemmLaunch:
    """A ready-to-launch GEMM: kernel, grid (N/BN, M/BM), block (threads), packed args, smem (the
    spec's, plus ``smem_pad`` bytes: launch.blocks_per_sm)."""

    def __init__(self, kern, spec, a, b, c, m: int, n: int, k: int, smem_pad: int = 0):
        self.kern, self.smem = kern, spec.smem_bytes + smem_pad
        self.grid, self.block = (n // spec.bn, m // spec.bm, 1), (spec.threads, 1, 1)
        self.args = pack_args({"A": a, "B": b, "C": c, "M": m, "N": n, "K": k})

    def __call__(self) -> None:
        """Enqueue one launch on the current CuPy stream."""
        self.kern(self.grid, self.block, self.args, shared_mem=self.smem)
