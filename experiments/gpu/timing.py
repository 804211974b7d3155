"""Median-of-batches timing with CUDA events, and GPU state (NVML) around it.

Method: ``warmup`` launches (the first pays the driver JIT), a single timed launch to size the
batch, then ``batches`` batches of ``L`` back-to-back launches between two CUDA events, where L is
chosen so that one batch lasts at least ``min_batch_ms``. Per-launch time = batch time / L.

With ``cuda_graph`` (the default) the L launches are captured once into a CUDA graph and each
batch is one graph launch, so Python's launch overhead does not enter small problems, and
everything the timing stream ever runs is a graph launch:

- the warm-up and the sizing launch replay a graph of one launch. Launching the kernel directly on
  the timing stream before its graph made every later graph replay in that process slower by about
  0.17 us per launch on an H200 (4.83 -> 5.00 us for a 5 us kernel, from the second timed kernel
  on), so small kernels timed differently depending on what the process had run before;
- each batch waits behind a *gate* (:class:`_Gate`, the blocking-kernel method of NVIDIA's
  nvbench): a one-thread kernel that spins on a flag in mapped host memory holds the stream while
  the host enqueues the start event, the batch and the end event, then the host sets the flag. The
  host's time to enqueue a batch (10-50 us on an H200 node, depending on how busy the CPU is)
  thus never lies between the two events.

What the method cannot remove: on an H200 some kernels time at one of two speeds about 0.8 % apart,
a state of the GPU that lasts seconds at the same SM clock (traced batch by batch, it switched after
0.3 s, after 1.5 s, or not at all; untimed warm-up batches of up to 1 s did not settle it), and
kernels sensitive to where their operands lie (fp16 with B stored K x N, 2048^3) moved by up to 5 %
from one allocation to the next. Rerunning a sweep shows both; ``experiments.report --repeat``
turns the reruns into the sweep's single-GPU spread.

Clock honesty: while the batches run, a background thread samples the SM clock of the timed GPU
with NVML every few milliseconds (:class:`ClockSampler`); long GEMMs on an H200 run at a
power-capped clock (NVML clock-event reason sw_power_cap, about 1785 instead of 1980 MHz), and the
mean clock says which clock a throughput was measured at; the same thread reads the board's power
draw (NVML's instantaneous reading where the driver has it, else its about-1-s average), and the
enforced power limit is read once, so a run shows how close to the cap it ran. Without NVML the
clock and power fields are absent.

Energy: NVML's total-energy counter (nvmlDeviceGetTotalEnergyConsumption, mJ) is read when the timed
batches start and when they end; where the driver has no counter (or it did not advance) the power
samples are integrated over time instead, and ``energy_source`` says which. Timed windows shorter than
MIN_ENERGY_WINDOW_S in all give no energy (``energy_source=none``): NVML's readings lag the load.

Exact window clock: a probe kernel of a few blocks per SM (``timing_clock_probe``) records each block's
``%smid``, ``%clock64`` and ``%globaltimer`` on the timing stream just before the first timed batch and
just after the last; an SM's cycles between its two records over their ns is that SM's mean clock over
the whole timed window, counted by the SM itself (:func:`window_clock`), where NVML's samples only
approximate it.

Regimes (``regime``): ``sustained`` times ``batches`` batches of at least ``min_batch_ms`` each, long
enough for a large GEMM to bring an H200 to its power cap (its clock then sits below the boost clock);
``burst`` first waits, bounded by ``idle_wait_s``, until the GPU has idled back (:func:`wait_idle`: its
power below ``IDLE_POWER_SHARE`` of the enforced limit for ``idle_s``), then runs the warm-ups and a
short window of ``burst_batches`` batches of ``burst_batch_ms`` (tens of ms in all): the speed of a
kernel that starts on a rested GPU. Which regime a figure was measured in is not visible in the
figure: the run records it (param ``timing.regime``).

Replicates (``repeats`` = R): the whole timed measurement (warm-ups, probes, batches) is repeated R
times in one run, each replicate after a pause of ``repeat_pause_s`` seconds with the GPU idle (in the
burst regime, after its wait for the GPU to idle back). Within one measurement the batches agree to
about 0.15 % on an H200 while the same kernel measured again moves by about 1 %; the spread of the
replicates' medians (``replicate_spread``) shows the second, and the run's median is over all batches
of all replicates.
"""
from __future__ import annotations

import math
import statistics
import threading
import time

__all__ = ["time_launches", "gpu_state", "tflops", "ClockSampler", "clock_summary", "window_clock",
           "wait_idle", "energy_summary", "key_items", "key_params", "REGIMES", "IDLE_POWER_SHARE"]

REGIMES = ("sustained", "burst")     # timing.regime (experiments.config.Regime)
# the GPU counts as idle (burst regime) while its power draw stays below this share of its enforced limit
IDLE_POWER_SHARE = 0.25
# TimingConf fields added after the first runs were stored: (field, default); a run key holds one only
# when it differs from its default (burst: every burst setting), so the keys of earlier runs stay
LATER_FIELDS = {"regime": "sustained", "repeats": 1, "repeat_pause_s": None, "burst_batches": None,
                "burst_batch_ms": None, "idle_wait_s": None, "idle_s": None}


def tflops(m: int, n: int, k: int, us: float) -> float:
    """Throughput in TFLOP/s (or TOP/s for integer types) of an M x N x K GEMM: 2*M*N*K / time."""
    return 2.0 * m * n * k / (us * 1e-6) / 1e12


def _nvml_handle(nvml, pci_bus_id: str | None):
    nvml.nvmlInit()
    return (nvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id) if pci_bus_id
            else nvml.nvmlDeviceGetHandleByIndex(0))


def clock_summary(samples_mhz, max_possible_mhz: float | None = None, power_mw=(),
                  power_limit_mw: float | None = None) -> dict:
    """Mean, min and max (MHz) and the count of SM clock samples, plus the GPU's highest SM clock
    (``sm_clock_mhz_max_possible``, MHz) when known; with power samples (mW, NVML) their mean and
    maximum in W (``power_w_mean``, ``power_w_max``) and the enforced limit (``power_limit_w``, W)
    when known. Returns {} for no clock samples: a clock that was not read is absent, never zero."""
    samples = [float(x) for x in samples_mhz]
    if not samples:
        return {}
    out = {"sm_clock_mhz_mean": statistics.fmean(samples), "sm_clock_mhz_min": min(samples),
           "sm_clock_mhz_max": max(samples), "sm_clock_samples": len(samples)}
    if max_possible_mhz:
        out["sm_clock_mhz_max_possible"] = float(max_possible_mhz)
    watts = [float(x) / 1000.0 for x in power_mw]
    if watts:
        out["power_w_mean"], out["power_w_max"] = statistics.fmean(watts), max(watts)
    if power_limit_mw:
        out["power_limit_w"] = float(power_limit_mw) / 1000.0
    return out


def key_items(settings: dict) -> list:
    """The timing settings that identify a measurement in its run key, sorted (key, value) pairs:
    every setting older than :data:`LATER_FIELDS` as before; ``regime`` and the burst settings only
    for ``burst``; ``repeats`` and ``repeat_pause_s`` only for more than one replicate. So the run
    keys of runs stored before these settings existed, and of runs at their defaults, are unchanged."""
    regime = str(settings.get("regime", "sustained"))
    burst = regime == "burst"
    many = int(settings.get("repeats", 1)) != 1
    keep = {"regime": burst, "burst_batches": burst, "burst_batch_ms": burst, "idle_wait_s": burst,
            "idle_s": burst, "repeats": many, "repeat_pause_s": many}
    return sorted((k, str(v) if k == "regime" else v) for k, v in settings.items()
                  if k not in LATER_FIELDS or keep.get(k, False))


def key_params(params: dict) -> dict:
    """A run's params (``timing.<setting>`` among them) as a run key holds them: the
    :data:`LATER_FIELDS` settings only where :func:`key_items` keeps them (a skipped combination keeps
    the key it had before those settings existed)."""
    settings = {k.partition(".")[2]: v for k, v in params.items() if k.startswith("timing.")}
    kept = {k for k, _ in key_items(settings)}
    return {k: v for k, v in params.items() if not k.startswith("timing.")
            or k.partition(".")[2] not in LATER_FIELDS or k.partition(".")[2] in kept}


# NVML's energy counter and power readings lag the load by tens to hundreds of ms: on an H200 a 64 ms burst
# window right after idle read 122 W (the idle draw) for a GEMM that draws the 700 W cap. Windows shorter
# than this give no energy (energy_source=none); a sustained run reaches it with timing.min_batch_ms=100.
MIN_ENERGY_WINDOW_S = 1.0


def energy_summary(counter_mj: tuple | None, power: list, window_s: float, launches: int) -> dict:
    """Energy over timed windows: ``counter_mj`` (mJ spent, from NVML's total-energy counter; None
    where the driver has none or it did not advance), else the integral of ``power`` (a list of
    windows, each a list of (seconds, mW) samples, trapezoids within a window); ``window_s`` the
    windows' seconds in all, ``launches`` the kernel launches timed in them. Returns ``energy_j`` (J),
    ``energy_j_per_launch`` (J), ``power_w_avg`` (energy / window_s, W) and ``energy_source``
    ('nvml_energy_counter' or 'power_samples'); only ``{"energy_source": "none"}`` when the windows
    last less than MIN_ENERGY_WINDOW_S in all (too short for NVML's readings to follow the load); {}
    when neither gives a number (no NVML, or fewer than two power samples in every window)."""
    if counter_mj:
        joules, source = counter_mj / 1000.0, "nvml_energy_counter"
    else:
        joules, source = 0.0, "power_samples"
        spans = [w for w in power if len(w) >= 2]
        if not spans:
            return {}
        for w in spans:
            pairs = zip(w, w[1:], strict=False)
            joules += sum((t1 - t0) * (p0 + p1) / 2.0 for (t0, p0), (t1, p1) in pairs) / 1000.0
    if window_s < MIN_ENERGY_WINDOW_S:
        return {"energy_source": "none"}
    if joules <= 0:
        return {}
    return {"energy_j": joules, "energy_j_per_launch": joules / max(1, launches),
            "power_w_avg": joules / window_s, "energy_source": source}


class ClockSampler:
    """Samples the SM clock (MHz) and the power draw (mW) of one GPU with NVML in a background thread,
    and reads NVML's total-energy counter (mJ) on entry and exit.

    ``with ClockSampler(pci_bus_id, interval_s=0.005) as clk: ...`` takes a sample on entry, then one
    every ``interval_s`` seconds (NVML updates the reading about that often), and one on exit;
    ``clk.summary()`` gives :func:`clock_summary` of them (a GPU whose power NVML does not report
    gives clock samples only). ``pci_bus_id`` selects the GPU (None: NVML device 0). The sampler may
    be entered again (the replicates of one run): samples, energy and window seconds add up, and
    :meth:`energy` gives :func:`energy_summary` of all its windows. Without NVML (not installed, no
    driver, not permitted) it samples nothing and ``summary()`` is {}; it never raises for NVML's sake.
    """

    def __init__(self, pci_bus_id: str | None = None, interval_s: float = 0.005):
        self.pci_bus_id, self.interval_s = pci_bus_id, interval_s
        self.samples: list = []
        self.power_mw: list = []
        self.windows: list = []          # per entry: [(seconds, mW), ...] of its power samples
        self.energy_mj: float | None = 0.0   # the counter's mJ over every window; None: not read
        self.window_s = 0.0
        self.max_possible = self.power_limit = None
        self._nvml = self._handle = self._thread = None
        self._stop = threading.Event()
        self._t0 = self._e0 = None

    def _sample(self) -> None:
        try:
            self.samples.append(self._nvml.nvmlDeviceGetClockInfo(self._handle, self._nvml.NVML_CLOCK_SM))
        except Exception:  # noqa: BLE001 - a failed reading is a missing sample
            pass
        try:
            mw = self._power()
            self.power_mw.append(mw)
            self.windows[-1].append((time.perf_counter(), mw))
        except Exception:  # noqa: BLE001 - no power reading on this GPU, or a failed one
            pass

    def _power(self) -> int:
        """The board's power draw (mW): NVML's instantaneous field where the driver has it
        (NVML_FI_DEV_POWER_INSTANT), else nvmlDeviceGetPowerUsage (on recent GPUs an average over
        about a second, which lags a change of load)."""
        nvml, field = self._nvml, getattr(self._nvml, "NVML_FI_DEV_POWER_INSTANT", None)
        if field is not None:
            value, = nvml.nvmlDeviceGetFieldValues(self._handle, [field])
            if value.nvmlReturn == 0:
                return value.value.uiVal
        return nvml.nvmlDeviceGetPowerUsage(self._handle)

    def _energy(self) -> int | None:
        """NVML's total energy since the driver loaded (mJ), None where it has no counter."""
        try:
            return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except Exception:  # noqa: BLE001 - not supported on this GPU or driver
            return None

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> ClockSampler:
        if self._handle is None:
            try:
                import pynvml
                self._nvml = pynvml
                self._handle = _nvml_handle(pynvml, self.pci_bus_id)
                self.max_possible = pynvml.nvmlDeviceGetMaxClockInfo(self._handle, pynvml.NVML_CLOCK_SM)
            except Exception:  # noqa: BLE001 - NVML missing or not permitted: no samples
                self._handle = None
                return self
            try:
                self.power_limit = pynvml.nvmlDeviceGetEnforcedPowerLimit(self._handle)
            except Exception:  # noqa: BLE001 - no power limit reported
                self.power_limit = None
        self.windows.append([])
        self._stop.clear()
        self._e0, self._t0 = self._energy(), time.perf_counter()
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="sm-clock-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            e1 = self._energy()             # first: the wait for the thread below is not in the window
            self._sample()
            self.window_s += time.perf_counter() - self._t0
            self._stop.set()
            self._thread.join()
            self._thread = None
            if self.energy_mj is not None and self._e0 is not None and e1 is not None and e1 > self._e0:
                self.energy_mj += e1 - self._e0
            else:
                self.energy_mj = None       # one window without the counter: all are integrated

    def summary(self) -> dict:
        """:func:`clock_summary` of the samples taken (MHz, W); {} without NVML."""
        return clock_summary(self.samples, self.max_possible, self.power_mw, self.power_limit)

    def energy(self, launches: int) -> dict:
        """:func:`energy_summary` of every window so far, ``launches`` timed in them; {} without NVML."""
        if self._handle is None:
            return {}
        return energy_summary(self.energy_mj, self.windows, self.window_s, launches)


def wait_idle(read_power_w, limit_w: float | None, idle_s: float, max_wait_s: float, *,
              poll_s: float = 0.02, clock=time.monotonic, sleep=time.sleep) -> dict:
    """Wait until the GPU has idled back: its power draw (``read_power_w()``, W; None when not read)
    below :data:`IDLE_POWER_SHARE` of ``limit_w`` for ``idle_s`` seconds in a row, polled every
    ``poll_s``, for at most ``max_wait_s`` seconds. Without a power reading or a limit it waits
    ``idle_s`` (a GPU left alone that long). Returns ``idle_wait_s`` (s waited), ``power_w_start`` (W,
    the last reading) and ``idle`` ('reached', 'timed out' after max_wait_s, or 'waited' without
    power readings)."""
    t0 = clock()
    first = read_power_w()
    if first is None or not limit_w:
        sleep(idle_s)
        return {"idle_wait_s": clock() - t0, "idle": "waited"}
    since, watts = None, first
    while True:
        now = clock()
        if watts is not None and watts < IDLE_POWER_SHARE * limit_w:
            since = now if since is None else since
            if now - since >= idle_s:
                state = "reached"
                break
        else:
            since = None
        if now - t0 >= max_wait_s:
            state = "timed out"
            break
        sleep(poll_s)
        watts = read_power_w()
    out = {"idle_wait_s": clock() - t0, "idle": state}
    if watts is not None:
        out["power_w_start"] = watts
    return out


def window_clock(pairs) -> dict:
    """The SMs' mean clock over timed windows from probe records: ``pairs`` is a list of (before,
    after) arrays of shape (blocks, 3) holding (smid, clock64, globaltimer ns) per probe block. Per
    SM, its cycles from its earliest record before to its latest after, over the ns between them, are
    added over the windows. Returns ``sm_clock_mhz_window`` (all SMs' cycles / all SMs' ns x 1000:
    MHz), ``window_cycles`` (an SM's cycles over the windows, the mean over SMs), ``window_sms`` (SMs
    recorded both before and after); {} when no SM was recorded on both sides. %globaltimer may move
    in steps of up to 1 us: 0.005 % of a 20 ms window."""
    import numpy as np
    cycles: dict = {}
    ns: dict = {}
    for before, after in pairs:
        b, a = np.asarray(before, dtype=np.int64), np.asarray(after, dtype=np.int64)
        for sm in set(b[:, 0].tolist()) & set(a[:, 0].tolist()):
            rb, ra = b[b[:, 0] == sm], a[a[:, 0] == sm]
            c, t = int(ra[:, 1].max() - rb[:, 1].min()), int(ra[:, 2].max() - rb[:, 2].min())
            if c > 0 and t > 0:
                cycles[sm], ns[sm] = cycles.get(sm, 0) + c, ns.get(sm, 0) + t
    if not cycles:
        return {}
    total_c, total_ns = sum(cycles.values()), sum(ns.values())
    return {"sm_clock_mhz_window": 1000.0 * total_c / total_ns,
            "window_cycles": round(total_c / len(cycles)), "window_sms": len(cycles)}


GATE_TIMEOUT_S = 2.0     # a gate not released by then opens itself; the batch is then refused
# A CUDA graph whose kernel nodes the driver submits one at a time (cuBLAS int8 at 2048 on an H200: 0.25 ms
# to enqueue 200 launches, against 0.01 ms for fp16) can fill the stream's queue of pending work behind the
# closed gate; the host then blocks in the graph launch until the gate opens itself. A batch refused so is
# timed again with a quarter of the launches, down to this many (then the refusal stands).
MIN_GATED_LAUNCHES = 16

_GATE_SOURCE = r"""
extern "C" __global__ void timing_gate(volatile const int* release, volatile int* timed_out,
                                       unsigned long long timeout_ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    while (*release == 0) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 > timeout_ns) { *timed_out = 1; __threadfence_system(); return; }
    }
}
"""


def _graph_of(stream, launch, n: int):
    """A CUDA graph of ``n`` back-to-back ``launch()`` captured on ``stream`` (made the current CuPy
    stream meanwhile, as ``launch`` enqueues on the current stream)."""
    with stream:
        stream.begin_capture()
        try:
            for _ in range(n):
                launch()
        except BaseException:
            try:
                stream.end_capture()
            except Exception:  # noqa: BLE001 - the launch's own error is the one to report
                pass
            raise
        return stream.end_capture()


class _PerDevice:
    """One instance per CUDA device, made on first use (:meth:`get`); each subclass keeps its own."""
    _by_device: dict

    @classmethod
    def get(cls):
        """The instance of the current device."""
        import cupy
        dev = cupy.cuda.Device().id
        if dev not in cls._by_device:
            cls._by_device[dev] = cls()
        return cls._by_device[dev]


class _Gate(_PerDevice):
    """Holds a stream until the host releases it (one per process and device).

    A one-thread kernel (``timing_gate``, NVRTC) spins on an int in mapped, pinned host memory and
    ends when the host writes 1 there, or after ``GATE_TIMEOUT_S`` (then it sets ``timed_out``). It
    is replayed from a one-node CUDA graph so that the timing stream sees graph launches only.
    """
    _by_device: dict = {}

    def __init__(self):
        import ctypes

        import cupy
        import numpy as np
        rt = cupy.cuda.runtime
        self._host = rt.hostAlloc(8, rt.hostAllocMapped)          # [release, timed_out]
        self._release = ctypes.c_int.from_address(self._host)
        self._timed_out = ctypes.c_int.from_address(self._host + 4)
        dev = rt.pointerGetAttributes(self._host).devicePointer
        kern = cupy.RawModule(code=_GATE_SOURCE).get_function("timing_gate")
        args = (np.uint64(dev), np.uint64(dev + 4), np.uint64(int(GATE_TIMEOUT_S * 1e9)))
        stream = cupy.cuda.Stream(non_blocking=True)
        self._graph = _graph_of(stream, lambda: kern((1,), (1,), args), 1)
        self._release.value = 1
        self._graph.launch(stream)                  # loads the kernel; passes at once
        stream.synchronize()

    def hold(self, stream) -> None:
        """Enqueue the gate, closed, on ``stream``: the stream waits until :meth:`release`."""
        self._release.value = 0
        self._timed_out.value = 0
        self._graph.launch(stream)

    def release(self) -> None:
        """Open the gate."""
        self._release.value = 1

    def timed_out(self) -> bool:
        """Whether the last gate opened itself (read it after the stream's work has finished)."""
        return bool(self._timed_out.value)


_PROBE_SOURCE = r"""
extern "C" __global__ void timing_clock_probe(unsigned long long* out) {
    if (threadIdx.x != 0) return;
    unsigned int sm;
    unsigned long long c, t;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(c));
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    out[3 * blockIdx.x] = sm;
    out[3 * blockIdx.x + 1] = c;
    out[3 * blockIdx.x + 2] = t;
}
"""
PROBE_BLOCKS_PER_SM = 4      # probe blocks per SM of the GPU: a free GPU spreads them, every SM gets one


class _Probe(_PerDevice):
    """The window clock's probe (``timing_clock_probe``, NVRTC): PROBE_BLOCKS_PER_SM x SMs blocks of
    32 threads, thread 0 of each recording (%smid, %clock64, %globaltimer) into its record. Two
    one-node CUDA graphs, one writing the record before the window and one after, so that the timing
    stream sees graph launches only (module docstring)."""
    _by_device: dict = {}

    def __init__(self):
        import cupy
        blocks = PROBE_BLOCKS_PER_SM * cupy.cuda.Device().attributes["MultiProcessorCount"]
        kern = cupy.RawModule(code=_PROBE_SOURCE).get_function("timing_clock_probe")
        self.records = [cupy.zeros((blocks, 3), dtype=cupy.uint64) for _ in range(2)]
        stream = cupy.cuda.Stream(non_blocking=True)
        self._graphs = [_graph_of(stream, lambda r=r: kern((blocks,), (32,), (r,)), 1) for r in self.records]
        for g in self._graphs:
            g.launch(stream)                         # loads the kernel
        stream.synchronize()

    def record(self, stream, which: int) -> None:
        """Enqueue the probe on ``stream``, writing record ``which`` (0: before, 1: after the window)."""
        self._graphs[which].launch(stream)

    def pair(self) -> tuple:
        """(before, after) records as host arrays (after the stream's work has finished)."""
        return self.records[0].get(), self.records[1].get()


def _nvml_power_reader(pci_bus_id: str | None):
    """(a function reading the board's power draw in W, or None on failure; the enforced power limit
    in W or None); (a function returning None, None) without NVML."""
    probe = ClockSampler(pci_bus_id)
    try:
        import pynvml
        probe._nvml, probe._handle = pynvml, _nvml_handle(pynvml, pci_bus_id)
    except Exception:  # noqa: BLE001 - NVML missing or not permitted
        return (lambda: None), None
    try:
        limit = pynvml.nvmlDeviceGetEnforcedPowerLimit(probe._handle) / 1000.0
    except Exception:  # noqa: BLE001 - no limit reported
        limit = None

    def read():
        try:
            return probe._power() / 1000.0
        except Exception:  # noqa: BLE001 - no power reading
            return None
    return read, limit


def _sm_clock_now(pci_bus_id: str | None) -> float | None:
    """The SM clock NVML reports now (MHz), None without NVML."""
    return gpu_state(pci_bus_id).get("sm_clock_mhz")


def time_launches(launch, *, warmup: int = 3, batches: int = 10, min_batch_ms: float = 20.0,
                  max_launches: int = 2000, cuda_graph: bool = True, l2_flush: bool = False,
                  pci_bus_id: str | None = None, clock_interval_s: float = 0.005,
                  regime: str = "sustained", repeats: int = 1, repeat_pause_s: float = 1.0,
                  burst_batches: int = 5, burst_batch_ms: float = 4.0, idle_wait_s: float = 10.0,
                  idle_s: float = 1.0) -> dict:
    """Time ``launch()`` (enqueues one kernel on the current CuPy stream; it must be capturable in a
    CUDA graph unless ``cuda_graph`` is False).

    Returns per-launch times in microseconds over all batches of all replicates: median_us, min_us,
    max_us, spread (max-min)/median, and launches_per_batch, batches (all replicates'), method,
    batch_us (list), regime, replicates (``repeats``) and replicate_median_us (list, one median per
    replicate); with NVML also the SM clock during the timed batches, sampled every
    ``clock_interval_s`` seconds on the GPU ``pci_bus_id`` (None: NVML device 0) from the first batch
    to the end of the last (:func:`clock_summary`: sm_clock_mhz_mean, _min, _max in MHz,
    sm_clock_samples, sm_clock_mhz_max_possible), and the energy (:func:`energy_summary`); with
    ``cuda_graph`` the exact mean SM clock of the timed windows (:func:`window_clock`). ``regime``
    burst: each replicate first waits for the GPU to idle back (:func:`wait_idle`, at most
    ``idle_wait_s``), then ``warmup`` launches and ``burst_batches`` batches of at least
    ``burst_batch_ms``; it adds idle_wait_s (summed), idle ('reached', 'timed out' or 'waited'; the
    last replicate's), power_w_start (W) and sm_clock_mhz_start (MHz, NVML, as the first window
    starts). Replicates after the first start after ``repeat_pause_s`` seconds of idle GPU
    (sustained) or the wait (burst) and their own warm-ups. With ``cuda_graph`` every launch on the
    timing stream is a graph replay and each batch waits behind the gate (module docstring); without
    it the launches are direct and the host's launch time is part of a batch.
    Raises ValueError for an unknown ``regime`` or ``repeats`` < 1, what the launches raise (a
    faulting kernel surfaces at the first synchronize), and RuntimeError when the host took more than
    GATE_TIMEOUT_S to enqueue one batch of MIN_GATED_LAUNCHES launches (a larger batch refused so is
    retried with a quarter of its launches, and ``launches_per_batch`` says how many were timed).
    """
    regime = str(getattr(regime, "name", regime))
    if regime not in REGIMES or int(repeats) < 1:
        raise ValueError(f"timing.regime={regime}, timing.repeats={repeats}: the regime is one of "
                         f"{', '.join(REGIMES)} and repeats a whole number >= 1")
    import cupy
    burst = regime == "burst"
    if burst:
        batches, min_batch_ms = burst_batches, burst_batch_ms
    stream = cupy.cuda.Stream(non_blocking=True)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    flush = None
    with stream:
        if l2_flush:
            buf = cupy.empty(2 * cupy.cuda.Device().attributes["L2CacheSize"], dtype=cupy.uint8)
            flush = _graph_of(stream, lambda: buf.fill(1), 1) if cuda_graph else (lambda: buf.fill(1))
        probe = None
        if cuda_graph:
            gate = _Gate.get()
            probe = _Probe.get()
            one = _graph_of(stream, launch, 1)
            single = lambda: one.launch(stream)  # noqa: E731
        else:
            single = launch
        for _ in range(max(1, warmup)):
            single()
        stream.synchronize()
        start.record(stream)
        single()
        end.record(stream)
        end.synchronize()
        one_ms = max(cupy.cuda.get_elapsed_time(start, end), 1e-4)
        n = int(min(max_launches, max(1, math.ceil(min_batch_ms / one_ms))))
        state = {"n": n, "graph": None}
        if cuda_graph:
            state["graph"] = _graph_of(stream, launch, n)
            state["graph"].launch(stream)  # upload the graph before timing
        stream.synchronize()
        clock = ClockSampler(pci_bus_id, clock_interval_s)
        replicates, pairs, idle, waited_s = [], [], {}, 0.0
        power = _nvml_power_reader(pci_bus_id) if burst else None
        for r in range(int(repeats)):
            if burst:
                idle = {**idle, **wait_idle(power[0], power[1], idle_s, idle_wait_s)}
                waited_s += idle["idle_wait_s"]
            elif r:
                time.sleep(repeat_pause_s)
            if burst or r:
                for _ in range(max(1, warmup)):
                    single()
                stream.synchronize()
            if burst and not r and (mhz := _sm_clock_now(pci_bus_id)):
                idle["sm_clock_mhz_start"] = float(mhz)
            with clock:             # the probes right before the first batch and right after the last
                if probe is not None:
                    probe.record(stream, 0)
                replicates.append(_batches(stream, launch, state, batches, flush, cuda_graph,
                                           gate if cuda_graph else None, start, end))
                if probe is not None:
                    probe.record(stream, 1)
                    stream.synchronize()
            if probe is not None:
                pairs.append(probe.pair())
    n = state["n"]
    per_launch = [x for rep in replicates for x in rep]
    med = statistics.median(per_launch)
    out = dict(median_us=med, min_us=min(per_launch), max_us=max(per_launch),
               spread=(max(per_launch) - min(per_launch)) / med, launches_per_batch=n,
               batches=len(per_launch), batch_us=per_launch,
               method="cuda_graph" if cuda_graph else "stream", l2_flush=bool(l2_flush),
               regime=regime, replicates=len(replicates),
               replicate_median_us=[statistics.median(rep) for rep in replicates],
               **clock.summary(), **clock.energy(n * len(per_launch)), **window_clock(pairs))
    if burst:
        out.update(idle, idle_wait_s=waited_s)
    return out


def _batches(stream, launch, state: dict, batches: int, flush, cuda_graph: bool, gate, start, end) -> list:
    """Time ``batches`` batches of ``state['n']`` launches on ``stream`` (one replicate of
    :func:`time_launches`): per-launch us of each batch. A gated batch the host could not enqueue in
    time lowers ``state['n']`` (and ``state['graph']``) and times every batch again."""
    import cupy
    per_launch = []
    while len(per_launch) < batches:
        n = state["n"]
        if flush is not None:
            flush.launch(stream) if cuda_graph else flush()
        if cuda_graph:
            gate.hold(stream)
            try:
                start.record(stream)
                state["graph"].launch(stream)
                end.record(stream)
            finally:
                gate.release()
            end.synchronize()
            if gate.timed_out():
                if n <= MIN_GATED_LAUNCHES:
                    raise RuntimeError(f"the host took more than {GATE_TIMEOUT_S} s to enqueue "
                                       f"one timed batch of {n} launches (a stalled or overloaded "
                                       "CPU); time again")
                # a graph whose nodes the driver submits one by one fills the stream's queue
                # behind the closed gate and the host blocks: fewer launches, all batches again
                state["n"] = max(MIN_GATED_LAUNCHES, n // 4)
                state["graph"] = _graph_of(stream, launch, state["n"])
                state["graph"].launch(stream)
                stream.synchronize()
                per_launch.clear()
                continue
        else:
            start.record(stream)
            for _ in range(n):
                launch()
            end.record(stream)
            end.synchronize()
        per_launch.append(cupy.cuda.get_elapsed_time(start, end) * 1000.0 / n)
    return per_launch


def gpu_state(pci_bus_id: str | None = None) -> dict:
    """SM clock (MHz), GPU temperature (C) and clock-event (throttle) reason bitmask from NVML.

    Returns {} when NVML is not available (the reading is then missing, never zero).
    """
    try:
        import pynvml
        h = _nvml_handle(pynvml, pci_bus_id)
        out = {"sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
               "temperature_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)}
        try:
            out["clock_event_reasons"] = pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)
        except (AttributeError, pynvml.NVMLError):
            out["clock_event_reasons"] = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)
        return out
    except Exception:  # noqa: BLE001 - NVML missing or not permitted: no reading
        return {}
