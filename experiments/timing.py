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
"""
from __future__ import annotations

import math
import statistics
import threading

__all__ = ["time_launches", "gpu_state", "tflops", "ClockSampler", "clock_summary"]


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


class ClockSampler:
    """Samples the SM clock (MHz) and the power draw (mW) of one GPU with NVML in a background thread.

    ``with ClockSampler(pci_bus_id, interval_s=0.005) as clk: ...`` takes a sample on entry, then one
    every ``interval_s`` seconds (NVML updates the reading about that often), and one on exit;
    ``clk.summary()`` gives :func:`clock_summary` of them (a GPU whose power NVML does not report
    gives clock samples only). ``pci_bus_id`` selects the GPU (None: NVML
    device 0). Without NVML (not installed, no driver, not permitted) it samples nothing and
    ``summary()`` is {}; it never raises for NVML's sake.
    """

    def __init__(self, pci_bus_id: str | None = None, interval_s: float = 0.005):
        self.pci_bus_id, self.interval_s = pci_bus_id, interval_s
        self.samples: list = []
        self.power_mw: list = []
        self.max_possible = self.power_limit = None
        self._nvml = self._handle = self._thread = None
        self._stop = threading.Event()

    def _sample(self) -> None:
        try:
            self.samples.append(self._nvml.nvmlDeviceGetClockInfo(self._handle, self._nvml.NVML_CLOCK_SM))
        except Exception:  # noqa: BLE001 - a failed reading is a missing sample
            pass
        try:
            self.power_mw.append(self._power())
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

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> ClockSampler:
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
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="sm-clock-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._sample()
            self._thread = None

    def summary(self) -> dict:
        """:func:`clock_summary` of the samples taken (MHz, W); {} without NVML."""
        return clock_summary(self.samples, self.max_possible, self.power_mw, self.power_limit)


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


class _Gate:
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

    @classmethod
    def get(cls) -> _Gate:
        """The gate of the current device (made on first use)."""
        import cupy
        dev = cupy.cuda.Device().id
        if dev not in cls._by_device:
            cls._by_device[dev] = cls()
        return cls._by_device[dev]

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


def time_launches(launch, *, warmup: int = 3, batches: int = 10, min_batch_ms: float = 20.0,
                  max_launches: int = 2000, cuda_graph: bool = True, l2_flush: bool = False,
                  pci_bus_id: str | None = None, clock_interval_s: float = 0.005) -> dict:
    """Time ``launch()`` (enqueues one kernel on the current CuPy stream; it must be capturable in a
    CUDA graph unless ``cuda_graph`` is False).

    Returns per-launch times in microseconds: median_us, min_us, max_us, spread (max-min)/median,
    and launches_per_batch, batches, method, batch_us (list); with NVML also the SM clock during the
    timed batches, sampled every ``clock_interval_s`` seconds on the GPU ``pci_bus_id`` (None: NVML
    device 0) from the first batch to the end of the last (:func:`clock_summary`: sm_clock_mhz_mean,
    _min, _max in MHz, sm_clock_samples, sm_clock_mhz_max_possible). With ``cuda_graph`` every
    launch on the timing stream is a graph replay and each batch waits behind the gate (module
    docstring); without it the launches are direct and the host's launch time is part of a batch.
    Raises what the launches raise (a faulting kernel surfaces at the first synchronize), and
    RuntimeError when the host took more than GATE_TIMEOUT_S to enqueue one batch of
    MIN_GATED_LAUNCHES launches (a larger batch refused so is retried with a quarter of its launches,
    and ``launches_per_batch`` says how many were timed).
    """
    import cupy
    stream = cupy.cuda.Stream(non_blocking=True)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    flush = None
    with stream:
        if l2_flush:
            buf = cupy.empty(2 * cupy.cuda.Device().attributes["L2CacheSize"], dtype=cupy.uint8)
            flush = _graph_of(stream, lambda: buf.fill(1), 1) if cuda_graph else (lambda: buf.fill(1))
        if cuda_graph:
            gate = _Gate.get()
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
        if cuda_graph:
            graph = _graph_of(stream, launch, n)
            graph.launch(stream)  # upload the graph before timing
        stream.synchronize()
        per_launch = []
        with ClockSampler(pci_bus_id, clock_interval_s) as clock:
            while len(per_launch) < batches:
                if flush is not None:
                    flush.launch(stream) if cuda_graph else flush()
                if cuda_graph:
                    gate.hold(stream)
                    try:
                        start.record(stream)
                        graph.launch(stream)
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
                        n = max(MIN_GATED_LAUNCHES, n // 4)
                        graph = _graph_of(stream, launch, n)
                        graph.launch(stream)
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
    med = statistics.median(per_launch)
    return dict(median_us=med, min_us=min(per_launch), max_us=max(per_launch),
                spread=(max(per_launch) - min(per_launch)) / med, launches_per_batch=n,
                batches=batches, batch_us=per_launch,
                method="cuda_graph" if cuda_graph else "stream", l2_flush=bool(l2_flush),
                **clock.summary())


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
