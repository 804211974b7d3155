"""experiments/gpu/verify.py on NumPy: int4 packing, bfloat16 rounding, operands and the comparison."""
import numpy as np
import pytest

from experiments.dtypes import tolerance
from experiments.gpu.verify import (bf16_bits, bf16_values, check, fp8_finite_codes, fp8_values,
                                make_operands, pack_int4, poison, unpack_int4)

# -- int4 packing -----------------------------------------------------------------------------

def test_pack_int4_exact_bytes():
    got = pack_int4(np.array([[1, -2, 3, 4]], dtype=np.int8))
    assert got.dtype == np.uint8
    assert got.tolist() == [[0xE1, 0x43]]     # element 0 in the low nibble, -2 = 0xE


def test_pack_int4_extremes():
    got = pack_int4(np.array([-8, 7, 7, -8, 0, -1], dtype=np.int8))
    assert got.tolist() == [0x78, 0x87, 0xF0]


def test_unpack_int4_every_byte():
    packed = np.arange(256, dtype=np.uint8).reshape(16, 16)
    vals = unpack_int4(packed)
    assert vals.dtype == np.int8 and vals.shape == (16, 32)
    lo = np.arange(256) & 0xF
    hi = np.arange(256) >> 4
    signed = lambda x: np.where(x >= 8, x - 16, x)  # noqa: E731
    assert vals.reshape(-1)[0::2].tolist() == signed(lo).tolist()
    assert vals.reshape(-1)[1::2].tolist() == signed(hi).tolist()
    assert np.array_equal(pack_int4(vals), packed)
    assert unpack_int4(np.array([0xE1, 0x43], dtype=np.uint8)).tolist() == [1, -2, 3, 4]


def test_pack_int4_odd_last_axis():
    with pytest.raises(ValueError, match=r"int4 packing needs an even last axis, got shape \(2, 3\)"):
        pack_int4(np.zeros((2, 3), dtype=np.int8))


# -- bfloat16 -----------------------------------------------------------------------------------

@pytest.mark.parametrize("value, bits", [
    (1.0, 0x3F80),
    (1.0 + 2.0 ** -8, 0x3F80),                  # halfway, 0x3F80 is even: down
    (1.0 + 3 * 2.0 ** -8, 0x3F82),              # halfway, 0x3F81 is odd: up
    (1.0 + 2.0 ** -8 + 2.0 ** -20, 0x3F81),     # above halfway: up
    (1.0 + 2.0 ** -9, 0x3F80),                  # below halfway: down
    (-2.5, 0xC020),
    (0.0, 0x0000),
    (-0.0, 0x8000),
    (float("inf"), 0x7F80),
    (3.3895313892515355e38, 0x7F7F),            # the largest bfloat16
])
def test_bf16_bits_round_to_nearest_even(value, bits):
    got = bf16_bits(np.array([value], dtype=np.float32))
    assert got.dtype == np.uint16
    assert int(got[0]) == bits


def test_bf16_values_exact():
    bits = np.array([0x3F80, 0x3F82, 0xC020, 0x0001], dtype=np.uint16)
    assert bf16_values(bits).tolist() == [1.0, 1.0 + 2.0 ** -6, -2.5, 2.0 ** -133]


# -- operands -----------------------------------------------------------------------------------

@pytest.mark.parametrize("precision, dtype, k_cols, lo, hi", [
    ("fp16", np.float16, 64, -1.0, 1.0),
    ("bf16", np.uint16, 64, -1.0, 1.0),
    ("int8", np.int8, 64, -128, 127),
    ("int4", np.uint8, 32, -8, 7),
    ("fp8_e4m3", np.uint8, 64, -448, 448),
    ("fp8_e5m2", np.uint8, 64, -57344, 57344),
])
def test_make_operands_numpy(precision, dtype, k_cols, lo, hi):
    ops = make_operands(precision, 48, 40, 64, seed=5, xp=np)
    assert ops.a.dtype == dtype and ops.b.dtype == dtype
    assert ops.a.shape == (48, k_cols) and ops.b.shape == (40, k_cols)
    assert ops.a_ref.dtype == np.float64 and ops.b_ref.dtype == np.float64
    assert ops.a_ref.shape == (48, 64) and ops.b_ref.shape == (40, 64)
    for ref in (ops.a_ref, ops.b_ref):
        assert lo <= ref.min() and ref.max() <= hi
        assert np.count_nonzero(ref) > ref.size // 2      # fresh random data, not zeros
    assert not np.array_equal(ops.a_ref[:40], ops.b_ref)  # A and B drawn independently
    # what the kernel reads holds exactly the reference values
    if precision == "int4":
        assert np.array_equal(unpack_int4(ops.a).astype(np.float64), ops.a_ref)
        assert np.array_equal(unpack_int4(ops.b).astype(np.float64), ops.b_ref)
    elif precision == "bf16":
        assert np.array_equal(bf16_values(ops.a).astype(np.float64), ops.a_ref)
    elif precision.startswith("fp8"):
        assert np.array_equal(fp8_values(ops.b, precision).astype(np.float64), ops.b_ref)
        assert np.isfinite(ops.a_ref).all() and np.isfinite(ops.b_ref).all()
    else:
        assert np.array_equal(ops.a.astype(np.float64), ops.a_ref)


def test_make_operands_int_ranges_are_covered():
    ops = make_operands("int4", 64, 64, 64, seed=1, xp=np)
    assert set(np.unique(ops.a_ref).tolist()) == set(range(-8, 8))
    ops = make_operands("int8", 128, 128, 64, seed=1, xp=np)
    assert ops.a_ref.min() == -128 and ops.a_ref.max() == 127


def test_make_operands_seed():
    a = make_operands("int8", 16, 16, 32, seed=3, xp=np)
    b = make_operands("int8", 16, 16, 32, seed=3, xp=np)
    c = make_operands("int8", 16, 16, 32, seed=4, xp=np)
    assert np.array_equal(a.a, b.a) and not np.array_equal(a.a, c.a)


# -- fp8 ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("precision, bits, value", [
    ("fp8_e4m3", 0x00, 0.0),
    ("fp8_e4m3", 0x01, 2.0 ** -9),                  # smallest subnormal: 1/8 * 2**-6
    ("fp8_e4m3", 0x07, 7 / 8 * 2.0 ** -6),          # largest subnormal
    ("fp8_e4m3", 0x08, 2.0 ** -6),                  # smallest normal
    ("fp8_e4m3", 0x38, 1.0),                        # exponent 7 = bias
    ("fp8_e4m3", 0x3C, 1.5),
    ("fp8_e4m3", 0x7E, 448.0),                      # largest: 1.75 * 2**8
    ("fp8_e4m3", 0xFE, -448.0),
    ("fp8_e4m3", 0x80, -0.0),
    ("fp8_e5m2", 0x01, 2.0 ** -16),                 # 1/4 * 2**-14
    ("fp8_e5m2", 0x04, 2.0 ** -14),
    ("fp8_e5m2", 0x3C, 1.0),
    ("fp8_e5m2", 0x3E, 1.5),
    ("fp8_e5m2", 0x7B, 57344.0),                    # 1.75 * 2**15
    ("fp8_e5m2", 0xC0, -2.0),
    ("fp8_e5m2", 0x7C, float("inf")),
    ("fp8_e5m2", 0xFC, float("-inf")),
])
def test_fp8_values_exact(precision, bits, value):
    got = fp8_values(np.array([bits], dtype=np.uint8), precision)
    assert got.dtype == np.float32
    assert got[0] == value and np.signbit(got[0]) == np.signbit(value)


def test_fp8_nans_and_finite_codes():
    codes = np.arange(256, dtype=np.uint8)
    e4m3, e5m2 = fp8_values(codes, "fp8_e4m3"), fp8_values(codes, "fp8_e5m2")
    assert np.flatnonzero(np.isnan(e4m3)).tolist() == [0x7F, 0xFF]
    assert np.flatnonzero(np.isnan(e5m2)).tolist() == [0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF]
    assert len(fp8_finite_codes("fp8_e4m3")) == 254 and len(fp8_finite_codes("fp8_e5m2")) == 248
    # every finite value once, except +-0
    assert len(set(e4m3[fp8_finite_codes("fp8_e4m3")].tolist())) == 253


def test_fp8_operands_cover_the_codes():
    ops = make_operands("fp8_e4m3", 128, 64, 128, seed=3, xp=np)
    assert set(np.unique(ops.a).tolist()) == set(fp8_finite_codes("fp8_e4m3").tolist())


# -- B stored K x N ----------------------------------------------------------------------------

@pytest.mark.parametrize("precision", ["fp16", "bf16", "int8", "int4", "fp8_e5m2"])
def test_make_operands_row_b(precision):
    col = make_operands(precision, 16, 64, 32, seed=9, xp=np)
    row = make_operands(precision, 16, 64, 32, seed=9, xp=np, b_layout="row")
    assert np.array_equal(col.a, row.a) and np.array_equal(col.b_ref, row.b_ref)
    assert row.b_ref.shape == (64, 32)                  # the values stay N x K
    if precision == "int4":
        assert row.b.shape == (32, 32)                  # K x N/2: packed along N
        assert np.array_equal(unpack_int4(row.b).T.astype(np.float64), row.b_ref)
    else:
        assert row.b.shape == (32, 64) and row.b.flags.c_contiguous
        assert np.array_equal(row.b.T, col.b)


def test_make_operands_bad_layout():
    with pytest.raises(ValueError, match="b_layout='rows' is not valid; valid values: col, row"):
        make_operands("int8", 16, 16, 32, seed=1, xp=np, b_layout="rows")


# -- f16 accumulation ---------------------------------------------------------------------------

def test_tolerance_f32_is_rtol():
    assert tolerance("fp16", "f32", 8192, 1e-3) == 1e-3


@pytest.mark.parametrize("k, want", [
    (256, 33 * 2.0 ** -10 / (1 - 33 * 2.0 ** -10)),     # worst case, n = 256/8 + 1 = 33
    (1024, 8 * 129 ** 0.5 * 2.0 ** -10),                 # probabilistic bound is smaller from here
    (8192, 8 * 1025 ** 0.5 * 2.0 ** -10),                # worst case is void (n u >= 1)
])
def test_tolerance_f16(k, want):
    assert tolerance("fp16", "f16", k, 1e-3) == pytest.approx(want, rel=1e-12)


def test_tolerance_f16_small_k_keeps_rtol():
    assert tolerance("fp16", "f16", 8, 0.5) == 0.5


def test_check_f16_c():
    ops = make_operands("fp16", 32, 16, 256, seed=4, xp=np)
    ref = ops.a_ref @ ops.b_ref.T
    c = ref.astype(np.float16)                          # one rounding to f16: well inside the bound
    tol = tolerance("fp16", "f16", 256, 1e-3)
    res = check(c, ops, is_float=True, rtol=tol)
    assert res.ok and res.max_error < 2.0 ** -11
    c[3, 4] = np.float16(ref[3, 4] + 0.1 * (np.abs(ops.a_ref[3]) @ np.abs(ops.b_ref[4])))
    res = check(c, ops, is_float=True, rtol=tol)
    assert not res.ok and res.where == (3, 4) and res.max_error == pytest.approx(0.1, rel=0.01)


@pytest.mark.parametrize("rtol", [float("nan"), float("inf"), -1e-3])
def test_check_refuses_a_tolerance_that_passes_anything(rtol):
    """A constant C is wrong within 1e-3; a NaN or infinite bound used to call it verified."""
    ops = make_operands("fp16", 32, 16, 64, seed=4, xp=np)
    c = np.full((32, 16), 12345.0, dtype=np.float32)
    assert not check(c, ops, is_float=True, rtol=1e-3).ok
    with pytest.raises(ValueError, match="is not a finite tolerance >= 0"):
        check(c, ops, is_float=True, rtol=rtol)


def test_poison_f16():
    c = np.zeros((2, 3), dtype=np.float16)
    poison(c)
    assert np.isnan(c).all()


# -- check --------------------------------------------------------------------------------------

def _int_case():
    ops = make_operands("int8", 32, 24, 64, seed=11, xp=np)
    exact = (ops.a.astype(np.int64) @ ops.b.astype(np.int64).T).astype(np.int32)
    return ops, exact


def test_check_exact_integer_result():
    ops, c = _int_case()
    res = check(c, ops, is_float=False, rtol=1e-3)
    assert res.ok
    assert (res.max_error, res.mismatches, res.tolerance) == (0.0, 0, 0.0)


def test_check_one_wrong_integer():
    ops, c = _int_case()
    expected = int(c[5, 17])
    c[5, 17] += 3
    res = check(c, ops, is_float=False, rtol=1e-3)
    assert not res.ok
    assert res.where == (5, 17)
    assert (res.got, res.expected) == (expected + 3, expected)
    assert isinstance(res.got, int) and isinstance(res.expected, int)
    assert (res.max_error, res.mismatches) == (3.0, 1)
    assert res.message() == (f"1 elements of C differ from the reference (exactly); worst at C[5, 17]: "
                             f"got {expected + 3}, expected {expected}, error 3")


def test_check_unwritten_poisoned_element():
    ops, exact = _int_case()
    c = np.empty_like(exact)
    poison(c)
    assert (c == np.iinfo(np.int32).min).all()
    c[:] = exact
    c[31, 0] = np.iinfo(np.int32).min          # the one element a kernel did not write
    res = check(c, ops, is_float=False, rtol=1e-3)
    assert not res.ok
    assert res.where == (31, 0) and res.mismatches == 1
    assert res.got == -2147483648 and res.expected == int(exact[31, 0])


def _float_case(precision="fp16"):
    ops = make_operands(precision, 32, 16, 64, seed=2, xp=np)
    ref = ops.a_ref @ ops.b_ref.T
    bound = np.abs(ops.a_ref) @ np.abs(ops.b_ref).T
    return ops, ref, bound


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_check_float_rounding_noise_passes(precision):
    ops, ref, bound = _float_case(precision)
    rs = np.random.RandomState(0)
    c = (ref + rs.choice([-1, 1], ref.shape) * 1e-6 * bound).astype(np.float32)
    res = check(c, ops, is_float=True, rtol=1e-3)
    assert res.ok, res.message()
    assert res.mismatches == 0 and res.max_error < 2e-6 and res.tolerance == 1e-3


def test_check_float_perturbation_fails():
    ops, ref, bound = _float_case()
    c = ref.astype(np.float32)
    c[7, 3] = ref[7, 3] + 1e-2 * bound[7, 3]
    res = check(c, ops, is_float=True, rtol=1e-3)
    assert not res.ok
    assert res.where == (7, 3) and res.mismatches == 1
    assert res.max_error == pytest.approx(1e-2, rel=1e-3)
    assert res.expected == pytest.approx(ref[7, 3], rel=1e-12)
    assert "(within rtol=0.001); worst at C[7, 3]" in res.message()


def test_check_float_poison_fails():
    ops, ref, _ = _float_case()
    c = np.empty(ref.shape, dtype=np.float32)
    poison(c)
    assert np.isnan(c).all()
    c[:] = ref
    c[0, 15] = np.nan
    res = check(c, ops, is_float=True, rtol=1e-3)
    assert not res.ok
    assert res.where == (0, 15) and res.mismatches == 1
    assert res.max_error == float("inf") and np.isnan(res.got)


def test_bf16_bits_keeps_nan():
    x = np.array([0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00000, 0x7F800001], dtype=np.uint32).view(np.float32)
    bits = bf16_bits(x)
    assert bits.tolist() == [0x7FFF, 0xFFFF, 0x7FC0, 0x7FC0]
    assert np.isnan(bf16_values(bits)).all()
