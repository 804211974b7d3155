"""experiments/gpu/timing.py's host logic on the CPU, with NVML and CuPy's streams and events replaced:
energy (NVML's counter, else power samples integrated), the window clock from probe records, the wait
for an idle GPU (burst regime), replicates (timing.repeats), the run key of the new settings, and what
a run logs of them (the store, through the runner with the GPU worker replaced)."""
import sys
import types

import numpy as np
import pytest
from test_family_runner import EXPERIMENT, _compose, _stub_gpu

from experiments.store import record
from experiments.config import TimingConf
from experiments.runner.kernel import setting_problem
from experiments.gpu.timing import (ClockSampler, energy_summary, key_items, key_params, time_launches,
                                wait_idle, window_clock)
from experiments.store.track import Tracker

# the settings every run key held before regime and repeats existed (TimingConf less timeout_s)
OLD = {"warmup": 3, "batches": 10, "min_batch_ms": 20.0, "max_launches": 2000, "cuda_graph": True,
       "l2_flush": False}


def fake_nvml(power_mw=(650_000,), energy_mj=None, limit_mw=700_000):
    """A pynvml stand-in for one H200: SM clock 1980 MHz, power readings ``power_mw`` in turn (then
    the last), the total-energy counter ``energy_mj`` in turn (None: not supported)."""
    watts, last = iter(power_mw), [power_mw[0]]
    joules = iter(energy_mj or ())

    def power(h):
        last[0] = next(watts, last[0])
        return last[0]

    def energy(h):
        if energy_mj is None:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return next(joules)
    return types.SimpleNamespace(
        NVML_CLOCK_SM="SM", NVML_TEMPERATURE_GPU="T", nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: "h0", nvmlDeviceGetHandleByPciBusId=lambda bus: "h0",
        nvmlDeviceGetClockInfo=lambda h, which: 1980, nvmlDeviceGetMaxClockInfo=lambda h, which: 1980,
        nvmlDeviceGetPowerUsage=power, nvmlDeviceGetEnforcedPowerLimit=lambda h: limit_mw,
        nvmlDeviceGetTotalEnergyConsumption=energy, nvmlDeviceGetTemperature=lambda h, which: 35,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0, NVMLError=RuntimeError)


# ----------------------------------------------------------------------------- the run key
def test_run_key_holds_new_settings_only_away_from_their_defaults():
    """At their defaults regime and repeats leave a run's key as it was (the keys of stored runs
    stay); burst adds the regime and every burst setting, repeats > 1 the replicates and their pause."""
    defaults = {k: v for k, v in vars(TimingConf()).items() if k != "timeout_s"}
    defaults["regime"] = "sustained"            # as job.py passes it (enum_to_str)
    assert key_items(defaults) == sorted(OLD.items())
    assert key_items(OLD) == sorted(OLD.items())                    # a config of before
    burst = key_items({**defaults, "regime": "burst"})
    assert ("regime", "burst") in burst and {k for k, _ in burst} == set(OLD) | {
        "regime", "burst_batches", "burst_batch_ms", "idle_wait_s", "idle_s"}
    assert set(dict(key_items({**defaults, "repeats": 3}))) == set(OLD) | {"repeats", "repeat_pause_s"}
    assert key_items({**defaults, "burst_batch_ms": 9.0}) == sorted(OLD.items())   # unused when sustained
    # a skipped combination's key is made of its params: the new settings at their defaults are left out
    params = {"precision": "fp8_e4m3", **{f"timing.{k}": str(v) for k, v in defaults.items()}}
    assert key_params(params) == {"precision": "fp8_e4m3", **{f"timing.{k}": str(v) for k, v in OLD.items()}}
    burst = key_params({**params, "timing.regime": "burst", "timing.repeats": "2"})
    assert burst["timing.regime"] == "burst" and burst["timing.repeats"] == "2" and "timing.idle_s" in burst


def test_new_settings_are_checked():
    assert setting_problem("timing.repeats", 0) == "timing.repeats=0 is not valid; it must be a whole number >= 1"
    assert setting_problem("timing.burst_batch_ms", 0) is not None
    assert setting_problem("timing.idle_wait_s", -1.0) is not None and setting_problem("timing.repeats", 3) is None
    with pytest.raises(ValueError, match="timing.regime=steady, timing.repeats=1: the regime is one of "
                                         "sustained, burst"):
        time_launches(lambda: None, regime="steady")


def test_regime_is_an_enum_of_the_config():
    from omegaconf import ValidationError
    assert str(_compose("timing.regime=burst").timing.regime.name) == "burst"
    with pytest.raises(Exception, match="timing.regime=steady") as info:
        _compose("timing.regime=steady")
    assert isinstance(info.value.__cause__, ValidationError) and "sustained, burst" in str(info.value.__cause__)


# ----------------------------------------------------------------------------- energy
def test_energy_from_the_counter_else_from_power_samples():
    """Counter: 1234 mJ over 0.2 s and 100 launches; samples: two windows of 650 W then 700 W for
    0.1 s each (trapezoids: 67.5 J + 70 J); a window of one sample integrates nothing."""
    e = energy_summary(1234.0, [], 2.0, 100)
    assert e == {"energy_j": 1.234, "energy_j_per_launch": 0.01234, "power_w_avg": pytest.approx(0.617),
                 "energy_source": "nvml_energy_counter"}
    # a window shorter than NVML's readings follow (a 64 ms burst window read the idle draw on an H200)
    assert energy_summary(9622.0, [], 0.064, 45) == {"energy_source": "none"}
    windows = [[(0.0, 650_000), (0.1, 650_000)], [(5.0, 700_000), (5.1, 700_000)], [(9.0, 1)]]
    s = energy_summary(None, windows, 1.0, 10)
    assert s["energy_j"] == pytest.approx(65.0 + 70.0) and s["power_w_avg"] == pytest.approx(135.0)
    assert s["energy_source"] == "power_samples" and s["energy_j_per_launch"] == pytest.approx(13.5)
    assert energy_summary(None, [[(0.0, 1)]], 2.0, 10) == {} and energy_summary(0, [], 2.0, 1) == {}


def test_clock_sampler_reads_the_energy_counter_per_window(monkeypatch):
    """Two windows (two replicates) add their counter differences; a counter the driver lacks falls
    back to the power samples; without NVML there is no energy."""
    import experiments.gpu.timing
    monkeypatch.setattr(experiments.gpu.timing, "MIN_ENERGY_WINDOW_S", 0.0)     # windows of microseconds here
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(energy_mj=[10_000, 10_700, 20_000, 20_300]))
    clk = ClockSampler(interval_s=0.001)
    for _ in range(2):
        with clk:
            pass
    e = clk.energy(launches=50)
    assert e["energy_j"] == 1.0 and e["energy_j_per_launch"] == 0.02 and e["energy_source"] == "nvml_energy_counter"
    assert e["power_w_avg"] == pytest.approx(1.0 / clk.window_s) and len(clk.windows) == 2
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(power_mw=(600_000,)))
    with ClockSampler(interval_s=0.001) as clk:
        while len(clk.power_mw) < 3:
            pass
    e = clk.energy(launches=1)
    assert e["energy_source"] == "power_samples" and e["power_w_avg"] == pytest.approx(600.0, rel=0.05)
    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace())
    with ClockSampler() as clk:
        pass
    assert clk.energy(launches=1) == {} and clk.summary() == {}


# ----------------------------------------------------------------------------- the window clock
def test_window_clock_matches_records_by_sm():
    """SM 0 counts 3.6e6 cycles in 2 ms (1800 MHz), SM 5 3.9e6 in 2 ms (1950 MHz; two probe blocks
    there: its earliest before and latest after), SM 7 was recorded only before: left out. A second
    window adds its cycles and ns."""
    before = [(0, 1000, 10_000), (5, 500, 10_000), (5, 520, 10_010), (7, 1, 10_000)]
    after = [(0, 3_601_000, 2_010_000), (5, 3_900_500, 2_010_000), (5, 3_900_400, 2_009_990)]
    w = window_clock([(np.array(before), np.array(after))])
    assert w == {"sm_clock_mhz_window": pytest.approx(1875.0), "window_cycles": 3_750_000, "window_sms": 2}
    slow = [(0, 0, 0)], [(0, 1_000_000, 1_000_000)]            # SM 0 at 1000 MHz for 1 ms more
    w2 = window_clock([(np.array(before), np.array(after)), tuple(map(np.array, slow))])
    assert w2["sm_clock_mhz_window"] == pytest.approx(1000 * (7.5e6 + 1e6) / (4e6 + 1e6))
    assert window_clock([(np.array([(1, 0, 0)]), np.array([(2, 5, 5)]))]) == {}


def test_per_clock_figures_use_the_window_clock():
    """throughput_per_ghz and throughput_at_max_clock divide by the SMs' own count where measured,
    never by NVML's samples then; throughput_per_w by the energy's average power."""
    t = {"sm_clock_mhz_mean": 1834.0, "sm_clock_mhz_max_possible": 1980.0, "sm_clock_mhz_window": 1766.0,
         "window_cycles": 353_200_000, "window_sms": 132, "power_w_mean": 690.0, "power_w_avg": 699.5,
         "energy_j": 139.9, "energy_j_per_launch": 0.00139912, "median_us": 1.0}
    m = record.clock_metrics(660.0, t)
    assert m["throughput_per_ghz"] == round(660.0 / 1.766, 2) and m["sm_clock_mhz_window"] == 1766.0
    assert m["throughput_at_max_clock"] == round(660.0 * 1980 / 1766.0, 2)
    assert m["throughput_per_w"] == round(660.0 / 699.5, 3) and m["energy_j_per_launch"] == 0.001399
    assert set(m) <= set(record.METRICS)
    line = record.result_line((8192,) * 3, 1665.0, 660.0, "TFLOP/s", 0.0015, "sw_power_cap", m)
    assert ("verified; SM clock 1766 MHz of 1980 (counted by the SMs), 700 W; 139.90 J, 1.399 mJ per "
            "launch, 0.944 TFLOP/s/W; clock-event") in line


# ----------------------------------------------------------------------------- the idle wait
def test_wait_idle_reached_timed_out_and_without_power():
    """A fake clock: power 650 W, then 90 W (below 0.25 x 700): idle from the second poll, reached
    idle_s = 1 s later; a GPU that stays busy times out at max_wait_s; no power reading: idle_s waited."""
    now = [0.0]
    sleep = lambda s: now.__setitem__(0, now[0] + s)  # noqa: E731
    readings = iter([650.0] + [90.0] * 200)
    out = wait_idle(lambda: next(readings), 700.0, 1.0, 30.0, poll_s=0.25, clock=lambda: now[0], sleep=sleep)
    assert out == {"idle": "reached", "idle_wait_s": 1.25, "power_w_start": 90.0}
    now[0] = 0.0
    out = wait_idle(lambda: 650.0, 700.0, 1.0, 5.0, poll_s=0.5, clock=lambda: now[0], sleep=sleep)
    assert out == {"idle_wait_s": 5.0, "idle": "timed out", "power_w_start": 650.0}
    now[0] = 0.0
    assert wait_idle(lambda: None, None, 2.0, 30.0, clock=lambda: now[0], sleep=sleep) == {
        "idle_wait_s": 2.0, "idle": "waited"}


# ----------------------------------------------------------------------------- time_launches
def fake_cupy(batch_ms):
    """A CuPy stand-in for direct launches (cuda_graph=False): events whose elapsed times are 1 ms for
    the sizing launch, then ``batch_ms`` in turn."""
    times = iter([1.0] + list(batch_ms))

    class Stream:
        def __init__(self, non_blocking=False):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def synchronize(self):
            pass

    event = types.SimpleNamespace(record=lambda s: None, synchronize=lambda: None)
    cuda = types.SimpleNamespace(Stream=Stream, Event=lambda: event, get_elapsed_time=lambda a, b: next(times))
    return types.SimpleNamespace(cuda=cuda)


def test_replicates_and_burst_window(monkeypatch):
    """repeats=3 of 2 batches of 20 launches: the median is over all 6 batches, one median per replicate;
    burst: 3 batches of burst_batch_ms (5 launches of 1 ms), after the GPU's power fell below idle,
    with the clock at the start and the energy of the window."""
    import experiments.gpu.timing
    monkeypatch.setattr(experiments.gpu.timing, "MIN_ENERGY_WINDOW_S", 0.0)     # fake windows of microseconds
    launches = []
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy([20.0, 22.0, 21.0, 21.0, 24.0, 20.0]))
    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace())
    t = time_launches(lambda: launches.append(1), warmup=1, batches=2, cuda_graph=False, repeats=3,
                      repeat_pause_s=0.0)
    assert t["batch_us"] == [1000.0, 1100.0, 1050.0, 1050.0, 1200.0, 1000.0] and t["batches"] == 6
    assert t["median_us"] == 1050.0 and t["replicate_median_us"] == [1050.0, 1050.0, 1100.0]
    assert t["replicates"] == 3 and t["regime"] == "sustained" and t["launches_per_batch"] == 20
    assert len(launches) == 1 + 1 + 6 * 20 + 2          # warm-up, sizing, batches, each later replicate's warm-up
    assert "idle_wait_s" not in t and not any(k.startswith("energy") for k in t)
    metrics, series = record.replicate_metrics(t)
    assert metrics == {"replicates": 3, "replicate_spread": round(50.0 / 1050.0, 4)}
    assert series == {"replicate_median_us": [1050.0, 1050.0, 1100.0]}

    monkeypatch.setitem(sys.modules, "cupy", fake_cupy([5.0, 5.5, 5.0]))
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(power_mw=(650_000, 90_000), energy_mj=[1000, 1900]))
    t = time_launches(lambda: None, warmup=2, cuda_graph=False, regime="burst", burst_batches=3,
                      burst_batch_ms=5.0, idle_s=0.05, idle_wait_s=5.0)
    assert t["regime"] == "burst" and t["batches"] == 3 and t["launches_per_batch"] == 5
    assert t["median_us"] == 1000.0 and t["idle"] == "reached" and 0.05 <= t["idle_wait_s"] < 5.0
    assert t["sm_clock_mhz_start"] == 1980.0 and t["power_w_start"] == 90.0
    assert t["energy_j"] == 0.9 and t["energy_j_per_launch"] == pytest.approx(0.06) and t["energy_source"] == "nvml_energy_counter"


# ----------------------------------------------------------------------------- the store
def test_burst_replicates_and_energy_reach_the_store(tmp_path, monkeypatch):
    """Through the runner with the GPU worker replaced: a sustained run logs param timing.regime and
    its run key as before; a burst run with three replicates is another measurement (a run of its own)
    and logs replicate_median_us at steps 0..2, replicates, replicate_spread, the energy, the window
    clock and the idle wait, its tags say where the energy came from and whether the GPU idled."""
    from experiments.store import track
    job, store, worker = _stub_gpu(tmp_path, monkeypatch, 100.0)
    keys, run_key = [], track.run_key
    monkeypatch.setattr(track, "run_key", lambda *parts: keys.append(parts) or run_key(*parts))
    size = ["family=dp4a", "precision=int8", "problem.sizes=[512]", *store]
    assert job.run_job(_compose(*size))["finished"] == 1
    worker.kernel_clock = {"regime": "burst", "replicates": 3, "replicate_median_us": [100.0, 101.5, 99.5],
                           "energy_j": 1.23456, "energy_j_per_launch": 0.0411521, "power_w_avg": 612.34,
                           "energy_source": "power_samples", "sm_clock_mhz_window": 1979.61,
                           "window_cycles": 39_592_200, "window_sms": 132, "idle_wait_s": 1.2345,
                           "idle": "reached", "sm_clock_mhz_start": 1980.0, "power_w_start": 88.46}
    burst = size + ["timing.regime=burst", "timing.repeats=3"]
    assert job.run_job(_compose(*burst)) == {"finished": 1, "failed": 0, "done_before": 0}
    assert job.run_job(_compose(*burst))["done_before"] == 1            # its key: found again
    tr = Tracker(f"sqlite:///{tmp_path}/mlflow.db", EXPERIMENT, create=False)
    runs = sorted((r for r in tr.client.search_runs([tr.experiment_id]) if "mlflow.parentRunId" in r.data.tags),
                  key=lambda r: r.info.start_time)
    assert len(runs) == 2
    sustained, run = runs[0], runs[1]
    assert sustained.data.params["timing.regime"] == "sustained" and run.data.params["timing.regime"] == "burst"
    assert sustained.data.tags["run_key"] != run.data.tags["run_key"]
    assert not {"replicate_spread", "energy_j", "idle_wait_s"} & set(sustained.data.metrics)
    m = run.data.metrics
    assert (m["replicates"], m["replicate_spread"]) == (3, round(2.0 / 100.0, 4))
    assert (m["energy_j"], m["energy_j_per_launch"], m["power_w_avg"]) == (1.235, 0.041152, 612.3)
    thr = 2 * 512 ** 3 / 100e-6 / 1e12
    assert m["throughput_per_w"] == round(thr / 612.3, 3)
    assert (m["sm_clock_mhz_window"], m["window_sms"], m["idle_wait_s"]) == (1979.6, 132, 1.234)
    assert m["throughput_per_ghz"] == round(thr / 1.97961, 2) == 1.36
    history = tr.client.get_metric_history(run.info.run_id, "replicate_median_us")
    assert sorted((h.step, h.value) for h in history) == [(0, 100.0), (1, 101.5), (2, 99.5)]
    assert run.data.tags["energy_source"] == "power_samples" and run.data.tags["burst_idle"] == "reached"
    assert "burst after 1.2 s idle, clock at start 1980 MHz" in run.data.tags["mlflow.note.content"]
    from experiments import metrics
    assert metrics.undeclared(m) == []
    # the sustained run's key is made of the timing settings of before; the burst run's holds the regime
    gpu_keys = [k for k in keys if k[0] == "gpu"]
    assert sorted(OLD.items()) in gpu_keys[0] and ("regime", "burst") in gpu_keys[1][-2]
    assert ("repeats", 3) in gpu_keys[1][-2]


def test_no_power_per_watt_from_a_burst_window():
    """A burst window (tens of ms after idle) read NVML's idle draw on an H200 (128 W for a GEMM at the
    700 W cap), so per-W figures came out 5x too high: a burst run gets none without the energy; a
    sustained run keeps the mean sample's."""
    burst = record.clock_metrics(750.0, {"regime": "burst", "power_w_mean": 128.0, "sm_clock_mhz_window": 1600.0})
    assert "throughput_per_w" not in burst and burst["throughput_per_ghz"] == pytest.approx(468.75)
    sustained = record.clock_metrics(650.0, {"regime": "sustained", "power_w_mean": 650.0})
    assert sustained["throughput_per_w"] == 1.0
    measured = record.clock_metrics(700.0, {"regime": "burst", "power_w_avg": 700.0, "power_w_mean": 128.0})
    assert measured["throughput_per_w"] == 1.0
