"""experiments/dtypes.py and experiments/hardware.py: the one table of element types and accumulators,
the one verification bound per accumulation, and the tables derived from them (no GPU needed)."""
from pathlib import Path

import numpy as np
import pytest

from experiments import config, families, hardware, spec, spec_tables
from experiments.gpu import verify
from experiments.families.mma_sync import config as root_config
from experiments.dtypes import FP8_RTOL, Accum, DType, accum, dtype, tolerance

KS = (16, 256, 512, 4096, 8192)
F16_BOUND = {16: 0.002938295788442703, 256: 0.033299697275479316, 512: 0.06298638865858242,
             4096: 0.1769492445766582, 8192: 0.25012204052472065}
# (family, precision, acc) -> rtol at each K of KS with rtol = 1e-3, as each family verified before
# the table existed (0: exact); None: the f16 accumulation's bound above
BEFORE = {
    **{("mma_sync", p, a): 1e-3 for p, a in (("fp16", "f32"), ("bf16", "f32"), ("fp8_e4m3", "f32"),
                                              ("fp8_e5m2", "f32"))},
    ("mma_sync", "fp16", "f16"): None, ("mma_sync", "int8", "s32"): 0.0, ("mma_sync", "int4", "s32"): 0.0,
    ("wmma", "fp16", "f32"): 1e-3, ("wmma", "bf16", "f32"): 1e-3, ("wmma", "int8", "s32"): 0.0,
    ("wmma", "int4", "s32"): 0.0,
    ("wgmma", "fp16", "f32"): 1e-3, ("wgmma", "bf16", "f32"): 1e-3, ("wgmma", "fp8_e4m3", "f32"): 2.0 ** -8,
    ("wgmma", "fp8_e5m2", "f32"): 2.0 ** -8, ("wgmma", "int8", "s32"): 0.0,
    ("cublas", "fp16", "f32"): 1e-3, ("cublas", "bf16", "f32"): 1e-3, ("cublas", "fp8_e4m3", "f32"): 2.0 ** -8,
    ("cublas", "int8", "s32"): 0.0, ("dp4a", "int8", "s32"): 0.0,
}
# wmma's f16 accumulation had a formula of its own, 2**-10 sqrt(K / 8) (lambda = 1, tuned to the
# operands' distribution): it now takes the one f16 bound, valid for any operands
WMMA_F16_BEFORE = {16: 0.0013810679320049757, 256: 0.005524271728019903, 512: 0.0078125,
                   4096: 0.02209708691207961, 8192: 0.03125}


def _family_tolerance(name, precision, acc, k):
    fam = families.get(name)
    opts = {"acc": acc} if "acc" in fam.axes else {}
    arch = "sm_90a" if name == "wgmma" else "sm_90"
    return fam.tolerance(fam.spec(precision, opts, arch), k, 1e-3)


@pytest.mark.parametrize("family, precision, acc", list(BEFORE))
def test_tolerance_of_each_family_type_and_accumulator_is_unchanged(family, precision, acc):
    for k in KS:
        want = F16_BOUND[k] if BEFORE[family, precision, acc] is None else BEFORE[family, precision, acc]
        got = (tolerance(precision, acc, k, 1e-3) if family == "mma_sync"
               else _family_tolerance(family, precision, acc, k))
        assert got == want, (family, precision, acc, k)


def test_wmma_f16_takes_the_one_f16_bound():
    for k in KS:
        assert _family_tolerance("wmma", "fp16", "f16", k) == F16_BOUND[k] == Accum.f16.tolerance(k, 1e-3)
        assert F16_BOUND[k] > WMMA_F16_BEFORE[k]       # the one bound is the wider of the two


def test_each_accumulation_has_one_formula():
    assert Accum.s32.tolerance(4096, 1e-3) == 0.0
    assert Accum.f32.tolerance(4096, 2e-3) == 2e-3
    assert Accum.f16.tolerance(8, 0.5) == 0.5                    # never below the rtol asked for
    # narrow accumulation (wgmma, cuBLASLt fp8) only raises the floor of fp8 types
    assert tolerance("fp8_e4m3", "f32", 512, 1e-3, narrow=True) == FP8_RTOL
    assert tolerance("fp8_e4m3", "f32", 512, 1e-3) == 1e-3
    assert tolerance("fp16", "f32", 512, 1e-3, narrow=True) == 1e-3
    assert tolerance("int8", "s32", 512, 1e-3, narrow=True) == 0.0


def test_unknown_names_say_what_is_valid():
    with pytest.raises(ValueError, match="precision='int5' is not an element type; valid values: fp16, bf16, "
                                         "int8, int4, fp8_e4m3, fp8_e5m2"):
        dtype("int5")
    with pytest.raises(ValueError, match="acc='f64' is not an accumulator; valid values: f32, f16, s32"):
        accum("f64")
    with pytest.raises(ValueError, match="precision='copy' is not an element type"):
        tolerance("copy", "f32", 16, 1e-3)


def test_config_enums_are_derived_from_the_table():
    """What users type stays: precision values in the old order, then copy (not an element type)."""
    assert [p.name for p in config.Precision] == ["fp16", "bf16", "int8", "int4", "fp8_e4m3", "fp8_e5m2", "copy"]
    assert all(p.value == p.name for p in config.Precision)
    assert [a.name for a in root_config.Acc] == ["auto", "f32", "f16", "s32"]


def test_every_familys_precisions_are_members():
    for name in families.names():
        extra = set(families.get(name).axes["precision"]) - set(DType.__members__)
        assert extra == ({"copy"} if name == "peak" else set()), name
    for name in ("wmma", "wgmma", "cublas"):
        mod = __import__(f"experiments.families.{name}", fromlist=["TYPES"])
        assert all(mod.TYPES[p] is DType[p] for p in mod.TYPES)
    assert spec_tables.PRECISIONS == {d.name: d for d in DType}
    assert list(spec_tables.ACCUMULATORS) == ["f32", "s32", "f16"]     # the mma_sync acc axis' order


def test_facts_agree_with_what_verify_makes():
    """The storage dtype of each type is what make_operands hands the kernels; integer ranges and FP8
    formats follow from bits and exponent/mantissa widths."""
    for d in DType:
        ops = verify.make_operands(d.name, 16, 16, 64, seed=2, xp=np)
        assert ops.a.dtype == np.dtype(d.np_dtype), d
        assert d.unit == ("TFLOP/s" if d.is_float else "TOP/s")
    i4 = verify.make_operands("int4", 64, 64, 64, seed=2, xp=np)
    assert (i4.a_ref.min(), i4.a_ref.max()) == (-8, 7)
    assert len(verify.fp8_finite_codes("fp8_e4m3")) == 254 and len(verify.fp8_finite_codes("fp8_e5m2")) == 248
    assert [a.np_dtype for a in Accum] == [np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int32)]


def test_gpu_facts_and_types_are_defined_once():
    """No module but its home defines an arch table, an SM count table or a table of element types."""
    assert spec.ARCHS is spec_tables.ARCHS is hardware.ARCHS
    assert spec.sm_count("NVIDIA L4") == (hardware.SM_COUNTS["L4"], "table entry 'L4'")
    root = Path(hardware.__file__).parent
    homes = {"ARCHS = {": "hardware.py", "SM_COUNTS = {": "hardware.py", "DEFAULT_SMS = ": "hardware.py",
             "class ArchLimits": "hardware.py", "FP8_RTOL = ": "dtypes.py", "_FP8 = ": None, "MMA_TYPES = ": None,
             "ACCS = {": None}
    for text, home in homes.items():
        found = sorted(str(f.relative_to(root)) for f in root.rglob("*.py") if text in f.read_text())
        assert found == ([home] if home else []), text
