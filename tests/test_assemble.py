"""experiments/assemble.py: ptxas report parsing, occupancy, SASS mix, errors, and every kernel of
the config space assembled by ptxas for sm_80, sm_89 and sm_90."""
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from experiments import assemble as asm_mod
from experiments.assemble import (PTXAS_HINT, PtxasError, PtxasMissing, assemble, find_ptxas,
                                  parse_ptxas_report, sass_mix, theoretical_occupancy)
from experiments.render import render
from experiments.spec import PRECISIONS, KernelSpec, SpecError, valid_ktiles

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
    assert sass_mix(SASS) == {"LDC": 1, "S2R": 1, "HMMA": 2, "LDGSTS": 2, "LDSM": 1, "IMMA": 1,
                              "BAR": 1, "LDS": 1, "BRA": 2, "EXIT": 1}


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
    if asm_mod.shutil.which("cuobjdump") is None:
        assert (a.sass, a.sass_counts) == ("", {})
    else:
        assert a.sass_counts["IMMA"] > 0 and a.sass_counts["LDSM"] > 0


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


def test_find_ptxas_env_then_wheel(monkeypatch, tmp_path):
    _no_ptxas(monkeypatch, tmp_path)
    wheel = tmp_path / "site" / "nvidia" / "cu13" / "bin" / "ptxas"
    wheel.parent.mkdir(parents=True)
    wheel.write_text("")
    monkeypatch.setattr(sys, "path", sys.path + [str(tmp_path / "site")])
    assert find_ptxas() == str(wheel)
    monkeypatch.setenv("PTXAS", "/opt/cuda/bin/ptxas")
    assert find_ptxas() == "/opt/cuda/bin/ptxas"


# -- every kernel of the config space assembles ---------------------------------------------------

# conf/tile/<name>.yaml -> (BM, BN, warps along M, warps along N)
TILE_PRESETS = {
    "128x128": (128, 128, 2, 4),
    "64x64": (64, 64, 2, 2),
    "128x256": (128, 256, 2, 4),
    "256x128": (256, 128, 4, 2),
    "128x128_w2x2": (128, 128, 2, 2),
    "128x256_w4x4": (128, 256, 4, 4),
    "256x128_w4x4": (256, 128, 4, 4),
}
ARCHS_TESTED = ("sm_80", "sm_89", "sm_90")

# (precision, ktile, mma) triples: fp16 4 ktiles x 2 shapes = 8, bf16 8, int8 16 -> k16 and
# 32/64/128 -> k16, k32 = 7, int4 32 -> k32 and 64/128 -> k32, k64 = 5: 28. x 7 tiles x 4 stages
# x 2 cache ops = 1568 specs per arch. Only shared memory rejects any: stages x (BM + BN) x pitch
# with pitch 272 (16-bit ktile 128: 4 triples), 144 (16-bit ktile 64 and int8 ktile 128: 6),
# 80 (16-bit ktile 32, int8 ktile 64, int4 ktile 128: 8); BM + BN is 256 (2 presets), 128 (1) or
# 384 (4 presets). Rejected (stages over the limit per preset, x presets x 2 cache ops x triples):
#   sm_90 (232448 B): 272: 256 -> s4, 384 -> s3, s4: (2*1 + 4*2) * 2 * 4 = 80
#   sm_89 (101376 B): 272: 256 -> s2-4, 128 -> s3-4, 384 -> s1-4: (2*3 + 2 + 4*4) * 2 * 4 = 192;
#                     144: 256 -> s3-4, 384 -> s2-4: (2*2 + 4*3) * 2 * 6 = 192;
#                     80: 384 -> s4: 4 * 2 * 8 = 64; total 448
#   sm_80 (166912 B): 272: 256 -> s3-4, 384 -> s2-4: (2*2 + 4*3) * 2 * 4 = 128;
#                     144: 384 -> s4: 4 * 2 * 6 = 48; total 176
SPACE_SIZE = 1568
VALID_SPECS = {"sm_80": 1568 - 176, "sm_89": 1568 - 448, "sm_90": 1568 - 80}

# Block rasterization off (group_m=1 takes the other branch of the template): every triple with
# tile 64x64, 1 stage, cache ca; 64x64 fits every arch: 28 more per arch.
ROW_MAJOR_SPECS = 28



def _space(arch):
    """(specs, number rejected with SpecError, row-major specs) for one arch: the whole axis
    product with the default group_m, then the row-major (group_m=1) set."""
    specs, rejected = [], 0
    for prec, p in PRECISIONS.items():
        for ktile in valid_ktiles(p):
            for mma_k in p.mma_k:
                if ktile % mma_k:
                    continue
                for bm, bn, wm, wn in TILE_PRESETS.values():
                    for stages in range(1, 5):
                        for cache in ("ca", "cg"):
                            try:
                                specs.append(KernelSpec(prec, ktile, mma_k, bm, bn, wm, wn, stages,
                                                        cache, arch))
                            except SpecError as exc:
                                assert "bytes of shared memory per block" in str(exc)
                                rejected += 1
    row_major = [KernelSpec(prec, ktile, mma_k, 64, 64, 2, 2, 1, "ca", arch, group_m=1)
                 for prec, p in PRECISIONS.items() for ktile in valid_ktiles(p)
                 for mma_k in p.mma_k if ktile % mma_k == 0]
    return specs, rejected, row_major


def _module(texts):
    """One PTX module of many kernels: the shared header once, then each entry."""
    header = None
    bodies = []
    for text in texts:
        start = text.index(".visible .entry")
        head = text[text.index(".version"):start]
        if header is None:
            header = head
        assert head == header
        bodies.append(text[start:])
    return header + "\n".join(bodies)


def _ptxas(ptxas, arch, path):
    t0 = time.perf_counter()
    proc = subprocess.run([ptxas, f"-arch={arch}", "-v", str(path), "-o", str(path) + ".cubin"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr, time.perf_counter() - t0


@pytest.fixture(scope="module")
def space_reports(tmp_path_factory):
    """Assemble every spec of every arch: 4 modules per arch, 2 ptxas processes at a time.
    Returns {arch: (specs, rejected, row_major, {entry: parsed report}, chunk reports)}."""
    ptxas = find_ptxas()
    if ptxas is None:
        pytest.skip("ptxas not found (CUDA toolkit or pip install nvidia-cuda-nvcc)")
    tmp = tmp_path_factory.mktemp("space")
    t0 = time.perf_counter()
    out = {}
    with ThreadPoolExecutor(2) as pool:
        futures = []
        for arch in ("sm_90", "sm_80", "sm_89"):     # the largest modules first
            specs, rejected, row_major = _space(arch)
            out[arch] = (specs, rejected, row_major, {}, [])
            every = specs + row_major
            for i in range(4):
                part = every[i::4]
                path = tmp / f"{arch}_{i}.ptx"
                path.write_text(_module(render(s) for s in part))
                futures.append((arch, part, pool.submit(_ptxas, ptxas, arch, path)))
        for arch, part, fut in futures:
            report, _ = fut.result()
            out[arch][4].append(report)
            for s in part:
                out[arch][3][s.entry] = parse_ptxas_report(report, s.entry)
    print(f"\nassembled {sum(len(v[3]) for v in out.values())} kernels in "
          f"{time.perf_counter() - t0:.1f} s")
    return out


def test_tile_presets_match_conf():
    found = {}
    for path in sorted((ROOT / "conf" / "tile").glob("*.yaml")):
        c = OmegaConf.load(path)
        found[path.stem] = (*c.block, *c.warps)
    assert found == TILE_PRESETS


@pytest.mark.parametrize("arch", ARCHS_TESTED)
def test_space_size(arch):
    specs, rejected, row_major = _space(arch)
    assert len(specs) + rejected == SPACE_SIZE
    assert len(specs) == VALID_SPECS[arch]
    assert len(row_major) == ROW_MAJOR_SPECS
    assert len({s.entry for s in specs + row_major}) == VALID_SPECS[arch] + ROW_MAJOR_SPECS


@pytest.mark.parametrize("arch", ARCHS_TESTED)
def test_every_kernel_assembles(space_reports, arch):
    specs, rejected, row_major, parsed, reports = space_reports[arch]
    every = specs + row_major
    assert len(parsed) == len(every) == VALID_SPECS[arch] + ROW_MAJOR_SPECS
    compiled = [e for r in reports for e in re.findall(r"Compiling entry function '(\w+)' for '(\w+)'", r)]
    assert sorted(compiled) == sorted((s.entry, arch) for s in every)
    for s in every:
        r = parsed[s.entry]
        assert 16 <= r["registers"] <= 255, (s.entry, r)
        assert r["barriers"] == 1 and r["static_smem"] == 0, (s.entry, r)
        if r["spill_stores"] or r["spill_loads"]:
            assert r["stack_frame"] > 0, (s.entry, r)     # spilled values live in the stack frame


def _spilled(parsed):
    return {e: r for e, r in parsed.items() if r["spill_stores"] or r["spill_loads"]}


@pytest.mark.parametrize("arch", ARCHS_TESTED)
def test_no_spills_with_64x64_warp_tiles(space_reports, arch):
    """The presets with 64 x 64 warp tiles (the default 256x128, 128x256, 128x128_w2x2) keep their
    128 accumulators and two fragment sets in registers for every precision, ktile and stage count."""
    spilled = _spilled(space_reports[arch][3])
    wide = [e for e in spilled if any(t in e for t in ("_256x128_w4x2_", "_128x256_w2x4_", "_128x128_w2x2_"))]
    assert wide == []


@pytest.mark.parametrize("arch", ARCHS_TESTED)
def test_spills_elsewhere_stay_small(space_reports, arch):
    """Other presets may spill a little (512-thread blocks are capped at 128 registers)."""
    worst = max((r["spill_stores"] for r in _spilled(space_reports[arch][3]).values()), default=0)
    assert worst <= 256


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
