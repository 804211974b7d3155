"""The cuBLAS family: the vendor library's GEMM for the same operands, called on cuBLAS directly.

One ``cublasGemmEx`` call per launch (cuBLAS Library User Guide, "cublasGemmEx"), with the library's
own kernel choice (CUBLAS_GEMM_DEFAULT):
  fp16, bf16: A/B CUDA_R_16F / CUDA_R_16BF, C CUDA_R_32F, CUBLAS_COMPUTE_32F (f32 output, like the
              mma_sync kernels' f32 accumulator);
  int8:       A/B CUDA_R_8I, C CUDA_R_32I, CUBLAS_COMPUTE_32I.
Layout: cuBLAS is column-major. Row-major C (M x N) = A (M x K, row-major) B^T with B stored N x K is
C^T = B A^T in column-major terms: ``gemmEx(op_T, op_N, m=N, n=M, k=K, B, ldb=K, A, lda=K, C, ldc=N)``,
no copies. This is the "TN" form cuBLAS's int8 (IMMA) path requires; it also needs the leading
dimensions (K for A and B, N for C) to be multiples of 4 and 4-byte aligned pointers, which
:meth:`CublasFamily.check_problem` enforces. The enum values are those of ``library_types.h``
(cudaDataType_t) and ``cublas_api.h`` (cublasComputeType_t, cublasOperation_t), stable ABI.

The calls go through ctypes to the libcublas CuPy has loaded, on a handle of our own with its own
32 MiB workspace (:class:`_Gemm`), because the timing replays launches as a CUDA graph: CuPy's cuBLAS
binding refuses calls while a stream is capturing, and without a user workspace cuBLAS would allocate
during capture (cuBLAS guide, "CUDA Graphs Support"; ``cublasSetStream`` resets the workspace, so it
is set again after every stream change).
"""
from __future__ import annotations

import ctypes
import weakref

import numpy as np

from .base import Build, Family, FamilySpec, Prepared, SpecError

__all__ = ["CublasFamily", "TYPES", "gemm_args"]

CUDA_R_32F, CUDA_R_16F, CUDA_R_8I, CUDA_R_32I, CUDA_R_16BF = 0, 2, 3, 10, 14
CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32I = 68, 72
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUBLAS_GEMM_DEFAULT = -1
WORKSPACE_BYTES = 32 << 20     # the workspace the cuBLAS guide recommends for sm_90
# precision -> (A/B type, C type, compute type, C dtype, alpha/beta dtype)
TYPES = {
    "fp16": (CUDA_R_16F, CUDA_R_32F, CUBLAS_COMPUTE_32F, np.float32, np.float32),
    "bf16": (CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F, np.float32, np.float32),
    "int8": (CUDA_R_8I, CUDA_R_32I, CUBLAS_COMPUTE_32I, np.int32, np.int32),
}


class _Ptr(int):
    """An address (passed as void*); plain ints are passed as int."""


def gemm_args(precision: str, m: int, n: int, k: int, a: int, b: int, c: int, alpha: int, beta: int) -> tuple:
    """The arguments of ``cublasGemmEx`` after the handle that compute row-major C (M x N) = A B^T
    with A row-major M x K and B stored N x K, given the addresses a, b, c, alpha, beta. In cuBLAS's
    column-major terms: C^T (N x M, ldc = N) = op_T(b, a K x N matrix with ld K) x (a, a K x M matrix
    with ld K). Addresses are wrapped in :class:`_Ptr` (passed as void*)."""
    ab_type, c_type, compute, _, _ = TYPES[precision]
    return (CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, _Ptr(alpha), _Ptr(b), ab_type, k, _Ptr(a), ab_type, k,
            _Ptr(beta), _Ptr(c), c_type, n, compute, CUBLAS_GEMM_DEFAULT)


def _libcublas():
    """The libcublas CuPy uses (found in /proc/self/maps after CuPy loaded it), else by soname."""
    import cupy
    cupy.cuda.device.get_cublas_handle()
    paths = []
    try:
        with open("/proc/self/maps") as maps:
            paths = [ln.split()[-1] for ln in maps if "/libcublas.so" in ln]
    except OSError:
        pass
    for name in paths[:1] + ["libcublas.so.13", "libcublas.so.12", "libcublas.so"]:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.cublasGetStatusName.restype = ctypes.c_char_p
        return lib
    raise RuntimeError("libcublas not found: install the CUDA toolkit's cuBLAS or nvidia-cublas")


class _Gemm:
    """A cuBLAS handle of our own with a fixed workspace; call(...) = one cublasGemmEx on the
    current CuPy stream. The handle is destroyed when the object is collected."""

    def __init__(self):
        import cupy
        self.lib, self.handle = _libcublas(), ctypes.c_void_p()
        self._check(self.lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate")
        self.workspace = cupy.empty(WORKSPACE_BYTES, dtype=np.uint8)
        self.stream = None
        weakref.finalize(self, _destroy, self.lib, self.handle.value, self.workspace)

    def _check(self, status: int, what: str) -> None:
        if status:
            name = self.lib.cublasGetStatusName(status)
            raise RuntimeError(f"{what} failed: {name.decode() if name else status}")

    def __call__(self, *args) -> None:
        import cupy
        stream = cupy.cuda.get_current_stream().ptr
        if stream != self.stream:
            lib, ws = self.lib, ctypes.c_void_p(self.workspace.data.ptr)
            self._check(lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(stream)), "cublasSetStream")
            self._check(lib.cublasSetWorkspace_v2(self.handle, ws, ctypes.c_size_t(WORKSPACE_BYTES)),
                        "cublasSetWorkspace")
            self.stream = stream
        conv = [ctypes.c_void_p(a) if isinstance(a, _Ptr) else ctypes.c_int(a) for a in args]
        self._check(self.lib.cublasGemmEx(self.handle, *conv), "cublasGemmEx")


def _destroy(lib, handle, workspace) -> None:
    try:
        lib.cublasDestroy_v2(ctypes.c_void_p(handle))
    except Exception:  # noqa: BLE001 - at interpreter exit the library may be gone already
        pass


class CublasFamily(Family):
    """``family=cublas``: precision fp16, bf16 or int8; no other axes (the library picks the kernel)."""
    name = "cublas"
    title = "cuBLAS GEMM"
    axes = {"precision": tuple(TYPES)}

    def check_problem(self, spec: FamilySpec, m: int, n: int, k: int) -> None:
        """Raise SpecError for non-positive sizes, sizes of 2**31 or more (cuBLAS takes int), and for
        int8 unless K and N are multiples of 4 (leading dimensions of the IMMA path)."""
        if min(m, n, k) <= 0 or max(m, n, k) >= 2 ** 31:
            raise SpecError(f"{spec.entry}: problem {m}x{n}x{k} must have sizes in [1, 2**31)")
        if spec.precision == "int8" and (k % 4 or n % 4):
            raise SpecError(f"{spec.entry}: cuBLAS int8 GEMM needs K and N multiples of 4 (leading "
                            f"dimensions of A, B and C), got K={k}, N={n}")

    def build(self, spec: FamilySpec) -> Build:
        return Build("none", "", spec.entry)

    def prepare(self, spec: FamilySpec, build: Build, m: int, n: int, k: int, seed: int,
                *, rtol: float = 1e-3) -> Prepared:
        """Operands as verify.make_operands makes them, C poisoned; launch = one cublasGemmEx on the
        current CuPy stream (capturable in a CUDA graph). Floats are checked within ``rtol``, int8
        exactly. Raises RuntimeError with cuBLAS's status name when a call fails."""
        from ..verify import check, make_operands
        from . import gpu
        self.check_problem(spec, m, n, k)
        c_dtype, s_dtype = TYPES[spec.precision][3:]
        ops = make_operands(spec.precision, m, n, k, seed)
        c = gpu.poisoned((m, n), c_dtype)
        gemm = _Gemm()
        # host scalars (a new handle's CUBLAS_POINTER_MODE_HOST), kept alive by the closure
        alpha, beta = np.ones(1, s_dtype), np.zeros(1, s_dtype)
        args = gemm_args(spec.precision, m, n, k, ops.a.data.ptr, ops.b.data.ptr, c.data.ptr,
                         alpha.ctypes.data, beta.ctypes.data)

        def launch():
            gemm(*args)

        is_float = spec.precision != "int8"
        note = ("cuBLAS picks its own kernel (CUBLAS_GEMM_DEFAULT); computes in f32 and writes f32 C"
                if is_float else "cuBLAS picks its own kernel (CUBLAS_GEMM_DEFAULT); int8 TN, int32 C")
        return Prepared(launch=launch, verify=lambda: check(c, ops, is_float, rtol if is_float else 0.0),
                        note=note)
