"""experiments/gpu/timing.py on the GPU (``gpu`` marker): the window clock counted by the SMs, energy, the
burst regime and replicates, timed on the register-only fp16 mma.sync peak (a known amount of work,
verified exactly first).

Run with ``python -m pytest tests/test_timing_gpu.py -s`` to see the printed figures; some 20 s on an H200.
"""
import pytest

from experiments import families
from experiments.gpu.timing import time_launches

pytestmark = pytest.mark.gpu

TIMING = dict(warmup=2, batches=5, min_batch_ms=10.0)
# dense fp16 tensor-core work one SM can do per cycle on sm_90 (one m16n8k16-equivalent per cycle:
# 989 TFLOP/s = 132 SMs x 1830 MHz x 4096), an upper bound for any fp16 kernel's work per SM-cycle
FP16_FLOP_PER_SM_CYCLE = 4096


def _peak():
    """(family, spec, prepared) of the fp16 register-only mma.sync peak of this GPU, verified."""
    import cupy

    from experiments.families.gpu import device_sm
    fam = families.get("peak")
    spec = fam.spec("fp16", {}, f"sm_{device_sm()}")
    prep = fam.prepare(spec, fam.build(spec), 0, 0, 0, 3)
    prep.launch()
    cupy.cuda.Device().synchronize()
    assert prep.verify().ok
    return fam, spec, prep


def test_window_clock_bounds_the_per_clock_figure():
    """(Almost) every SM is recorded by the window probes; the window clock lies within what the GPU can run;
    the work per SM-cycle from the window clock is below the instruction peak and at most the kernel's
    own count per cycle (the window holds the launches and the gaps between them)."""
    from experiments.families.gpu import sm_count
    fam, spec, prep = _peak()
    t = time_launches(prep.launch, **TIMING)
    own = prep.clocks()
    sms, mhz = sm_count(), t["sm_clock_mhz_window"]
    flops = fam.flops(spec, 0, 0, 0)
    per_cycle = flops / (t["median_us"] * mhz) / sms          # flop / (us x MHz) = flop per cycle
    m, n, k = (int(x) for x in spec.p["mma"][1:].replace("n", " ").replace("k", " ").split())
    own_flops = own["mma_per_sm_cycle"] * 2 * m * n * k
    print(f"\nwindow clock {mhz:.1f} MHz over {t['window_sms']} SMs ({t['window_cycles']} cycles), NVML mean "
          f"{t.get('sm_clock_mhz_mean', float('nan')):.1f}, kernel's own {own.get('sm_clock_mhz_kernel', 0):.1f}; "
          f"{per_cycle:.1f} flop per SM-cycle by the window, {own_flops:.1f} by the kernel's count")
    assert t["window_sms"] >= 0.9 * sms        # the block scheduler places the probe's blocks, not we
    assert 100 < mhz <= t.get("sm_clock_mhz_max_possible", 3000) * 1.005
    assert per_cycle <= FP16_FLOP_PER_SM_CYCLE
    assert per_cycle <= own_flops * 1.01


def test_energy_burst_and_replicates():
    """Sustained with two replicates of 5 batches of 110 ms (1.1 s, a window NVML's energy readings
    follow): energy over the timed batches with a mean power between idle and the enforced limit, two replicate medians within 5 %; burst: the GPU idled back first, a window of
    burst_batches short batches (tens of ms), the clock at its start."""
    _, _, prep = _peak()
    t = time_launches(prep.launch, **{**TIMING, "min_batch_ms": 110.0}, repeats=2, repeat_pause_s=0.2)
    print(f"\nsustained: {t['median_us']:.1f} us, replicates {t['replicate_median_us']}, "
          f"{t.get('energy_j', 0):.3f} J ({t.get('energy_source')}), {t.get('power_w_avg', 0):.0f} W avg, "
          f"{t.get('power_w_mean', 0):.0f} W mean sample")
    assert t["replicates"] == 2 and t["batches"] == 2 * TIMING["batches"]
    a, b = t["replicate_median_us"]
    assert abs(a - b) / min(a, b) < 0.05
    if "power_limit_w" in t:
        assert t["energy_j"] > 0 and 20 < t["power_w_avg"] <= 1.1 * t["power_limit_w"]
        assert t["energy_j_per_launch"] == pytest.approx(t["energy_j"] / (t["batches"] * t["launches_per_batch"]))
    burst = time_launches(prep.launch, warmup=2, regime="burst", burst_batches=4, burst_batch_ms=4.0,
                          idle_s=0.5, idle_wait_s=20.0)
    window_ms = burst["batches"] * burst["launches_per_batch"] * burst["median_us"] / 1000
    print(f"burst: {burst['median_us']:.1f} us after {burst['idle_wait_s']:.2f} s ({burst['idle']}), clock at "
          f"start {burst.get('sm_clock_mhz_start')}, window {burst['sm_clock_mhz_window']:.0f} MHz, {window_ms:.1f} ms")
    assert burst["regime"] == "burst" and burst["batches"] == 4 and window_ms < 100
    assert burst["idle"] in ("reached", "waited") and burst["idle_wait_s"] >= 0.5
    # NVML's energy readings cannot follow a window of tens of ms: no energy, and the run says so
    assert burst["energy_source"] == "none" and "energy_j" not in burst
