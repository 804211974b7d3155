"""Performance check of one sweep: the best kernel of the default family against cuBLAS and the GPU's peak.

Per precision and size, and tile=auto against the best tile preset (conf/experiment/h200_performance.yaml).

    python -m experiments.performance [--uri URI] [--experiment NAME] [--sweep latest|RUN_ID]
                                      [--goal 0.8] [--out results/h200/performance.md]
    python -m experiments.performance --generations | --methodology [--sweep ...] [--out FILE.md]

Reads the verified runs of the sweep (experiments.store.track.sweep_runs) and writes a markdown table per
precision and size: ours (the best run of the default family), cuBLAS (the best cublas run), the peak (the
peak family's run that ``pct_of_peak`` divides by: experiments.reports.compare.peak_of, the same sweep's
when it
measured one), ours' share of that peak, the ceiling of ours' main loop where the sweep
measured it (family=peak feed=ldmatrix: mma.sync fed by ldmatrix at the GEMM's 64 x 64 warp tile) and
ours' share of it, the mean SM clock while ours was timed and its throughput at the GPU's highest
clock; below it the mean power, throughput per W and energy per launch of ours and cuBLAS (NVML's
energy counter over the timed batches where the driver has it). Where ours carries Nsight Compute
counters (``python -m experiments.profile``), a second table
shows the ones that explain the gap: tensor-pipe, shared-memory-pipe and L2 activity, issue activity
and the three largest warp stall reasons. Then it prints the shares and checks:

- every precision measured at N = 8192 reaches ``goal`` (a fraction) of its peak;
- at N = 512 ... 2048, the best tile=auto run (tag ``tile_auto``) is the best tile preset's kernel, or
  at least as fast as the best run of a tile preset within the largest ``spread`` of the two runs and
  the distance between the two timings of tile=auto's kernel (as tile=auto and as its preset, when
  the sweep timed both; the faster of them counts).

``--generations`` writes the two-generations table instead (:func:`generations`), ``--methodology`` the
tables of timing regime, operand data, clocks and energy (:func:`methodology`); both exit 0 once written.

A sweep's runs include those it reused (measured by an earlier sweep, found in the store): the header
says how many, the kernel column marks them "(reused)".

Exit status: 0 when both hold, 1 when one does not (or a precision at 8192 lacks ours or the peak),
2 when the store, experiment or sweep does not exist or the sweep has no verified run.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .compare import VERIFIED, family_of, feed_of, peak_of
from ..families import DEFAULT
from ..families.runner import WGMMA
from ..metrics import label
from ..ncu import PREFIX
from ..store.record import PEAK, reused_count, reused_in
from .report import AT_MAX, CLOCK, CLOCK_HEAD, _fmt, static_command, sweep_run
from ..store.track import StoreError, Tracker, resolve_uri

__all__ = ["Check", "NothingMeasured", "check", "generations", "methodology", "sweep_run", "main",
           "GOAL_SIZE", "AUTO_SIZES"]

GOAL_SIZE = 8192                   # N at which every precision must reach the goal share of peak
AUTO_SIZES = (512, 1024, 2048)     # N at which tile=auto must match the best preset
CUBLAS = "cublas"


@dataclass
class Check:
    """The outcome of :func:`check`: the markdown report, the share of peak per (precision, size)
    (a fraction, None without a peak run), and the reasons the check failed (empty: it passed)."""
    markdown: str
    shares: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


class NothingMeasured(RuntimeError):
    """The sweep holds no verified GPU run to compare; the message says what it holds."""


def _holdings(tr: Tracker, parent: str) -> str:
    """What the sweep ``parent`` holds, e.g. 'sweep 1a2b... (experiment=generations): 37 static, 3
    skipped'."""
    runs = tr.sweep_runs(parent)
    counts: dict = {}
    for r in runs:
        o = r.data.tags.get("outcome", r.info.status.lower())
        counts[o] = counts.get(o, 0) + 1
    name = tr.client.get_run(parent).info.run_name or ""
    what = ", ".join(f"{n} {o}" for o, n in sorted(counts.items())) or "no runs"
    if counts.get("static"):          # made without a GPU: their resources have a table of their own
        what += f" (their table: {static_command(tr.uri, tr.experiment, parent)})"
    return f"sweep {parent} ({name}): {what}"


def _reused(runs: list, parent: str) -> str:
    """'' or ' (N of its M verified runs reused from earlier sweeps)' for the header of a report."""
    n = reused_count(runs, parent)
    return f" ({n} of its {len(runs)} verified runs reused from earlier sweeps)" if n else ""


def _mark(run, parent: str) -> str:
    """' (reused)' after the kernel of a run the sweep ``parent`` reused, else ''."""
    return " (reused)" if reused_in(run, parent) else ""


def _best(runs: list):
    return max(runs, key=lambda r: r.data.metrics["throughput"], default=None)


def _thr(run, unit: bool = True) -> str:
    if run is None:
        return "-"
    text = f"{run.data.metrics['throughput']:.1f}"
    return text + (f" {run.data.tags.get('throughput_unit', '')}" if unit else "")


def check(uri: str, experiment: str = "tensor-core-ablations", sweep: str = "latest",
          goal: float = 0.8) -> Check:
    """Compare and check the verified runs of ``sweep`` (a parent run id or "latest") of the store
    ``uri``; ``goal``: the share of peak (0..1) every precision must reach at N = :data:`GOAL_SIZE`.

    Read-only. Raises StoreError when the store, experiment or sweep does not exist, NothingMeasured
    when the sweep holds no verified run to compare (the message says what it holds)."""
    tr = Tracker(uri, experiment, create=False)
    parent = sweep_run(tr, sweep)
    runs = [r for r in tr.sweep_runs(parent, VERIFIED) if "throughput" in r.data.metrics]
    if not any(family_of(r) != PEAK and "problem.m" in r.data.params for r in runs):
        raise NothingMeasured(f"no verified GEMM run in {_holdings(tr, parent)}. The check reads a sweep "
                              "measured on a GPU, e.g. `python run.py -m experiment=h200_performance`.")
    groups: dict = {}
    for r in runs:
        p = r.data.params
        if family_of(r) == PEAK or "problem.m" not in p:
            continue
        size = tuple(int(p[f"problem.{d}"]) for d in "mnk")
        groups.setdefault((p.get("precision", "?"), size), []).append(r)
    fed = {r.data.params.get("precision"): r for r in runs
           if family_of(r) == PEAK and feed_of(r) == "ldmatrix"}
    out = [f"Performance of sweep {parent}{_reused(runs, parent)}; store: {uri}", "",
           "| precision | M x N x K | ours | kernel | cuBLAS | peak | share of peak | ldmatrix-fed ceiling | "
           f"share of it | {CLOCK_HEAD} | at max clock |",
           "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    res, best, power = Check(""), {}, []
    for (prec, size), rs in sorted(groups.items()):
        ours = best[(prec, size)] = _best([r for r in rs if family_of(r) == DEFAULT])
        cublas = _best([r for r in rs if family_of(r) == CUBLAS])
        power.append((prec, size[0] if len(set(size)) == 1 else "x".join(map(str, size)), [ours, cublas]))
        peak = peak_of(tr, ours, sweep=parent) if ours is not None else None
        thr = ours.data.metrics["throughput"] if ours is not None else None
        share = _share(thr, peak.data.metrics["throughput"] if peak else None)
        ceiling = fed.get(prec)
        res.shares[(prec, size)] = share
        m = ours.data.metrics if ours is not None else {}
        out.append(f"| {prec} | {'x'.join(map(str, size))} | {_thr(ours)} | "
                   f"{ours.data.tags.get('kernel', '?') + _mark(ours, parent) if ours else '-'} | "
                   f"{_thr(cublas)} | {_thr(peak)} | "
                   f"{_fmt(share, '.1%')} | {_thr(ceiling)} | "
                   f"{_fmt(_share(thr, ceiling.data.metrics['throughput'] if ceiling else None), '.1%')} | "
                   f"{_fmt(m.get(CLOCK), '.0f')} | {_fmt(m.get(AT_MAX), '.1f')} |")
    lines = _goal_lines(groups, res, goal) + _auto_lines(groups, res)
    power = _power_lines(power, ("ours", "cuBLAS"))
    res.markdown = "\n".join(out + [""] + power + [""] + _counter_lines(best, parent) + lines) + "\n"
    return res


# (canonical ncu metric, column): the counters of ours that say where the time goes (units from
# experiments.metrics)
COUNTERS = (*((name, label(PREFIX + name, words)) for name, words in (
    ("tensor_pipe_active_pct", "tensor pipe active"), ("smem_pipe_pct", "shared-memory pipe"),
    ("l2_throughput_pct", "L2 throughput"), ("issue_active_pct", "issue active"),
    ("achieved_occupancy_pct", "achieved occupancy"))), ("registers_per_thread", "registers"))
STALL = PREFIX + "stall_"


def _counter_lines(best: dict, parent: str) -> list[str]:
    """The counters table of ours per (precision, size) that has Nsight Compute metrics, or one line
    saying how to add them."""
    rows = []
    for (prec, size), run in sorted(best.items()):
        m = run.data.metrics if run is not None else {}
        if not any(k.startswith(PREFIX) for k in m):
            continue
        stalls = sorted(((v, k[len(STALL):]) for k, v in m.items() if k.startswith(STALL)), reverse=True)[:3]
        values = [_fmt(m.get(PREFIX + name), ".0f" if name == "registers_per_thread" else ".1f")
                  for name, _ in COUNTERS]
        rows.append(f"| {prec} | {'x'.join(map(str, size))} | " + " | ".join(values) + " | "
                    + (", ".join(f"{why} {v:.2f}" for v, why in stalls) or "-") + " |")
    if not rows:
        return ["No Nsight Compute counters on these runs: `python -m experiments.profile --parent "
                f"{parent}` adds them.", ""]
    return (["Counters of ours (Nsight Compute; stalls in cycles per issued instruction):", "",
             "| precision | M x N x K | " + " | ".join(c for _, c in COUNTERS) + " | largest stalls |",
             "| --- | --- |" + " ---: |" * len(COUNTERS) + " --- |"] + rows + [""])


def _goal_lines(groups: dict, res: Check, goal: float) -> list[str]:
    lines = []
    for (prec, size), share in sorted(res.shares.items()):
        if size != (GOAL_SIZE,) * 3:
            continue
        if share is None:
            ours = any(family_of(r) == DEFAULT for r in groups[(prec, size)])
            why = ("no verified peak run of this GPU, driver and precision" if ours
                   else f"no verified {DEFAULT} run")
            res.failures.append(f"{prec} {GOAL_SIZE}: {why}")
            lines.append(f"- {prec} at {GOAL_SIZE}: {why}: FAIL")
            continue
        verdict = "ok" if share >= goal else "FAIL"
        if share < goal:
            res.failures.append(f"{prec} {GOAL_SIZE}: {share:.1%} of peak, below the goal {goal:.0%}")
        lines.append(f"- {prec} at {GOAL_SIZE}: {share:.1%} of peak (goal {goal:.0%}): {verdict}")
    if not lines:
        lines.append(f"- no GEMM run at {GOAL_SIZE}: the share of peak is not checked")
    return lines


def _auto_lines(groups: dict, res: Check) -> list[str]:
    lines = []
    for (prec, size), rs in sorted(groups.items()):
        if size not in [(n,) * 3 for n in AUTO_SIZES]:
            continue
        mine = [r for r in rs if family_of(r) == DEFAULT]
        auto = _best([r for r in mine if r.data.tags.get("tile_auto") == "true"])
        preset = _best([r for r in mine if r.data.tags.get("tile_auto") != "true"])
        if auto is None or preset is None:
            continue
        a, b = auto.data.metrics["throughput"], preset.data.metrics["throughput"]
        # the same kernel timed as a preset run too (its twin): how far two timings of one kernel lie
        # apart in this sweep (an int8 64x64 kernel at 1024 timed 235.5 and 251.7 TOP/s on an H200,
        # twice, with batch spreads below 0.6 %) is part of the tolerance, and the faster timing counts
        twin = _best([r for r in mine if r.data.tags.get("tile_auto") != "true"
                      and r.data.tags.get("kernel") == auto.data.tags.get("kernel")])
        t = twin.data.metrics["throughput"] if twin is not None else a
        tol = max(auto.data.metrics.get("spread", 0.0), preset.data.metrics.get("spread", 0.0),
                  abs(a - t) / max(a, t))
        a = max(a, t)
        tile = lambda r: r.data.params.get("tile.block", "?")  # noqa: E731
        if auto.data.tags.get("kernel") == preset.data.tags.get("kernel"):
            # the rule chose the best preset's own kernel: two timings of one kernel differ from run to
            # run by more than either run's spread, which says nothing about the choice
            lines.append(f"- tile=auto {prec} at {size[0]}: chose the best preset's kernel ({tile(auto)}; "
                         f"timed {_thr(auto, False)} and {_thr(preset)}): ok")
            continue
        ok = a >= b * (1 - tol)
        two = ", the faster of its two timings" if twin is not None else ""
        lines.append(f"- tile=auto {prec} at {size[0]}: {a:.1f} {auto.data.tags.get('throughput_unit', '')} "
                     f"({tile(auto)}{two}) vs the best preset {_thr(preset, False)} ({tile(preset)}), "
                     f"tolerance {tol:.1%}: {'ok' if ok else 'FAIL'}")
        if not ok:
            res.failures.append(f"tile=auto {prec} {size[0]}: {a:.1f} < {b:.1f} of the best preset")
    return lines or ["- no tile=auto run beside a tile preset run at "
                     + ", ".join(map(str, AUTO_SIZES)) + ": tile=auto is not checked"]



def _watts(run):
    """A run's mean power over its timed window (W): from its energy (power_w_avg) where measured, else
    the mean of NVML's samples; None without either."""
    m = run.data.metrics if run is not None else {}
    return m.get("power_w_avg", m.get("power_w_mean"))


def _power_lines(groups: list, names: tuple) -> list[str]:
    """The power and energy table of the best runs: ``groups`` is [(precision, size text, [run or
    None per name]), ...]; per run its mean power (W), throughput per W and energy per launch (J).
    One line instead when no run has a power reading (NVML)."""
    if not any(_watts(r) is not None for _, _, runs in groups for r in runs):
        return ["No power readings on these runs (NVML reads them where the driver permits)."]
    cols = [f"{name} {what}" for name in names for what in ("W", "per W", "J per launch")]
    out = ["Power and energy of the runs above (W: mean over the timed batches, from NVML's energy counter "
           "where measured; per W: throughput per W):", "",
           "| precision | N | " + " | ".join(cols) + " |", "| --- | ---: |" + " ---: |" * len(cols)]
    for prec, size, runs in groups:
        cells = [c for r in runs for c in (_fmt(_watts(r), ".0f"),
                 _fmt(r.data.metrics.get("throughput_per_w") if r else None, ".3f"),
                 _fmt(r.data.metrics.get("energy_j_per_launch") if r else None, ".4f"))]
        out.append(f"| {prec} | {size} | " + " | ".join(cells) + " |")
    return out


def _share(value, peak):
    return value / peak if value is not None and peak else None


def generations(uri: str, experiment: str = "tensor-core-ablations", sweep: str = "latest") -> str:
    """The side-by-side table of two tensor-core generations in one sweep (conf/experiment/generations.yaml)
    as markdown: per precision and size the best run of the default family, the best wgmma run, cuBLAS, the
    mma.sync peak and the wgmma peak (:func:`experiments.reports.compare.peak_of`: the sweep's own, else
    the latest of
    the GPU, driver and precision), each generation's share of its own peak (mma.sync share = best
    default-family run / mma.sync peak, wgmma share = best wgmma / wgmma peak, as pct_of_peak) and wgmma over
    cuBLAS; then the mean power, throughput per W and energy per launch of the best runs; then the main
    effect of each wgmma axis: per precision and size, each value's best
    throughput divided by that of the same point with the axis at its default, over the runs that
    differ from the default in that axis alone, or in it and axes that the compared run shares (e.g.
    a value that needs fewer stages against the default at those stages).

    Read-only. Raises StoreError when the store, experiment or sweep does not exist, NothingMeasured
    when the sweep holds no verified run to compare (the message says what it holds)."""
    from ..families import get
    tr = Tracker(uri, experiment, create=False)
    parent = sweep_run(tr, sweep)
    runs = [r for r in tr.sweep_runs(parent, VERIFIED)
            if "throughput" in r.data.metrics and "problem.m" in r.data.params]
    if not any(family_of(r) == WGMMA for r in runs):
        raise NothingMeasured(f"no wgmma run measured and verified on a GPU in {_holdings(tr, parent)}. "
                              "--generations reads a sweep of `python run.py -m experiment=generations` "
                              "measured on a GPU.")
    groups: dict = {}
    for r in runs:
        p = r.data.params
        groups.setdefault((p["precision"], int(p["problem.m"])), []).append(r)
    out = [f"Two generations on one GPU: sweep {parent}{_reused(runs, parent)}; store: {uri}", "",
           "| precision | N | mma.sync (best) | wgmma (best) | cuBLAS | mma.sync peak | wgmma peak | "
           "mma.sync share | wgmma share | wgmma / cuBLAS |", "|" + " --- |" * 2 + " ---: |" * 8]
    power = []
    for (prec, n), rs in sorted(groups.items()):
        best = {f: _best([r for r in rs if family_of(r) == f]) for f in (DEFAULT, WGMMA, CUBLAS)}
        power.append((prec, n, [best[DEFAULT], best[WGMMA], best[CUBLAS]]))
        # any run of the group names its GPU, driver and precision; a run of the generation itself also
        # its shape (spec.mma)
        anchor = {i: best[i] or best[DEFAULT] or best[WGMMA] or best[CUBLAS] for i in (DEFAULT, WGMMA)}
        peak = {i: peak_of(tr, a, i, parent) if a is not None else None for i, a in anchor.items()}
        thr = {f: r.data.metrics["throughput"] if r else None for f, r in best.items()}
        pk = {i: r.data.metrics["throughput"] if r else None for i, r in peak.items()}
        ratio = thr[WGMMA] / thr[CUBLAS] if thr[WGMMA] and thr[CUBLAS] else None
        out.append(f"| {prec} | {n} | {_thr(best[DEFAULT])} | {_thr(best[WGMMA])} | {_thr(best[CUBLAS])} | "
                   f"{_thr(peak[DEFAULT])} | {_thr(peak[WGMMA])} | "
                   f"{_fmt(_share(thr[DEFAULT], pk[DEFAULT]), '.1%')} | "
                   f"{_fmt(_share(thr[WGMMA], pk[WGMMA]), '.1%')} | {_fmt(ratio, '.2f')} |")
    out += [""] + _power_lines(power, ("mma.sync", "wgmma", "cuBLAS"))
    fam = get(WGMMA)
    axes = [a for a in fam.axes if a != "precision"]
    default = {a: str(fam.defaults.get(a, fam.axes[a][0])).lower() for a in axes}
    out += ["", "Main effect of each wgmma axis (throughput relative to the default value, the other axes at "
            "their defaults):", "", "| precision | N | axis | value | throughput | vs default |",
            "| --- | ---: | --- | --- | ---: | ---: |"]
    for (prec, n), rs in sorted(groups.items()):
        points: dict = {}       # the settings that differ from the default -> the best run with them
        for r in rs:
            if family_of(r) == WGMMA:
                vals = {a: str(r.data.params.get(f"family.{a}", default[a])).lower() for a in axes}
                diff = tuple((a, v) for a, v in vals.items() if v != default[a])
                points[diff] = _best([x for x in (points.get(diff), r) if x is not None])
        for diff, run in sorted(points.items(), key=lambda kv: (len(kv[0]), kv[0])):
            for a, value in diff:
                ref = points.get(tuple(d for d in diff if d[0] != a))
                if ref is None:
                    continue
                at = "; at " + ", ".join(f"{b}={v}" for b, v in diff if b != a) if len(diff) > 1 else ""
                rel = run.data.metrics["throughput"] / ref.data.metrics["throughput"]
                out.append(f"| {prec} | {n} | {a} | {value} (default {default[a]}{at}) | {_thr(run)} | "
                           f"{rel:.2f} |")
    return "\n".join(out) + "\n"


REGIME, DATA = "timing.regime", "data"         # params: the timing regime and the operand data of a run
METHOD_KERNELS = {DEFAULT: "mma.sync", WGMMA: "wgmma", CUBLAS: "cuBLAS"}   # family -> its name in the table
WINDOW, WATTS = "sm_clock_mhz_window", "power_w_avg"


def _regime(run) -> str:
    return run.data.params.get(REGIME, "sustained")


def _data(run) -> str:
    return run.data.params.get(DATA, "full")


def _rel(a, b) -> str:
    """a / b - 1 as a signed percentage, '-' where either is missing."""
    return "-" if a is None or not b else f"{a / b - 1:+.1%}"


def methodology(uri: str, experiment: str = "tensor-core-ablations", sweep: str = "latest") -> str:
    """The methodology tables of a sweep (conf/experiment/methodology.yaml) as markdown: per kernel
    (the best run of the default family, of wgmma and of cuBLAS), precision, size, timing regime
    (param ``timing.regime``, sustained where absent) and operand data (param ``data``, full where
    absent): throughput, the SMs' own mean clock over the timed window (``sm_clock_mhz_window``; NVML's
    mean sample, marked ~, where the run has no window clock), the mean power over the window
    (``power_w_avg``, else the mean sample, ~), throughput per W, energy per launch and the batches'
    spread; then burst beside sustained for cuBLAS bf16 at 8192; then how much the regime (burst /
    sustained, data full) and the data (each value / full, sustained) move each kernel, as relative
    changes.

    Read-only. Raises StoreError when the store, experiment or sweep does not exist, NothingMeasured
    when the sweep holds no verified run of those kernels."""
    tr = Tracker(uri, experiment, create=False)
    parent = sweep_run(tr, sweep)
    runs = [r for r in tr.sweep_runs(parent, VERIFIED) if "throughput" in r.data.metrics
            and "problem.m" in r.data.params and family_of(r) in METHOD_KERNELS]
    if not runs:
        raise NothingMeasured(f"no verified mma.sync, wgmma or cuBLAS run in {_holdings(tr, parent)}. "
                              "--methodology reads a sweep of `python run.py -m experiment=methodology` "
                              "measured on a GPU.")
    best: dict = {}
    for r in runs:
        key = (family_of(r), r.data.params.get("precision", "?"), int(r.data.params["problem.m"]), _regime(r),
               _data(r))
        best[key] = _best([x for x in (best.get(key), r) if x is not None])
    order = list(METHOD_KERNELS)
    data_values = list(dict.fromkeys(["full", *sorted({k[4] for k in best} - {"full"})]))
    head = ["throughput", label(WINDOW, "SM clock (window)"), label(WATTS, "power"), "throughput per W",
            label("energy_j_per_launch", "energy per launch"), "spread"]
    out = [f"Methodology: sweep {parent}{_reused(runs, parent)}; store: {uri}", "",
           "Per kernel, timing regime and operand data (~: NVML's mean sample where the run has no window "
           "clock or energy; a burst window, tens of ms after idle, is too short for NVML's power and energy "
           "readings, which still show the idle draw then: no power for burst runs):", "",
           "| kernel | precision | N | regime | data | " + " | ".join(head) + " |",
           "| --- | --- | ---: | --- | --- |" + " ---: |" * len(head)]
    sort = lambda k: (order.index(k[0]), k[1], k[2], k[3] != "sustained", data_values.index(k[4]))  # noqa: E731
    for key in sorted(best, key=sort):
        fam, prec, n, regime, data = key
        m = best[key].data.metrics
        clock = _fmt(m.get(WINDOW), ".0f") if WINDOW in m else "~" + _fmt(m.get(CLOCK), ".0f")
        burst_only = regime == "burst" and WATTS not in m      # NVML cannot follow a burst window
        watts = ("-" if burst_only else _fmt(m.get(WATTS), ".0f") if WATTS in m
                 else "~" + _fmt(m.get("power_w_mean"), ".0f"))
        per_w = "-" if burst_only else _fmt(m.get("throughput_per_w"), ".3f")
        out.append(f"| {METHOD_KERNELS[fam]} | {prec} | {n} | {regime} | {data} | {_thr(best[key])} | "
                   f"{clock} | {watts} | {per_w} | "
                   f"{_fmt(m.get('energy_j_per_launch'), '.4f')} | {_fmt(m.get('spread'), '.2%')} |")
    thr = {k: r.data.metrics["throughput"] for k, r in best.items()}
    out += ["", "cuBLAS bf16 at 8192, burst beside sustained (operands full):", ""]
    pair = [best.get((CUBLAS, "bf16", GOAL_SIZE, reg, "full")) for reg in ("burst", "sustained")]
    if all(pair):
        b, s_ = (r.data.metrics for r in pair)
        out.append(f"- burst {_thr(pair[0])} at {_fmt(b.get(WINDOW, b.get(CLOCK)), '.0f')} MHz, "
                   + (f"{_fmt(b[WATTS], '.0f')} W" if WATTS in b
                      else "power not measurable (window too short)")
                   + f"; sustained {_thr(pair[1])} at "
                   f"{_fmt(s_.get(WINDOW, s_.get(CLOCK)), '.0f')} MHz, "
                   f"{_fmt(s_.get(WATTS, s_.get('power_w_mean')), '.0f')} W: burst / sustained "
                   f"{_rel(b['throughput'], s_['throughput'])}")
    else:
        out.append("- not measured in both regimes in this sweep")
    others = [d for d in data_values if d != "full"]
    out += ["", "How much the regime and the data move each kernel (relative change of throughput):", "",
            "| kernel | precision | N | burst vs sustained (full) | "
            + "".join(f"{d} vs full (sustained) | " for d in others),
            "| --- | --- | ---: | ---: |" + " ---: |" * len(others)]
    for point in sorted({k[:3] for k in best}, key=lambda k: (order.index(k[0]), k[1], k[2])):
        full = thr.get((*point, "sustained", "full"))
        out.append(f"| {METHOD_KERNELS[point[0]]} | {point[1]} | {point[2]} | "
                   f"{_rel(thr.get((*point, 'burst', 'full')), full)} | "
                   + "".join(f"{_rel(thr.get((*point, 'sustained', d)), full)} | " for d in others))
    return "\n".join(out) + "\n"


def _safely(test, path: str) -> bool:
    """``test`` (Path.is_dir, Path.exists) of ``path``; False where the file system refuses the name
    (e.g. too long: the write then says so)."""
    try:
        return test(Path(path))
    except OSError:
        return False


def main(argv=None) -> int:
    """The command line (module docstring); returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m experiments.performance",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--uri", default=None, help="tracking URI (default: as run.py resolves it)")
    ap.add_argument("--experiment", default="tensor-core-ablations")
    ap.add_argument("--sweep", default="latest", help="the sweep's parent run id, or latest")
    ap.add_argument("--goal", type=float, default=None,
                    help="share of peak each precision must reach at 8192 (default 0.8; the check only)")
    ap.add_argument("--out", default=None, help="also write the report to this markdown file (.md)")
    ap.add_argument("--generations", action="store_true",
                    help="the mma.sync / wgmma table (experiment=generations) instead of the check")
    ap.add_argument("--methodology", action="store_true",
                    help="the regime / data / energy tables (experiment=methodology) instead of the check")
    args = ap.parse_args(argv)
    if args.generations and args.methodology:
        ap.error("--generations and --methodology are two reports: give one")
    table = generations if args.generations else methodology if args.methodology else None
    if table is not None and args.goal is not None:
        ap.error(f"--goal is the check's; --{table.__name__} writes the table only")
    args.goal = 0.8 if args.goal is None else args.goal
    if not 0 < args.goal <= 1:
        ap.error(f"--goal {args.goal} is a share of the peak: a number in (0, 1], e.g. 0.8")
    if args.out is not None and (not args.out.endswith(".md") or _safely(Path.is_dir, args.out)):
        ap.error(f"--out {args.out!r} must name a markdown file (.md), e.g. results/h200/performance.md")
    try:
        uri = resolve_uri(args.uri, create=False)
        res = (Check(table(uri, args.experiment, args.sweep)) if table is not None
               else check(uri, args.experiment, args.sweep, args.goal))
    except StoreError as exc:
        print(f"Store error: {exc}", file=sys.stderr)
        return 2
    except NothingMeasured as exc:
        kept = f", {args.out} left as it is" if args.out and _safely(Path.exists, args.out) else ""
        print(f"Nothing to compare{kept}: {exc}", file=sys.stderr)
        return 2
    print(res.markdown)
    if args.out:
        try:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(res.markdown)
        except OSError as exc:
            why = ("a folder on its path is a file" if isinstance(exc, (FileExistsError, NotADirectoryError))
                   else exc.strerror or str(exc))
            print(f"Could not write --out {args.out}: {why}", file=sys.stderr)
            return 2
    if table is not None:
        return 0
    print("Performance check: " + ("passed" if res.ok else "FAILED: " + "; ".join(res.failures)))
    return 0 if res.ok else 1


if __name__ == "__main__":
    from experiments.cli import run_main
    sys.exit(run_main(main))
