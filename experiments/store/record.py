"""The run record: the names of the params, tags and artifacts a run carries (its metrics are declared,
with their units, in experiments.metrics), and how a run presents itself in the MLflow UI (name,
one-line description, decoded tags).

Tracking (``job``, ``sweep``), the report and the analysis read names from here, so a rename is one edit.
"""
from __future__ import annotations

import re

from ..metrics import CLOCK_FIELDS, DECLARED, KERNEL_CLOCK_FIELDS, PCT_OF_PEAK, SPEEDUP, rounded, units_line

__all__ = ["METRICS", "TAGS", "ARTIFACTS", "OUTCOMES", "CLOCK_FIELDS", "clock_reasons", "clock_metrics",
           "replicate_metrics", "run_name", "SPEEDUP_RUN", "swept_axes", "winners", "padded",
           "with_analysis", "ANALYSIS_HEAD", "size_label", "NONE", "SWEPT_PARAMS", "EMULATED", "emulated",
           "emulated_note", "occupancy_pct", "tolerance_text", "result_line", "params_of", "outcome_of",
           "sweep_note", "plotting", "throughput_figure", "BASELINES", "PEAK", "SPEEDUP",
           "PCT_OF_PEAK", "KERNEL_CLOCK_FIELDS", "MEMBER", "NEW", "REUSED", "reused_in", "reused_count",
           "FAILED_STAGES", "failure_summary"]

# the mark of an emulated kernel's run (:func:`emulated`) in its name, description and report rows
EMULATED = "EMULATED"
# the value of a param a run has no value of (``variant``, ``study_kernel``, ``size``: params_of, size_label)
NONE = "none"
# params every run carries for a sweep's views to group and compare on; not part of any run key
SWEPT_PARAMS = ("variant", "study_kernel", "size", "precision")

# tag naming the run a speedup_vs_<family> divides by (experiments.reports.compare.speedups_with_runs)
SPEEDUP_RUN = SPEEDUP + ".run"

# families whose runs are the reference points of the others (docs/DESIGN.md, "Speedups and peaks")
BASELINES = ("wmma", "dp4a", "cublas")
PEAK = "peak"

# tag of a run that belongs to the sweep whose parent run id follows the dot, with its value: NEW (the
# sweep made the run) or REUSED (the sweep found it measured by an earlier one); experiments.store.track
MEMBER, NEW, REUSED = "in_sweep.{}", "new", "reused"

# metric -> unit of every metric with a name of its own (patterns expanded where their values are known);
# the declarations, with descriptions, sources and decimals, are experiments.metrics
_SPEEDUP = next(m for m in DECLARED if m.matches(SPEEDUP.format(PEAK)))
METRICS = {**{m.name: m.unit for m in DECLARED if "<" not in m.name},
           **{SPEEDUP.format(b): _SPEEDUP.unit for b in BASELINES}}

TAGS = {
    "kernel": "PTX entry name, derived from the spec",
    "outcome": "verified | static | skipped | failed | interrupted",
    "run_key": "identity of the measurement: hash of spec, PTX, size, GPU, driver, toolchain, settings",
    "backend": "gpu | static", "arch": "sm_XY the kernel was built for",
    "ptx_sha256": "hash of the PTX text", "ptxas_version": "ptxas that gave the resources",
    "cuobjdump_version": "cuobjdump that gave the SASS", "nvdisasm_version": "nvdisasm (cuobjdump's backend)",
    "git_commit": "the project's commit",
    "gpu": "GPU name", "compute_capability": "e.g. 90", "driver": "NVIDIA driver",
    "cuda_driver": "CUDA version of the driver", "cuda_runtime": "CUDA runtime of CuPy", "cupy": "CuPy",
    "verified": "true | false", "throughput_unit": "TFLOP/s | TOP/s | GB/s (the family's unit())",
    "family_note": "what a family's run is not like-for-like with the default family's kernels",
    "peak_run": "the run id of the peak measurement pct_of_peak divides by",
    "clocks_throttled": "NVML clock-event reasons during timing, decoded (none = full clocks)",
    "timing_method": "how the batches were launched", "l2_flush": "L2 overwritten between batches",
    "energy_source": "nvml_energy_counter | power_samples: where energy_j came from; none: the timed window "
                     "was shorter than NVML's readings follow (experiments.gpu.timing.MIN_ENERGY_WINDOW_S)",
    "burst_idle": "reached | timed out | waited: whether the GPU idled back before a burst window "
                  "(waited: no power reading, timing.idle_s waited)",
    "gpu_start_unix": "when this run took the GPU (s)", "gpu_end_unix": "when it gave it back (s)",
    "failed_stage": "assemble | verify | gpu | job", "error": "why the run FAILED",
    "sweep_values": "a sweep's values as they ran, where Hydra expanded one otherwise than it is written",
    "long_values": "params and tags longer than MLflow allows: each keeps its start, the whole value is "
                   "the artifact long_values/<name>.txt",
    "verify_tolerance": "the tolerance verification used: 'exact' (integer types, whatever verify.rtol "
                        "says) or the rtol (verify.rtol; fp8 on wgmma its own, experiments.dtypes.FP8_RTOL)",
    "speedup_vs_<family>.run": "the run speedup_vs_<family> divides by: '<run id> <run name>'",
    "skip_reason": "why the run was skipped or interrupted", "study_kernel": "the study's kernel name",
    "mma_native": "true | false | unknown: the SASS holds the tensor-core MMA of the element type",
    "mma_native_reason": "what the SASS holds instead (e.g. emulation of .s4 on sm_90)",
    "tile_auto": "true: tile=auto chose this run's block tile and warps (params tile.*: the choice)",
    "tile_auto_sms": "SMs tile=auto planned the waves for, and where the number came from",
    MEMBER.format("<parent run id>"): f"{NEW} | {REUSED}: the run belongs to that sweep, which made it or "
                                      "reused it (found it measured by an earlier sweep)",
}

# the kernel's PTX and SASS are logged as .txt so that the UI previews them
ARTIFACTS = {"ptx": "kernel.ptx.txt", "sass": "kernel.sass.txt", "ptxas": "ptxas_report.txt",
             "config": "config.yaml", "batches": "batch_us.txt", "traceback": "traceback.txt",
             "figure": "throughput_vs_size.png", "cuda": "kernel.cu.txt",
             "long_value": "long_values/{}.txt"}

# failed_stage -> how the failed runs of that stage read in a sweep's summary and its FAILED reason
FAILED_STAGES = {"assemble": "rejected by the assembler", "verify": "wrong result(s)", "gpu": "GPU fault(s)",
                 "job": "job(s) could not run"}

OUTCOMES = ("verified", "static", "skipped", "failed", "interrupted")

# NVML clock-event reason bits (nvml.h, nvmlClocksEventReason*)
_CLOCK_REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
                  0x10: "sync_boost", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake",
                  0x100: "display_clock"}


def clock_reasons(mask: int | None) -> str:
    """NVML clock-event bitmask as names joined by '+', e.g. 4 -> 'sw_power_cap'; 0 -> 'none';
    None (no reading) -> 'unknown'. Unknown bits appear as hex."""
    if mask is None:
        return "unknown"
    names = [name for bit, name in _CLOCK_REASONS.items() if mask & bit]
    rest = mask & ~sum(_CLOCK_REASONS)
    return "+".join(names + ([hex(rest)] if rest else [])) or "none"


def size_label(size: tuple[int, int, int] | None) -> str:
    """The param ``size`` of a run: ``8192`` for a square problem, ``MxNxK`` otherwise, :data:`NONE` for
    a run measured at no size (a static run, a family that ignores the size)."""
    if size is None:
        return NONE
    m, n, k = size
    return str(m) if m == n == k else f"{m}x{n}x{k}"


def run_name(family, spec, size: tuple[int, int, int] | None = None, variant: str | None = None,
             emulated: bool = False) -> str:
    """A run's name, made to read well when the UI cuts it: what a sweep varies first, the variant
    (``variant=NAME`` that chose the kernel, where one did: the kernels of a study differ there first),
    then the size (``512x1024x256`` for a non-square size; none for static runs and for families that
    ignore it), then the family's own rule (``family.name_tokens(spec)``: the default family's
    ``8192 int8 bk64 m16n8k32 s3 256x128``) or, without one, the family, the precision and the values of
    its option axes, e.g. ``int8_wmma 1024 wmma int8 s32 128x128 2x4`` or ``peak int8 m16n8k32``.
    ``emulated``: the kernel emulates its MMA (:func:`emulated`): :data:`EMULATED` follows the size."""
    parts = [variant] if variant and variant != NONE else []
    if size is not None:
        parts.append(size_label(size))
    if emulated:
        parts.append(EMULATED)
    own = family.name_tokens(spec)
    if own is not None:
        return " ".join(parts + own)
    p = spec.p
    parts += [spec.family, spec.precision]
    parts += [_axis_label(a, p[a]) for a in family.axes if a != "precision" and a in p]
    return " ".join(parts)


def clock_metrics(throughput: float, timing: dict) -> dict:
    """The SM clock and energy metrics of a verified run from the timing dict of ``time_launches``:
    the :data:`CLOCK_FIELDS` it holds, ``throughput_per_ghz`` (throughput / clock in GHz) and
    ``throughput_at_max_clock`` (throughput x max possible / clock), both in throughput's unit, where
    the clock is the SMs' own count over the timed window (``sm_clock_mhz_window``) when measured, else
    NVML's mean sample; ``throughput_per_w`` (throughput / ``power_w_avg``, the energy over the
    window, else, sustained only, / the mean power sample); the :data:`KERNEL_CLOCK_FIELDS` it holds (a
    kernel's own cycle record), with or without NVML. Returns {} when nothing was read: never
    invented. Rounded to the decimals of experiments.metrics."""
    out = {f: timing[f] for f in (*CLOCK_FIELDS, *KERNEL_CLOCK_FIELDS) if timing.get(f) is not None}
    clock = out.get("sm_clock_mhz_window") or out.get("sm_clock_mhz_mean")
    if clock:
        out["throughput_per_ghz"] = throughput / (clock / 1000.0)
        if out.get("sm_clock_mhz_max_possible"):
            out["throughput_at_max_clock"] = throughput * out["sm_clock_mhz_max_possible"] / clock
    out = rounded(out)
    # per W of the energy over the window; sustained, else of NVML's mean sample (the GPU at its steady
    # draw); a burst window is too short for NVML's readings, which still show the idle draw then
    sampled = out.get("power_w_mean") if timing.get("regime", "sustained") != "burst" else None
    if watts := out.get("power_w_avg") or sampled:
        out.update(rounded({"throughput_per_w": throughput / watts}))
    return out


def replicate_metrics(timing: dict) -> tuple[dict, dict]:
    """(metrics, series) of the replicates in a timing dict of ``time_launches``: ``replicates`` (R)
    and, for R >= 2, ``replicate_spread`` ((max - min) / median of the replicates' medians); the series
    ``replicate_median_us`` (one value per replicate, logged as MLflow steps 0..R-1). Empty without
    replicate medians."""
    reps = list(timing.get("replicate_median_us") or ())
    if not reps:
        return {}, {}
    import statistics
    out = {"replicates": len(reps)}
    if len(reps) >= 2:
        out["replicate_spread"] = (max(reps) - min(reps)) / statistics.median(reps)
    return rounded(out), {"replicate_median_us": [rounded({"replicate_median_us": v})["replicate_median_us"]
                                                  for v in reps]}


def result_line(size, median_us: float, throughput: float, unit: str, spread: float, clocks: str,
                clock: dict | None = None) -> str:
    """One-line result of a verified run, for its description; ``clock``: :func:`clock_metrics`
    (the mean SM clock during timing and the GPU's highest, MHz; the mean power draw and the limit,
    W; a kernel's own MMA instructions per SM per cycle and clock), left out when empty."""
    m, n, k = size
    sm = ""
    clock = clock or {}
    mhz = clock.get("sm_clock_mhz_window") or clock.get("sm_clock_mhz_mean")
    if mhz:
        top = clock.get("sm_clock_mhz_max_possible")
        sm = f"; SM clock {mhz:.0f} MHz" + (f" of {top:.0f}" if top else "")
        sm += " (counted by the SMs)" if clock.get("sm_clock_mhz_window") else ""
        if watts := clock.get("power_w_avg") or clock.get("power_w_mean"):
            cap = clock.get("power_limit_w")
            sm += f", {watts:.0f} W" + (f" of {cap:.0f}" if cap else "")
    if clock.get("energy_j"):
        sm += (f"; {clock['energy_j']:.2f} J, {1000 * clock['energy_j_per_launch']:.3f} mJ per launch"
               + (f", {clock['throughput_per_w']:.3f} {unit}/W" if clock.get("throughput_per_w") else ""))
    if clock.get("idle_wait_s") is not None:
        start = clock.get("sm_clock_mhz_start")
        sm += (f"; burst after {clock['idle_wait_s']:.1f} s idle"
               + (f", clock at start {start:.0f} MHz" if start else ""))
    if clock and clock.get("mma_per_sm_cycle") and clock.get("sm_clock_mhz_kernel"):
        sm += (f"; {clock['mma_per_sm_cycle']:.4f} MMA per SM and cycle at "
               f"{clock['sm_clock_mhz_kernel']:.0f} MHz (the kernel's own count)")
    return (f"{m}x{n}x{k}: {median_us:.1f} us, {throughput:.1f} {unit} (spread {spread:.1%}), verified{sm}; "
            f"clock-event reasons during timing: {clocks}")


def params_of(flat_config: dict, family=None, spec_flat: dict | None = None,
              variant: str | None = None) -> dict:
    """The run's params: the flattened config without ``tracking.*`` (where the store lives is not a
    property of the run); given the kernel's ``family`` and its spec (``spec_flat``), what the family
    logs of them (``family.run_params``: ``family`` and ``spec.<key>`` values, without the config keys
    it does not read). Every family logs the axes a sweep may vary (:data:`SWEPT_PARAMS`), so that the
    runs of one sweep compare and group on them: ``variant`` (the ``variant=NAME`` that chose the
    kernel, else :data:`NONE`), ``study_kernel`` (the study's kernel name, else :data:`NONE`) and
    ``precision``; ``size`` is the job's, per run (:func:`size_label`)."""
    params = {k: v for k, v in flat_config.items() if not k.startswith("tracking.")}
    if family is not None:
        params = family.run_params(params, spec_flat or {})
    params["variant"] = variant or params.get("variant") or NONE
    params.setdefault("size", NONE)
    if params.get("study_kernel") in (None, "null", "None", ""):
        params["study_kernel"] = NONE
    return params


def tolerance_text(rtol: float) -> str:
    """The tag ``verify_tolerance`` of a verification with relative tolerance ``rtol``: 'exact' for 0,
    else the number (e.g. '0.001')."""
    return "exact" if rtol == 0 else f"{rtol:g}"


def occupancy_pct(metrics: dict) -> float | None:
    """A run's theoretical occupancy in % (metric ``theoretical_occupancy_pct``; runs logged before it
    hold ``theoretical_occupancy`` as 0..1), or None where it has neither."""
    if metrics.get("theoretical_occupancy_pct") is not None:
        return metrics["theoretical_occupancy_pct"]
    old = metrics.get("theoretical_occupancy")
    return None if old is None else round(100 * old, 1)


def emulated(tags: dict) -> bool:
    """Whether a run's kernel emulates the tensor-core MMA of its element type (tag ``mma_native=false``:
    its numbers are ptxas' emulation, not the tensor cores'; :data:`EMULATED` marks them)."""
    return tags.get("mma_native") == "false"


def emulated_note(tags: dict) -> str:
    """The start of an emulated kernel's run description (:func:`emulated`): 'EMULATED MMA (<what the
    SASS holds instead>): '; '' for any other run."""
    if not emulated(tags):
        return ""
    why = tags.get("mma_native_reason", "")
    return f"{EMULATED} MMA{f' ({why})' if why else ''}: not the tensor cores' throughput. "


def outcome_of(run) -> str:
    """A run's outcome tag, or its status in lower case for runs tracked before outcomes existed."""
    return run.data.tags.get("outcome", run.info.status.lower())


def failure_summary(failed: list, total: int) -> str:
    """Why a sweep FAILED: how many of its ``total`` runs (MLflow runs) failed, by stage (tag
    ``failed_stage``, :data:`FAILED_STAGES`), e.g. '2 of 4 run(s) failed: 1 rejected by the assembler,
    1 wrong result'."""
    import collections
    stages = collections.Counter(r.data.tags.get("failed_stage", "") for r in failed)
    parts = [f"{n} {FAILED_STAGES.get(stage, stage or 'failed')}" for stage, n in sorted(stages.items())]
    return f"{len(failed)} of {total} run(s) failed: {', '.join(parts)}"


def reused_in(run, parent: str | None) -> bool:
    """Whether the sweep ``parent`` reused ``run`` (found it measured by an earlier sweep: tag
    in_sweep.<parent> = reused); False for no sweep (None)."""
    return parent is not None and run.data.tags.get(MEMBER.format(parent)) == REUSED


def reused_count(runs: list, parent: str | None) -> int:
    """How many of ``runs`` the sweep ``parent`` reused (:func:`reused_in`)."""
    return sum(reused_in(r, parent) for r in runs)


def sweep_note(command: str, runs: list, parent: str | None = None, replicates=None) -> str:
    """The parent run's description (Markdown, the first screen of the sweep in the MLflow UI): the
    command, the outcome counts (and how many of the runs the sweep ``parent`` reused from earlier
    sweeps), what was swept (:func:`swept_axes`), the winner per precision (with ``data=<kind>`` where
    not full) and size with its margin over the runner-up (:func:`winners`; ``replicates(run)`` -> the
    run's replicate medians in us, to say whether the margin is beyond the replicate noise), the
    skipped combinations with their reasons, the failures, and the units of the metrics the runs
    logged (experiments.metrics.units_line). The table is fixed-width text in a code block: MLflow's
    Markdown preview draws table cells without padding. ``python -m analysis.report`` adds its verdicts
    and a link to its report below (:func:`with_analysis`)."""
    import collections
    counts = collections.Counter(outcome_of(r) for r in runs)
    reused = reused_count(runs, parent)
    lines = [f"`{command}`", "", ", ".join(f"{n} {o}" for o, n in sorted(counts.items()))
             + (f"; {reused} of them reused (measured by an earlier sweep)" if reused else "") + "."]
    if axes := swept_axes(runs):
        lines += ["", "Swept: " + "; ".join(f"{k} ({len(v)}): {', '.join(v)}" for k, v in axes.items()) + "."]
    if rows := winners(runs, parent, replicates):
        lines += ["", "Winner per precision and size, and its margin over the runner-up:", "", "```text",
                  *padded(rows), "```"]
    skipped = [r for r in runs if outcome_of(r) == "skipped"]
    if skipped:
        lines += ["", "Skipped combinations (they cannot exist; not failures):"]
        lines += [f"- {r.info.run_name[len('skipped '):]}: {r.data.tags.get('skip_reason', '')}"
                  for r in skipped]
    failed = [r for r in runs if outcome_of(r) == "failed"]
    if failed:
        lines += ["", "Failed:"] + [f"- {r.info.run_name}: {r.data.tags.get('error', '').splitlines()[0]}"
                                    for r in failed if r.data.tags.get("error")]
    if units := units_line({k for r in runs for k in r.data.metrics}):
        lines += ["", units]
    return "\n".join(lines)


# params that never tell a sweep's points apart (bookkeeping, or another spelling of a swept value)
_NOT_AXES = ("verify.seed_used", "problem.", "spec.", "tracking.", "study_kernel")


def _natural(value: str) -> list:
    """Sort key of a param value: its digit runs as numbers (``32 < 64 < 128``, ``m16n8k16 < m16n8k32``)."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", value) if t]


def swept_axes(runs: list) -> dict[str, list[str]]:
    """What a sweep varied: param -> its distinct values in natural order (numbers by value, ``none``
    last), for each param with two or more values among the runs, a skipped combination's values
    included (it was asked for; its size, which it never reached, left out), ``variant`` first and then
    ``size``; bookkeeping params and other spellings of a swept value (``problem.*``, ``spec.*``,
    ``study_kernel``, ``verify.seed_used``) left out."""
    values: dict = {}
    for r in runs:
        skipped = outcome_of(r) == "skipped"
        for k, v in r.data.params.items():
            if not k.startswith(_NOT_AXES) and not (skipped and k == "size"):
                values.setdefault(k, set()).add(v)
    axes = {k: sorted(v, key=lambda x: (x == NONE, _natural(x))) for k, v in values.items() if len(v) >= 2}
    order = ["variant", "size"]
    return {k: axes[k] for k in sorted(axes, key=lambda k: (order.index(k) if k in order else 2, k))}


def _kernel_label(run) -> str:
    """A kernel in the parent's table: its variant where one chose it, else its entry name; EMULATED
    after it where it emulates its MMA."""
    p, t = run.data.params, run.data.tags
    name = p.get("variant") if p.get("variant", NONE) != NONE else t.get("kernel", run.info.run_name)
    return name + (f" {EMULATED}" if emulated(t) else "")


def winners(runs: list, parent: str | None = None, replicates=None) -> list[list[str]]:
    """The rows of the parent's winner table (header first): per precision (``data=<kind>`` after it
    where not full) and size, the verified run of highest throughput (marked "(reused)" where the
    sweep ``parent`` reused it), its median time and throughput with unit, the runner-up and the
    margin (winner / runner-up - 1), and whether the margin is beyond the replicate noise:
    :func:`experiments.reports.compare.verdict` of the two runs' replicate medians (``replicates(run)``
    -> list, us) where both have two or more (timing.repeats), else "not tested (timing.repeats=1)".
    [] without a verified run."""
    groups: dict = {}
    for r in runs:
        m, p = r.data.metrics, r.data.params
        if outcome_of(r) != "verified" or "throughput" not in m:
            continue
        prec = p.get("precision", "?") + ("" if p.get("data", "full") == "full" else f" data={p['data']}")
        size = tuple(int(p.get(f"problem.{d}", 0)) for d in "mnk")
        groups.setdefault((prec, size), []).append(r)
    if not groups:
        return []
    rows = [["precision", "size", "winner", "median us", "throughput", "runner-up", "margin", "vs noise"]]
    for (prec, size), group in sorted(groups.items()):
        group.sort(key=lambda r: -r.data.metrics["throughput"])
        best, m = group[0], group[0].data.metrics
        row = [prec, size_label(size) if any(size) else NONE,
               _kernel_label(best) + (" (reused)" if reused_in(best, parent) else ""),
               f"{m['median_us']:.1f}" if "median_us" in m else "-",
               f"{m['throughput']:.1f} {best.data.tags.get('throughput_unit', '')}".strip()]
        if len(group) < 2:
            rows.append(row + ["-", "-", "only one kernel"])
            continue
        second = group[1]
        margin = m["throughput"] / second.data.metrics["throughput"] - 1
        rows.append(row + [_kernel_label(second), f"{margin:+.1%}", _beyond_noise(best, second, replicates)])
    return rows


def _beyond_noise(best, second, replicates) -> str:
    """Whether ``best`` is faster than ``second`` beyond their replicate noise, in a table cell."""
    from ..reports.compare import verdict
    a, b = (replicates(second), replicates(best)) if replicates else ([], [])
    if min(len(a), len(b)) < 2:
        return "not tested (timing.repeats=1)"
    v = verdict(a, b)
    word = {"faster": "beyond noise", "same": "within noise", "slower": "reversed"}.get(v.call,
                                                                                     "not told apart")
    return f"{word} (R={min(v.replicates)}, +-{v.margin:.1%})" if v.margin else word


def padded(rows: list[list[str]]) -> list[str]:
    """``rows`` (header first) as fixed-width text lines, each column padded to its widest cell and two
    spaces apart (numbers right-aligned), with a rule under the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    numeric = [all(_numeric(r[i]) for r in rows[1:]) for i in range(len(widths))]

    def line(r):
        cells = zip(r, widths, numeric, strict=True)
        return "  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in cells).rstrip()
    return [line(rows[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in rows[1:]]


def _numeric(cell: str) -> bool:
    return bool(cell) and (cell[0].isdigit() or cell[0] in "+-") and cell != "-"


ANALYSIS_HEAD = "### Analysis"     # where python -m analysis.report's part of a parent's description starts


def with_analysis(note: str, section: list[str]) -> str:
    """The parent's description ``note`` with its analysis part (lines from :data:`ANALYSIS_HEAD`)
    replaced by ``section`` (its lines, the head first)."""
    kept = ("\n" + note).split("\n" + ANALYSIS_HEAD)[0].strip("\n")
    return (kept + "\n\n" if kept else "") + "\n".join(section)


def plotting():
    """matplotlib.pyplot (Agg backend) and seaborn, imported on first use (seconds)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns
    return plt, sns


def throughput_figure(runs: list, path) -> bool:
    """Save throughput against problem size, one line per kernel, as a PNG at ``path``.

    Uses the verified runs with a square size; returns False (and writes nothing) when there are none."""
    rows = [(r.data.tags.get("kernel", "?"), int(r.data.params["problem.m"]), r.data.metrics["throughput"],
             r.data.tags.get("throughput_unit", ""))
            for r in runs if outcome_of(r) == "verified" and "throughput" in r.data.metrics
            and "problem.m" in r.data.params and len({r.data.params.get(f"problem.{d}") for d in "mnk"}) == 1]
    if not rows:
        return False
    import pandas as pd
    plt, sns = plotting()
    df = pd.DataFrame(rows, columns=["kernel", "N", "throughput", "unit"])
    fig, ax = plt.subplots(figsize=(9, 5))
    sns.lineplot(data=df, x="N", y="throughput", hue="kernel", marker="o", ax=ax)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M = N = K")
    ax.set_ylabel("throughput (" + " / ".join(sorted(set(df.unit))) + ")")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _axis_label(axis: str, value) -> str:
    """A value in a run name: text as it is (``128x128``, ``s32``); a number or a switch says its axis
    (``bn256``, ``producer``, ``no_persistent``), so that bare numbers and true/false stay readable."""
    if str(value) in ("true", "false") or isinstance(value, bool):
        return axis if str(value).lower() == "true" else f"no_{axis}"
    return f"{axis}{value}" if isinstance(value, int) else str(value)
