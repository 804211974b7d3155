"""KernelSpec validation, spec_from_config, the derived numbers and the space of the default family
(experiments/families/mma_sync/spec.py)."""
from math import prod

import pytest
from omegaconf import OmegaConf

from experiments.config import Config
from experiments.families.mma_sync.rules import RULES, valid_ktiles
from experiments.families.mma_sync.spec import KernelSpec, describe_space, space, spec_from_config
from experiments.hardware import ARCHS
from experiments.spec import SpecError, resolve_arch
from experiments.spec_tables import PRECISIONS
from experiments.families.mma_sync.domains import MAX_STAGES, tile_presets

# Axes the numbers below depend on, pinned so that a change of a default does not move them
BASE = ["tile.block=[128,128]", "tile.warps=[2,4]", "tile.group_m=8", "pipeline.stages=2",
        "cache.op=cg", "cache.l2_hint_a=none", "cache.l2_hint_b=none", "mma=auto", "acc=auto",
        "b_layout=col", "loader.a=x4", "loader.b=x2", "target.arch=auto", "target.ptx_version=auto"]


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
    ("fp8_e4m3", [32, 64, 128]),   # the only fp8 shape is m16n8k32
    ("fp8_e5m2", [32, 64, 128]),
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
    # int8 ktile 16 = 16-byte rows: an m16 tile of A is 2 ldmatrix matrices, so .x4 needs two m16
    # tiles; the warp tile 16x32 has one. .x2 and .x1 fit.
    msg = spec_error("precision=int8", "ktile=16", "tile.block=[32,128]", "tile.warps=[2,4]")
    assert msg == ("loader.a=x4 reads 4 8x8 matrices at once, 2 m16 tiles of 2 each (ktile=16, 16-byte "
                   "rows), but the warp tile 16x32 has 1; valid loader.a here: x1, x2, manual")
    s = spec("precision=int8", "ktile=16", "tile.block=[32,128]", "tile.warps=[2,4]", "loader.a=x2")
    assert s.loader_a == "x2" and s.warp_tile == (16, 32)


def test_loader_b_x4_needs_pairs_of_n8_tiles():
    # warp tile 16x8 (block 32x64, 2x8 warps): one n8 tile; B .x4 covers two n8 tiles of 32-byte K
    msg = spec_error("precision=fp16", "ktile=16", "tile.block=[32,64]", "tile.warps=[2,8]", "loader.b=x4")
    assert msg == ("loader.b=x4 reads 4 8x8 matrices at once, 2 n8 tiles of 2 each (ktile=16, 32-byte "
                   "rows), but the warp tile 16x8 has 1; valid loader.b here: x1, x2, manual")
    # 16-byte rows: one matrix per n8 tile, .x4 needs 4 of them (the study tile has 2)
    msg = spec_error("precision=int4", "ktile=32", "tile.block=[32,64]", "tile.warps=[2,4]",
                     "loader.a=x2", "loader.b=x4")
    assert msg.endswith("valid loader.b here: x1, x2, manual")


def test_row_b_of_8_and_4_bit_types_needs_the_manual_loader():
    for prec in ("int8", "int4", "fp8_e4m3"):
        msg = spec_error(f"precision={prec}", "ktile=64", "b_layout=row", "target.arch=sm_90")
        assert msg == (f"loader.b=x2 is not valid with b_layout=row and precision={prec}: ldmatrix.m8n8 .trans "
                       f"transposes 16-bit elements only (PTX ISA 9.7.14.5.15), so {PRECISIONS[prec].bits}"
                       "-bit B stored K x N is gathered by scalar loads; valid values: manual")
        s = spec(f"precision={prec}", "ktile=64", "b_layout=row", "loader.b=manual", "target.arch=sm_90")
        assert (s.b_layout, s.loader_b) == ("row", "manual")
    s = spec("precision=bf16", "ktile=32", "b_layout=row", "loader.b=x4")
    assert s.entry == "gemm_bf16_bk32_m16n8k16_ldx4x4_cg_brow_s2_128x128_w2x4_g8"


def test_row_b_copies_whole_16_byte_chunks():
    # int4, BN = 16: a K row of the B tile is 8 bytes, less than one cp.async chunk
    msg = spec_error("precision=int4", "ktile=32", "tile.block=[32,16]", "tile.warps=[2,2]",
                     "b_layout=row", "loader.a=x2", "loader.b=manual")
    assert msg == ("b_layout=row copies K rows of BN=16 int4 elements (8 bytes) in 16-byte cp.async "
                   "chunks: BN * bits / 8 must be a multiple of 16. Use a wider tile.block or b_layout=col.")


def test_chunks_of_a_row_divide_the_threads():
    # fp16 K x N rows of BN = 96 elements = 192 bytes = 12 chunks; 128 threads are not a multiple of 12
    msg = spec_error("precision=fp16", "ktile=32", "tile.block=[64,96]", "tile.warps=[2,2]", "b_layout=row",
                     "loader.b=x2")
    assert msg == ("B rows of 192 bytes are 12 cp.async chunks, which do not divide the 128 threads of "
                   "tile.warps=[2, 2]; use a power-of-two tile.")


def test_fp8_needs_sm89_and_ptx_84():
    msg = spec_error("precision=fp8_e4m3", "ktile=64", "target.arch=sm_80")
    assert msg == ("precision=fp8_e4m3 needs target.arch sm_89 or later (mma.sync with .e4m3, PTX ISA 8.4); "
                   "valid target.arch: sm_89, sm_90, sm_90a, sm_100, sm_120")
    s = spec("precision=fp8_e5m2", "ktile=64", "target.arch=sm_89")
    assert (s.mma_shape, s.acc, s.ptx_version) == ("m16n8k32", "f32", (8, 4))
    assert spec("precision=fp8_e4m3", "ktile=32", "target.arch=sm_120").ptx_version == (8, 7)


def test_f16_accumulation_is_for_fp16_only():
    s = spec("precision=fp16", "ktile=32", "acc=f16")
    assert (s.acc, s.accum.c_dtype, s.accum.regs_per_tile) == ("f16", "float16", 2)
    assert s.entry == "gemm_fp16_bk32_m16n8k16_accf16_ldx4x2_cg_bcol_s2_128x128_w2x4_g8"
    assert_names(spec_error("precision=bf16", "acc=f16"), "acc", "f16", ["f32"], "precision=bf16")
    assert_names(spec_error("precision=int8", "acc=f32"), "acc", "f32", ["s32"], "precision=int8")
    assert spec("precision=fp16", "acc=f32").entry == spec("precision=fp16").entry   # the default


def test_group_m_range():
    assert spec("tile.group_m=1").group_m == 1
    assert spec("tile.group_m=64").group_m == 64
    assert spec_error("tile.group_m=0") == "tile.group_m=0 must be between 1 (row-major) and 64"
    assert spec_error("tile.group_m=65") == "tile.group_m=65 must be between 1 (row-major) and 64"


def test_unknown_arch():
    msg = spec_error("target.arch=sm_75")
    assert msg == ("target.arch='sm_75' is not supported; valid: auto, sm_80, sm_86, sm_89, sm_90, "
                   "sm_90a, sm_100, sm_120")


def test_bad_ptx_version_string():
    msg = spec_error("target.ptx_version=seven")
    assert msg == "target.ptx_version='seven' must be 'auto' or MAJOR.MINOR, e.g. 7.8"


def test_direct_construction_validates_stages_and_cache():
    with pytest.raises(SpecError) as err:
        KernelSpec("int8", 64, 32, 128, 128, 2, 4, 66, "cg", "sm_90")
    assert str(err.value) == ("pipeline.stages=66 is not valid; valid values: 1 ... 65 that fit shared memory "
                              "(the main loop of S stages waits with cp.async.wait_group S - 2, and its counter "
                              "holds at most 63 pending groups)")
    with pytest.raises(SpecError) as err:
        KernelSpec("int8", 64, 32, 128, 128, 2, 4, 2, "cs", "sm_90")
    assert_names(str(err.value), "cache.op", "cs", ["ca", "cg"])
    with pytest.raises(SpecError) as err:
        KernelSpec("int8", 64, 32, 128, 128, 2, 4, 2, "cg", "sm_90", l2_hint_b="evict_soon")
    assert_names(str(err.value), "cache.l2_hint_b", "evict_soon",
                 ["none", "evict_first", "evict_last", "evict_normal"])
    with pytest.raises(SpecError) as err:
        KernelSpec("int8", 64, 32, 128, 128, 2, 4, 2, "cg", "sm_90", loader_a="x8")
    assert_names(str(err.value), "loader.a", "x8", ["x1", "x2", "x4", "manual"])
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
    assert resolve_arch("auto", 100) == "sm_100"
    assert resolve_arch("sm_80", 90) == "sm_80"
    with pytest.raises(SpecError, match="target.arch='sm_103' is not supported"):
        resolve_arch("auto", 103)
    with pytest.raises(SpecError) as err:
        resolve_arch("SM_90A", None)
    assert str(err.value).endswith("; did you mean target.arch=sm_90a?")


@pytest.mark.parametrize("arch, limit, stages", [
    # int4 ktile 32 on the study tile: 16-byte rows, (32 + 64) x 16 = 1536 B per stage
    ("sm_89", 101376, 65),     # 66 stages would fit 99 KiB; a wait_group holds 63 -> 65 stages
    ("sm_120", 101376, 65),
    ("sm_100", 232448, 65),
])
def test_stages_up_to_what_fits(arch, limit, stages):
    s = spec("precision=int4", "ktile=32", "tile.block=[32,64]", "tile.warps=[2,4]", "loader.a=x2",
             f"target.arch={arch}", f"pipeline.stages={stages}")
    assert s.stage_bytes == 1536 and s.smem_bytes == 99840 <= limit == ARCHS[arch].max_smem_block
    assert MAX_STAGES == 65


def test_stages_limited_by_shared_memory():
    # fp16 ktile 64 on 128x128: pitch 144, 256 rows = 36864 B per stage; sm_89: 2 stages fit, 3 do not
    assert spec("precision=fp16", "ktile=64", "pipeline.stages=2", "target.arch=sm_89").smem_bytes == 73728
    msg = spec_error("precision=fp16", "ktile=64", "pipeline.stages=3", "target.arch=sm_89")
    assert "needs 110592 bytes of shared memory per block (3 stages x 36864 B); sm_89 allows 101376" in msg
    # sm_90 allows 6 (6 x 36864 = 221184 <= 232448), not 7
    assert spec("precision=fp16", "ktile=64", "pipeline.stages=6").smem_bytes == 221184
    assert "sm_90 allows 232448" in spec_error("precision=fp16", "ktile=64", "pipeline.stages=7")


# -- PTX version ------------------------------------------------------------------------------

@pytest.mark.parametrize("arch, version", [("sm_80", (7, 0)), ("sm_86", (7, 1)), ("sm_89", (7, 8)),
                                           ("sm_90", (7, 8)), ("sm_100", (8, 6)), ("sm_120", (8, 7))])
def test_ptx_version_auto(arch, version):
    s = spec("precision=int8", "ktile=64", f"target.arch={arch}")
    assert s.ptx_version == version
    assert s.flat()["ptx_version"] == "%d.%d" % version


def test_ptx_version_with_l2_hints():
    # createpolicy and cp.async .L2::cache_hint need PTX ISA 7.4
    s = spec("precision=int8", "ktile=64", "target.arch=sm_80", "cache.l2_hint_a=evict_last")
    assert s.ptx_version == (7, 4)
    assert s.entry == "gemm_int8_bk64_m16n8k32_ldx4x2_cg_l2lx_bcol_s2_128x128_w2x4_g8"
    msg = spec_error("precision=int8", "target.arch=sm_80", "cache.l2_hint_b=evict_first",
                     "target.ptx_version=7.3")
    assert msg == ("target.ptx_version=7.3 is below 7.4, the lowest that sm_80 and mma.m16n8k32.s8 with "
                   ".L2::cache_hint need")


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
    s = spec("precision=int4", "ktile=32", "cache.op=ca", "pipeline.stages=3",
             "tile.block=[64,64]", "tile.warps=[2,2]", "tile.group_m=1")
    assert s.entry == "gemm_int4_bk32_m16n8k32_ldx4x2_ca_bcol_s3_64x64_w2x2_g1"
    s = spec("precision=int4", "ktile=64", "b_layout=row", "loader.a=manual", "loader.b=manual",
             "cache.l2_hint_a=evict_first", "cache.l2_hint_b=evict_normal")
    assert s.entry == "gemm_int4_bk64_m16n8k64_ldmanman_cg_l2fn_brow_s2_128x128_w2x4_g8"


def test_todays_default_entry_is_unchanged():
    cfg_ = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.from_dotlist(["precision=int8", "ktile=64"]))
    assert spec_from_config(cfg_).entry == "gemm_int8_bk64_m16n8k32_ldx4x2_cg_bcol_s3_256x128_w4x2_g8"


def test_l2_prefetch_from_the_config_and_from_configs_tracked_before_it():
    """cache.l2_prefetch is a typed key (an unknown size stops with the valid ones); a config.yaml
    tracked before the key existed gives the kernel it ran (none)."""
    assert spec("precision=int8", "ktile=64", "cache.l2_prefetch=256B").entry.endswith("_cg_pf256B_bcol_s2_128x128_w2x4_g8")
    with pytest.raises(Exception, match="512B"):
        cfg("cache.l2_prefetch=512B")
    old = OmegaConf.create(OmegaConf.to_container(cfg("precision=int8", "ktile=64"), enum_to_str=True))
    del old.cache["l2_prefetch"]
    assert spec_from_config(old).l2_prefetch == "none"


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


def test_row_b_numbers():
    # bf16 ktile 32, B stored K x N: a stage holds BM = 128 rows of A (64 B + 16 pad) and BK = 32 rows
    # of B of BN = 128 elements (256 B + 16 pad)
    s = spec("precision=bf16", "ktile=32", "b_layout=row")
    assert (s.smem_stride, s.b_row_bytes, s.b_stride) == (80, 256, 272)
    assert s.stage_bytes == 128 * 80 + 32 * 272 == 18944
    # int4 B of 16 bytes per K row (BN = 32) packs without padding, like 16-byte A rows
    s = spec("precision=int4", "ktile=32", "tile.block=[64,32]", "tile.warps=[2,2]", "b_layout=row",
             "loader.b=manual")
    assert (s.b_row_bytes, s.b_stride, s.stage_bytes) == (16, 16, 64 * 16 + 32 * 16)


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
                              "gemm_int8_bk64_m16n8k32_ldx4x2_cg_bcol_s2_128x128_w2x4_g8: A and B must each "
                              "stay below 2^32 bytes, C below 2^40 bytes")
    s.check_problem(65536, 128, 65472)          # 65536 x 65472 < 2**32


# -- the space ---------------------------------------------------------------------------------

ONE_TILE = {"64x64": (64, 64, 2, 2)}


def test_space_counts_by_hand():
    """sm_80, one tile (64x64, 2x2 warps): every point is the product of the axes; the counts below
    follow from the rules without running the enumerator."""
    sp = space(["sm_80"], ONE_TILE)
    free = 2 * 4 * 4 * 2 * 4                               # cache.op, two L2 hints, group_m, L2 prefetch
    # acc ktile mma b_layout tile loaders smem_layout stages
    per_prec = 3 * 4 * 4 * 2 * 1 * 4 * 4 * 2 * MAX_STAGES * free
    c = sp.counts["sm_80"]
    assert sum(c.values()) == 6 * per_prec
    assert c["arch"] == 2 * per_prec                       # fp8 before sm_89
    # acc: fp16 keeps f32, f16; bf16, int8, int4 keep one of 3
    assert c["acc"] == (1 + 2 + 2 + 2) * per_prec // 3
    # smem on sm_80 (166912 B): stage bytes = 128 rows x pitch (64x64 tile, col B); valid stages =
    # min(65, 166912 // stage). Padded pitch 16 -> 81 (65), 48 -> 27, 80 -> 16, 144 -> 9, 272 -> 4;
    # swizzled rows are not padded: 32 -> 40, 64 -> 20, 128 -> 10, 256 -> 5
    max_stages = {}
    for _, values, mx in sp.cells:
        s = sp.spec(values, 1)
        if s.b_layout == "col":
            max_stages.setdefault((s.smem_layout, s.smem_stride), set()).add(mx)
    assert max_stages == {("padded", 16): {65}, ("padded", 48): {27}, ("padded", 80): {16},
                          ("padded", 144): {9}, ("padded", 272): {4}, ("swizzled", 32): {40},
                          ("swizzled", 64): {20}, ("swizzled", 128): {10}, ("swizzled", 256): {5}}
    # swizzled with x1/x2/manual loaders or B stored K x N: rejected by the swizzle rule
    assert c["swizzle"] > 0
    assert c["valid"] == sum(cnt for _, _, cnt in sp.cells) * free


def test_space_cells_are_valid_and_the_rest_is_not():
    """Every cell's stages 1..max are valid KernelSpecs; max + 1 is rejected by shared memory."""
    sp = space(["sm_89"], ONE_TILE)
    for _, values, mx in sp.cells[::37]:
        s = sp.spec(values, mx)
        assert s.arch == "sm_89" and s.smem_bytes <= ARCHS["sm_89"].max_smem_block
        if mx < MAX_STAGES:
            with pytest.raises(SpecError, match="bytes of shared memory per block"):
                sp.spec(values, mx + 1)


def test_space_rules_partition_the_points():
    sp = space(["sm_90", "sm_120"])
    sizes = [len(a.values) for a in sp.axes]
    for c in sp.counts.values():
        assert sum(c.values()) == prod(sizes) // 2        # two of the archs
        assert set(c) <= {"valid"} | {r.name for r in RULES}
    assert sp.counts["sm_90"]["valid"] > sp.counts["sm_120"]["valid"]   # 227 KiB vs 99 KiB


def test_describe_space_lists_every_axis_and_rule():
    text = describe_space()
    for key in ("target.arch", "precision", "acc", "ktile", "mma", "b_layout", "tile", "loader.a",
                "loader.b", "smem_layout", "pipeline.stages", "cache.op", "cache.l2_hint_a", "cache.l2_hint_b", "tile.group_m"):
        assert f"\n  {key} " in text, key
    assert "1, 2, 3, ..., 65" in text
    assert all(f"  {r.name} " in text for r in RULES)


def test_tile_presets_include_the_study_tile():
    assert tile_presets()["l4_32x64"] == (32, 64, 2, 4)
    assert tile_presets()["256x128"] == (256, 128, 4, 2)


X4 = ("loader.a=x4", "loader.b=x4")


@pytest.mark.parametrize("overrides, texts", [
    (("precision=fp16", "ktile=64"), ["loader.a=x4 and loader.b=x4"]),            # the default loader.b=x2
    (("precision=int8", "ktile=16", *X4), ["rows of at least 32 bytes (ktile=16 gives 16",
                                           "valid ktile for int8: 32, 64, 128"]),
    # one message for all it needs, not the loader rule's `loader.b ... valid values: manual` first
    (("precision=int8", "ktile=64", "b_layout=row"), ["b_layout=col", "loader.a=x4 and loader.b=x4"]),
    (("precision=int8", "ktile=128", "tile.block=[64,64]", "tile.warps=[1,1]", *X4),
     ["32 threads copy 4 rows of 128 bytes per pass"]),
])
def test_swizzled_layout_names_every_requirement(overrides, texts):
    msg = spec_error("smem_layout=swizzled", *overrides)
    assert msg.startswith("smem_layout=swizzled (16-byte chunk j of row r stored at j ^ f(r)) needs ")
    assert msg.endswith("Use smem_layout=padded otherwise.")
    for text in texts:
        assert text in msg, msg


def test_swizzled_layout_needs_no_padding():
    """Swizzled rows are not padded: a 128x256 fp16 stage of BK 64 is 384 x 128 bytes, not x 144."""
    s = spec("smem_layout=swizzled", "precision=fp16", "ktile=64", "tile.block=[128,256]", "tile.warps=[2,4]", *X4)
    assert (s.smem_stride, s.stage_bytes, s.swizzle) == (128, 384 * 128, (0, 7))
    assert spec("precision=fp16", "ktile=64", "tile.block=[128,256]", "tile.warps=[2,4]", *X4).stage_bytes == 384 * 144
    assert spec("smem_layout=swizzled", "precision=int8", "ktile=64", *X4).swizzle == (1, 3)
    assert spec("smem_layout=swizzled", "precision=fp16", "ktile=16", *X4).swizzle == (2, 1)
