"""experiments/build/assemble.py: ptxas report parsing, occupancy, SASS mix and summary, errors, and a
covering subset of the whole kernel space assembled by ptxas for sm_80, sm_89, sm_90 and sm_120."""
import hashlib
import itertools
import json
import subprocess
import sys
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from experiments.build.assemble import (PTXAS_HINT, SASS_OPS, Assembly, PtxasError, PtxasMissing, assemble,
                                  disassemble, find_ptxas, find_tool, misaligned_descriptors,
                                  parse_ptxas_report, sass_mix, sass_opcodes, sass_summary,
                                  theoretical_occupancy)
from experiments.families.mma_sync.render import render
from experiments.families.mma_sync.spec import KernelSpec, space
from experiments.families.mma_sync.cover import covering_subset, requirements

ROOT = Path(__file__).resolve().parent.parent

# -- parse_ptxas_report ----------------------------------------------------------------------

# `ptxas -arch=sm_80 -v` on one module with two entries (ptxas 13.0 prints the later entry first)
REPORT_SM80 = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'gemm_fp16_bk128_m16n8k8_ldx4x2_ca_bcol_s1_64x64_w2x2_g8' for 'sm_80'
ptxas info    : Function properties for gemm_fp16_bk128_m16n8k8_ldx4x2_ca_bcol_s1_64x64_w2x2_g8
    8 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 64 registers, used 1 barriers, 8 bytes cumulative stack size, 388 bytes cmem[0]
ptxas info    : Compile time = 19.785 ms
ptxas info    : Compiling entry function 'small_k' for 'sm_80'
ptxas info    : Function properties for small_k
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers, 2048 bytes smem, 360 bytes cmem[0]
ptxas info    : Compile time = 3.907 ms
"""

# the sm_90 form: no cmem figure on the "Used" line
REPORT_SM90 = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'gemm_int8_bk64_m16n8k32_ldx4x2_cg_bcol_s2_128x128_w2x4_g8' for 'sm_90'
ptxas info    : Function properties for gemm_int8_bk64_m16n8k32_ldx4x2_cg_bcol_s2_128x128_w2x4_g8
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 98 registers, used 1 barriers
ptxas info    : Compile time = 31.772 ms
"""


def test_parse_report_first_entry():
    got = parse_ptxas_report(REPORT_SM80, "gemm_fp16_bk128_m16n8k8_ldx4x2_ca_bcol_s1_64x64_w2x2_g8")
    assert got == dict(registers=64, spill_stores=8, spill_loads=12, stack_frame=8, static_smem=0,
                       barriers=1)


def test_parse_report_second_entry_with_static_smem():
    got = parse_ptxas_report(REPORT_SM80, "small_k")
    assert got == dict(registers=8, spill_stores=0, spill_loads=0, stack_frame=0, static_smem=2048,
                       barriers=0)


def test_parse_report_sm90_form():
    got = parse_ptxas_report(REPORT_SM90, "gemm_int8_bk64_m16n8k32_ldx4x2_cg_bcol_s2_128x128_w2x4_g8")
    assert got == dict(registers=98, spill_stores=0, spill_loads=0, stack_frame=0, static_smem=0,
                       barriers=1)


def test_parse_report_unknown_entry():
    with pytest.raises(ValueError, match="no ptxas -v report for entry 'other_k'"):
        parse_ptxas_report(REPORT_SM90, "other_k")


# -- theoretical occupancy ------------------------------------------------------------------

def test_occupancy_register_limited_sm90():
    # 98 regs x 32 = 3136 -> 3328 per warp (units of 256); 65536 // 3328 = 19 warps -> 2 blocks
    # of 8 warps. warps: 64 // 8 = 8; smem: 40960 + 1024 = 41984 -> 233472 // 41984 = 5.
    assert theoretical_occupancy("sm_90", 256, 98, 40960) == (0.25, 2, "registers")


def test_occupancy_128_threads_56_registers():
    # 4 warps; 56 x 32 = 1792 per warp (already a multiple of 256): 65536 // 1792 = 36 warps
    # -> 9 blocks; warps: 64 // 4 = 16; blocks: 32; smem: 4096 + 1024 = 5120 -> 233472 // 5120 = 45.
    # 9 blocks x 4 warps / 64 = 0.5625
    assert theoretical_occupancy("sm_90", 128, 56, 4096) == (0.5625, 9, "registers")


def test_occupancy_register_rounding_matters():
    # 98 regs, 4 warps: 3328 per warp -> 19 warps -> 4 blocks (without rounding 3136 -> 20 -> 5)
    assert theoretical_occupancy("sm_90", 128, 98, 0) == (0.25, 4, "registers")


def test_occupancy_smem_limited_sm89():
    # 64 regs: 2048 per warp -> 32 warps -> 4 blocks of 8; warps: 48 // 8 = 6; blocks: 24;
    # smem: 41984 B -> 102400 // 41984 = 2 blocks -> 16 / 48 warps
    occ, blocks, limiter = theoretical_occupancy("sm_89", 256, 64, 40960)
    assert (blocks, limiter) == (2, "smem")
    assert occ == pytest.approx(1 / 3)


def test_occupancy_smem_granularity():
    # sm_90: 233472 B per SM. 115712 + 1024 = 116736 = 233472 / 2 (a multiple of 128): 2 blocks;
    # one byte more rounds up to 116864 B per block: 1 block
    assert theoretical_occupancy("sm_90", 128, 32, 115712) == (0.125, 2, "smem")
    assert theoretical_occupancy("sm_90", 128, 32, 115713) == (0.0625, 1, "smem")


def test_occupancy_warp_and_block_limits():
    # sm_86, 512 threads = 16 warps, 32 regs: warps 48 // 16 = 3, registers 64 warps // 16 = 4
    assert theoretical_occupancy("sm_86", 512, 32, 0) == (1.0, 3, "warps")
    # sm_89, one warp per block: warps 48, registers 64, blocks 24 -> 24 / 48
    assert theoretical_occupancy("sm_89", 32, 32, 0) == (0.5, 24, "blocks")


# -- SASS instruction mix --------------------------------------------------------------------

SASS = """\
	code for sm_90
		Function : gemm_int8_bk64_m16n8k32_ldx4x2_cg_bcol_s2_128x128_w2x4_g8
	.headerflags	@"EF_CUDA_TEXMODE_UNIFIED EF_CUDA_64BIT_ADDRESS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                          /* 0x00000a00ff017b82 */
                                                                                   /* 0x000fe40000000800 */
        /*0010*/                   S2R R0, SR_TID.X ;                              /* 0x0000000000007919 */
        /*0090*/                   HMMA.16816.F32 R4, R8, R12, R4 ;
        /*00a0*/                   HMMA.16816.F32 R16, R8, R14, R16 ;
        /*00b0*/              @P0 LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64] ;
        /*00c0*/             @!P1 LDGSTS.E.BYPASS.128 [R1+0x80], desc[UR4][R6.64] ;
        /*00d0*/                   LDSM.16.M88.4 R8, [R20] ;
        /*00e0*/                   IMMA.16832.S8.S8 R24, R8.ROW, R12.COL, R24 ;
        /*00f0*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0100*/             @!PT LDS.U.128 R4, [R0] ;
        /*0110*/              @UP0 BRA 0x90 ;
        /*1a30*/                   EXIT ;
        /*1a40*/                   BRA 0x1a40;
"""


def test_sass_mix_counts_base_opcodes():
    # `@!PT LDS.U.128` never executes (ptxas pads with such lines): not counted
    assert sass_mix(SASS) == {"LDC": 1, "S2R": 1, "HMMA": 2, "LDGSTS": 2, "LDSM": 1, "IMMA": 1,
                              "BAR": 1, "BRA": 2, "EXIT": 1}


def test_sass_opcodes_keep_modifiers():
    ops = sass_opcodes(SASS)
    assert ops["HMMA.16816.F32"] == 2 and ops["IMMA.16832.S8.S8"] == 1
    assert ops["LDGSTS.E.BYPASS.128"] == 2 and ops["LDSM.16.M88.4"] == 1
    assert "LDS.U.128" not in ops


def test_sass_mix_single_lines():
    assert sass_mix("        /*0090*/                   HMMA.16816.F32 R4, R8, R12, R4 ;") == {"HMMA": 1}
    assert sass_mix("        /*0090*/  @P0 LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64] ;") == {"LDGSTS": 1}
    assert sass_mix("no SASS here /* 0x000fe40000000800 */") == {}


# -- assemble() on real ptxas ---------------------------------------------------------------

INT8_K64 = dict(precision="int8", ktile=64, mma_k=32, bm=128, bn=128, warps_m=2, warps_n=4, stages=2,
                cache_op="cg", arch="sm_90")


def test_assemble_one_kernel(need_ptxas, tmp_path):
    s = KernelSpec(**INT8_K64)
    a = assemble(render(s), s.entry, s.arch, threads=s.threads, dyn_smem=s.smem_bytes,
                 workdir=tmp_path)
    assert a.arch == "sm_90"
    assert f"Compiling entry function '{s.entry}' for 'sm_90'" in a.report
    assert a.cubin[:4] == b"\x7fELF"
    assert (tmp_path / f"{s.entry}.ptx").read_text() == render(s)
    assert (tmp_path / f"{s.entry}.sm_90.cubin").read_bytes() == a.cubin
    assert 32 < a.registers <= 255
    assert (a.spill_stores, a.spill_loads, a.stack_frame, a.static_smem, a.barriers) == (0, 0, 0, 0, 1)
    assert (a.occupancy, a.blocks_per_sm, a.occupancy_limiter) == theoretical_occupancy(
        "sm_90", 256, a.registers, 40960)
    if not disassemble(tmp_path / f"{s.entry}.sm_90.cubin"):
        assert (a.sass, a.sass_counts) == ("", {})
    else:
        # 128x128 / 2x4 warps: 4 x 4 m16n8 tiles per warp, 2 k32 MMAs per 64-deep K tile
        assert a.sass_counts["IMMA"] == 32 and a.sass_counts["LDSM"] > 0


def test_ptxas_error_shows_line_and_context(need_ptxas, tmp_path):
    s = KernelSpec(**INT8_K64)
    ptx = render(s)
    bad = ptx.replace("mma.sync.aligned", "mma.sync.bogus", 1)
    line = bad.splitlines().index(next(x for x in bad.splitlines() if "mma.sync.bogus" in x)) + 1
    with pytest.raises(PtxasError) as err:
        assemble(bad, s.entry, s.arch, threads=s.threads, dyn_smem=s.smem_bytes, workdir=tmp_path)
    msg = str(err.value)
    path = tmp_path / f"{s.entry}.ptx"
    assert f"{path}, line {line}; error" in msg
    assert "Unknown modifier '.bogus'" in msg
    assert f"PTX file: {path}" in msg
    assert f"--- PTX lines {line - 3}-{line + 3} ---" in msg
    marked = [x for x in msg.splitlines() if x.startswith(">")]
    assert marked == [f">{line:5d}  {bad.splitlines()[line - 1]}"]


def _no_ptxas(monkeypatch, tmp_path):
    empty = tmp_path / "empty_bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("PTXAS", raising=False)
    wheel = ("nvidia/cuda_nvcc/bin/ptxas", "nvidia/cu13/bin/ptxas")
    monkeypatch.setattr(sys, "path", [p for p in sys.path
                                      if not any((Path(p) / w).is_file() for w in wheel)])


def test_ptxas_missing(monkeypatch, tmp_path):
    _no_ptxas(monkeypatch, tmp_path)
    assert find_ptxas() is None
    s = KernelSpec(**INT8_K64)
    with pytest.raises(PtxasMissing) as err:
        assemble(render(s), s.entry, s.arch, threads=s.threads, dyn_smem=s.smem_bytes,
                 workdir=tmp_path / "w")
    assert str(err.value) == PTXAS_HINT
    assert "nvidia-cuda-nvcc" in str(err.value) and "PTXAS=/path/to/ptxas" in str(err.value)
    assert not (tmp_path / "w").exists()


def test_find_tool_in_a_cuda13_wheel(monkeypatch, tmp_path):
    """cuobjdump from the nvidia-cuda-cuobjdump wheel (CUDA 13 layout nvidia/cu13/bin) when PATH has none."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    wheel = tmp_path / "site" / "nvidia" / "cu13" / "bin" / "cuobjdump"
    wheel.parent.mkdir(parents=True)
    wheel.write_text("")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "site")])
    assert find_tool("cuobjdump", "cuda_cuobjdump") == str(wheel)
    assert find_tool("nvdisasm", "cuda_nvdisasm") is None


def test_disassemble_without_tools_is_empty(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(sys, "path", [])
    assert disassemble(tmp_path / "k.cubin") == ""


def test_find_ptxas_env_then_wheel(monkeypatch, tmp_path):
    _no_ptxas(monkeypatch, tmp_path)
    wheel = tmp_path / "site" / "nvidia" / "cu13" / "bin" / "ptxas"
    wheel.parent.mkdir(parents=True)
    wheel.write_text("")
    monkeypatch.setattr(sys, "path", sys.path + [str(tmp_path / "site")])
    assert find_ptxas() == str(wheel)
    monkeypatch.setenv("PTXAS", "/opt/cuda/bin/ptxas")
    assert find_ptxas() == "/opt/cuda/bin/ptxas"


# -- SASS summary ------------------------------------------------------------------------------

def _asm(sass, arch="sm_90"):
    return Assembly(arch=arch, registers=64, spill_stores=0, spill_loads=0, stack_frame=0, static_smem=0,
                    barriers=1, report="", sass=sass)


def _line(i, text, guard=""):
    return f"        /*{i * 16:04x}*/              {guard:>4} {text} ;"


# what cuobjdump shows for an int4 kernel on sm_90 (two k32 s8 MMAs and a call per emulated k64 MMA)
SASS_INT4_SM90 = "\n".join([_line(i, x) for i, x in enumerate([
    "LDSM.16.M88.4 R8, [R20]", "LDSM.16.M88.2 R12, [R21]", "LOP3.LUT R4, R8, 0xf0f0f0f, RZ, 0xc0, !PT",
    "IMMA.16832.S8.S8 R24, R4.ROW, R12.COL, R24", "IMMA.16832.S8.S8 R24, R5.ROW, R13.COL, R24",
    "CALL.REL.NOINC 0x1230", "BAR.SYNC.DEFER_BLOCKING 0x0", "LDGSTS.E.LTC128B.128 [R1], desc[UR4][R2.64]",
    "EXIT"])] + [_line(9, "LDS RZ, [RZ]", "@!PT")])
SASS_E4M3_SM90 = "\n".join(_line(i, x) for i, x in enumerate([
    "F2FP.F16.E4M3.UNPACK_B R4, R8", "F2FP.F16.E4M3.UNPACK_B R5, R9", "F2FP.F16.E4M3.UNPACK_B R6, R10",
    "HMMA.16816.F32 R24, R4, R12, R24", "HMMA.16816.F32 R28, R6, R12, R28", "STS.128 [R3], R24"]))
SASS_E4M3_SM89 = _line(0, "QMMA.16832.F32.E4M3.E4M3 R24, R4, R12, R24") + "\n" + _line(1, "LDS.U8 R4, [R2]")


def test_sass_summary_int4_emulated_on_sm90():
    s = KernelSpec("int4", 64, 64, 128, 128, 2, 4, 2, "cg", "sm_90")
    metrics, tags = sass_summary(_asm(SASS_INT4_SM90), s)
    assert metrics == {"sass_HMMA": 0, "sass_IMMA": 2, "sass_QMMA": 0, "sass_HGMMA": 0, "sass_LDSM": 2,
                       "sass_LDGSTS": 1, "sass_LDS": 0, "sass_STS": 0, "sass_CALL": 1, "sass_BAR": 1,
                       "sass_F2FP": 0, "sass_instructions": 9}
    assert set(metrics) == {f"sass_{op}" for op in SASS_OPS} | {"sass_instructions"}
    assert tags == {"mma_native": "false",
                    "mma_native_reason": "no IMMA.*.S4 in the SASS for mma.sync .s4 on sm_90: ptxas "
                                         "emulates it with 2 x IMMA.16832.S8.S8, 1 x CALL"}


def test_sass_summary_fp8_converted_on_sm90_native_on_sm89():
    s90 = KernelSpec("fp8_e4m3", 64, 32, 128, 128, 2, 4, 2, "cg", "sm_90")
    metrics, tags = sass_summary(_asm(SASS_E4M3_SM90), s90)
    assert (metrics["sass_F2FP"], metrics["sass_HMMA"], metrics["sass_QMMA"], metrics["sass_STS"]) == (3, 2, 0, 1)
    assert tags["mma_native"] == "false"
    assert tags["mma_native_reason"] == ("no QMMA.*.E4M3 in the SASS for mma.sync .e4m3 on sm_90: ptxas "
                                         "emulates it with 2 x HMMA.16816.F32, 3 x F2FP conversions")
    s89 = KernelSpec("fp8_e4m3", 64, 32, 128, 128, 2, 4, 2, "cg", "sm_89")
    metrics, tags = sass_summary(_asm(SASS_E4M3_SM89, "sm_89"), s89)
    assert (metrics["sass_QMMA"], metrics["sass_LDS"]) == (1, 1)
    assert tags == {"mma_native": "true", "mma_native_reason":
                    "1 x QMMA.16832.F32.E4M3.E4M3: mma.sync .e4m3 runs on the tensor cores"}
    # an e5m2 kernel is not native with e4m3 QMMAs, an fp16 kernel not with bf16 HMMAs
    s5 = KernelSpec("fp8_e5m2", 64, 32, 128, 128, 2, 4, 2, "cg", "sm_89")
    assert sass_summary(_asm(SASS_E4M3_SM89, "sm_89"), s5)[1]["mma_native"] == "false"
    bf = _line(0, "HMMA.16816.F32.BF16 R4, R8, R12, R4")
    f16 = KernelSpec("fp16", 32, 16, 128, 128, 2, 4, 2, "cg", "sm_90")
    b16 = KernelSpec("bf16", 32, 16, 128, 128, 2, 4, 2, "cg", "sm_90")
    assert sass_summary(_asm(bf), f16)[1]["mma_native"] == "false"
    assert sass_summary(_asm(bf), b16)[1]["mma_native"] == "true"
    # a warpgroup MMA (wgmma on sm_90a) is named as such, not as mma.sync
    hg = _line(0, "HGMMA.64x256x16.F32 R24, gdesc[UR4], RZ, !UPT")
    assert sass_summary(_asm(hg, "sm_90a"), f16)[1] == {
        "mma_native": "true", "mma_native_reason": "1 x HGMMA.64x256x16.F32: wgmma .f16 runs on the tensor cores"}


def test_sass_summary_without_sass_is_missing_not_zero():
    s = KernelSpec("int8", 64, 32, 128, 128, 2, 4, 2, "cg", "sm_90")
    assert sass_summary(_asm(""), s) == ({}, {"mma_native": "unknown", "mma_native_reason":
                                               "no SASS: cuobjdump or nvdisasm was not found"})


@pytest.mark.parametrize("precision, ktile, mma_k, arch, native", [
    ("int4", 64, 64, "sm_89", "true"), ("int4", 64, 64, "sm_90", "false"),
    ("fp8_e4m3", 64, 32, "sm_89", "true"), ("fp8_e5m2", 64, 32, "sm_90", "false"),
    ("fp8_e4m3", 64, 32, "sm_120", "true"), ("int8", 64, 32, "sm_120", "true"),
])
def test_sass_summary_on_real_sass(need_ptxas, tmp_path, precision, ktile, mma_k, arch, native):
    """With cuobjdump or nvdisasm (toolkit, or the nvidia-cuda-cuobjdump wheel) the real SASS says
    which MMA ptxas emitted."""
    s = KernelSpec(precision, ktile, mma_k, 64, 64, 2, 2, 2, "cg", arch)
    a = assemble(render(s), s.entry, arch, threads=s.threads, dyn_smem=s.smem_bytes, workdir=tmp_path)
    if not a.sass:
        pytest.skip("neither cuobjdump nor nvdisasm found (pip install nvidia-cuda-cuobjdump)")
    metrics, tags = sass_summary(a, s)
    assert tags["mma_native"] == native, tags
    # 64x64 / 2x2 warps: 2 x 4 m16n8 tiles per warp and K chunk
    n_chunks = s.row_bytes // 32
    if native == "true":
        mma = "QMMA" if precision.startswith("fp8") else "IMMA"
        assert metrics[f"sass_{mma}"] == 8 * n_chunks * (32 // s.mma_k_bytes)    # the loop body, once
    assert metrics["sass_BAR"] >= 1 and metrics["sass_LDGSTS"] > 0 and metrics["sass_LDSM"] > 0


# -- L2 cache hints: the policy is a 64-bit memory descriptor in an aligned uniform register pair ---

# nvdisasm of the kernel that raised cudaErrorIllegalInstruction on an H200 (bf16, 64x64, 3 stages,
# cp.async.cg with evict_first for A and evict_last for B, ptxas 13.0): the prologue's copies name an
# aligned pair, the main loop's an odd register ptxas never set
FAULTING_SASS = """\
        /*09f0*/                   LDGSTS.E.BYPASS.LTC128B.128 [R75], desc[UR20][R52.64] ;
        /*0a50*/                   LDGSTS.E.BYPASS.LTC128B.128 [R75+0x1400], desc[UR18][R46.64] ;
        /*0fe0*/              @!P0 LDGSTS.E.BYPASS.LTC128B.128 [R75+UR0], desc[UR1][R62.64] ;
        /*1000*/              @!P0 LDGSTS.E.BYPASS.LTC128B.128 [R75+UR0+0xa00], desc[UR1][R2.64] ;
        /*1100*/                   LDG.E.128 R4, desc[UR14][R2.64] ;
"""


def test_misaligned_descriptors_names_the_faulting_lines():
    bad = misaligned_descriptors(FAULTING_SASS)
    assert [ln.split("*/")[0] for ln in bad] == ["/*0fe0", "/*1000"]
    assert misaligned_descriptors("LDG.E R4, desc[UR10][R2.64] ;\nLDG.E R5, desc[UR16][R2.64] ;") == []
    assert misaligned_descriptors("LDG.E R4, desc[UR11][R2.64] ;") != []


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_l2_hint_kernels_keep_aligned_descriptors(need_ptxas, tmp_path, arch):
    """Every L2 eviction priority, on A, on B and on both, through 1..4 stages and two block tiles,
    assembles into SASS whose cache-policy descriptors sit in aligned register pairs (the template
    keeps the refill address per thread; the kernel above was the 3-stage one)."""
    specs = []
    for (ha, hb), stages, (bm, bn, wm, wn), prec in itertools.product(
            [("evict_first", "evict_last"), ("none", "evict_normal"), ("evict_last", "none")],
            (1, 2, 3, 4), [(64, 64, 2, 2), (128, 256, 2, 4)], ("bf16", "int8")):
        ktile, mma_k = (32, 16) if prec == "bf16" else (64, 32)
        specs.append(KernelSpec(prec, ktile, mma_k, bm, bn, wm, wn, stages, "cg", arch,
                                l2_hint_a=ha, l2_hint_b=hb))
    path = tmp_path / "hints.ptx"
    path.write_text(_module([render(s) for s in specs]))
    _ptxas(find_ptxas(), arch, path)
    sass = disassemble(str(path) + ".cubin")
    if not sass:
        pytest.skip("neither cuobjdump nor nvdisasm found (pip install nvidia-cuda-cuobjdump)")
    assert sass.count("LDGSTS") >= 48 * 2 and "desc[UR" in sass
    assert misaligned_descriptors(sass) == []


# -- a covering subset of the whole space assembles ------------------------------------------------

ARCHS_TESTED = ("sm_80", "sm_89", "sm_90", "sm_120")


def _module(texts):
    """One PTX module of many kernels (their PTX texts) that share .version/.target: the header once,
    then each entry."""
    head = texts[0][texts[0].index(".version"):texts[0].index(".visible .entry")]
    return head + "\n".join(x[x.index(".visible .entry"):] for x in texts)


def _ptxas(ptxas, arch, path):
    proc = subprocess.run([ptxas, f"-arch={arch}", "-v", str(path), "-o", str(path) + ".cubin"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def covered(request, tmp_path_factory):
    """The space of ARCHS_TESTED, its covering subset and {(entry, arch): parsed ptxas -v report}.
    Reports are cached by sha256(ptxas version, arch, PTX) in the pytest cache (.pytest_cache/d/);
    the rest is assembled in modules of up to 40 kernels, 2 ptxas processes at a time."""
    ptxas = find_ptxas()
    if ptxas is None:
        pytest.skip("ptxas not found (CUDA toolkit or pip install nvidia-cuda-nvcc)")
    t0 = time.perf_counter()
    sp = space(ARCHS_TESTED)
    specs = covering_subset(sp)
    version = subprocess.run([ptxas, "--version"], capture_output=True, text=True).stdout.strip()
    cache_plugin = getattr(request.config, "cache", None)    # absent with -p no:cacheprovider
    cache = (Path(cache_plugin.mkdir("ptxas_space")) if cache_plugin is not None
             else tmp_path_factory.mktemp("ptxas_space"))
    reports, todo = {}, defaultdict(list)
    ptx = {s: render(s) for s in specs}
    for s in specs:
        key = hashlib.sha256(f"{version}\n{s.arch}\n{ptx[s]}".encode()).hexdigest()
        hit = cache / f"{key}.json"
        if hit.is_file():
            reports[(s.entry, s.arch)] = json.loads(hit.read_text())
        else:
            todo[(s.arch, s.ptx_version)].append((s, hit))
    jobs = [(arch, group[i::-(-len(group) // 40)]) for (arch, _), group in todo.items()
            for i in range(-(-len(group) // 40))]
    tmp = tmp_path_factory.mktemp("space")
    with ThreadPoolExecutor(2) as pool:
        futures = []
        for n, (arch, part) in enumerate(jobs):
            path = tmp / f"{arch}_{n}.ptx"
            path.write_text(_module([ptx[s] for s, _ in part]))
            futures.append((part, pool.submit(_ptxas, ptxas, arch, path)))
        for part, fut in futures:
            text = fut.result()
            for s, hit in part:
                assert f"Compiling entry function '{s.entry}' for '{s.arch}'" in text
                reports[(s.entry, s.arch)] = parse_ptxas_report(text, s.entry)
                hit.write_text(json.dumps(reports[(s.entry, s.arch)]))
    n_new = sum(len(p) for _, p in jobs)
    print(f"\nassembled {len(reports)} kernels ({n_new} by ptxas, {len(reports) - n_new} from the cache) "
          f"in {time.perf_counter() - t0:.1f} s")
    for arch, c in sp.counts.items():
        bad = ", ".join(f"{k} {v}" for k, v in sorted(c.items()) if k != "valid")
        print(f"  {arch}: {c['valid']} valid points; invalid by first failing rule: {bad}")
    return sp, specs, reports


def test_covering_subset_assembles(covered):
    """The whole valid space of sm_80, sm_89, sm_90 and sm_120 (tile presets of conf/tile/, stages
    1..65, tile.group_m 1 and 8) is enumerated by experiments.families.mma_sync.spec.space(); assembled
    is the covering subset of experiments.families.mma_sync.cover: every pair of values of two
    kernel-shaping axes (arch, precision, acc, ktile, mma, b_layout, tile, loader.a, loader.b,
    smem_layout) that occurs in a valid point, each of their values with every stage class it allows
    (1 to 4, the powers of two and the largest count), and for every (precision, arch) every value of
    every axis, cache.op / L2 hints / group_m included, and every stage class.
    Every chosen kernel assembles, with 1 barrier, no static shared memory and <= 255 registers."""
    sp, specs, reports = covered
    assert len(reports) == len({(s.entry, s.arch) for s in specs}) == len(specs)
    for s in specs:
        r = reports[(s.entry, s.arch)]
        assert 16 <= r["registers"] <= 255, (s.entry, r)
        assert r["barriers"] == 1 and r["static_smem"] == 0, (s.entry, r)
        if r["spill_stores"] or r["spill_loads"]:
            assert r["stack_frame"] > 0, (s.entry, r)     # spilled values live in the stack frame


def test_covering_subset_meets_every_requirement(covered):
    """What the docstring above claims, checked from the chosen kernels themselves."""
    sp, specs, _ = covered
    shaping = [a for a in sp.axes if a.shaping]
    index = {a.key: {v: i for i, v in enumerate(a.values)} for a in sp.axes}
    met, per_pa = set(), defaultdict(lambda: defaultdict(set))
    for s in specs:
        vals = []
        for i, ax in enumerate(shaping):
            v = tuple(getattr(s, f) for f in ax.attrs)
            vals.append((i, v[0] if ax.key == "pipeline.stages" else index[ax.key][v]))
        met |= set(itertools.combinations(vals, 2))
        met |= {("pa", vals[0][1], vals[1][1], v) for v in vals}
        for ax in sp.axes:
            if not ax.shaping:
                per_pa[(s.precision, s.arch)][ax.key].add(tuple(getattr(s, f) for f in ax.attrs))
    missing = requirements(sp) - met
    assert not missing, sorted(missing)[:5]
    for (prec, arch), got in per_pa.items():
        for ax in sp.axes:
            if not ax.shaping:
                assert got[ax.key] == set(ax.values), (prec, arch, ax.key)
    assert {(s.precision, s.arch) for s in specs} == {
        (p, a) for a in ARCHS_TESTED for p in ("fp16", "bf16", "int8", "int4", "fp8_e4m3", "fp8_e5m2")
        if not (p.startswith("fp8") and a == "sm_80")}


def test_covering_subset_reaches_the_stage_limits(covered):
    """Per (precision, arch) the largest stage count the space allows is assembled, e.g. 65 for
    int4/int8 with 16-byte rows everywhere (the wait_group limit) and fewer for 16-bit types on sm_89."""
    sp, specs, _ = covered
    most = Counter()
    for s in specs:
        most[(s.precision, s.arch)] = max(most[(s.precision, s.arch)], s.stages)
    assert most[("int4", "sm_89")] == most[("int8", "sm_120")] == most[("int4", "sm_90")] == 65
    # fp16: the smallest stage is the study tile 32x64 with ktile 16 and swizzled (unpadded) rows: 32
    # rows of A and 64 of B, 32 bytes each = 3072 B -> 33 stages on sm_89 (padded, B stored K x N:
    # 32 x (32 + 16) + 16 x (128 + 16) = 3840 B -> 26)
    assert most[("fp16", "sm_89")] == 101376 // ((32 + 64) * 32) == 33
    assert most[("fp16", "sm_90")] == min(65, 232448 // 3072) == 65


@pytest.mark.parametrize("arch", ARCHS_TESTED)
def test_spills_stay_small(covered, arch):
    """Warp tiles of 64 x 64 (the default 256x128 and 128x256, 128x128_w2x2) keep their accumulators
    and two fragment sets in registers for int8/fp16/bf16, but where ptxas for sm_80 holds a one-stage
    kernel to 128 registers (seen: fp16, f16 accumulation, m16n8k8, 128x128_w2x2: 20 bytes; with 2
    stages it takes 134 registers and spills nothing); other kernels may spill a little (512-thread
    blocks are capped at 128 registers, emulated fp8/int4 MMAs need extra registers)."""
    _, specs, reports = covered
    spilled = {s: reports[(s.entry, arch)] for s in specs if s.arch == arch
               and reports[(s.entry, arch)]["spill_stores"]}
    wide = {s.entry: r for s, r in spilled.items() if s.warp_tile == (64, 64) and s.precision in ("int8", "fp16", "bf16")
            and not (arch == "sm_80" and s.stages == 1 and r["registers"] == 128 and r["spill_stores"] <= 64)}
    assert wide == {}
    # the most seen: 560 bytes, int4 with bk128, manual loaders and B stored K x N in a 256-thread block
    # on sm_89 (gemm_int4_bk128_m16n8k64_ldmanman_ca_l2nx_pf128B_brow_s4_128x128_w2x4_g8)
    most = max(spilled.items(), key=lambda sr: sr[1]["spill_stores"], default=(None, {"spill_stores": 0}))
    assert most[1]["spill_stores"] <= 640, (most[0].entry, most[1])


def test_parse_report_matches_the_whole_entry_name():
    """An entry whose name is a prefix of another's gets its own figures, in either order."""
    long_first = """\
ptxas info    : Compiling entry function 'k_long' for 'sm_90'
ptxas info    : Function properties for k_long
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers
ptxas info    : Compiling entry function 'k' for 'sm_90'
ptxas info    : Function properties for k
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 0 barriers
"""
    assert parse_ptxas_report(long_first, "k")["registers"] == 12
    assert parse_ptxas_report(long_first, "k_long")["registers"] == 40


def test_occupancy_counts_registers_per_sm_subpartition():
    # 1 warp at 104 regs: 3328 registers per warp; 16384 per sub-partition hold 4 warps -> 16 blocks
    # (the whole-SM count 65536 // 3328 = 19 would overstate it)
    assert theoretical_occupancy("sm_90", 32, 104, 0) == (0.25, 16, "registers")
