"""experiments.gpu.launch.pack_args: launch arguments checked against their .param types."""
import numpy as np
import pytest

from experiments.gpu.launch import KERNEL_PARAMS, LaunchConfigError, pack_args


def _values(**over):
    v = {"A": np.zeros(4, np.int8), "B": np.zeros(4, np.int8), "C": np.zeros(4, np.int32),
         "M": 512, "N": 256, "K": 128}
    v.update(over)
    return v


def test_kernel_contract():
    assert KERNEL_PARAMS == (("A", "u64"), ("B", "u64"), ("C", "u64"),
                             ("M", "u32"), ("N", "u32"), ("K", "u32"))


def test_valid_ints_become_uint32():
    vals = _values(M=512, N=np.int64(2 ** 32 - 1), K=0)
    out = pack_args(vals)
    assert len(out) == 6
    assert out[0] is vals["A"] and out[1] is vals["B"] and out[2] is vals["C"]   # arrays pass as is
    for got, want in zip(out[3:], (512, 2 ** 32 - 1, 0), strict=True):
        assert type(got) is np.uint32
        assert int(got) == want


def test_pointer_as_int_becomes_uint64():
    out = pack_args(_values(A=0x7F0000001000))
    assert type(out[0]) is np.uint64 and int(out[0]) == 0x7F0000001000


def test_value_too_large_for_u32():
    with pytest.raises(LaunchConfigError) as err:
        pack_args(_values(N=2 ** 32))
    assert str(err.value) == "kernel parameter N (.u32) = 4294967296 is outside [0, 4294967295]"


def test_negative_value():
    with pytest.raises(LaunchConfigError) as err:
        pack_args(_values(K=-1))
    assert str(err.value) == "kernel parameter K (.u32) = -1 is outside [0, 4294967295]"


def test_negative_pointer():
    with pytest.raises(LaunchConfigError, match=r"kernel parameter B \(\.u64\) = -8 is outside"):
        pack_args(_values(B=-8))


@pytest.mark.parametrize("bad, shown", [(512.0, "512.0"), (True, "True"), ("512", "'512'"),
                                        (None, "None")])
def test_non_integer(bad, shown):
    with pytest.raises(LaunchConfigError) as err:
        pack_args(_values(M=bad))
    assert str(err.value) == f"kernel parameter M (.u32) needs an integer, got {shown}"


def test_missing_parameter():
    vals = _values()
    del vals["K"]
    with pytest.raises(LaunchConfigError) as err:
        pack_args(vals)
    assert str(err.value) == "kernel parameter K (.u32) has no value"


def test_launch_config_error_is_value_error():
    assert issubclass(LaunchConfigError, ValueError)


def test_custom_params_s32():
    out = pack_args({"x": -5}, params=(("x", "s32"),))
    assert type(out[0]) is np.int32 and int(out[0]) == -5
    with pytest.raises(LaunchConfigError, match=r"x \(\.s32\) = 2147483648 is outside"):
        pack_args({"x": 2 ** 31}, params=(("x", "s32"),))
