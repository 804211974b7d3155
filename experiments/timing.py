"""Median-of-batches timing with CUDA events, and GPU state (NVML) around it.

Method: ``warmup`` launches (the first pays the driver JIT), a single timed launch to size the
batch, then ``batches`` batches of ``L`` back-to-back launches between two CUDA events, where L is
chosen so that one batch lasts at least ``min_batch_ms``. With ``cuda_graph`` the L launches are
captured once into a CUDA graph and each batch is one graph launch, so Python's launch overhead
does not enter small problems. Per-launch time = batch time / L.
"""
from __future__ import annotations

import math
import statistics

__all__ = ["time_launches", "gpu_state", "tflops"]


def tflops(m: int, n: int, k: int, us: float) -> float:
    """Throughput in TFLOP/s (or TOP/s for integer types) of an M x N x K GEMM: 2*M*N*K / time."""
    return 2.0 * m * n * k / (us * 1e-6) / 1e12


def time_launches(launch, *, warmup: int = 3, batches: int = 10, min_batch_ms: float = 20.0,
                  max_launches: int = 2000, cuda_graph: bool = True, l2_flush: bool = False) -> dict:
    """Time ``launch()`` (enqueues one kernel on the current CuPy stream).

    Returns per-launch times in microseconds: median_us, min_us, max_us, spread (max-min)/median,
    and launches_per_batch, batches, method, batch_us (list). Raises what the launches raise
    (a faulting kernel surfaces at the first synchronize).
    """
    import cupy
    stream = cupy.cuda.Stream(non_blocking=True)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    flush = None
    if l2_flush:
        l2 = cupy.cuda.Device().attributes["L2CacheSize"]
        flush = cupy.empty(2 * l2, dtype=cupy.uint8)
    with stream:
        for _ in range(max(1, warmup)):
            launch()
        stream.synchronize()
        start.record(stream)
        launch()
        end.record(stream)
        end.synchronize()
        one_ms = max(cupy.cuda.get_elapsed_time(start, end), 1e-4)
        n = int(min(max_launches, max(1, math.ceil(min_batch_ms / one_ms))))
        if cuda_graph:
            stream.begin_capture()
            for _ in range(n):
                launch()
            graph = stream.end_capture()
            run = lambda: graph.launch(stream)  # noqa: E731
            run()  # upload the graph before timing
        else:
            def run():
                for _ in range(n):
                    launch()
        stream.synchronize()
        per_launch = []
        for _ in range(batches):
            if flush is not None:
                flush.fill(1)
            start.record(stream)
            run()
            end.record(stream)
            end.synchronize()
            per_launch.append(cupy.cuda.get_elapsed_time(start, end) * 1000.0 / n)
    med = statistics.median(per_launch)
    return dict(median_us=med, min_us=min(per_launch), max_us=max(per_launch),
                spread=(max(per_launch) - min(per_launch)) / med, launches_per_batch=n,
                batches=batches, batch_us=per_launch,
                method="cuda_graph" if cuda_graph else "stream", l2_flush=bool(l2_flush))


def gpu_state(pci_bus_id: str | None = None) -> dict:
    """SM clock (MHz), GPU temperature (C) and clock-event (throttle) reason bitmask from NVML.

    Returns {} when NVML is not available (the reading is then missing, never zero).
    """
    try:
        import pynvml
        pynvml.nvmlInit()
        h = (pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id) if pci_bus_id
             else pynvml.nvmlDeviceGetHandleByIndex(0))
        out = {"sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
               "temperature_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)}
        try:
            out["clock_event_reasons"] = pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)
        except (AttributeError, pynvml.NVMLError):
            out["clock_event_reasons"] = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)
        return out
    except Exception:  # noqa: BLE001 - NVML missing or not permitted: no reading
        return {}
