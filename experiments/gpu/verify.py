"""Operands, reference and comparison for verifying a GEMM before it is timed.

Data are fresh random values drawn as the root key ``data`` says (:class:`Data`; ``full``, the default:
every value of the type); C is poisoned before the launch (NaN for f32 and f16, INT32_MIN for s32) so
unwritten elements fail. The reference is a float64 GEMM (cuBLAS DGEMM
through CuPy), exact for the integer types (|C| < 2**53), and the float types are checked
element-wise against the bound ``rtol * (|A| |B|)_ij`` of a K-term dot product (rtol per accumulation:
:func:`experiments.dtypes.tolerance`). FP8 operands are random finite bit patterns, decoded exactly
(:func:`fp8_values`, OCP FP8 formats as PTX ISA 5.2.3 describes them; no ml_dtypes needed).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from ..dtypes import DType, dtype

__all__ = ["pack_int4", "unpack_int4", "make_operands", "Operands", "check", "VerifyResult",
           "bf16_bits", "bf16_values", "fp8_values", "fp8_finite_codes", "fp8_codes", "poison", "Data",
           "data_kind", "data_tolerance"]


class Data(Enum):
    """What A and B hold (the root key ``data``; param ``data`` of every run, in its run key when not
    ``full``): the values can change a GEMM's speed (switching activity, power, the clock the GPU holds),
    never its work. Each member's value says what it draws; :func:`make_operands` draws them."""
    full = ("every value of the type: floats uniform in [-1, 1) (fp8: uniform over every finite code), "
            "integers uniform over the whole range")
    uniform = ("floats uniform in [-1, 1) rounded to the type (fp8: to the nearest code, so 1 occurs); "
               "integers in [-8, 7] (int4: [-2, 1])")
    normal = ("floats from N(0, 1), rounded to the type; integers round(N(0, s)) clipped to the range, "
              "s = 32 (int8), 2 (int4)")
    zeros = "every element 0 (C exactly 0)"
    sparse = "the full operands of the seed, each element zeroed with probability 1/2 (independently)"
    constant = "every element 1"


# integers of data=uniform: values of this many bits (signed), per element bits
UNIFORM_INT_BITS = {8: 4, 4: 2}
# integers of data=normal: standard deviation per element bits
NORMAL_INT_SD = {8: 32.0, 4: 2.0}


def data_kind(name) -> Data:
    """The :class:`Data` member called ``name`` (a member, its name, or an Enum whose name it is). Raises
    ValueError naming the valid values for another name."""
    key = getattr(name, "name", name)
    try:
        return Data[key]
    except KeyError:
        raise ValueError(f"data={key!r} is not valid; valid values: " + ", ".join(Data.__members__)) from None


def data_tolerance(data, bound: float) -> float:
    """The bound :func:`check` applies to C computed from operands of ``data`` (relative to
    (|A| |B|)_ij, so it already scales with the operands' magnitudes, as
    :func:`experiments.dtypes.tolerance` derives it for any operands): 0 (exact) for ``zeros``, where every
    product and every partial sum is 0 in any precision; ``bound`` (the precision's and accumulation's)
    otherwise. Raises ValueError for an unknown data kind."""
    return 0.0 if data_kind(data) is Data.zeros else bound


def pack_int4(vals):
    """Pack int4 values (int8 array, values in [-8, 7], last axis even) two per byte.

    Element 2j goes to the low nibble of byte j, element 2j+1 to the high nibble (DESIGN.md,
    Kernel contract; PTX ISA 9.7.14.5.x: .s4 elements in ascending bit order). Works on NumPy and
    CuPy arrays; returns uint8 with the last axis halved. Raises ValueError for an odd last axis.
    """
    if vals.shape[-1] % 2:
        raise ValueError(f"int4 packing needs an even last axis, got shape {vals.shape}")
    lo = vals[..., 0::2].astype(np.uint8) & 0xF
    hi = vals[..., 1::2].astype(np.uint8) & 0xF
    return lo | (hi << 4)


def unpack_int4(packed):
    """Inverse of :func:`pack_int4`: uint8 (..., K/2) -> int8 (..., K), sign-extended."""
    lo = (packed & 0xF).astype(np.int8)
    hi = (packed >> 4).astype(np.int8)
    lo = lo - ((lo & 8) << 1)
    hi = hi - ((hi & 8) << 1)
    out_shape = packed.shape[:-1] + (packed.shape[-1] * 2,)
    xp = _xp(packed)
    out = xp.empty(out_shape, dtype=np.int8)
    out[..., 0::2], out[..., 1::2] = lo, hi
    return out


def bf16_bits(x32):
    """float32 array -> uint16 bfloat16 bit patterns, round to nearest even; NaN stays NaN."""
    xp = _xp(x32)
    u = x32.view(np.uint32)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    quiet_nan = ((u >> 16) | 0x40).astype(np.uint16)     # keep sign and payload, force quiet
    return xp.where((u & 0x7FFFFFFF) > 0x7F800000, quiet_nan, rounded)


def bf16_values(bits):
    """uint16 bfloat16 bit patterns -> float32 values (exact)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def fp8_values(bits, precision: str):
    """uint8 FP8 bit patterns -> float32 values, exact (every FP8 value is a float32).

    precision: 'fp8_e4m3' (4 exponent bits, bias 7, 3 mantissa bits, no infinity, NaN = 0x7F / 0xFF) or
    'fp8_e5m2' (5, bias 15, 2; exponent 31 = infinity with mantissa 0, else NaN), as
    :class:`experiments.dtypes.DType` describes them. NaN patterns give NaN, e5m2 infinities +-inf.
    Raises ValueError for another precision.
    """
    d = dtype(precision)
    if not d.is_fp8:
        raise ValueError(f"precision={precision!r} is not an FP8 type; valid values: "
                         + ", ".join(t.name for t in DType if t.is_fp8))
    ebits, mbits, bias = d.ebits, d.mbits, (1 << (d.ebits - 1)) - 1
    xp = _xp(bits)
    b = bits.astype(np.int32)
    sign = xp.where(b >> 7 == 1, -1.0, 1.0).astype(np.float32)
    e = (b >> mbits) & ((1 << ebits) - 1)
    m = (b & ((1 << mbits) - 1)).astype(np.float32)
    frac = m / np.float32(1 << mbits)
    normal = xp.ldexp((1 + frac).astype(np.float32), (e - bias).astype(np.int32))
    sub = xp.ldexp(frac, np.int32(1 - bias) * xp.ones_like(e))
    out = sign * xp.where(e == 0, sub, normal).astype(np.float32)
    top = e == (1 << ebits) - 1
    if d is DType.fp8_e4m3:
        out = xp.where(top & (b & 7 == 7), np.float32(np.nan), out)
    else:
        out = xp.where(top, xp.where(b & 3 == 0, sign * np.float32(np.inf), np.float32(np.nan)), out)
    return out.astype(np.float32)


def fp8_finite_codes(precision: str):
    """The uint8 patterns of every finite value of ``precision`` (254 for e4m3, 248 for e5m2)."""
    codes = np.arange(256, dtype=np.uint8)
    return codes[np.isfinite(fp8_values(codes, precision))]


def _xp(a):
    mod = type(a).__module__
    if mod.startswith("cupy"):
        import cupy
        return cupy
    return np


@dataclass
class Operands:
    """Device operands and their values for the reference.

    a, b: what the kernel reads (A: M x K; B: N x K for b_layout 'col', K x N for 'row'; int4 packed
    two per byte along the last axis, bf16 as uint16 bits, fp8 as uint8 bits); a_ref, b_ref: float64
    values in the logical shapes M x K and N x K (whatever the layout of b).
    """
    a: object
    b: object
    a_ref: object
    b_ref: object


def fp8_codes(values, precision: str):
    """float32 values -> the uint8 codes of the nearest finite ``precision`` values (ties to the code
    of the smaller value; values beyond the largest finite magnitude -> that magnitude). NumPy or CuPy."""
    xp = _xp(values)
    codes = fp8_finite_codes(precision)
    vals = fp8_values(codes, precision)
    order = np.argsort(vals, kind="stable")
    sv, sc = xp.asarray(vals[order]), xp.asarray(codes[order])
    i = xp.clip(xp.searchsorted(sv, values), 1, len(sv) - 1)
    lo, hi = sv[i - 1], sv[i]
    pick = xp.where(values - lo <= hi - values, i - 1, i)
    return sc[pick]


def _operand(d: DType, data: Data, shape: tuple, rs, xp):
    """One operand of ``shape`` drawn from ``rs`` as ``data`` says (not ``sparse``: :func:`_holes`): (what
    the kernel reads before int4 packing, its float64 values). ``full`` draws exactly as it always has."""
    if d.is_fp8 and data is Data.full:
        codes = xp.asarray(fp8_finite_codes(d.name))
        bits = codes[rs.randint(0, len(codes), shape)]
        return bits, fp8_values(bits, d.name).astype(np.float64)
    if d.is_float:
        if data is Data.full or data is Data.uniform:
            v32 = rs.uniform(-1, 1, shape).astype(np.float32)
        elif data is Data.normal:
            v32 = rs.standard_normal(shape).astype(np.float32)
        else:
            v32 = xp.full(shape, 0.0 if data is Data.zeros else 1.0, dtype=np.float32)
        if d.is_fp8:
            bits = fp8_codes(v32, d.name)
            return bits, fp8_values(bits, d.name).astype(np.float64)
        if d is DType.fp16:
            v = v32.astype(np.float16)
            return v, v.astype(np.float64)
        bits = bf16_bits(v32)
        return bits, bf16_values(bits).astype(np.float64)
    lo, hi = -(1 << (d.bits - 1)), 1 << (d.bits - 1)          # signed integers of d.bits bits
    if data is Data.full:
        v = rs.randint(lo, hi, shape)
    elif data is Data.uniform:
        half = 1 << (UNIFORM_INT_BITS[d.bits] - 1)
        v = rs.randint(-half, half, shape)
    elif data is Data.normal:
        v = xp.clip(xp.rint(rs.standard_normal(shape) * NORMAL_INT_SD[d.bits]), lo, hi - 1)
    else:
        v = xp.full(shape, 0 if data is Data.zeros else 1)
    v = v.astype(np.int8)
    return v, v.astype(np.float64)


def _holes(vals, ref, rs, xp):
    """``vals`` and ``ref`` with each element zeroed with probability 1/2 (``data=sparse``)."""
    keep = rs.random_sample(vals.shape) >= 0.5
    return xp.where(keep, vals, xp.zeros((), vals.dtype)), xp.where(keep, ref, 0.0)


def make_operands(precision: str, m: int, n: int, k: int, seed: int, xp=None,
                  b_layout: str = "col", data="full") -> Operands:
    """Fresh A (M x K) and B (N x K values, stored as ``b_layout`` says) for ``precision``, drawn as
    ``data`` (a :class:`Data` member or its name) says; ``full``: fp16, bf16 uniform [-1, 1); int8
    uniform [-128, 127]; int4 uniform [-8, 7]; fp8 uniform over the finite bit patterns. A and B are
    drawn independently (A first) from one generator seeded with ``seed``: the same arguments give the
    same operands. xp is NumPy or CuPy (default CuPy). Raises ValueError for an unknown precision,
    b_layout or data kind.
    """
    if xp is None:
        import cupy as xp
    if b_layout not in ("col", "row"):
        raise ValueError(f"b_layout={b_layout!r} is not valid; valid values: col, row")
    d, kind = dtype(precision), data_kind(data)
    rs = xp.random.RandomState(seed)
    drawn = Data.full if kind is Data.sparse else kind
    a, a_ref = _operand(d, drawn, (m, k), rs, xp)
    b, b_ref = _operand(d, drawn, (n, k), rs, xp)
    if kind is Data.sparse:                  # the full operands of the seed, then their holes
        (a, a_ref), (b, b_ref) = _holes(a, a_ref, rs, xp), _holes(b, b_ref, rs, xp)
    if b_layout == "row":
        b = xp.ascontiguousarray(b.T)
    if d.bits == 4:
        a, b = pack_int4(a), pack_int4(b)
    return Operands(a, b, a_ref, b_ref)


@dataclass
class VerifyResult:
    """ok; max_error (integers: max |C - ref|; floats: max |C - ref| / (|A||B|)_ij);
    where (row, col) of the worst element; got and expected there; mismatches (count)."""
    ok: bool
    max_error: float
    where: tuple
    got: float
    expected: float
    mismatches: int
    tolerance: float

    def message(self) -> str:
        kind = "exactly" if self.tolerance == 0 else f"within rtol={self.tolerance:g}"
        return (f"{self.mismatches} elements of C differ from the reference ({kind}); worst at "
                f"C[{self.where[0]}, {self.where[1]}]: got {self.got!r}, expected {self.expected!r}, "
                f"error {self.max_error:.3g}")


def poison(c) -> None:
    """Fill C with a value no correct kernel writes (NaN for f32/f16, INT32_MIN for s32)."""
    c.fill(np.nan if c.dtype.kind == "f" else np.iinfo(np.int32).min)


def check(c, ops: Operands, is_float: bool, rtol: float) -> VerifyResult:
    """Compare C (M x N, float32, float16 or int32) with the float64 reference A_ref @ B_ref.T:
    integers exactly, floats element-wise within ``rtol * (|A| |B|)_ij``, or exactly where ``rtol`` is 0
    (:func:`data_tolerance`: max_error is then max |C - ref|). Raises ValueError for an ``rtol`` that is
    negative or not finite (a NaN bound would pass every result)."""
    if is_float and not (np.isfinite(rtol) and rtol >= 0):
        raise ValueError(f"rtol={rtol} is not a finite tolerance >= 0")
    xp = _xp(c)
    ref = ops.a_ref @ ops.b_ref.T
    if is_float and rtol == 0:
        err = xp.abs(c.astype(np.float64) - ref)
        err = xp.where(xp.isfinite(err), err, np.inf)
        bad = err != 0
        tol = 0.0
    elif is_float:
        bound = xp.abs(ops.a_ref) @ xp.abs(ops.b_ref).T
        err = xp.abs(c.astype(np.float64) - ref) / xp.maximum(bound, np.finfo(np.float64).tiny)
        err = xp.where(xp.isfinite(err), err, np.inf)
        bad = err > rtol
        tol = rtol
    else:
        err = xp.abs(c.astype(np.int64) - ref.astype(np.int64)).astype(np.float64)
        bad = err != 0
        tol = 0.0
    flat = int(err.argmax())
    i, j = divmod(flat, c.shape[1])
    n_bad = int(bad.sum())
    expected = ref[i, j].item() if is_float else int(ref[i, j].item())
    return VerifyResult(n_bad == 0, float(err.max()), (i, j), c[i, j].item(), expected, n_bad, tol)
