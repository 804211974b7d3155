"""The cuBLAS family: the vendor library's GEMM for the same operands, called on cuBLAS directly.

One ``cublasGemmEx`` call per launch (cuBLAS Library User Guide, "cublasGemmEx"), with the library's
own kernel choice (CUBLAS_GEMM_DEFAULT):
  fp16, bf16: A/B CUDA_R_16F / CUDA_R_16BF, C CUDA_R_32F, CUBLAS_COMPUTE_32F (f32 output, like the
              default family's f32 accumulator);
  int8:       A/B CUDA_R_8I, C CUDA_R_32I, CUBLAS_COMPUTE_32I.
fp8_e4m3 goes through cuBLASLt instead (cublasGemmEx has no FP8; cuBLAS guide, "cublasLtMatmul", its
FP8 type table): one ``cublasLtMatmul`` per launch, A/B CUDA_R_8F_E4M3, C and D CUDA_R_32F,
CUBLAS_COMPUTE_32F, scales f32 on the host, the first algorithm ``cublasLtMatmulAlgoGetHeuristic``
returns for the workspace below; FP8 needs sm_89 or later and the TN form (transa = T), which the
layout below is. e5m2 x e5m2 is not among cuBLASLt's FP8 combinations, so fp8_e5m2 has no cuBLAS run.
Layout: cuBLAS is column-major. Row-major C (M x N) = A (M x K, row-major) B^T with B stored N x K is
C^T = B A^T in column-major terms: ``gemmEx(op_T, op_N, m=N, n=M, k=K, B, ldb=K, A, lda=K, C, ldc=N)``,
no copies. This is the "TN" form cuBLAS's int8 (IMMA) path requires; it also needs the leading
dimensions (K for A and B, N for C) to be multiples of 4 and 4-byte aligned pointers, which
:meth:`CublasFamily.check_problem` enforces. The enum values are those of ``library_types.h``
(cudaDataType_t) and ``cublas_api.h`` (cublasComputeType_t, cublasOperation_t), stable ABI.

The calls go through ctypes to the libcublas (libcublasLt) CuPy has loaded, on a handle of our own with
its own 32 MiB workspace (:class:`_Gemm`, :class:`_LtGemm`), because the timing replays launches as a
CUDA graph: CuPy's cuBLAS binding refuses calls while a stream is capturing, and without a user
workspace cuBLAS would allocate during capture (cuBLAS guide, "CUDA Graphs Support"; ``cublasSetStream``
resets the workspace, so it is set again after every stream change).
"""
from __future__ import annotations

import ctypes
import weakref

import numpy as np

from ..dtypes import Accum, DType
from .base import Build, Family, FamilySpec, Prepared, Rule, SpecError, sm_of

__all__ = ["CublasFamily", "TYPES", "gemm_args"]

CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUBLAS_GEMM_DEFAULT = -1
WORKSPACE_BYTES = 32 << 20     # the workspace the cuBLAS guide recommends for sm_90
# the element types cuBLAS computes here; A/B, C and compute types are the members' cudaDataType_t and
# their accumulator's cudaDataType_t and cublasComputeType_t (DType.cuda, Accum.cuda, Accum.compute);
# alpha and beta have C's type
TYPES = {d.name: d for d in (DType.fp16, DType.bf16, DType.int8, DType.fp8_e4m3)}
LT = ("fp8_e4m3",)             # precisions computed by cublasLtMatmul
# cublasLt enums (cublasLt.h): matmul descriptor TRANSA / TRANSB, preference MAX_WORKSPACE_BYTES
LT_DESC_TRANSA, LT_DESC_TRANSB, LT_PREF_MAX_WORKSPACE = 3, 4, 1
LT_HEURISTIC_BYTES = 96        # cublasLtMatmulHeuristicResult_t: algo (64 bytes), workspace, state, waves


class _Ptr(int):
    """An address (passed as void*); plain ints are passed as int."""


def gemm_args(precision: str, m: int, n: int, k: int, a: int, b: int, c: int, alpha: int, beta: int) -> tuple:
    """The arguments of ``cublasGemmEx`` after the handle that compute row-major C (M x N) = A B^T
    with A row-major M x K and B stored N x K, given the addresses a, b, c, alpha, beta. In cuBLAS's
    column-major terms: C^T (N x M, ldc = N) = op_T(b, a K x N matrix with ld K) x (a, a K x M matrix
    with ld K). Addresses are wrapped in :class:`_Ptr` (passed as void*)."""
    d = TYPES[precision]
    acc = Accum[d.acc]
    ab_type, c_type, compute = d.cuda, acc.cuda, acc.compute
    return (CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, _Ptr(alpha), _Ptr(b), ab_type, k, _Ptr(a), ab_type, k,
            _Ptr(beta), _Ptr(c), c_type, n, compute, CUBLAS_GEMM_DEFAULT)


def _libcublas(name: str = "libcublas"):
    """The libcublas (or libcublasLt) CuPy uses (found in /proc/self/maps after CuPy loaded cuBLAS),
    else by soname."""
    import cupy
    cupy.cuda.device.get_cublas_handle()
    paths = []
    try:
        with open("/proc/self/maps") as maps:
            paths = [ln.split()[-1] for ln in maps if f"/{name}.so" in ln]
    except OSError:
        pass
    for path in paths[:1] + [f"{name}.so.13", f"{name}.so.12", f"{name}.so"]:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        if name == "libcublas":
            lib.cublasGetStatusName.restype = ctypes.c_char_p
        return lib
    raise RuntimeError(f"{name} not found: install the CUDA toolkit's cuBLAS or nvidia-cublas")


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


class _LtGemm:
    """One cuBLASLt matmul, planned once: row-major C (M x N, f32) = A (M x K) B^T with B stored N x K,
    as column-major C^T (ld N) = op_T(B as K x N, ld K) x (A as K x M, ld K), the TN form FP8 needs.
    call() = one cublasLtMatmul on the current CuPy stream with a fixed workspace (capturable).
    Raises RuntimeError with the cublasLt status when a call fails or no algorithm fits."""

    def __init__(self, ab_type: int, m: int, n: int, k: int, a: int, b: int, c: int):
        import cupy
        self.lib, v, ref, size = _libcublas("libcublasLt"), ctypes.c_void_p, ctypes.byref, ctypes.c_size_t
        self.handle, self.desc, self.pref = v(), v(), v()
        self.layouts = [v(), v(), v()]          # A (ours B), B (ours A), C = D
        self.workspace = cupy.empty(WORKSPACE_BYTES, dtype=np.uint8)
        self._call("cublasLtCreate", ref(self.handle))
        weakref.finalize(self, _destroy_lt, self.lib, self.handle.value, self.desc, self.pref, self.layouts,
                         self.workspace)
        self._call("cublasLtMatmulDescCreate", ref(self.desc), Accum.f32.compute, Accum.f32.cuda)
        for attr, op in ((LT_DESC_TRANSA, CUBLAS_OP_T), (LT_DESC_TRANSB, CUBLAS_OP_N)):
            val = ctypes.c_int32(op)
            self._call("cublasLtMatmulDescSetAttribute", self.desc, attr, ref(val), size(4))
        shapes = ((ab_type, k, n, k), (ab_type, k, m, k), (Accum.f32.cuda, n, m, n))
        for lay, (dtype, rows, cols, ld) in zip(self.layouts, shapes, strict=True):
            self._call("cublasLtMatrixLayoutCreate", ref(lay), dtype, ctypes.c_uint64(rows),
                       ctypes.c_uint64(cols), ctypes.c_int64(ld))
        self._call("cublasLtMatmulPreferenceCreate", ref(self.pref))
        ws = ctypes.c_uint64(WORKSPACE_BYTES)
        self._call("cublasLtMatmulPreferenceSetAttribute", self.pref, LT_PREF_MAX_WORKSPACE, ref(ws), size(8))
        self.heuristic = ctypes.create_string_buffer(LT_HEURISTIC_BYTES)
        found = ctypes.c_int(0)
        la, lb, lc = self.layouts
        self._call("cublasLtMatmulAlgoGetHeuristic", self.handle, self.desc, la, lb, lc, lc, self.pref, 1,
                   self.heuristic, ref(found))
        if found.value < 1:
            raise RuntimeError(f"cublasLtMatmulAlgoGetHeuristic found no algorithm for {m}x{n}x{k}")
        self.alpha, self.beta = np.ones(1, np.float32), np.zeros(1, np.float32)
        self.ptrs = (v(b), v(a), v(c))

    def _call(self, name: str, *args) -> None:
        status = getattr(self.lib, name)(*args)
        if status:
            raise RuntimeError(f"{name} failed: cublasStatus_t {status} (cublas_api.h)")

    def __call__(self) -> None:
        import cupy
        b, a, c = self.ptrs
        la, lb, lc = self.layouts
        stream = ctypes.c_void_p(cupy.cuda.get_current_stream().ptr)
        self._call("cublasLtMatmul", self.handle, self.desc, _v_ptr(self.alpha), b, la, a, lb,
                   _v_ptr(self.beta), c, lc, c, lc, self.heuristic, ctypes.c_void_p(self.workspace.data.ptr),
                   ctypes.c_size_t(WORKSPACE_BYTES), stream)


def _v_ptr(arr: np.ndarray) -> ctypes.c_void_p:
    """The host address of a numpy array, as void*."""
    return ctypes.c_void_p(arr.ctypes.data)


def _destroy_lt(lib, handle, desc, pref, layouts, workspace) -> None:
    try:
        for lay in layouts:
            if lay.value:
                lib.cublasLtMatrixLayoutDestroy(lay)
        if pref.value:
            lib.cublasLtMatmulPreferenceDestroy(pref)
        if desc.value:
            lib.cublasLtMatmulDescDestroy(desc)
        lib.cublasLtDestroy(ctypes.c_void_p(handle))
    except Exception:  # noqa: BLE001 - at interpreter exit the library may be gone already
        pass


def _destroy(lib, handle, workspace) -> None:
    try:
        lib.cublasDestroy_v2(ctypes.c_void_p(handle))
    except Exception:  # noqa: BLE001 - at interpreter exit the library may be gone already
        pass


def _fp8_rule(precision, params, arch):
    if precision in LT and sm_of(arch) < 89:
        return f"cuBLASLt's FP8 matmul needs sm_89 or later, not {arch}"
    return None


class CublasFamily(Family):
    """``family=cublas``: precision fp16, bf16, int8 (cublasGemmEx) or fp8_e4m3 (cublasLtMatmul, sm_89
    or later); no other axes (the library picks the kernel)."""
    name = "cublas"
    title = "cuBLAS GEMM"
    narrow_accumulation = True      # cuBLASLt's FP8 kernels on sm_90 are wgmma's (dtypes.FP8_RTOL)
    axes = {"precision": tuple(TYPES)}
    rules = (Rule("fp8", "fp8_e4m3 (cuBLASLt) needs sm_89 or later", _fp8_rule),)

    def padding_refusal(self, spec: FamilySpec) -> str:
        """cuBLAS launches kernels of its own choice (launch.blocks_per_sm)."""
        return ("cuBLAS chooses and launches its own kernels, whose shared memory and launch this "
                "framework does not set, so it cannot cap their resident blocks")

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
                *, rtol: float = 1e-3, data: str = "full") -> Prepared:
        """Operands as verify.make_operands draws them for ``data``, C poisoned; launch = one cublasGemmEx
        (fp8: cublasLtMatmul) on the current CuPy stream (capturable in a CUDA graph). fp16 and bf16 are
        checked within ``rtol``, fp8 within the larger of ``rtol`` and its narrow accumulation's bound
        (:meth:`tolerance`), int8 (and data=zeros) exactly. Raises RuntimeError with cuBLAS's status
        when a call fails."""
        from ..gpu.verify import check, data_tolerance, make_operands
        from . import gpu
        self.check_problem(spec, m, n, k)
        d = TYPES[spec.precision]
        acc = Accum[d.acc]
        c_dtype = s_dtype = acc.np_dtype
        ops = make_operands(spec.precision, m, n, k, seed, data=data)
        c = gpu.poisoned((m, n), c_dtype)
        tol = data_tolerance(data, self.tolerance(spec, k, rtol))
        if spec.precision in LT:
            lt = _LtGemm(d.cuda, m, n, k, ops.a.data.ptr, ops.b.data.ptr, c.data.ptr)
            return Prepared(launch=lt, verify=lambda: check(c, ops, True, tol),
                            note=f"cuBLASLt picks its own kernel (first heuristic); FP8 TN, f32 C; verified "
                                 f"within rtol={tol:.3g}")
        gemm = _Gemm()
        # host scalars (a new handle's CUBLAS_POINTER_MODE_HOST), kept alive by the closure
        alpha, beta = np.ones(1, s_dtype), np.zeros(1, s_dtype)
        args = gemm_args(spec.precision, m, n, k, ops.a.data.ptr, ops.b.data.ptr, c.data.ptr,
                         alpha.ctypes.data, beta.ctypes.data)

        def launch():
            gemm(*args)

        is_float = not acc.exact
        note = ("cuBLAS picks its own kernel (CUBLAS_GEMM_DEFAULT); computes in f32 and writes f32 C"
                if is_float else "cuBLAS picks its own kernel (CUBLAS_GEMM_DEFAULT); int8 TN, int32 C")
        return Prepared(launch=launch, verify=lambda: check(c, ops, is_float, tol),
                        note=note)
