"""Every metric a run logs, declared once: name, unit, one-line description, where the number comes
from, and how it is rounded at log time to what the measurement supports (decimals, or significant
digits; neither: logged as measured, integers and exact counts):

| quantity | rounding |
| --- | --- |
| times (`median_us`, `min_us`, `max_us`, `replicate_median_us`), `throughput` | 5 significant digits |
| `jit_s` (one JIT's wall time) | 3 significant digits |
| `verify_max_error` | 4 significant digits |
| clocks (MHz), power (W), `theoretical_occupancy_pct` (%) | 1 decimal |
| `throughput_per_ghz`, `throughput_at_max_clock`, `pct_of_peak`, sweep seconds | 2 decimals |
| spreads, `speedup_vs_<family>` | 4 decimals; energy: 3 (J) and 6 (J per launch) |
| `ncu.<name>`: counts (byte, cycle, inst, ...) | as ncu gives them |
| `ncu.<name>` in % | 2 decimals (as ncu shows them) |
| `ncu.<name>`: every other unit (hz, byte/s, ratios, us) | 5 significant digits |
| registers, bytes, instructions, blocks, launches | exact |

One scale per quantity: occupancy is a percentage everywhere it is shown (``theoretical_occupancy_pct``,
``ncu.*_occupancy_pct``; runs logged before hold ``theoretical_occupancy`` as 0..1, which readers convert).

The loggers round through :func:`rounded`, the reports label their columns with :func:`label` and the
analysis (analysis/runs.py) documents its columns with :func:`describe`. A name with ``<...>`` is a
pattern (``speedup_vs_<family>``, ``sass_<op>``); the Nsight Compute metrics ``ncu.<name>`` are read
from their own table, conf/ncu/metrics.yaml (experiments.ncu.load_table), never repeated here.
"""
from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

from .ncu import PREFIX, load_table

__all__ = ["Metric", "DECLARED", "SPEEDUP", "PCT_OF_PEAK", "CLOCK_FIELDS", "KERNEL_CLOCK_FIELDS", "GPU_STATE",
           "REPLICATE_FIELDS",
           "table", "lookup", "rounded", "label", "describe", "undeclared", "units_line"]

SPEEDUP = "speedup_vs_{}"        # this run's throughput / the best baseline run's (reports.compare)
PCT_OF_PEAK = "pct_of_peak"      # 100 * this run's throughput / the peak run's (experiments.reports.compare)
# timing fields of experiments.gpu.timing.time_launches logged under the same names (NVML samples)
CLOCK_FIELDS = ("sm_clock_mhz_mean", "sm_clock_mhz_min", "sm_clock_mhz_max", "sm_clock_samples",
                "sm_clock_mhz_max_possible", "power_w_mean", "power_w_max", "power_limit_w",
                "sm_clock_mhz_window", "window_cycles", "window_sms", "energy_j", "energy_j_per_launch",
                "power_w_avg", "idle_wait_s", "sm_clock_mhz_start", "power_w_start")
# the replicates of a run's timed measurement (timing.repeats); replicate_median_us: MLflow steps 0..R-1
REPLICATE_FIELDS = ("replicate_median_us", "replicates", "replicate_spread")
# fields of experiments.families.peak.kernel_clock (a kernel's own cycle record) logged under the same names
KERNEL_CLOCK_FIELDS = ("mma_per_sm_cycle", "sm_clock_mhz_kernel", "kernel_cycles")
# experiments.gpu.timing.gpu_state's readings, logged as <field>_before and <field>_after the timing
GPU_STATE = {"sm_clock_mhz": ("MHz", "SM clock", "NVML nvmlDeviceGetClockInfo(NVML_CLOCK_SM)"),
             "temperature_c": ("C", "GPU temperature", "NVML nvmlDeviceGetTemperature")}


@dataclass(frozen=True)
class Metric:
    """One declared metric, or a pattern of them (a ``<...>`` part stands for any text)."""
    name: str
    unit: str
    description: str
    source: str
    decimals: int | None = None
    digits: int | None = None        # significant digits, where decimals do not fit the range

    def round(self, v):
        """``v`` rounded as declared (decimals, else significant digits); as it is otherwise, and for
        None, 0, an integer with significant digits or a value that is not finite."""
        if v is None or isinstance(v, bool):
            return v
        if self.decimals is not None:
            return round(v, self.decimals)
        if self.digits is not None and isinstance(v, float) and v and math.isfinite(v):
            return float(f"{v:.{self.digits}g}")
        return v

    @functools.cached_property
    def _regex(self) -> re.Pattern:
        return re.compile("".join(".+" if p.startswith("<") else re.escape(p)
                                  for p in re.split(r"(<[^>]+>)", self.name) if p))

    def matches(self, key: str) -> bool:
        """Whether the logged name ``key`` is this metric (or an instance of this pattern)."""
        return key == self.name if "<" not in self.name else bool(self._regex.fullmatch(key))


_M = Metric
_TIMED = "CUDA events over the timed batches (experiments.gpu.timing.time_launches)"
_NVML = "NVML samples every ~5 ms during the timed batches (experiments.gpu.timing)"
_PTXAS = "ptxas -v (experiments.build.assemble)"
_THR = "throughput's unit (tag throughput_unit)"

DECLARED: tuple[Metric, ...] = (
    # -- timing and result (experiments.runner.job)
    _M("throughput", "TFLOP/s, TOP/s or GB/s (tag throughput_unit)",
       "the family's work (2MNK for a GEMM) / median_us", _TIMED, digits=5),
    _M("median_us", "us", "median time per launch over the batches (all batches of all replicates, "
       "timing.repeats)", _TIMED, digits=5),
    _M("min_us", "us", "fastest batch, time per launch", _TIMED, digits=5),
    _M("max_us", "us", "slowest batch, time per launch", _TIMED, digits=5),
    _M("spread", "(max - min) / median", "spread of the batches' times per launch", _TIMED, 4),
    _M("launches_per_batch", "launches", "kernel launches in one timed batch", _TIMED),
    _M("batches", "batches", "timed batches, all replicates", _TIMED),
    _M("replicate_median_us", "us", "median time per launch of one replicate of the timed measurement "
       "(MLflow step = replicate 0..R-1)", _TIMED, digits=5),
    _M("replicates", "replicates", "replicates of the timed measurement, apart in time (timing.repeats)",
       _TIMED),
    _M("replicate_spread", "(max - min) / median", "spread of the replicates' medians (R >= 2)", _TIMED, 4),
    # -- verification and the JIT (experiments.gpu.worker)
    _M("verify_max_error", "|C - C_ref|", "largest error against the float64 reference",
       "experiments.gpu.verify against a float64 reference", digits=4),
    _M("verify_mismatches", "elements", "output elements outside the tolerance", "experiments.gpu.verify"),
    _M("verify_rtol", "tolerance", "runs logged before the tag verify_tolerance: the tolerance "
       "verification used (0 = exact)", "experiments.gpu.verify"),
    _M("jit_registers", "registers/thread", "registers of the loaded kernel", "CuPy RawModule num_regs"),
    _M("jit_local_bytes", "bytes/thread", "local memory of the loaded kernel",
       "CuPy RawModule local_size_bytes"),
    _M("jit_s", "s", "time to load (JIT) the kernel", "time.perf_counter around the module load", digits=3),
    # -- the SM clock and the power draw during timing
    _M("sm_clock_mhz_mean", "MHz", "mean SM clock during the timed batches", _NVML, 1),
    _M("sm_clock_mhz_min", "MHz", "lowest SM clock sample", _NVML),
    _M("sm_clock_mhz_max", "MHz", "highest SM clock sample", _NVML),
    _M("sm_clock_samples", "samples", "SM clock samples taken", _NVML),
    _M("sm_clock_mhz_max_possible", "MHz", "the GPU's highest SM clock", "NVML nvmlDeviceGetMaxClockInfo"),
    _M("power_w_mean", "W", "mean board power draw during the timed batches",
       "NVML nvmlDeviceGetPowerUsage samples", 1),
    _M("power_w_max", "W", "highest power sample", "NVML nvmlDeviceGetPowerUsage samples", 1),
    _M("power_limit_w", "W", "the enforced power limit", "NVML nvmlDeviceGetEnforcedPowerLimit", 1),
    _M("sm_clock_mhz_window", "MHz", "mean SM clock over the timed windows, counted by the SMs: their "
       "cycles / their ns between a probe before the first batch and one after the last",
       "probe kernel's %clock64 and %globaltimer per %smid (experiments.gpu.timing.window_clock)", 1),
    _M("window_cycles", "cycles", "an SM's cycles over the timed windows (mean over SMs)",
       "probe kernel's %clock64 (experiments.gpu.timing.window_clock)"),
    _M("window_sms", "SMs", "SMs the window probes recorded before and after",
       "probe kernel's %smid (experiments.gpu.timing.window_clock)"),
    _M("throughput_per_ghz", f"{_THR} per GHz", "throughput / (SM clock / 1000): sm_clock_mhz_window where "
       "measured, else sm_clock_mhz_mean", "derived (experiments.store.record.clock_metrics)", 2),
    _M("throughput_at_max_clock", _THR, "throughput x sm_clock_mhz_max_possible / SM clock (as in "
       "throughput_per_ghz): what the run would reach at the full clock if it scaled with it",
       "derived (experiments.store.record.clock_metrics)", 2),
    _M("energy_j", "J", "energy the board drew over the timed batches (all replicates; tag energy_source)",
       "NVML nvmlDeviceGetTotalEnergyConsumption, else power samples integrated (experiments.gpu.timing)", 3),
    _M("energy_j_per_launch", "J", "energy_j / launches timed", "derived (experiments.gpu.timing)", 6),
    _M("power_w_avg", "W", "energy_j / the timed windows' seconds", "derived (experiments.gpu.timing)", 1),
    _M("throughput_per_w", f"{_THR} per W", "throughput / power_w_avg (else power_w_mean): TFLOP/J for "
       "TFLOP/s", "derived (experiments.store.record.clock_metrics)", 3),
    # -- the burst regime (timing.regime=burst): the GPU idled back before the window
    _M("idle_wait_s", "s", "time waited for the GPU to idle back before the timed window(s)",
       "NVML power samples (experiments.gpu.timing.wait_idle)", 3),
    _M("sm_clock_mhz_start", "MHz", "SM clock as the timed window started", "NVML nvmlDeviceGetClockInfo"),
    _M("power_w_start", "W", "power draw when the wait for idle ended", "NVML power samples", 1),
    # -- the kernel's own cycle record of its last timed launch (the peak family's MMA loops)
    _M("mma_per_sm_cycle", "MMA/(SM cycle)", "MMA instructions per SM per cycle of the SM's own clock",
       "the kernel's clock64 and MMA counts (experiments.families.peak.kernel_clock)", 5),
    _M("sm_clock_mhz_kernel", "MHz", "the SMs' cycles / their ns during the last timed launch",
       "the kernel's clock64 and globaltimer (experiments.families.peak.kernel_clock)", 1),
    _M("kernel_cycles", "cycles", "the longest SM's span of the last timed launch",
       "the kernel's clock64 (experiments.families.peak.kernel_clock)"),
    # -- the GPU's state before and after the timing (experiments.gpu.timing.gpu_state)
    *(_M(f"{field}_{when}", unit, f"{what} {when} the timing", source)
      for field, (unit, what, source) in GPU_STATE.items() for when in ("before", "after")),
    # -- relations between runs (experiments.reports.compare)
    _M(SPEEDUP.format("<family>"), "x", "throughput / the best verified run's of baseline family <family> "
       "(wmma, dp4a, cublas), same GPU, size and precision", "experiments.reports.compare.speedups", 4),
    _M(PCT_OF_PEAK, "%", "100 x throughput / the peak family's, same GPU, driver, precision and instruction "
       "(tag peak_run)", "experiments.reports.compare", 2),
    # -- static: the assembled kernel (experiments.runner.kernel)
    _M("threads", "threads/block", "threads per block", "the kernel's spec"),
    _M("smem_dynamic_bytes", "bytes/block", "dynamic shared memory per block", "the kernel's spec"),
    _M("smem_static_bytes", "bytes/block", "static shared memory per block", _PTXAS),
    _M("registers", "registers/thread", "registers per thread", _PTXAS),
    _M("spill_stores_bytes", "bytes/thread", "spill stores", _PTXAS),
    _M("spill_loads_bytes", "bytes/thread", "spill loads", _PTXAS),
    _M("stack_frame_bytes", "bytes/thread", "stack frame", _PTXAS),
    _M("theoretical_occupancy_pct", "%", "resident warps / the SM's max, in %, that the launch allows (with "
       "launch.blocks_per_sm's padding)", "ptxas -v and the GPU's limits (experiments.build.assemble)", 1),
    _M("theoretical_occupancy", "fraction of the SM's warps", "runs logged before theoretical_occupancy_pct: "
       "the same as 0..1", "ptxas -v and the GPU's limits (experiments.build.assemble)"),
    _M("blocks_per_sm", "blocks", "resident blocks per SM that the launch allows (with "
       "launch.blocks_per_sm's padding)", "ptxas -v and the GPU's limits (experiments.build.assemble)"),
    _M("smem_padding_bytes", "bytes/block", "dynamic shared memory added to each block's launch to cap the "
       "resident blocks per SM (launch.blocks_per_sm)", "experiments.build.assemble.smem_padding"),
    _M("sass_instructions", "instructions", "instructions in the kernel's SASS", "cuobjdump -sass"),
    _M("sass_<op>", "instructions", "SASS instructions of class <op> (experiments.build.assemble.SASS_OPS)",
       "cuobjdump -sass"),
    # -- Nsight Compute (experiments.ncu.profile); ncu.<name> itself comes from conf/ncu/metrics.yaml
    _M("ncu_over_event_time", "ratio", "ncu.duration_us / median_us", "derived (experiments.ncu.profile)"),
    # -- a sweep's parent run (experiments.runner.sweep.gpu_time)
    _M("sweep_wall_s", "s", "the sweep's wall time", "time.time", 2),
    _M("gpu_busy_s", "s", "seconds the sweep's runs held a GPU, summed over GPUs", "tags gpu_start_unix, "
       "gpu_end_unix", 2),
    _M("gpu_busy_share", "fraction", "gpu_busy_s / (sweep_wall_s x gpus)", "derived", 4),
    _M("gpus", "GPUs", "GPUs the sweep's runs held", "tags gpu_uuid, pci_bus_id"),
    _M("gpu_overlaps", "pairs", "pairs of runs that held one GPU at the same time (0 expected)",
       "tags gpu_start_unix, gpu_end_unix"),
    _M("runs_reused", "runs", "runs the sweep found measured by an earlier sweep", "experiments.store.track"),
)

_BY_NAME = {m.name: m for m in DECLARED}
# units of conf/ncu/metrics.yaml that count things: logged as ncu gives them
NCU_COUNTS = ("byte", "cycle", "inst", "block", "register/thread", "conflict", "wavefront", "sector")


def _ncu_metric(m) -> Metric:
    """The declaration of one entry of the ncu table (experiments.ncu.Metric)."""
    names = m.ncu.get("*") or "; ".join(f"{a}: {n}" for a, n in m.ncu.items())
    what = (f"{m.text[0]}: {m.text[1]}" if m.text else f"warps stalled on {m.name[len('stall_'):]}, per "
            "issued instruction" if m.name.startswith("stall_") else m.name.replace("_", " "))
    pct, count = m.unit == "%", m.unit in NCU_COUNTS
    return Metric(m.key, m.unit, what, f"ncu {names} (conf/ncu/metrics.yaml)", decimals=2 if pct else None,
                  digits=None if pct or count else 5)


@functools.cache
def table() -> dict[str, Metric]:
    """Every declaration by name: :data:`DECLARED`, the entries of conf/ncu/metrics.yaml as
    ``ncu.<name>`` and, last, the pattern ``ncu.<name>`` for a metric set's own definitions."""
    out = dict(_BY_NAME)
    out.update({m.key: _ncu_metric(m) for m in load_table().metrics.values()})
    rest = Metric(PREFIX + "<name>", "the metric set's unit",
                  "a metric defined in a metric set (conf/ncu/*.yaml)", "ncu")
    return {**out, rest.name: rest}



def lookup(key: str) -> Metric | None:
    """The declaration of the logged name ``key``: the exact name first, else the first pattern that
    matches; None for a name nothing declares. Only an ``ncu.`` name reads conf/ncu/metrics.yaml."""
    decl = table() if key.startswith(PREFIX) else _BY_NAME
    return decl.get(key) or next((m for m in decl.values() if "<" in m.name and m.matches(key)), None)


def rounded(values: dict) -> dict:
    """``values`` (metric name -> number) with each number rounded as declared (:meth:`Metric.round`,
    the module's table), in the same order; undeclared names are kept as they are (the test suite
    checks that every logged name is declared)."""
    out = {}
    for key, v in values.items():
        m = lookup(key)
        out[key] = m.round(v) if m is not None else v
    return out


def label(key: str, words: str) -> str:
    """A report's column header: ``words`` and the metric's unit, e.g. label("median_us", "median") ->
    "median us"; where ``words`` holds ``{unit}`` the unit goes there (label("pct_of_peak",
    "{unit} of peak") -> "% of peak"). Raises KeyError for an undeclared name."""
    m = lookup(key)
    if m is None:
        raise KeyError(f"metric {key!r} is not declared in experiments/metrics.py")
    return words.format(unit=m.unit) if "{unit}" in words else f"{words} {m.unit}"


def describe(key: str) -> str:
    """The unit and meaning of a logged name, e.g. "us: median time per launch over the batches";
    "" for an undeclared name."""
    m = lookup(key)
    return f"{m.unit}: {m.description}" if m else ""


def undeclared(keys) -> list[str]:
    """The names among ``keys`` that nothing in :func:`table` declares, sorted."""
    return sorted(k for k in keys if lookup(k) is None)


def units_line(keys) -> str:
    """One markdown line with the unit of each declared metric among the logged names ``keys``, in
    declaration order, a pattern once (e.g. "Units: `throughput` TFLOP/s, ...; `median_us` us;
    `sass_<op>` instructions"), for a description the MLflow UI shows beside the raw numbers; "" when
    none is declared."""
    found = {m.name: m for m in filter(None, map(lookup, set(keys)))}
    order = list(table())
    parts = [f"`{m.name}` {m.unit}" for m in sorted(found.values(), key=lambda m: order.index(m.name))]
    return "Units: " + "; ".join(parts) + "." if parts else ""
