"""experiments/ncu/__init__.py and ncu_text.py: ncu CSV pages and text reports parsed to the values the files
hold; the canonical metric table checked against `ncu --query-metrics` output of each chip."""
import re
from decimal import Decimal
from pathlib import Path

import pytest

from experiments import ncu
from experiments.ncu.text import parse_text_report, program_info

DATA = Path(__file__).resolve().parent / "data" / "ncu"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "reference"
TABLE = ncu.load_table()
DEFAULT = ncu.load_set("default", TABLE)


def parse(name):
    return ncu.parse_csv((DATA / name).read_text())


# -- raw page ------------------------------------------------------------------------------------

def test_raw_page_many_kernels_cpp_names_separators():
    rep = parse("h200_raw_metrics.csv")
    assert [la.id for la in rep.launches] == list(range(13))
    # ncu's lines and the program's own output before the header
    assert rep.preamble[0].startswith("==WARNING== Note: Running with unmodified GPU clocks")
    assert "ok 256.3832092285156 0.0" in rep.preamble
    assert rep.units[rep.header.index("gpu__time_duration.sum")] == "ns"
    first, naive, last = rep.launches[0], rep.launches[5], rep.launches[12]
    assert first.kernel == ("void generate_seed_pseudo<rng_config<curandStateXORWOW, 101>>(unsigned long long, "
                            "unsigned long long, unsigned long long, curandOrdering, curandStateXORWOW *, "
                            "unsigned int *)")
    assert first.number("dram__cycles_active.sum") == 1128.0            # "1,128"
    assert first.number("dram__cycles_active.avg") == 23.5
    assert first.number("gpu__time_duration.sum") == 181216.0           # "181,216"
    assert naive.kernel == "naive_gemm" and naive.grid == (64, 64, 1) and naive.block == (16, 16, 1)
    assert naive.number("gpu__time_duration.sum") == 417664.0
    assert naive.number("dram__cycles_active.avg") == 5465.17
    assert naive.number("l1tex__t_sector_hit_rate.pct") == 87.73
    assert naive.cc == "9.0" and naive.stream == "7"
    assert rep.launches[2].number("dram__cycles_active.avg") == 2732.67   # "2,732.67"
    assert rep.launches[6].number("dram__cycles_active.avg") == 157180.83
    assert last.function == ("void cub::DeviceReduceSingleTileKernel<cub::policy_hub<float, unsigned int, "
                             "nan_handling_max<float>>::Policy1000, float *, float *, int, nan_handling_max<float>, "
                             "float, float, cuda::identity>")


def test_raw_page_values_above_100_percent():
    rep = parse("h200_raw_metrics.csv")
    over = {(la.id, name): la.number(name) for la in rep.launches for name in la.values
            if la.units.get(name) == "%" and la.values[name] and la.number(name) > 100}
    assert over == {(6, "lts__t_sector_hit_rate.pct"): 100.27,
                    (12, "sm__warps_active.max.pct_of_peak_sustained_active"): 1408.70}


def test_two_launches_of_one_kernel():
    rep = parse("h200_raw_two_launches.csv")
    assert [(la.id, la.kernel) for la in rep.launches] == [(0, "dbl"), (1, "dbl")]
    assert [la.number("gpu__time_duration.sum") for la in rep.launches] == [82016.0, 81440.0]
    assert [la.number("dram__cycles_active.avg") for la in rep.launches] == [75278.33, 74040.83]
    # asking for .avg also returns .min/.max/.sum
    assert [la.number("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum") for la in rep.launches] == [2097152.0] * 2


def test_tensor_pipe_counter_without_hfma2():
    rep = parse("h200_raw_tensor_metrics_cublas_bf16.csv")
    plain = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
    excl = "sm__pipe_tensor_op_hmma_type_hmma_hgmma_qgmma_cycles_active.avg.pct_of_peak_sustained_active"
    rng, gemm = rep.launches[0], rep.launches[2]
    assert rng.number(plain) == 1.32 and rng.number(excl) == 0.0      # HFMA2.MMA of an RNG kernel
    assert gemm.kernel == "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
    assert [la.number(excl) for la in rep.launches[2:]] == [94.88, 94.93, 95.01]
    assert TABLE.metrics["tensor_hmma_active_pct"].ncu_name("sm_90") == excl


def test_set_full_row_into_canonical_metrics():
    rep = parse("h200_raw_set_full.csv")
    assert len(rep.launches) == 1 and rep.launches[0].kernel == "naive_gemm"
    la = rep.launches[0]
    assert la.number("LTS.TriageCompute.lts__average_t_sector_hit_rate_realtime.pct") is None   # empty
    assert la.number("TPC.TriageCompute.sm__cycles_active.avg") == 790437.83
    assert la.number("derived__pct_occupancy_per_block_size") == 5706.0                         # "5,706"
    assert la.number("derived__l1tex__lsu_writeback_bytes_mem_lgds.sum.per_second") == 20741337634408.60
    with pytest.raises(ValueError, match="not a number: 'CachePreferNone'"):
        la.number("launch__func_cache_config")
    got, missing = ncu.canonical(la, DEFAULT.metrics, "sm_90")
    assert got["ncu.duration_us"] == 416.64                      # 416,640 ns
    assert got["ncu.achieved_occupancy_pct"] == 91.77
    assert got["ncu.theoretical_occupancy_pct"] == 100.0
    assert got["ncu.dram_cycles_active"] == 5466.67
    assert got["ncu.dram_active_pct"] == 0.42
    assert got["ncu.dram_bytes_per_s"] == 20153609831.03
    assert got["ncu.l1_hit_rate_pct"] == 87.60 and got["ncu.l2_hit_rate_pct"] == 97.89
    assert got["ncu.sm_clock_hz"] == 1960107083.22 and got["ncu.dram_clock_hz"] == 3199436763.95
    assert got["ncu.inst_executed"] == 154632192.0 and got["ncu.ipc"] == 1.48
    assert got["ncu.occupancy_limit_registers"] == 8.0 and got["ncu.occupancy_limit_warps"] == 8.0
    assert got["ncu.smem_wavefronts"] == 65536.0 and got["ncu.smem_bank_conflicts"] == 0.0
    assert got["ncu.smem_pipe_pct"] == 0.06
    assert got["ncu.stall_long_scoreboard"] == 13.92 and got["ncu.stall_lg_throttle"] == 14.37
    assert got["ncu.warp_cycles_per_issued_inst"] == 39.63
    # what the run did not request is missing, never 0
    assert missing == {k: f"{TABLE.metrics[k[4:]].ncu_name('sm_90')}: not returned" for k in (
        "ncu.dram_bytes", "ncu.global_load_sectors_per_request", "ncu.global_store_sectors_per_request",
        "ncu.tensor_pipe_active_pct", "ncu.tensor_hmma_active_pct", "ncu.l2_throughput_pct")}
    assert not set(missing) & set(got)
    assert len(got) + len(missing) == len(DEFAULT.metrics)


def test_na_is_missing_not_zero():
    text = (DATA / "h200_raw_two_launches.csv").read_text().replace('"82,016"', '"n/a"')
    la = ncu.parse_csv(text).launches[0]
    got, missing = ncu.canonical(la, DEFAULT.metrics, "sm_90")
    assert "ncu.duration_us" not in got
    assert missing["ncu.duration_us"] == "gpu__time_duration.sum: n/a"
    assert got["ncu.dram_cycles_active"] == 75278.33


def test_details_page():
    rep = parse("h200_details_name_base.csv")
    (la,) = rep.launches
    assert la.kernel == "dbl" and la.grid == (131072, 1, 1)
    assert len(la.values) == 10                                    # the rule row is not a metric
    assert la.values["gpu__time_duration.sum"] == "81,248" and la.units["gpu__time_duration.sum"] == "ns"
    assert la.number("dram__cycles_elapsed.avg.per_second") == 3198109491.93
    assert la.labels[("GPU Speed Of Light Throughput", "sm__cycles_active.avg")] == ("156,088.89", "cycle")
    got, _ = ncu.canonical(la, DEFAULT.metrics, "sm_90")
    assert got == {"ncu.duration_us": 81.248, "ncu.elapsed_cycles": 160788.0, "ncu.dram_clock_hz": 3198109491.93,
                   "ncu.sm_throughput_pct": 27.87, "ncu.memory_throughput_pct": 29.65,
                   "ncu.dram_throughput_pct": 29.65, "ncu.l2_throughput_pct": 40.53}


@pytest.mark.skipif(not (SHARED / "h200").is_dir(), reason="shared/reference/h200 not present")
@pytest.mark.parametrize("name", ["raw_metrics", "raw_two_launches", "raw_tensor_metrics_cublas_bf16",
                                  "raw_set_full", "details_name_base"])
def test_trimmed_fixture_holds_the_original_values(name):
    full = ncu.parse_csv((SHARED / "h200" / f"ncu_{name}.csv").read_text())
    trimmed = parse(f"h200_{name}.csv")
    assert trimmed.preamble == full.preamble
    assert len(trimmed.launches) == len(full.launches)
    for t, f in zip(trimmed.launches, full.launches, strict=True):
        assert (t.id, t.kernel, t.grid, t.block) == (f.id, f.kernel, f.grid, f.block)
        assert t.values == {k: f.values[k] for k in t.values}
        assert t.units == {k: f.units[k] for k in t.units}


def test_csv_errors():
    with pytest.raises(ncu.NcuParseError, match="no ncu CSV header"):
        ncu.parse_csv("==PROF== Connected to process 1\nhello\n")
    text = (DATA / "h200_raw_two_launches.csv").read_text().replace('"dbl","1"', '"dbl","1","extra"', 1)
    with pytest.raises(ncu.NcuParseError, match="CSV row 1 has 51 fields, the header 50"):
        ncu.parse_csv(text)


def test_numbers_and_units():
    assert ncu.to_decimal("20,741,337,634,408.60") == Decimal("20741337634408.60")
    assert ncu.to_decimal("-1.5e3") == Decimal("-1500")
    assert ncu.to_decimal("n/a") is None and ncu.to_decimal("") is None
    for bad in ("(64, 1, 1)", "1,12", "inf"):
        with pytest.raises(ValueError):
            ncu.to_decimal(bad)
    dur, clk, mem = TABLE.metrics["duration_us"], TABLE.metrics["sm_clock_hz"], TABLE.metrics["dram_bytes_per_s"]
    assert ncu.convert(Decimal("1.65"), "s", dur) == 1650000.0
    assert ncu.convert(Decimal("1.43"), "ms", dur) == 1430.0
    assert ncu.convert(Decimal("416640"), "ns", dur) == 416.64
    assert ncu.convert(Decimal("66.08"), "usecond", dur) == 66.08
    assert ncu.convert(Decimal("805.73"), "Mhz", clk) == 805730000.0
    assert ncu.convert(Decimal("161.72"), "Gbyte/s", mem) == 161720000000.0
    assert ncu.convert(Decimal("13.92"), "inst", TABLE.metrics["stall_wait"]) == 13.92      # accepted as is
    with pytest.raises(ncu.NcuParseError, match="'cycle', which does not convert to 'us'"):
        ncu.convert(Decimal(1), "cycle", dur)


# -- the metric table ----------------------------------------------------------------------------

def test_canonical_names_are_plain_mlflow_names_with_units():
    assert {"ncu.duration_us", "ncu.achieved_occupancy_pct", "ncu.theoretical_occupancy_pct",
            "ncu.dram_cycles_active", "ncu.dram_active_pct", "ncu.dram_bytes", "ncu.l1_hit_rate_pct",
            "ncu.l2_hit_rate_pct", "ncu.tensor_pipe_active_pct", "ncu.sm_clock_hz", "ncu.ipc",
            "ncu.inst_executed", "ncu.stall_long_scoreboard", "ncu.stall_gmma"} <= {m.key for m in DEFAULT.metrics}
    for m in TABLE.metrics.values():
        assert re.fullmatch(r"ncu\.[a-z0-9_]+", m.key), m.key
        assert m.unit, m.name
    assert TABLE.metrics["duration_us"].unit == "us" and TABLE.metrics["stall_wait"].unit == "cycle/inst"


def _query(chip):
    """{base metric name: type} from trimmed `ncu --query-metrics --chips CHIP` output."""
    out = {}
    for line in (DATA / f"query_metrics_{chip}.txt").read_text().splitlines()[4:]:
        if m := re.match(r"(\S+)\s+(Counter|Ratio|Throughput)\b", line):
            out[m[1]] = m[2]
    return out


COUNTER = {line.split()[0][len("dram__cycles_active"):]
           for line in (DATA / "suffix_counter_gh100.txt").read_text().splitlines()[4:]}
SUFFIXES = {"Counter": COUNTER, "Ratio": {".pct", ".ratio", ".max_rate"},
            "Throughput": {f".{r}.pct_of_peak_sustained_{w}" for r in ("avg", "max", "min", "sum")
                           for w in ("active", "elapsed")}}


def _launch_columns():
    cols = set()
    for name in ("h200_raw_metrics.csv", "h200_raw_set_full.csv"):
        cols |= set(parse(name).header)
    return cols


@pytest.mark.parametrize("arch", sorted(TABLE.archs))
def test_every_mapped_name_exists_for_its_chip(arch):
    assert len(COUNTER) == 44 and ".avg.pct_of_peak_sustained_elapsed" in COUNTER
    known, launch_cols = _query(TABLE.archs[arch]), _launch_columns()
    checked = 0
    for m in TABLE.metrics.values():
        name = m.ncu_name(arch)
        if name is None:
            assert m.name in ("stall_gmma", "stall_imc_miss") and arch != "sm_90"
            continue
        if m.kind == "launch":      # launch statistics: not listed by --query-metrics
            assert name in launch_cols, name
            continue
        base = name.split(".")[0]
        assert base in known, f"{m.key}: {base} is not a {TABLE.archs[arch]} metric"
        assert name[len(base):] in SUFFIXES[known[base]], f"{m.key}: {name} is not a valid {known[base]} name"
        checked += 1
    assert checked == len([m for m in TABLE.metrics.values() if m.kind == "hw" and m.ncu_name(arch)])


def test_arch_aliases_and_errors():
    assert TABLE.arch("sm_90") == "sm_90" and TABLE.arch("sm_86") == "sm_80"
    with pytest.raises(ncu.NcuConfigError, match="no ncu metric names are mapped for sm_75.*mapped: sm_80, sm_89, sm_90, sm_100, sm_120"):
        TABLE.arch("sm_75")
    assert "stall_gmma" in [m.name for m in DEFAULT.metrics] and TABLE.metrics["stall_gmma"].ncu_name("sm_89") is None
    assert len(DEFAULT.ncu_names("sm_90")) == len(DEFAULT.ncu_names("sm_89")) + 1 == len(DEFAULT.ncu_names("sm_100")) + 2


def test_metric_sets(tmp_path):
    full = ncu.load_set("full", TABLE)
    assert full.section_set == "full" and len(full.metrics) == len(TABLE.metrics)
    assert DEFAULT.section_set is None
    with pytest.raises(ncu.NcuConfigError, match="metric set 'fast' not found.*valid: default, full"):
        ncu.load_set("fast", TABLE)
    bad = tmp_path / "bad.yaml"
    bad.write_text("metrics: [duration_us, achieved_occupancy]\n")
    with pytest.raises(ncu.NcuConfigError, match="metric 'achieved_occupancy' is not in metrics.yaml; valid: stalls, duration_us"):
        ncu.load_set(str(bad), TABLE)
    inline = tmp_path / "inline.yaml"
    inline.write_text("section_set: null\nmetrics:\n  - duration_us\n  - sm_active_cycles: {unit: cycle, ncu: sm__cycles_active.avg}\n")
    s = ncu.load_set(str(inline), TABLE)
    assert [m.key for m in s.metrics] == ["ncu.duration_us", "ncu.sm_active_cycles"]
    assert s.ncu_names("sm_90") == ["gpu__time_duration.sum", "sm__cycles_active.avg"]
    inline.write_text("metrics:\n  - x: {ncu: sm__cycles_active.avg}\n")
    with pytest.raises(ncu.NcuConfigError, match="metric 'x' needs `unit`"):
        ncu.load_set(str(inline), TABLE)
    # YAML that does not parse, a name where a list belongs (it was read letter by letter), an empty
    # set and the metric table itself (both were taken as every metric): one line each
    for text, why in [("metrics: [\n", "not a readable YAML metric set"),
                      ("metrics: smem_pipe_pct\n", "a metric set needs `metrics:` with `all` or a list"),
                      ("", "a metric set needs `metrics:`")]:
        bad.write_text(text)
        with pytest.raises(ncu.NcuConfigError, match=re.escape(why)):
            ncu.load_set(str(bad), TABLE)
    with pytest.raises(ncu.NcuConfigError, match="a metric set needs `metrics:`"):
        ncu.load_set(str(TABLE.path), TABLE)
    # a nested list and a list as section_set were tracebacks, a list as ncu name went to ncu as Python text
    for text, why in [("metrics: [smem_pipe_pct, [l2_throughput_pct]]\n", "metric ['l2_throughput_pct'] is "
                       "neither a name from metrics.yaml nor an inline definition"),
                      ("metrics: [smem_pipe_pct]\nsection_set: [1, 2]\n", "section_set must be an ncu section "
                       "set's name (e.g. full) or null, got [1, 2]"),
                      ("metrics: [{my: {unit: cycle, ncu: [a, b]}}]\n", "my.ncu must be a metric name, or a name "
                       "per architecture"),
                      # a misspelt key dropped the full section set
                      ("section-set: full\nmetrics: all\n", "unknown key 'section-set'; a metric set has "
                       "`metrics` and `section_set`")]:
        bad.write_text(text)
        with pytest.raises(ncu.NcuConfigError, match=re.escape(why)):
            ncu.load_set(str(bad), TABLE)
    with pytest.raises(ncu.NcuConfigError, match=re.escape(f"--set {tmp_path} is a folder")):
        ncu.load_set(str(tmp_path), TABLE)


def test_profile_output_errors():
    from experiments.ncu import launch as nl
    with pytest.raises(nl.CounterPermissionError, match="NVreg_RestrictProfilingToAdminUsers=0"):
        nl.check_profile_output("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission", "regex:^(a)$")
    with pytest.raises(nl.NoKernelsProfiled, match=r"no kernel matching -k regex:\^\(gemm_a\|gemm_b\)\$"):
        nl.check_profile_output("==WARNING== No kernels were profiled.\n", nl.kernel_filter(["gemm_b", "gemm_a"]))
    nl.check_profile_output("==PROF== Disconnected from process 1\n", "regex:^(a)$")
    out = "ncu_launch: start warmup 0\nncu_launch: done warmup 0\nncu_launch: start profile 0\n==ERROR== x\n"
    assert nl.failed_launch(out) == ("profile", 0)
    assert nl.failed_launch(out + "ncu_launch: done profile 0\n") is None


# -- text reports --------------------------------------------------------------------------------

def test_text_report_columns_by_ruler():
    rep = parse_text_report((DATA / "text_report_synthetic.txt").read_text())
    assert rep.profiled == 2 and rep.passes == 40 and len(rep.blocks) == 2
    assert program_info(rep.program) == {"verified": True, "verify_line": rep.program[0], "m": 4096,
                                         "n": 4096, "k": 4096, "batch": 2}
    a, b = rep.blocks
    assert (a.function, a.grid, a.block, a.cc, a.stream) == ("gemm_demo", (4, 4, 1), (128, 1, 1), "9.0", "13")
    assert len(a.labels) == 10 and len(b.labels) == 5       # the rule separators are no table
    assert a.labels[("GPU and Memory Workload Distribution", "Average DRAM Active Cycles")] == ("123456789012.25", "cycle")
    assert b.labels[("GPU Speed Of Light Throughput", "Function Cache Configuration")] == ("CachePreferNone", "")
    got, missing = ncu.canonical(a, TABLE.metrics.values(), None)
    assert got["ncu.duration_us"] == 5.63 and got["ncu.sm_clock_hz"] == 1755000000.0
    assert got["ncu.dram_clock_hz"] == 3200000000.0 and got["ncu.dram_throughput_pct"] == 101.5
    assert got["ncu.dram_cycles_active"] == 123456789012.25 and got["ncu.occupancy_limit_registers"] == 2.0
    assert got["ncu.achieved_occupancy_pct"] == 24.87 and got["ncu.theoretical_occupancy_pct"] == 25.0
    assert missing["ncu.l2_hit_rate_pct"] == "not in the report"
    got, missing = ncu.canonical(b, TABLE.metrics.values(), None)
    assert got["ncu.duration_us"] == 12340.0 and got["ncu.dram_cycles_active"] == 2617198477.33
    assert missing["ncu.achieved_occupancy_pct"] == "Achieved Occupancy: n/a"


def test_text_table_without_closing_ruler():
    text = (DATA / "text_report_synthetic.txt").read_text()
    cut = text.index("    Achieved Occupancy              %        24.87") + len("    Achieved Occupancy              %        24.87\n")
    with pytest.raises(ncu.NcuParseError, match="table of section 'Occupancy' ends without its ruler"):
        parse_text_report(text[:cut] + "\n" + text[cut:])


TCP = SHARED / "tensorcoreptx"
# file: [(grid, stream, rows, Duration us, Achieved Occupancy %, Average DRAM Active Cycles, L1 hit %,
#         L2 hit %, Executed Instructions)], as printed in the files (third party: read, never copied)
PUBLISHED = {
    "run1__multiple_sizes__fp16_wmma_1024.txt": [((16, 32, 4), "13", 43, 1430.0, 63.81, 687042.67, None, None, None)],
    "run1__ncu_8192__fp16_ptx_mma_ncu.txt": [
        ((8, 16, 1), "13", 80, 66.08, 35.74, 39010.67, 61.64, 91.63, 2665472.0),
        ((128, 256, 4), "17", 80, 1650000.0, 66.20, 5575423704.0, 26.57, 66.06, 36954963968.0)],
    "run2__int8_dp4a_ncu_8192.txt": [
        ((512, 512, 4), "21", 80, 2360000.0, 99.95, 5681268165.33, 49.89, 50.12, 116375158784.0)],
    "run2__int8_ptx_mma_k32_ncu_1024.txt": [
        ((8, 16, 1), "13", 80, 41.18, 35.50, 19520.0, 63.55, 93.66, 1886208.0),
        ((8, 16, 1), "17", 80, 42.18, 35.66, 19512.0, 63.53, 93.76, 1886208.0),
        ((16, 32, 4), "21", 80, 726.46, 64.27, 354272.0, 62.43, 96.23, 49053696.0)],
    "run2__int8_wmma_ncu_8192.txt": [
        ((128, 256, 4), "21", 80, 858300.0, 98.66, 2795572312.0, 33.56, 81.86, 34745614336.0)],
    "run3__int4_wmma_ncu_8192.txt": [
        ((256, 512, 4), "21", 80, 712960.0, 99.91, 39299981.33, 80.34, 99.74, 68530733056.0)],
    "run4__int4_ptx_mma_k64_x2_x2nontrans_ca_ncu_8192.txt": [
        ((8, 16, 1), "13", 80, 27.65, 34.21, 9605.33, 63.55, 92.23, 1285120.0),
        ((8, 16, 1), "17", 80, 27.71, 34.80, 9682.67, 63.78, 94.49, 1285120.0),
        ((128, 256, 4), "21", 80, 179920.0, 66.51, 38973354.67, 60.96, 99.50, 10249830400.0)],
    "run4__int4_ptx_mma_k64_x4_x2nontrans_ca_ncu_8192.txt": [
        ((8, 16, 1), "13", 80, 27.04, 34.63, 9581.33, 64.08, 93.28, 1285120.0),
        ((8, 16, 1), "17", 80, 27.01, 34.45, 9581.33, 63.72, 93.87, 1285120.0),
        ((128, 256, 4), "21", 80, 167100.0, 66.51, 38960490.67, 61.56, 99.50, 10627317760.0)],
    "run4__int4_ptx_mma_k64_x4_x2nontrans_cg_ncu_8192.txt": [
        ((8, 16, 1), "13", 80, 28.64, 34.34, 9976.0, 20.23, 96.79, 1285120.0),
        ((8, 16, 1), "17", 80, 29.12, 34.44, 9981.33, 20.48, 96.67, 1285120.0),
        ((128, 256, 4), "21", 80, 228540.0, 66.47, 38992189.33, 1.58, 99.80, 10627317760.0)],
    "run4__int4_ptx_mma_k64_x4_x2trans_ca_ncu_8192.txt": [
        ((8, 16, 1), "13", 80, 92.54, 36.45, 9648.0, 94.58, 94.62, 1997824.0),
        ((8, 16, 1), "17", 80, 92.54, 36.35, 9648.0, 94.54, 93.96, 1997824.0),
        ((128, 256, 4), "21", 80, 913710.0, 66.62, 39370360.0, 87.74, 99.85, 27211595776.0)],
}
KEYS = ("ncu.duration_us", "ncu.achieved_occupancy_pct", "ncu.dram_cycles_active", "ncu.l1_hit_rate_pct",
        "ncu.l2_hit_rate_pct", "ncu.inst_executed")


@pytest.mark.skipif(not TCP.is_dir(), reason="shared/reference/tensorcoreptx (third-party reports) not present")
@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_text_reports(name):
    rep = parse_text_report((TCP / name).read_text())
    want = PUBLISHED[name]
    assert len(rep.blocks) == len(want)
    for block, (grid, stream, rows, *values) in zip(rep.blocks, want, strict=True):
        assert (block.grid, block.stream, len(block.labels)) == (grid, stream, rows)
        got, missing = ncu.canonical(block, TABLE.metrics.values(), None)
        assert [got.get(k) for k in KEYS] == values
        assert all(k in missing for k, v in zip(KEYS, values, strict=True) if v is None)
    info = program_info(rep.program)
    assert info["batch"] == 4 and info.get("verified") is (None if "multiple_sizes" in name else "x2_x2" not in name)
