"""Operands, reference and comparison for verifying a GEMM before it is timed.

Data are fresh random values (never zeros); C is poisoned before the launch (NaN for f32,
INT32_MIN for s32) so unwritten elements fail. The reference is a float64 GEMM (cuBLAS DGEMM
through CuPy), exact for the integer types (|C| < 2**53), and the float types are checked
element-wise against the bound ``rtol * (|A| |B|)_ij`` of a K-term dot product.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["pack_int4", "unpack_int4", "make_operands", "Operands", "check", "VerifyResult",
           "bf16_bits", "bf16_values"]


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


def _xp(a):
    mod = type(a).__module__
    if mod.startswith("cupy"):
        import cupy
        return cupy
    return np


@dataclass
class Operands:
    """Device operands and their values for the reference.

    a, b: what the kernel reads (A: M x K, B: N x K; int4 packed to M x K/2, N x K/2 uint8;
    bf16 as uint16 bits); a_ref, b_ref: float64 values, same logical shapes (M x K, N x K).
    """
    a: object
    b: object
    a_ref: object
    b_ref: object


def make_operands(precision: str, m: int, n: int, k: int, seed: int, xp=None) -> Operands:
    """Fresh random A (M x K) and B (N x K) for ``precision`` (fp16, bf16: uniform [-1, 1);
    int8: uniform [-128, 127]; int4: uniform [-8, 7], A and B packed independently)."""
    if xp is None:
        import cupy as xp
    rs = xp.random.RandomState(seed)
    if precision in ("fp16", "bf16"):
        a32 = rs.uniform(-1, 1, (m, k)).astype(np.float32)
        b32 = rs.uniform(-1, 1, (n, k)).astype(np.float32)
        if precision == "fp16":
            a, b = a32.astype(np.float16), b32.astype(np.float16)
            return Operands(a, b, a.astype(np.float64), b.astype(np.float64))
        a, b = bf16_bits(a32), bf16_bits(b32)
        return Operands(a, b, bf16_values(a).astype(np.float64), bf16_values(b).astype(np.float64))
    lo, hi = (-128, 128) if precision == "int8" else (-8, 8)
    av = rs.randint(lo, hi, (m, k)).astype(np.int8)
    bv = rs.randint(lo, hi, (n, k)).astype(np.int8)
    if precision == "int8":
        return Operands(av, bv, av.astype(np.float64), bv.astype(np.float64))
    return Operands(pack_int4(av), pack_int4(bv), av.astype(np.float64), bv.astype(np.float64))


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
    """Fill C with a value no correct kernel writes (NaN, or INT32_MIN for s32)."""
    c.fill(np.nan if c.dtype == np.float32 else np.iinfo(np.int32).min)


def check(c, ops: Operands, is_float: bool, rtol: float) -> VerifyResult:
    """Compare C (M x N, float32 or int32) with the float64 reference A_ref @ B_ref.T."""
    xp = _xp(c)
    ref = ops.a_ref @ ops.b_ref.T
    if is_float:
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
