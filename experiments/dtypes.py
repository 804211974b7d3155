"""The element types of A and B and the accumulators of C: one table each, keyed by an Enum.

:class:`DType` holds every element type a family accepts, by the name users type (``precision=int8``);
:class:`Accum` holds the accumulators (C and D). Each member carries its facts; every other table
(the families' precisions, the Hydra config's ``precision`` values, the run's throughput unit, the
verification bound) is a selection of members or is derived from their facts, never a copy of them.
``copy`` (the peak family's bandwidth run) is not an element type: it has no bits and no PTX type, so it
stays a value of that family's precision axis only.

Sources (each field names its own below):
  PTX ISA 9.0: 5.2.3 (alternate floating-point formats: bf16, e4m3, e5m2), 9.7.14.5.1 and 9.7.14.5.x
  (``mma.sync.aligned`` shapes, types and fragments; ``.e4m3``/``.e5m2`` since PTX ISA 8.4, sm_89),
  9.7.15.2 (``wgmma.mma_async`` shapes: K = 16 for .f16/.bf16, 32 for .e4m3/.e5m2/.s8);
  CUDA Runtime API ``library_types.h`` (cudaDataType_t), cuBLAS ``cublas_api.h`` (cublasComputeType_t),
  CUDA Driver API ``cuda.h`` (CUtensorMapDataType); CUDA Math API (``__half``, ``__nv_bfloat16``,
  ``__nv_fp8_e4m3``, ``__nv_fp8_e5m2`` of cuda_fp16.h, cuda_bf16.h, cuda_fp8.h);
  SASS opcodes as ``ptxas 13.0`` emits them (cuobjdump -sass), minimums checked with ``ptxas 13.0``.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

__all__ = ["ElementType", "DType", "Accumulator", "Accum", "dtype", "accum", "tolerance", "F16_ROUNDOFF",
           "FP8_RTOL"]


@dataclass(frozen=True)
class ElementType:
    """The facts of one element type of A and B.

    bits: bits per element in global and shared memory. ptx: PTX type (PTX ISA 9.7.14.5.1).
    acc: default accumulator (an :class:`Accum` name). accs: accumulators ``mma.sync`` (and WMMA) offer
    with this type, default first. mma_k: K of the native ``mma.sync`` m16n8kK shapes, ascending.
    min_arch, min_ptx: lowest compute capability (x10) and PTX ISA of ``mma.sync`` with this type.
    sass_mma: (opcode, modifier it must carry, modifiers it must not carry) of the tensor-core SASS
    instruction that executes the type natively, e.g. ("IMMA", "S4", ()) for ``IMMA.16864.S4.S4``.
    c_type: CUDA C++ element type (None: no C++ type of its own). np_dtype: NumPy dtype A and B are
    stored as (bf16 as uint16 bits, fp8 as uint8 bits, int4 two per uint8; verify.make_operands).
    cuda: cudaDataType_t (library_types.h). tma: CUtensorMapDataType (cuda.h; 8-bit types as UINT8).
    wgmma_k: K of one ``wgmma.mma_async`` (None: wgmma has no such type). ebits, mbits: exponent and
    mantissa bits of a float type (bias 2**(ebits - 1) - 1). narrow_rtol: the verification bound's floor
    where an instruction sums this type's products in fewer bits than f32 (0: it never does).
    """
    bits: int
    ptx: str
    acc: str
    accs: tuple
    mma_k: tuple
    min_arch: int
    min_ptx: tuple
    sass_mma: tuple
    c_type: str | None
    np_dtype: str
    cuda: int | None
    tma: int | None
    wgmma_k: int | None
    ebits: int | None = None
    mbits: int | None = None
    narrow_rtol: float = 0.0


# fp8 wgmma (and cuBLASLt's FP8 kernels on sm_90) add products in an accumulator narrower than f32
# (about 14 significant bits: DeepSeek-V3 technical report, section 3.3.2, "Increasing Accumulation
# Precision"); on an H200 the largest error relative to (|A| |B|)_ij was 1.0e-3 to 1.4e-3 for
# K = 512 ... 8192, the same for every axis value (a layout error gives errors of order 1). The bound
# 2**-8 leaves a margin of 2.7 and still flags a kernel that writes zeros: the median
# |C_ref| / (|A| |B|)_ij is 0.01 at K = 8192 and larger below. mma.sync's fp8 GEMMs keep the f32
# bound (tests/test_gpu.py verifies them within it).
FP8_RTOL = 2.0 ** -8


class DType(Enum):
    """Element types of A and B by the name users type; each member carries its :class:`ElementType`
    facts as attributes (``DType.int8.bits == 8``). Order: the order of the precision axes."""
    fp16 = ElementType(bits=16, ptx="f16", acc="f32", accs=("f32", "f16"), mma_k=(8, 16), min_arch=80,
                       min_ptx=(7, 0), sass_mma=("HMMA", "", ("BF16", "TF32")), c_type="__half",
                       np_dtype="float16", cuda=2, tma=6, wgmma_k=16, ebits=5, mbits=10)
    bf16 = ElementType(bits=16, ptx="bf16", acc="f32", accs=("f32",), mma_k=(8, 16), min_arch=80,
                       min_ptx=(7, 0), sass_mma=("HMMA", "BF16", ()), c_type="__nv_bfloat16",
                       np_dtype="uint16", cuda=14, tma=9, wgmma_k=16, ebits=8, mbits=7)
    int8 = ElementType(bits=8, ptx="s8", acc="s32", accs=("s32",), mma_k=(16, 32), min_arch=80,
                       min_ptx=(7, 0), sass_mma=("IMMA", "S8", ()), c_type="signed char",
                       np_dtype="int8", cuda=3, tma=0, wgmma_k=32)
    int4 = ElementType(bits=4, ptx="s4", acc="s32", accs=("s32",), mma_k=(32, 64), min_arch=80,
                       min_ptx=(7, 0), sass_mma=("IMMA", "S4", ()), c_type=None,
                       np_dtype="uint8", cuda=16, tma=None, wgmma_k=None)
    fp8_e4m3 = ElementType(bits=8, ptx="e4m3", acc="f32", accs=("f32",), mma_k=(32,), min_arch=89,
                           min_ptx=(8, 4), sass_mma=("QMMA", "E4M3", ()), c_type="__nv_fp8_e4m3",
                           np_dtype="uint8", cuda=28, tma=0, wgmma_k=32, ebits=4, mbits=3,
                           narrow_rtol=FP8_RTOL)
    fp8_e5m2 = ElementType(bits=8, ptx="e5m2", acc="f32", accs=("f32",), mma_k=(32,), min_arch=89,
                           min_ptx=(8, 4), sass_mma=("QMMA", "E5M2", ()), c_type="__nv_fp8_e5m2",
                           np_dtype="uint8", cuda=29, tma=0, wgmma_k=32, ebits=5, mbits=2,
                           narrow_rtol=FP8_RTOL)

    def __init__(self, facts: ElementType):
        self.__dict__.update(vars(facts))

    @property
    def is_float(self) -> bool:
        """True for floating-point types (verified within a bound), False for integers (exactly)."""
        return self.ebits is not None

    @property
    def is_fp8(self) -> bool:
        """True for the 8-bit float types (OCP FP8, PTX ISA 5.2.3)."""
        return self.is_float and self.bits == 8

    @property
    def unit(self) -> str:
        """Throughput unit of a GEMM on this type: TFLOP/s for float types, TOP/s for integers."""
        return "TFLOP/s" if self.is_float else "TOP/s"


@dataclass(frozen=True)
class Accumulator:
    """The facts of one accumulator (C and D).

    ptx: PTX type. c_dtype: NumPy dtype of C in memory; c_bytes: its bytes per element.
    regs_per_tile: registers per thread for one m16n8 tile of ``mma.sync`` (PTX ISA 9.7.14.5.x,
    "Matrix Fragments for mma.m16n8kK"). c_type, c_zero: CUDA C++ type and its zero (WMMA fragments).
    cuda: cudaDataType_t of C; compute: cublasComputeType_t; tma: CUtensorMapDataType of C
    (None where no kernel here uses it). exact: results are integers, compared exactly.
    """
    ptx: str
    c_dtype: str
    c_bytes: int
    regs_per_tile: int
    c_type: str
    c_zero: str
    cuda: int | None
    compute: int | None
    tma: int | None
    exact: bool = False


# unit roundoff of f16 (2**-11), doubled to cover truncation as well as round-to-nearest of its 11-bit
# significand
F16_ROUNDOFF = 2.0 ** -10


class Accum(Enum):
    """Accumulators by name (``acc=f32``); each member carries its :class:`Accumulator` facts and the
    one verification bound of its accumulation (:meth:`tolerance`)."""
    f32 = Accumulator(ptx="f32", c_dtype="float32", c_bytes=4, regs_per_tile=4, c_type="float", c_zero="0.0f",
                      cuda=0, compute=68, tma=7)
    f16 = Accumulator(ptx="f16", c_dtype="float16", c_bytes=2, regs_per_tile=2,     # two .f16x2 registers
                      c_type="__half", c_zero="__float2half(0.0f)", cuda=2, compute=None, tma=None)
    s32 = Accumulator(ptx="s32", c_dtype="int32", c_bytes=4, regs_per_tile=4, c_type="int", c_zero="0",
                      cuda=10, compute=72, tma=3, exact=True)

    def __init__(self, facts: Accumulator):
        self.__dict__.update(vars(facts))

    @property
    def np_dtype(self):
        """NumPy dtype of C in memory."""
        return np.dtype(self.c_dtype)

    def tolerance(self, k: int, rtol: float) -> float:
        """Bound on |C - C_ref| / (|A| |B|)_ij for a K-deep dot product accumulated here, the one
        formula per accumulation (``verify.check`` compares with it): 0 for s32 (exact); ``rtol``
        for f32; for f16 the larger of ``rtol`` and the smaller of
          - the worst case of recursive summation, gamma_n = n u / (1 - n u) (Higham, Accuracy and
            Stability of Numerical Algorithms, 2nd ed., section 4.2), usable while n u < 1, and
          - the probabilistic bound lambda sqrt(n) u with lambda = 8 (Higham and Mary, SIAM J. Sci.
            Comput. 41(5), 2019), which each element meets with probability >= 1 - 2 exp(-32),
        with n = K / 8 + 1 roundings (tensor cores add products in groups of at least 8 before
        rounding; + 1 for the final value) and u = :data:`F16_ROUNDOFF`; e.g. 0.033 at K = 256, 0.25
        at K = 8192. Valid for any operands and either rounding mode."""
        if self.exact:
            return 0.0
        if self is not Accum.f16:
            return rtol
        n, u = -(-k // 8) + 1, F16_ROUNDOFF
        worst = n * u / (1 - n * u) if n * u < 1 else float("inf")
        return max(rtol, min(worst, 8 * n ** 0.5 * u))


def _member(enum, name, what: str):
    """The member of ``enum`` called ``name`` (a member, its name, or an Enum whose name it is); raises
    ValueError ``what`` (``precision=... is not an element type``) naming the valid values otherwise."""
    key = getattr(name, "name", name)
    try:
        return enum[key]
    except KeyError:
        raise ValueError(f"{what.format(key=key)}; valid values: " + ", ".join(enum.__members__)) from None


def dtype(name) -> DType:
    """The element type called ``name`` (a :class:`DType`, its name, or an Enum whose name it is).
    Raises ValueError naming the valid values for another name."""
    return _member(DType, name, "precision={key!r} is not an element type")


def accum(name) -> Accum:
    """The accumulator called ``name`` (an :class:`Accum` or its name). Raises ValueError naming the
    valid values for another name."""
    return _member(Accum, name, "acc={key!r} is not an accumulator")


def tolerance(precision, acc, k: int, rtol: float, *, narrow: bool = False) -> float:
    """The bound ``verify.check`` applies to C of ``precision`` accumulated in ``acc`` over a K-deep dot
    product, relative to (|A| |B|)_ij: the accumulation's own (:meth:`Accum.tolerance`; 0 = exact),
    and where the instruction sums products in fewer bits than f32 (``narrow``: wgmma, cuBLASLt's FP8
    kernels) at least the type's ``narrow_rtol``. Raises ValueError for an unknown precision or acc."""
    a, d = accum(acc), dtype(precision)
    bound = a.tolerance(k, rtol)
    return max(bound, d.narrow_rtol) if narrow and not a.exact else bound
