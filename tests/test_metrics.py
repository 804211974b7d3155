"""experiments/metrics.py: every metric a run logs is declared once (name, unit, description, source,
decimals), the loggers round by it, and analysis/runs.py keeps every metric a run has."""
import pytest
from test_family_runner import EXPERIMENT, _compose, _stub_gpu

from analysis.runs import load_runs
from experiments import metrics
from experiments.store import record
from experiments.runner import sweep
from experiments.store.track import Tracker

# NVML's clock and power samples of the timing (experiments.gpu.timing.clock_summary), unrounded
NVML = {"sm_clock_mhz_mean": 1834.2617, "sm_clock_mhz_min": 1800.0, "sm_clock_mhz_max": 1845.0,
        "sm_clock_samples": 40, "sm_clock_mhz_max_possible": 1980.0, "power_w_mean": 612.3456,
        "power_w_max": 650.04, "power_limit_w": 700.0}
# the peak kernel's own cycle record (experiments.families.peak.kernel_clock)
CYCLES = {"mma_per_sm_cycle": 0.5963123, "mma_per_sm_cycle_min": 0.59, "mma_per_sm_cycle_max": 0.6,
          "kernel_cycles": 1_984_000, "kernel_sms": 132, "sm_clock_mhz_kernel": 1979.64}


def test_declarations_are_complete_and_unique():
    """Each declaration has a unit, a description and a source; names are unique; every entry of the
    ncu table (conf/ncu/metrics.yaml) is declared as ncu.<name> in its unit; patterns match."""
    from experiments.ncu import load_table
    assert len({m.name for m in metrics.DECLARED}) == len(metrics.DECLARED)
    assert all(m.unit and m.description and m.source for m in metrics.table().values())
    for m in load_table().metrics.values():
        assert metrics.lookup(m.key).name == m.key and metrics.lookup(m.key).unit == m.unit
    assert metrics.lookup("speedup_vs_cublas").name == "speedup_vs_<family>"
    assert metrics.lookup("sass_HMMA").name == "sass_<op>" and metrics.lookup("sass_instructions").unit == \
        "instructions"
    assert metrics.lookup("ncu.set_of_mine").name == "ncu.<name>"
    assert metrics.undeclared(["throughput", "sm_clock_mhz_after", "speedup_wmma", "temperature_c"]) == [
        "speedup_wmma", "temperature_c"]
    assert metrics.rounded({"throughput": 612.34567, "median_us": 1.23456, "spread": 0.123456,
                            "speedup_vs_wmma": 1.234567, "registers": 168, "other": 1.23456789}) == {
        "throughput": 612.35, "median_us": 1.2346, "spread": 0.1235, "speedup_vs_wmma": 1.2346,
        "registers": 168, "other": 1.23456789}
    # what the store showed unrounded: jit_s 0.03602116800000488, ncu.dram_bytes_per_s 2124152229044.03,
    # ncu.sm_clock_hz 1801048046.13; counts of ncu stay whole numbers
    assert metrics.rounded({"jit_s": 0.03602116800000488, "ncu.dram_bytes_per_s": 2124152229044.03,
                            "ncu.sm_clock_hz": 1801048046.13, "ncu.dram_bytes": 1234567.0,
                            "ncu.achieved_occupancy_pct": 24.87123, "theoretical_occupancy_pct": 75.0,
                            "median_us": 1579.12345, "throughput": 39.123456}) == {
        "jit_s": 0.036, "ncu.dram_bytes_per_s": 2.1242e12, "ncu.sm_clock_hz": 1.801e9, "ncu.dram_bytes": 1234567.0,
        "ncu.achieved_occupancy_pct": 24.87, "theoretical_occupancy_pct": 75.0, "median_us": 1579.1,
        "throughput": 39.123}
    assert metrics.label("median_us", "median") == "median us"
    assert metrics.label("pct_of_peak", "{unit} of peak") == "% of peak"
    with pytest.raises(KeyError, match="'speedup' is not declared in experiments/metrics.py"):
        metrics.label("speedup", "x")


def test_every_metric_a_run_logs_is_declared_and_reaches_the_analysis(tmp_path, monkeypatch):
    """Runs logged through the runner with the GPU worker replaced (a peak, a dp4a baseline and an
    mma_sync kernel of int8 at 512, with NVML clock and power samples): every metric name of every run
    is declared, each value is rounded to its declared decimals, and analysis/runs.py returns
    pct_of_peak, speedup_vs_dp4a and the power metrics with the values the store holds."""
    job, store, worker = _stub_gpu(tmp_path, monkeypatch, 1000.0)
    worker.kernel_clock = {**NVML, **CYCLES}
    assert job.run_job(_compose("family=peak", "precision=int8", *store))["finished"] == 1
    worker.us, worker.kernel_clock = 100.0, dict(NVML)
    assert job.run_job(_compose("family=dp4a", "precision=int8", "problem.sizes=[512]", *store))["finished"] == 1
    worker.us = 50.0
    assert job.run_job(_compose("precision=int8", "problem.sizes=[512]", *store))["finished"] == 1
    tr = Tracker(f"sqlite:///{tmp_path}/mlflow.db", EXPERIMENT, create=False)
    runs = {r.data.params.get("family"): r for r in tr.client.search_runs([tr.experiment_id])
            if "mlflow.parentRunId" in r.data.tags}
    assert set(runs) == {"peak", "dp4a", "mma_sync"}
    for fam, run in runs.items():
        logged = run.data.metrics
        assert metrics.undeclared(logged) == [], fam
        for key, value in logged.items():
            assert value == metrics.lookup(key).round(value), (fam, key, value)
        # no metric repeats a param: the tolerance used is a tag beside the param verify.rtol
        assert "verify_rtol" not in logged and run.data.tags["verify_tolerance"] == "exact", fam
        # occupancy in % only; the axes a sweep varies are params of every family
        assert "theoretical_occupancy" not in logged and 0 < logged.get("theoretical_occupancy_pct", 1) <= 100
        assert (run.data.params["variant"], run.data.params["study_kernel"], run.data.params["size"]) == (
            "none", "none", "none" if fam == "peak" else "512"), fam
    ours = runs["mma_sync"].data.metrics
    assert {"pct_of_peak", "speedup_vs_dp4a", "power_w_mean", "throughput_per_w", "sm_clock_mhz_before",
            "temperature_c_after", "registers"} <= set(ours)
    assert (ours["power_w_mean"], ours["power_w_max"], ours["sm_clock_mhz_mean"]) == (612.3, 650.0, 1834.3)
    assert ours["throughput_per_w"] == round(ours["throughput"] / 612.3, 3)
    assert ours["speedup_vs_dp4a"] == round(ours["throughput"] / runs["dp4a"].data.metrics["throughput"], 4)
    dp4a = runs["dp4a"]
    assert runs["mma_sync"].data.tags["speedup_vs_dp4a.run"] == f"{dp4a.info.run_id} {dp4a.info.run_name}"
    assert dp4a.info.run_name == "512 dp4a int8 128x128"
    assert runs["peak"].data.metrics["mma_per_sm_cycle"] == 0.59631
    assert not metrics.undeclared(sweep.gpu_time(list(runs.values()), 0.0, 10.0)[1])

    df = load_runs(f"sqlite:///{tmp_path}/mlflow.db", EXPERIMENT).set_index("family")
    for key in ("pct_of_peak", "speedup_vs_dp4a", "power_w_mean", "power_w_max", "power_limit_w",
                "throughput_per_w", "sm_clock_mhz_mean", "throughput_at_max_clock", "temperature_c_before"):
        assert df.loc["mma_sync", key] == ours[key], key
    assert df.loc["dp4a", "pct_of_peak"] == runs["dp4a"].data.metrics["pct_of_peak"]
    assert df.loc["mma_sync", "theoretical_occupancy_pct"] == ours["theoretical_occupancy_pct"]
    assert df.loc["peak", "kernel_cycles"] == 1_984_000 and df["speedup_vs_dp4a"].notna().sum() == 1
    assert set(record.KERNEL_CLOCK_FIELDS) <= set(df.columns)
