"""KernelSpec validation, spec_from_config and the derived numbers of experiments/spec.py."""
import pytest
from omegaconf import OmegaConf

from experiments.config import Config
from experiments.spec import (ARCHS, PRECISIONS, KernelSpec, SpecError, resolve_arch,
                              spec_from_config, valid_ktiles)


# Axes the numbers below depend on, pinned so that a change of a default does not move them
BASE = ["tile.block=[128,128]", "tile.warps=[2,4]", "tile.group_m=8", "pipeline.stages=2",
        "eviction.cache=cg", "mma=auto", "target.arch=auto", "target.ptx_version=auto"]


def cfg(*overrides):
    """The typed config with the pinned axes and dotted overrides, as Hydra would compose it."""
    return OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.from_dotlist(BASE),
                           OmegaConf.from_dotlist(list(overrides)))


def spec(*overrides, gpu_cc=None):
    return spec_from_config(cfg(*overrides), gpu_cc)


def spec_error(*overrides, gpu_cc=None) -> str:
    with pytest.raises(SpecError) as err:
        spec_from_config(cfg(*overrides), gpu_cc)
    return str(err.value)


def assert_names(msg: str, key: str, value, valid, given: str = "") -> None:
    """The message names key=value, the setting it conflicts with, and ends with the valid values."""
    assert f"{key}={value} is not valid" in msg, msg
    assert given in msg, msg
    assert msg.endswith("; valid values: " + ", ".join(map(str, valid))), msg


# -- valid K tiles and the automatic MMA shape -------------------------------------------------

@pytest.mark.parametrize("precision, ktiles", [
    ("fp16", [16, 32, 64, 128]),
    ("bf16", [16, 32, 64, 128]),
    ("int8", [16, 32, 64, 128]),
    ("int4", [32, 64, 128]),       # ktile 16 of int4 is 8 bytes, below one 16-byte cp.async chunk
])
def test_valid_ktiles_per_precision(precision, ktiles):
    assert valid_ktiles(PRECISIONS[precision]) == ktiles


@pytest.mark.parametrize("precision, ktile, shape, mma_k", [
    ("int8", 16, "m16n8k16", 16),
    ("int8", 32, "m16n8k32", 32),
    ("int8", 64, "m16n8k32", 32),
    ("int8", 128, "m16n8k32", 32),
    ("int4", 32, "m16n8k32", 32),
    ("int4", 64, "m16n8k64", 64),
    ("int4", 128, "m16n8k64", 64),
    ("fp16", 16, "m16n8k16", 16),
    ("fp16", 32, "m16n8k16", 16),
    ("bf16", 64, "m16n8k16", 16),
])
def test_mma_auto_picks_largest_native_k_dividing_ktile(precision, ktile, shape, mma_k):
    s = spec(f"precision={precision}", f"ktile={ktile}")
    assert s.mma_shape == shape
    assert s.mma_k == mma_k
    assert s.ktile == ktile


def test_explicit_mma_shape_is_kept():
    s = spec("precision=fp16", "ktile=32", "mma=m16n8k8")
    assert (s.mma_k, s.mma_shape) == (8, "m16n8k8")


# -- error messages name the key, the value and the valid values ---------------------------------

def test_mma_not_native_for_precision():
    msg = spec_error("precision=int8", "mma=m16n8k64")
    assert_names(msg, "mma", "m16n8k64", ["auto", "m16n8k16", "m16n8k32"], "precision=int8")
    msg = spec_error("precision=fp16", "mma=m16n8k32")
    assert_names(msg, "mma", "m16n8k32", ["auto", "m16n8k8", "m16n8k16"], "precision=fp16")


def test_mma_that_does_not_divide_ktile():
    msg = spec_error("precision=int4", "ktile=32", "mma=m16n8k64")
    assert "mma=m16n8k64 does not divide ktile=32" in msg
    assert msg.endswith("valid mma for ktile=32: m16n8k32")


def test_bad_ktile_lists_valid_ones():
    assert_names(spec_error("precision=int4", "ktile=16"), "ktile", 16, [32, 64, 128],
                 "precision=int4")
    assert_names(spec_error("precision=fp16", "ktile=8"), "ktile", 8, [16, 32, 64, 128],
                 "precision=fp16")


def test_ktile_not_a_power_of_two_is_rejected_with_auto_mma():
    # ktile 48 is a multiple of k16, so auto picks m16n8k16; the ktile check then rejects it
    assert_names(spec_error("precision=int8", "ktile=48"), "ktile", 48, [16, 32, 64, 128],
                 "precision=int8")


def test_warp_tile_not_multiple_of_16x8():
    msg = spec_error("tile.block=[64,64]", "tile.warps=[8,2]")
    assert "tile.block=[64, 64] with tile.warps=[8, 2] gives a warp tile of 8x32" in msg
    assert "multiple of 16x8" in msg


def test_too_many_accumulators():
    # warp tile 128x128: 8 m16 x 16 n8 tiles x 4 = 512 accumulators; fragments, two register
    # sets of (8 x 4 + 16 x 2): 128
    msg = spec_error("tile.block=[256,256]", "tile.warps=[2,2]")
    assert msg == ("warp tile 128x128 needs 512 accumulator and 128 fragment registers per thread; "
                   "more than 224 leave too few of the 255 for addresses. Use more warps.")


def test_register_budget_boundary():
    # one m16 tile by 27 n8 tiles: 108 accumulators + 2 x (4 + 54) = 116 fragment registers = 224
    s = spec("tile.block=[16,216]", "tile.warps=[1,1]")
    assert s.warp_tile == (16, 216)
    # 28 n8 tiles: 112 + 2 x (4 + 56) = 232 > 224
    msg = spec_error("tile.block=[16,224]", "tile.warps=[1,1]")
    assert msg.startswith("warp tile 16x224 needs 112 accumulator and 120 fragment registers per thread")


def test_too_many_threads():
    msg = spec_error("tile.block=[128,512]", "tile.warps=[8,8]")
    assert msg == "tile.warps=[8, 8] gives 2048 threads; at most 1024"


def test_odd_tile_count_with_16_byte_rows():
    # int8 ktile 16 = 16-byte rows; warp tile 16x32 has one m16 tile (needs an even count)
    msg = spec_error("precision=int8", "ktile=16", "tile.block=[32,128]", "tile.warps=[2,4]")
    assert "ktile=16 gives 16-byte rows" in msg
    assert "warp tile 16x32" in msg


def test_group_m_range():
    assert spec("tile.group_m=1").group_m == 1
    assert spec("tile.group_m=64").group_m == 64
    assert spec_error("tile.group_m=0") == "tile.group_m=0 must be between 1 (row-major) and 64"
    assert spec_error("tile.group_m=65") == "tile.group_m=65 must be between 1 (row-major) and 64"


def test_unknown_arch():
    msg = spec_error("target.arch=sm_75")
    assert msg == "target.arch='sm_75' is not supported; valid: auto, sm_80, sm_86, sm_89, sm_90"


def test_bad_ptx_version_string():
    msg = spec_error("target.ptx_version=seven")
    assert msg == "target.ptx_version='seven' must be 'auto' or MAJOR.MINOR, e.g. 7.8"


def test_direct_construction_validates_stages_and_cache():
    with pytest.raises(SpecError) as err:
        KernelSpec("int8", 64, 32, 128, 128, 2, 4, 5, "cg", "sm_90")
    assert_names(str(err.value), "pipeline.stages", 5, [1, 2, 3, 4])
    with pytest.raises(SpecError) as err:
        KernelSpec("int8", 64, 32, 128, 128, 2, 4, 2, "cs", "sm_90")
    assert_names(str(err.value), "eviction.cache", "cs", ["ca", "cg"])
    with pytest.raises(SpecError) as err:
        KernelSpec("int8", 64, 64, 128, 128, 2, 4, 2, "cg", "sm_90")
    assert_names(str(err.value), "mma", "m16n8k64", ["m16n8k16", "m16n8k32"], "precision=int8")


# -- shared memory per architecture --------------------------------------------------------------

def test_smem_over_sm89_limit():
    # fp16 ktile 128: 256-byte rows + 16 B pad = 272 B pitch; (128 + 128) rows x 272 = 69632 B
    # per stage, x 2 stages = 139264 B > 99 KiB = 101376 B (sm_89 opt-in maximum)
    msg = spec_error("precision=fp16", "ktile=128", "pipeline.stages=2", "target.arch=sm_89")
    assert ARCHS["sm_89"].max_smem_block == 101376 == 99 * 1024
    assert "needs 139264 bytes of shared memory per block (2 stages x 69632 B)" in msg
    assert "sm_89 allows 101376" in msg
    s = spec("precision=fp16", "ktile=128", "pipeline.stages=2", "target.arch=sm_90")
    assert s.smem_bytes == 139264 <= ARCHS["sm_90"].max_smem_block == 232448


def test_smem_limit_follows_the_gpu_compute_capability():
    # target.arch=auto takes the GPU's own sm_XY: an sm_89 GPU rejects what sm_90 accepts
    assert "sm_89 allows 101376" in spec_error("precision=fp16", "ktile=128", gpu_cc=89)
    assert spec("precision=fp16", "ktile=128", gpu_cc=90).arch == "sm_90"


def test_resolve_arch():
    assert resolve_arch("auto", None) == "sm_90"
    assert resolve_arch("auto", 86) == "sm_86"
    assert resolve_arch("sm_80", 90) == "sm_80"
    with pytest.raises(SpecError, match="target.arch='sm_100' is not supported"):
        resolve_arch("auto", 100)


# -- PTX version ------------------------------------------------------------------------------

@pytest.mark.parametrize("arch, version", [("sm_80", (7, 0)), ("sm_86", (7, 1)),
                                           ("sm_89", (7, 8)), ("sm_90", (7, 8))])
def test_ptx_version_auto(arch, version):
    s = spec("precision=int8", "ktile=64", f"target.arch={arch}")
    assert s.ptx_version == version
    assert s.flat()["ptx_version"] == "%d.%d" % version


def test_ptx_version_explicit():
    assert spec("target.arch=sm_90", "target.ptx_version=8.3").ptx_version == (8, 3)
    msg = spec_error("target.arch=sm_90", "target.ptx_version=7.0")
    assert msg == ("target.ptx_version=7.0 is below 7.8, the lowest that sm_90 and "
                   "mma.m16n8k16.f16 need")
    msg = spec_error("precision=int8", "target.arch=sm_80", "target.ptx_version=6.5")
    assert msg.startswith("target.ptx_version=6.5 is below 7.0")


# -- entry name and derived numbers ------------------------------------------------------------

def test_entry_name_format():
    s = spec("precision=int8", "ktile=64")
    assert s.entry == "gemm_int8_bk64_m16n8k32_ldx4x2_cg_bcol_s2_128x128_w2x4_g8"
    s = spec("precision=int4", "ktile=32", "eviction.cache=ca", "pipeline.stages=3",
             "tile.block=[64,64]", "tile.warps=[2,2]", "tile.group_m=1")
    assert s.entry == "gemm_int4_bk32_m16n8k32_ldx4x2_ca_bcol_s3_64x64_w2x2_g1"


def test_flat_and_kwargs_round_trip():
    s = spec("precision=bf16", "ktile=64", "tile.block=[64,64]", "tile.warps=[2,2]")
    flat = s.flat()
    assert flat["mma"] == "m16n8k16"
    assert (flat["precision"], flat["ktile"], flat["bm"], flat["bn"]) == ("bf16", 64, 64, 64)
    assert KernelSpec(**s.as_kwargs()) == s


def test_int8_k64_numbers():
    s = spec("precision=int8", "ktile=64", "pipeline.stages=2")
    assert s.threads == 256
    assert s.warp_tile == (64, 32)
    assert s.row_bytes == 64
    assert s.mma_k_bytes == 32
    assert s.smem_stride == 80          # 64 B + 16 B padding
    assert s.stage_bytes == 20480       # (128 + 128) x 80
    assert s.smem_bytes == 40960        # 2 stages


def test_int4_k32_has_unpadded_16_byte_rows():
    s = spec("precision=int4", "ktile=32", "pipeline.stages=3")
    assert s.row_bytes == 16
    assert s.smem_stride == 16
    assert s.stage_bytes == 4096        # 256 rows x 16 B
    assert s.smem_bytes == 12288


def test_fp16_k16_numbers():
    s = spec("precision=fp16", "ktile=16", "tile.block=[64,64]", "tile.warps=[2,2]",
             "pipeline.stages=4")
    assert (s.row_bytes, s.smem_stride, s.stage_bytes, s.smem_bytes) == (32, 48, 6144, 24576)
    assert s.threads == 128 and s.warp_tile == (32, 32)


# -- problem sizes ---------------------------------------------------------------------------

def test_check_problem_accepts_multiples():
    s = spec("precision=int8", "ktile=64")
    s.check_problem(512, 512, 512)
    s.check_problem(128, 256, 64)


@pytest.mark.parametrize("mnk, text", [
    ((500, 512, 512), "M=500 is not a multiple of BM=128"),
    ((512, 500, 512), "N=500 is not a multiple of BN=128"),
    ((512, 512, 100), "K=100 is not a multiple of BK=64"),
    ((0, 512, 512), "M=0 is not a multiple of BM=128"),
])
def test_check_problem_rejects_tails(mnk, text):
    s = spec("precision=int8", "ktile=64")
    with pytest.raises(SpecError) as err:
        s.check_problem(*mnk)
    msg = str(err.value)
    assert msg.startswith("gemm_int8_bk64_m16n8k32_ldx4x2_cg_bcol_s2_128x128_w2x4_g8 handles no tails: ")
    assert text in msg


def test_check_problem_names_every_bad_dimension():
    s = spec("precision=int8", "ktile=64")
    with pytest.raises(SpecError) as err:
        s.check_problem(100, 200, 300)
    msg = str(err.value)
    assert ("M=100 is not a multiple of BM=128; N=200 is not a multiple of BN=128; "
            "K=300 is not a multiple of BK=64") in msg


def test_check_problem_allows_fewer_k_tiles_than_stages():
    # the prologue skips the copies of tiles past K: one K tile with 4 stages is a valid problem
    s = spec("precision=int8", "ktile=64", "pipeline.stages=4")
    s.check_problem(128, 128, 64)


def test_check_problem_too_large_for_32_bit_offsets():
    s = spec("precision=int8", "ktile=64")
    with pytest.raises(SpecError) as err:
        s.check_problem(65536, 128, 65536)     # 65536 x 65536 bytes of A = 2**32
    assert str(err.value) == ("problem 65536x128x65536 is too large for 32-bit offsets in "
                              "gemm_int8_bk64_m16n8k32_ldx4x2_cg_bcol_s2_128x128_w2x4_g8")
    s.check_problem(65536, 128, 65472)          # 65536 x 65472 < 2**32
