"""Print (or write) the results table of a store: kernel, size, median us, throughput, spread.

    python -m experiments.report [--uri URI] [--experiment NAME] [--out results/h200/main_job.md]
    python -m experiments.report --by-family [--out results/h200/baselines.md]
    python -m experiments.report --sweep latest|RUN_ID [--by-family]
    python -m experiments.report --static [--sweep latest|RUN_ID]
    python -m experiments.report --uri ONE_GPU_STORE --against ALL_GPUS_STORE [--repeat ONE_GPU_AGAIN ...]
    python -m experiments.report [--sweep latest|RUN_ID] --against previous|RUN_ID

``--against RUN_ID`` (a sweep's parent run id, ``previous`` = the sweep before, or one run's id): the runs
of ``--sweep`` (default latest; or one run's id) of the same store against those runs, each run paired
with the reference run that agrees with it in every param but those on which the two sides differ
throughout (the compared axes, e.g. family.stages 2 against 4) and on the same GPU model: per pair both
medians, the difference and the verdict of the run against its reference (same, faster, slower,
ambiguous; experiments.reports.compare.verdict: from the runs' replicates, ``timing.repeats``) with its
reason,
then the tally.

``--against URI``: the same sweep measured twice (e.g. on one GPU and spread over all GPUs of a
node): per kernel and size both medians, the GPU each ran on (paired on the same GPU where the first
store has it), the difference and whether it lies within the first store's spread; and each
store's latest sweep wall time and GPU time. The spread of one run is that of its batches, taken
within a fraction of a second; ``--repeat URI`` (once or more) names a store that holds the first
sweep run again the same way, and the largest distance of its medians from the first store's, the
single-GPU spread of the sweep, becomes the spread of every pair where it is larger
(:func:`against_table` says why one number). Each pair also gets the verdict of the second run against
the first from their replicates (experiments.reports.compare.verdict), with its reason, and the tally.

Runs timed with NVML's SM clock samples add two columns: the mean SM clock during timing (MHz) and
the throughput at the GPU's highest clock (``throughput_at_max_clock``); older runs show "-".

``--by-family``: per GPU, precision, size and operand data, each family's best verified throughput, its
pct_of_peak and its speedups over the baselines (experiments.reports.compare; with the verdict of the run
against
the baseline's where both have replicates), and the peak runs.

``--sweep``: the runs of one sweep only (a parent run id, or latest), those it reused from earlier
sweeps included and marked reused (experiments.store.track.sweep_runs).

``--static``: the runs made without a GPU (rendered and assembled only), one row per kernel and
arch: registers, spills, shared memory, theoretical occupancy, SASS instruction mix and whether the
SASS holds the precision's tensor-core MMA (``mma_native``); with ``--sweep`` the kernels it reused
are marked; kernels that failed (the ptxas error line) or were skipped (the reason) are listed below.
"""
from __future__ import annotations

import argparse
import collections
import itertools
import math
import os
import re
import shlex
import statistics
import sys
from pathlib import Path

from .compare import (CLOCK_TOLERANCE, NO_REPLICATES, NOISE_FLOOR, NOISE_TIMES, VERDICTS, clock_of, data_of,
                      noise_of, replicates, verdict)
from ..metrics import PCT_OF_PEAK, label
from ..store.record import EMULATED, emulated, occupancy_pct, reused_in
from ..store.track import StoreError, Tracker, resolve_uri, sqlite_path

CLOCK, AT_MAX = "sm_clock_mhz_mean", "throughput_at_max_clock"     # experiments.metrics
CLOCK_HEAD = label(CLOCK, "SM clock")
__all__ = ["results_table", "families_table", "static_table", "static_command", "against_table", "sweep_run",
           "verdict_table", "main"]


def _gpu_runs(tr: Tracker, where: str, sweep: str | None) -> tuple[list, str | None]:
    """(the GPU runs of the store matching the MLflow filter ``where``, the sweep's parent run id):
    of the whole experiment (``sweep`` None), or of one sweep (a parent run id or "latest"; the runs
    it reused from earlier sweeps included, experiments.store.track.sweep_runs)."""
    where = f"tags.backend = 'gpu'{' and ' + where if where else ''}"
    if sweep is None:
        return tr.client.search_runs([tr.experiment_id], where, max_results=50000), None
    parent = sweep_run(tr, sweep)
    return tr.sweep_runs(parent, where), parent


def results_table(uri: str, experiment: str = "tensor-core-ablations", sweep: str | None = None) -> str:
    """Markdown table of every GPU run (FINISHED and FAILED) in the store, or of one ``sweep`` (a
    parent run id or "latest"; its status column says "reused" of the runs the sweep reused from
    earlier sweeps), grouped by GPU, sorted by kernel and size (a kernel followed by ``data=<kind>`` for
    operand data other than full); throughput is TFLOP/s for float types and TOP/s for integer types.

    Read-only: raises StoreError when the store, the experiment or the sweep does not exist."""
    tr = Tracker(uri, experiment, create=False)
    runs, parent = _gpu_runs(tr, "", sweep)
    rows = []
    for r in runs:
        p, m, t = r.data.params, r.data.metrics, r.data.tags
        if "problem.m" not in p:
            continue
        size = (int(p["problem.m"]), int(p["problem.n"]), int(p["problem.k"]))
        status = "verified" if r.info.status == "FINISHED" else r.info.status.lower()
        status += ", reused" if reused_in(r, parent) else ""
        kern = _with_data(t.get("kernel", "?"), r) + (f" {EMULATED}" if emulated(t) else "")
        rows.append((kern, size, m.get("median_us"), m.get("throughput"),
                     t.get("throughput_unit", ""), m.get("spread"), status, t.get("gpu", ""),
                     m.get(CLOCK), m.get(AT_MAX)))
    if not rows:
        return _nothing_measured(tr, uri, f"; {static_command(uri, experiment, parent)} tables their "
                                 "registers, spills, occupancy and SASS", ".", parent)
    rows.sort(key=lambda x: (x[7], x[0], x[1]))
    gpus = sorted({x[7] for x in rows})
    clocked = any(x[8] is not None for x in rows)       # runs timed with NVML's SM clock samples
    of = f"; sweep {parent}" if parent else ""
    out = [f"GPU: {', '.join(gpus) or '-'}; store: {uri}{of}", "",
           f"| GPU | kernel | M x N x K | {label('median_us', 'median')} | throughput | spread | status |"
           + (f" {CLOCK_HEAD} | at max clock |" if clocked else ""),
           "| --- | --- | --- | ---: | ---: | ---: | --- |" + (" ---: | ---: |" if clocked else "")]
    for kern, size, us, thr, unit, spread, status, gpu, mhz, at_max in rows:
        f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
        out.append(f"| {gpu} | {kern} | {'x'.join(map(str, size))} | {f(us, '.1f')} | "
                   f"{f(thr, '.1f')} {unit} | {f(spread, '.1%')} | {status} |"
                   + (f" {f(mhz, '.0f')} | {f(at_max, '.1f')} |" if clocked else ""))
    return "\n".join(out) + "\n"


NOTHING_MEASURED = "No run in "      # how the tables start when the store holds no GPU measurement


def _nothing_measured(tr: Tracker, uri: str, detail: str, end: str, parent: str | None = None) -> str:
    where = "tags.backend = 'static'"
    runs = (tr.sweep_runs(parent, where) if parent
            else tr.client.search_runs([tr.experiment_id], where, max_results=50000))
    skipped = sum(r.data.tags.get("outcome") == "skipped" for r in runs)
    also = f" and {skipped} skipped (combinations that do not exist, each with its reason)" if skipped else ""
    scope = f"sweep {parent} of {uri}" if parent else uri
    return (f"{NOTHING_MEASURED}{scope} was measured on a GPU yet: {len(runs) - skipped} static run(s) "
            f"(rendered and assembled only{detail}){also}{end}\n")


def _capped(kernel: str, run) -> str:
    """The kernel's name in a table, with its launch's block cap where it had one (launch.blocks_per_sm:
    the same kernel at another occupancy is a row of its own)."""
    cap = run.data.params.get("launch.blocks_per_sm", "0")
    return kernel if cap in ("0", "", None) else f"{kernel} (blocks_per_sm={cap})"


def static_table(uri: str, experiment: str = "tensor-core-ablations", sweep: str | None = None) -> str:
    """Markdown table of the store's static runs (made without a GPU: rendered and assembled only),
    those of ``sweep`` (a parent run id or "latest"; None: every sweep), one row per kernel and arch
    (the latest run): registers per thread, spill stores / loads (bytes), shared memory per block
    (static + dynamic, bytes), theoretical occupancy, the SASS instruction mix (the classes of
    experiments.build.assemble.SASS_OPS, most frequent first, of all instructions) and mma_native, with
    the reasons of kernels whose MMA is emulated below. "-" where a value is missing (a library
    call has no PTX; without cuobjdump/nvdisasm there is no SASS). Kernels the sweep reused from
    earlier sweeps are marked "(reused)" and counted in the header; kernels whose latest run failed,
    was skipped or interrupted are listed under "Not assembled:" with the first line of the reason.

    Read-only: raises StoreError when the store, experiment or sweep does not exist; returns a line
    starting with "No static run" when there is no static-backend run at all."""
    tr = Tracker(uri, experiment, create=False)
    where = "tags.backend = 'static'"
    parent = sweep_run(tr, sweep) if sweep else None
    runs = (tr.sweep_runs(parent, where) if parent       # oldest first, those it reused included
            else tr.client.search_runs([tr.experiment_id], where, max_results=50000,
                                       order_by=["attributes.start_time ASC"]))
    every = {(_capped(r.data.tags.get("kernel") or r.info.run_name or "?", r), r.data.tags.get("arch", "-"))
             : r for r in runs}
    latest = {k: r for k, r in every.items() if r.data.tags.get("outcome") == "static"}
    others = {k: r for k, r in every.items() if k not in latest}
    scope = f"sweep {parent} of {uri}" if parent else uri
    if not every:
        return f"{NO_STATIC}{scope}: a sweep without a GPU (or backend=static) makes them.\n"
    reused = sum(bool(reused_in(r, parent)) for r in latest.values())
    also = "".join(f", {n} {what}" for what, n in sorted(collections.Counter(
        r.data.tags.get("outcome") or r.info.status.lower() for r in others.values()).items()))
    out = [f"Static runs (rendered and assembled, not run) in {scope}: {len(latest)} kernel(s)"
           + (f" ({reused} reused from earlier sweeps)" if reused else "") + also, "",
           "| kernel | arch | registers | spills st/ld B | shared memory B | occupancy | SASS mix "
           "| mma_native |",
           "| --- | --- | ---: | ---: | ---: | ---: | --- | --- |"]
    emulated = {}
    for (kern, arch), r in sorted(latest.items()):
        m, t = r.data.metrics, r.data.tags
        smem = [m[k] for k in ("smem_static_bytes", "smem_dynamic_bytes") if k in m]
        spills = (f"{m['spill_stores_bytes']:.0f} / {m['spill_loads_bytes']:.0f}"
                  if {"spill_stores_bytes", "spill_loads_bytes"} <= set(m) else "-")
        mix = sorted(((n, k[len("sass_"):]) for k, n in m.items()
                      if k.startswith("sass_") and k != "sass_instructions" and n), reverse=True)
        sass = (", ".join(f"{op} {n:.0f}" for n, op in mix)
                + (f" of {m['sass_instructions']:.0f}" if "sass_instructions" in m else "")) if mix else "-"
        native = t.get("mma_native", "-")
        if native == "false":
            emulated[kern] = t.get("mma_native_reason", "")
        occupancy = _fmt(occupancy_pct(m), ".0f") + ("%" if occupancy_pct(m) is not None else "")
        mark = " (reused)" if reused_in(r, parent) else ""
        out.append(f"| {kern}{mark} | {arch} | {_fmt(m.get('registers'), '.0f')} | {spills} | "
                   f"{_fmt(sum(smem) if smem else None, '.0f')} | {occupancy} | {sass} | {native} |")
    out += ["", *(f"- {kern}: {why}" for kern, why in emulated.items())] if emulated else []
    if others:                              # failed, skipped or interrupted: the first line of the reason
        out += ["", "Not assembled:", *(
            f"- {kern} ({arch}): {r.data.tags.get('outcome') or r.info.status.lower()}: "
            f"{(r.data.tags.get('error') or r.data.tags.get('skip_reason') or '-').splitlines()[0]}"
            for (kern, arch), r in sorted(others.items()))]
    return "\n".join(out) + "\n"


NO_STATIC = "No static run in "       # how static_table starts when there is none


def static_command(uri: str, experiment: str = "tensor-core-ablations", sweep: str | None = None) -> str:
    """The command line that tables the static runs of the store ``uri`` (of ``sweep``, a parent run
    id), for the messages of the readers that need GPU runs."""
    return ("python -m experiments.report --static --uri " + shlex.quote(uri)
            + ("" if experiment == "tensor-core-ablations" else f" --experiment {shlex.quote(experiment)}")
            + (f" --sweep {sweep}" if sweep else ""))


def _fmt(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def families_table(uri: str, experiment: str = "tensor-core-ablations", sweep: str | None = None) -> str:
    """Markdown of the families side by side, from the verified GPU runs of the store.

    Per GPU: the peak runs (precision, mma shape or copy, throughput, unit; the latest per shape),
    then one row per (precision, M x N x K, family) with the family's best verified run: its kernel,
    throughput and unit, pct_of_peak and speedup_vs_<b> for b in record.BASELINES ("-" where the run
    has none: baselines get no speedups, a size without a baseline run gets none). Runs without a
    family param count as the default family. ``sweep`` (a parent run id or "latest"): the runs of that sweep
    only, those it reused included (marked "(reused)" after the kernel). Read-only: raises StoreError
    when the store, experiment or sweep does not exist."""
    from .compare import family_of
    from ..families import DEFAULT
    from ..store.record import BASELINES, PEAK, SPEEDUP
    tr = Tracker(uri, experiment, create=False)
    runs, parent = _gpu_runs(tr, "tags.outcome = 'verified' and attributes.status = 'FINISHED'", sweep)
    best, peaks = {}, {}
    for r in runs:
        p, m, t = r.data.params, r.data.metrics, r.data.tags
        if "throughput" not in m:
            continue
        gpu, fam = t.get("gpu", ""), family_of(r)
        if fam == PEAK:
            key = (gpu, p.get("precision", "?"), p.get("spec.mma") or p.get("spec.copy", ""))
            if key not in peaks or r.info.start_time > peaks[key].info.start_time:
                peaks[key] = r
        elif "problem.m" in p:
            size = tuple(int(p[f"problem.{d}"]) for d in "mnk")
            key = (gpu, p.get("precision", "?"), size, _with_data(fam, r))
            if key not in best or m["throughput"] > best[key].data.metrics["throughput"]:
                best[key] = r
    if not best and not peaks:
        return _nothing_measured(tr, uri, "", ": nothing to compare.", parent)
    order = {f: i for i, f in enumerate((DEFAULT,) + BASELINES)}
    reps = _Replicates()
    for r in best.values():             # every run a speedup's verdict may read, for the replicate noise
        reps(tr, r)
    out = [f"Families by precision and size; store: {uri}" + (f"; sweep {parent}" if parent else ""), ""]
    for gpu in sorted({k[0] for k in best} | {k[0] for k in peaks}):
        out += [f"## {gpu or 'unknown GPU'}", "", "| peak | shape | throughput |", "| --- | --- | ---: |"]
        for (g, prec, shape), r in sorted(peaks.items()):
            if g == gpu:
                out.append(f"| {prec} | {shape} | {r.data.metrics['throughput']:.1f} "
                           f"{r.data.tags.get('throughput_unit', '')} |")
        rows = sorted((k for k in best if k[0] == gpu), key=lambda k: (k[1], k[2], order.get(k[3], 99), k[3]))
        clocked = any(CLOCK in best[k].data.metrics for k in rows)
        head = ["precision", "M x N x K", "family", "kernel", "throughput",
                label(PCT_OF_PEAK, "{unit} of peak")]
        head += [f"vs {b}" for b in BASELINES] + ([CLOCK_HEAD, "at max clock"] if clocked else [])
        out += ["", "| " + " | ".join(head) + " |", "| --- | --- | --- | --- |" + " ---: |" * (len(head) - 4)]
        for key in rows:
            r = best[key]
            m = r.data.metrics
            cells = [key[1], "x".join(map(str, key[2])), key[3],
                     r.data.tags.get("kernel", "?") + (f" {EMULATED}" if emulated(r.data.tags) else "")
                     + (" (reused)" if reused_in(r, parent) else ""),
                     f"{m['throughput']:.1f} {r.data.tags.get('throughput_unit', '')}",
                     _fmt(m.get(PCT_OF_PEAK), ".1f")]
            cells += [_speedup_cell(m.get(SPEEDUP.format(b)), tr, r, best.get((*key[:3], _with_data(b, r))),
                                    reps) for b in BASELINES]
            if clocked:
                cells += [_fmt(m.get(CLOCK), ".0f"), _fmt(m.get(AT_MAX), ".1f")]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _with_data(family: str, run) -> str:
    """The families table's family column of ``family`` for runs of ``run``'s operand data."""
    return family if data_of(run) == "full" else f"{family} data={data_of(run)}"


def _speedup_cell(speedup, tr: Tracker, run, base, reps) -> str:
    """A speedup cell of the families table: the stored speedup_vs_<b> (2 decimals), followed by the
    verdict of ``run`` against ``base`` (the baseline's best run the table shows) where both have
    replicates (experiments.reports.compare.verdict: same, faster, slower or ambiguous)."""
    if speedup is None:
        return "-"
    if base is None or len(reps(tr, run)) < 2 or len(reps(tr, base)) < 2:
        return f"{speedup:.2f}"
    return f"{speedup:.2f} {reps.verdict(tr, base, tr, run).call}"


class _Replicates:
    """The replicate medians of runs (experiments.reports.compare.replicates), read once per report:
    calling it
    with a tracker and a run gives that run's; :meth:`noise` is the median replicate noise of the runs
    read so far that have replicates; :meth:`verdict` judges a second run against a first with it."""

    def __init__(self):
        self.seen: dict = {}

    def __call__(self, tr: Tracker, run) -> list:
        key = (tr.uri, run.info.run_id)
        if key not in self.seen:
            self.seen[key] = replicates(tr, run)
        return self.seen[key]

    def noise(self) -> tuple[float | None, int]:
        """(median replicate noise, how many runs it is the median of)."""
        found = [n for v in self.seen.values() if (n := noise_of(v)) is not None]
        return (statistics.median(found) if found else None), len(found)

    def verdict(self, tr_first: Tracker, first, tr_second: Tracker, second):
        """experiments.reports.compare.verdict of ``second`` against ``first`` with their SM clocks
        (experiments.reports.compare.clock_of) and the noise of every run read."""
        clocks = (clock_of(first), clock_of(second))
        return verdict(self(tr_first, first), self(tr_second, second), clocks=clocks, noise=self.noise()[0])

    def tally(self, verdicts: list) -> str:
        """One line: how many pairs got each verdict, the noise and margin they were judged with."""
        counts = collections.Counter(v.call for v in verdicts)
        line = "Verdicts: " + ", ".join(f"{counts[c]} {c}" for c in VERDICTS)
        if bare := sum(NO_REPLICATES in v.reason for v in verdicts):
            line += f" ({bare} without replicates: sweep with timing.repeats=5 to give each run its own)"
        noise, n = self.noise()
        if noise is not None:
            line += (f"; replicate noise {noise:.2%} (median of {n} run{'s' * (n != 1)}), margin "
                     f"+-{max(NOISE_FLOOR, NOISE_TIMES * noise):.1%}")
        if cycles := sum(v.normalised for v in verdicts):
            line += (f"; {cycles} pair{'s' * (cycles != 1)} compared as cycles (SM clocks more than "
                     f"{CLOCK_TOLERANCE:.0%} apart)")
        return line + "."


def _verified(tr: Tracker) -> dict:
    """{(kernel, M x N x K, GPU UUID): run} of the store's verified GPU runs (the latest of each; the
    kernel followed by ``data=<kind>`` for operand data other than full)."""
    runs = tr.client.search_runs([tr.experiment_id], "tags.backend = 'gpu' and tags.outcome = 'verified'",
                                 max_results=50000, order_by=["attributes.start_time ASC"])
    return {(_with_data(r.data.tags.get("kernel", "?"), r), _size(r), r.data.tags.get("gpu_uuid", "")): r
            for r in runs if "median_us" in r.data.metrics and "problem.m" in r.data.params}


def _us(run) -> float:
    return run.data.metrics["median_us"]


def _timed(runs: dict, uri: str) -> dict:
    """``runs`` (:func:`_verified`), after checking that every median is a time: raises StoreError
    naming the first run whose median_us is not a finite number > 0 (a differences' divisor)."""
    for (kern, size, _), run in runs.items():
        if not (math.isfinite(_us(run)) and _us(run) > 0):
            raise StoreError(f"run {run.info.run_id} in {uri} ({kern} {size}) has median_us={_us(run)}, "
                             "which is not a time: it cannot be compared (delete the run, or measure it "
                             "again)")
    return runs


def repeat_distances(first: dict, repeats: list) -> list:
    """|repeat - first| / first of each (kernel, size, GPU) that the first store (``_verified``) and a
    repeat store hold: how far the first sweep's medians move when the same sweep simply runs again."""
    return [abs(_us(r[key]) / _us(first[key]) - 1) for r in repeats for key in r.keys() & first.keys()]


def sweep_run(tr: Tracker, sweep: str = "latest") -> str:
    """The parent run id of ``sweep``: a run id, or "latest" (the newest run tagged kind=sweep).

    Raises StoreError when there is no such sweep in the tracker's experiment."""
    if sweep != "latest":
        try:
            run = tr.client.get_run(sweep)
        except Exception as exc:  # noqa: BLE001 - MlflowException for an unknown id
            raise StoreError(f"--sweep {sweep!r} is not a run id in {tr.uri}; give a sweep's parent run id, "
                             "or latest") from exc
        if (parent := run.data.tags.get("mlflow.parentRunId")) and run.data.tags.get("kind") != "sweep":
            raise StoreError(f"--sweep {sweep} is a run of the sweep {parent}, not a sweep: give --sweep "
                             f"{parent}")
        return sweep
    found = tr.client.search_runs([tr.experiment_id], "tags.kind = 'sweep'", max_results=1,
                                  order_by=["attributes.start_time DESC"])
    if not found:
        raise StoreError(f"no sweep (a parent run tagged kind=sweep) in {tr.uri}")
    return found[0].info.run_id


def _latest_sweep(tr: Tracker) -> dict:
    """The metrics of the store's latest sweep parent ({} without one)."""
    try:
        return tr.client.get_run(sweep_run(tr)).data.metrics
    except StoreError:
        return {}


def _sweep_times(m: dict) -> str:
    if not {"sweep_wall_s", "gpu_busy_s", "gpus"} <= set(m):
        return "no sweep timing"
    return f"{m['sweep_wall_s']:.1f} s wall, GPU time {m['gpu_busy_s']:.1f} s on {m['gpus']:.0f} GPU(s)"


def _larger_p(diffs: list, dist: list) -> float:
    """p of a one-sided Mann-Whitney U test (scipy.stats.mannwhitneyu) that the |differences| of the
    pairs are stochastically larger than the repeats' distances."""
    from scipy.stats import mannwhitneyu
    return float(mannwhitneyu([d for d, *_ in diffs], dist, alternative="greater").pvalue)


def against_table(uri: str, other: str, experiment: str = "tensor-core-ablations",
                  repeats: tuple = ()) -> str:
    """Markdown comparing the verified GPU runs of two stores that measured the same sweep (e.g. on one
    GPU, then over every GPU of the node with hydra/launcher=gpus).

    Each run of ``other`` is paired with the run of ``uri`` for the same kernel and size, on the same
    GPU (UUID) where ``uri`` holds one (so a first store that holds the one-GPU sweep run on each GPU
    of the node compares like with like), else on another. Per pair: both medians (us), both GPUs (end
    of the UUID), the difference (other - uri) / uri and whether it lies within the spread: that of the
    first run's batches ((max - min) / median), or, where larger, the single-GPU spread of the sweep:
    the largest of :func:`repeat_distances` over the ``repeats`` (stores holding the first sweep run
    again the same way). Then a summary: pairs within (on the same GPU, on another), the largest
    difference, the median |difference| beside the repeats' median distance (and :func:`_larger_p`), the
    tally of the pairs' verdicts (experiments.reports.compare.verdict of the second run against the
    first, from
    their replicates, in the table with its reason), each store's latest sweep (parent metrics
    sweep_wall_s, gpu_busy_s, gpus) and their ratio.

    Why one number for the whole sweep: a kernel's median can take one of two values for seconds at an
    unchanged SM clock, and kernels sensitive to where their operands lie move from one allocation to
    the next (:mod:`experiments.gpu.timing` says by how much); a single repeat catches either for some
    pairs only, so a pair's own repeat distance understates what any rerun may show.

    Read-only: raises StoreError when a store or the experiment does not exist, or when two of the
    stores hold the same runs (a copy)."""
    a, b = Tracker(uri, experiment, create=False), Tracker(other, experiment, create=False)
    named = [(uri, _timed(_verified(a), uri)), (other, _timed(_verified(b), other))]
    named += [(rep, _timed(_verified(Tracker(rep, experiment, create=False)), rep)) for rep in repeats]
    ids = [(name, {r.info.run_id for r in runs.values()}) for name, runs in named]
    for (first, fids), (second, sids) in itertools.combinations(ids, 2):
        if fids & sids:
            raise StoreError(f"{second} holds the same runs as {first} (a copy of that store?): the "
                             "comparison needs the sweep measured again, into another store")
    ra, rb, rr = named[0][1], named[1][1], [runs for _, runs in named[2:]]
    firsts = collections.defaultdict(dict)             # (kernel, size) -> {GPU: run}
    for (kern, size, gpu), run in ra.items():
        firsts[(kern, size)][gpu] = run
    pairs = [((kern, size), fs.get(gpu) or next(iter(fs.values())), y)
             for (kern, size, gpu), y in rb.items() if (fs := firsts.get((kern, size)))]
    pairs.sort(key=lambda p: (p[0][0], [int(d) for d in p[0][1].split("x")],
                              p[2].data.tags.get("gpu_uuid", "")))
    if not pairs:
        return (f"{NOTHING_MEASURED}{uri} has a match in {other} (the same kernel at the same size, verified "
                f"on a GPU): they hold {len(ra)} and {len(rb)} verified GPU run(s).\n")
    for rep, runs in zip(repeats, rr, strict=True):
        if not runs.keys() & ra.keys():
            raise StoreError(f"--repeat {rep} holds none of the runs of {uri} (the same kernel, size and "
                             "GPU): a repeat is the first sweep run again, on the same GPU(s)")
    dist = repeat_distances(ra, rr)
    single = max(dist, default=0.0)
    out = [f"First: {uri}", f"Second: {other}"]
    if repeats:
        out.append(f"Spread: the first run's batch spread, or where larger the single-GPU spread "
                   f"{single:.2%}: the largest distance between a median of the first store and the same "
                   f"kernel, size and GPU in {', '.join(repeats)} "
                   f"({len(dist)} pair{'' if len(dist) == 1 else 's'}).")
    out += ["", "| kernel | M x N x K | first us | GPU | second us | GPU | difference | spread | within "
                "| verdict | reason |",
            "| --- | --- | ---: | --- | ---: | --- | ---: | ---: | --- | --- | --- |"]
    within = collections.Counter()      # (same GPU, within the spread) -> pairs
    diffs, verdicts, reps = [], [], _Replicates()
    for _, x, y in pairs:
        reps(a, x), reps(b, y)
    for (kern, size), x, y in pairs:
        batch, diff = x.data.metrics.get("spread"), _us(y) / _us(x) - 1
        spread = None if batch is None and not repeats else max(batch or 0.0, single)
        ok = spread is not None and abs(diff) <= spread
        diffs.append((abs(diff), diff, kern, size))
        gx, gy = x.data.tags.get("gpu_uuid", ""), y.data.tags.get("gpu_uuid", "")
        within[(gx == gy, ok)] += 1
        verdicts.append(v := reps.verdict(a, x, b, y))
        out.append(f"| {kern} | {size} | {_us(x):.2f} | {gx[-8:]} | {_us(y):.2f} | {gy[-8:]} | {diff:+.2%} | "
                   + (f"{spread:.2%} | {'yes' if ok else 'no'} |" if spread is not None else "- | - |")
                   + f" {v.cell()} | {v.reason} |")
    _, worst, wkern, wsize = max(diffs)
    matched = {(kern, size) for (kern, size), _, _ in pairs}
    alone = (f" ({len(firsts.keys() - matched)} only in the first store, "
             f"{sum(1 for kern, size, _ in rb if (kern, size) not in firsts)} only in the second)")
    split = "; ".join(f"on {where}: {within[(same, True)]} of {within[(same, True)] + within[(same, False)]}"
                      for same, where in ((True, "the same GPU"), (False, "another GPU")))
    typical = statistics.median(d for d, *_ in diffs)
    out += ["", f"{len(pairs)} (kernel, size) pairs{alone}; {within[(True, True)] + within[(False, True)]} "
                f"within the spread ({split}); the largest difference {worst:+.2%} ({wkern} {wsize}); "
                f"median |difference| {typical:.2%}"
                + (f", the repeats' median distance from the first {statistics.median(dist):.2%} (one-sided "
                   "Mann-Whitney U, differences larger than those distances: "
                   f"p = {_larger_p(diffs, dist):.2f})." if dist else "."),
            reps.tally(verdicts) + " A verdict is of the second run against the first.",
            f"First sweep: {_sweep_times(sa := _latest_sweep(a))}. "
            f"Second sweep: {_sweep_times(sb := _latest_sweep(b))}."]
    if sa.get("sweep_wall_s", 0) > 0 and "sweep_wall_s" in sb:
        out.append(f"Wall time ratio, second / first: {sb['sweep_wall_s'] / sa['sweep_wall_s']:.2f}.")
    return "\n".join(out) + "\n"


RUN_ID = re.compile(r"[0-9a-f]{32}")        # an MLflow run id
# params that differ between any two runs and say nothing of the kernel: never a compared axis
PER_RUN = ("verify.seed_used",)
_VERIFIED_GPU = "tags.backend = 'gpu' and tags.outcome = 'verified' and attributes.status = 'FINISHED'"


def is_run_ref(text: str) -> bool:
    """Whether ``--against`` names runs of the same store (``previous`` or a run id), not another store."""
    return text == "previous" or bool(RUN_ID.fullmatch(text))


def _side(tr: Tracker, ident: str, after: str | None = None) -> tuple[list, str, str | None]:
    """(the verified GPU runs of ``ident``, how the table names them, the sweep's parent run id or None):
    a sweep's (its parent run id; latest; previous = the sweep that started last before the sweep
    ``after``) or one run's (its id). Raises StoreError for an unknown id, no such sweep, or a run that
    was not verified on a GPU (it has no time)."""
    if ident == "previous":
        start = tr.client.get_run(after).info.start_time if after else None
        sweeps = tr.client.search_runs([tr.experiment_id], "tags.kind = 'sweep'", max_results=50000,
                                       order_by=["attributes.start_time DESC"])
        found = [r for r in sweeps if start is not None and r.info.start_time < start]
        if not found:
            raise StoreError(f"no sweep before {after} in {tr.uri}: --against previous needs an earlier "
                             "sweep (or give a sweep's parent run id)")
        ident = found[0].info.run_id
    if ident == "latest":
        ident = sweep_run(tr)
    try:
        run = tr.client.get_run(ident)
    except Exception as exc:  # noqa: BLE001 - MlflowException for an unknown id
        raise StoreError(f"{ident!r} is not a run id in {tr.uri}; give a sweep's parent run id, one run's "
                         "id, latest or previous") from exc
    if run.data.tags.get("kind") == "sweep":
        return tr.sweep_runs(ident, _VERIFIED_GPU), f"sweep {ident}", ident
    t = run.data.tags
    if t.get("backend") != "gpu" or t.get("outcome") != "verified" or "median_us" not in run.data.metrics:
        raise StoreError(f"run {ident} ({run.info.run_name}) was not verified on a GPU (outcome "
                         f"{t.get('outcome', run.info.status.lower())}): it has no time to compare")
    return [run], f"run {ident} ({t.get('kernel', run.info.run_name)})", None


def _compared(xs: list, ys: list) -> dict:
    """The params on which the runs ``xs`` and ``ys`` differ throughout (no value in common; a missing
    param counts as a value), those of :data:`PER_RUN` aside: {param: (values of xs, values of ys)}."""
    out = {}
    for key in sorted({k for r in xs + ys for k in r.data.params} - set(PER_RUN)):
        vx = {r.data.params.get(key) for r in xs}
        vy = {r.data.params.get(key) for r in ys}
        if vx.isdisjoint(vy):
            out[key] = (vx, vy)
    return out


def _pair_key(run, shared: list) -> tuple:
    return (run.data.tags.get("gpu", ""), *(run.data.params.get(k) for k in shared))


def _size(run) -> str:
    p = run.data.params
    return "x".join(p[f"problem.{d}"] for d in "mnk") if "problem.m" in p else "-"


def verdict_table(uri: str, experiment: str = "tensor-core-ablations", sweep: str = "latest",
                  against: str = "previous") -> str:
    """Markdown of the verified GPU runs of ``sweep`` (a parent run id, latest, or one run's id) against
    those of ``against`` (a parent run id, previous = the sweep before, or one run's id) in one store.

    The params on which the two sides differ throughout are the compared axes (:func:`_compared`, e.g.
    family.stages 2 against 4; none when a sweep is run again); each run is paired with the latest
    reference run of the same GPU model that agrees with it in every other param. Per pair: both kernels,
    the size, both medians (us), the replicates of each, the difference and the verdict of the run
    against its reference (experiments.reports.compare.verdict, with the median replicate noise of the pairs'
    runs) with its reason; then the pairs left unmatched and the tally.

    Read-only: raises StoreError for an unknown store, experiment, sweep or run, the same runs on both
    sides, or a run that was not verified on a GPU."""
    tr = Tracker(uri, experiment, create=False)
    runs, name, parent = _side(tr, sweep)
    refs, ref_name, ref_parent = _side(tr, against, parent)
    if {r.info.run_id for r in runs} & {r.info.run_id for r in refs}:
        raise StoreError(f"{name} and {ref_name} hold the same runs: give two sweeps (or runs) to compare "
                         "(a sweep that finds its runs measured reuses them: tracking.rerun=true measures "
                         "again)")
    timed = lambda rs: [r for r in rs if math.isfinite(_us(r)) and _us(r) > 0]   # noqa: E731
    runs, refs = timed(runs), timed(refs)
    for side, sweep_id in ((runs, parent), (refs, ref_parent)):
        if not side and sweep_id:              # e.g. two sweeps of static runs: nothing timed to compare
            return _nothing_measured(tr, uri, "", ": a verdict needs verified GPU runs on both sides; their "
                                     "kernels compare as " + static_command(uri, experiment, sweep_id),
                                     sweep_id)
    axes = _compared(runs, refs)
    shared = sorted({k for r in runs + refs for k in r.data.params} - set(axes) - set(PER_RUN))
    latest = {}
    for r in sorted(refs, key=lambda r: r.info.start_time):
        latest[_pair_key(r, shared)] = r
    pairs = [(latest[key], r) for r in runs if (key := _pair_key(r, shared)) in latest]
    if not pairs:
        return (f"{NOTHING_MEASURED}{name} has a match in {ref_name} of {uri} (a run of the same GPU model "
                f"that agrees in every param but the compared ones: {', '.join(axes) or 'none'}): they hold "
                f"{len(runs)} and {len(refs)} verified GPU run(s).\n")
    on = "; ".join(f"{k} ({', '.join(sorted(map(str, a)))} against {', '.join(sorted(map(str, b)))})"
                   for k, (a, b) in axes.items()) or "no param differs (the same kernels measured again)"
    reps = _Replicates()
    for ref, r in pairs:
        reps(tr, ref), reps(tr, r)
    out = [f"{name} against {ref_name}; store: {uri}", f"Compared on: {on}.",
           "A verdict is of the run against its reference (the run agreeing in every other param, same GPU "
           "model).", "",
           "| kernel | against | M x N x K | reference us | us | R, R of reference | difference | verdict "
           "| reason |",
           "| --- | --- | --- | ---: | ---: | --- | ---: | --- | --- |"]
    verdicts = []
    for ref, r in sorted(pairs, key=lambda p: (p[1].data.tags.get("kernel", ""), _size_order(p[1]))):
        verdicts.append(v := reps.verdict(tr, ref, tr, r))
        kern, ref_kern = _with_data(r.data.tags.get("kernel", "?"), r), ref.data.tags.get("kernel", "?")
        out.append(f"| {kern} | {ref_kern} | {_size(r)} | {_us(ref):.2f} | {_us(r):.2f} | "
                   f"{v.replicates[1]}, {v.replicates[0]} | "
                   f"{_us(r) / _us(ref) - 1:+.2%} | {v.cell()} | {v.reason} |")
    used = {id(ref) for ref, _ in pairs}
    out += ["", f"{len(pairs)} pair(s); {len(runs) - len(pairs)} run(s) of {name} without a reference, "
                f"{sum(id(r) not in used for r in latest.values())} reference run(s) unmatched.",
            reps.tally(verdicts)]
    return "\n".join(out) + "\n"


def _size_order(run) -> list:
    return [int(x) for x in _size(run).split("x")] if "problem.m" in run.data.params else []


def _is_database(path: Path) -> bool:
    """Whether the file starts with SQLite's header (a store, not a table to overwrite)."""
    with open(path, "rb") as f:
        return f.read(16) == b"SQLite format 3\x00"


def _same_file(a: str, b: str) -> bool:
    """Two SQLite URIs that name one file (through a link, or with '..')."""
    pa, pb = sqlite_path(a), sqlite_path(b)
    if pa is None or pb is None:
        return False
    return pa.resolve() == pb.resolve() or (pa.is_file() and pb.is_file() and os.path.samefile(pa, pb))


def main(argv=None) -> int:
    """The command line; returns the exit status (2: nothing measured, the --out file untouched)."""
    ap = argparse.ArgumentParser(prog="python -m experiments.report", description=__doc__.splitlines()[0])
    ap.add_argument("--uri", default=None, help="tracking URI (default: as run.py resolves it)")
    ap.add_argument("--experiment", default="tensor-core-ablations")
    ap.add_argument("--out", default=None, help="also write the table to this file")
    ap.add_argument("--sweep", default=None, metavar="latest|RUN_ID",
                    help="the runs of one sweep only (its parent run id, or latest), those it reused from "
                         "earlier sweeps included and marked")
    ap.add_argument("--by-family", action="store_true",
                    help="families side by side: throughput, pct_of_peak, speedups "
                         "(results/h200/baselines.md)")
    ap.add_argument("--static", action="store_true",
                    help="the runs made without a GPU: registers, spills, shared memory, occupancy, SASS mix")
    ap.add_argument("--against", default=None, metavar="URI|previous|RUN_ID",
                    help="another store's URI: the same sweep measured there (e.g. one GPU against all "
                         "GPUs); previous or a run id of this store (a sweep's parent, or one run): the runs "
                         "of --sweep (default latest) against those, with a verdict per pair (same, faster, "
                         "slower, ambiguous: from the runs' replicates, timing.repeats)")
    ap.add_argument("--repeat", action="append", default=None, metavar="URI",
                    help="with --against: a store holding the first sweep run again (may be given more "
                         "than once); the largest distance of its medians from the first store's is the "
                         "single-GPU spread")
    args = ap.parse_args(argv)
    if args.repeat is not None and args.against is None:
        ap.error("--repeat widens the spread of an --against comparison: give --against too")
    if args.static and (args.by_family or args.against is not None):
        ap.error("--static tables the runs made without a GPU; --by-family and --against read GPU runs: "
                 "give one")
    runs_of_this_store = args.against is not None and is_run_ref(args.against.strip())
    given = (args.against or "").strip()
    if args.against is not None and not runs_of_this_store and not re.search(r"[:/\\.]", given) \
            and not Path(given).exists():
        ap.error(f"--against {given!r} is neither runs of this store (previous, or a run id: 32 hex digits) "
                 "nor another store (a tracking URI such as sqlite:///PATH/mlflow.db, or a path to one)")
    if runs_of_this_store and args.repeat is not None:
        ap.error("--repeat widens the spread of a comparison of two stores; --against previous or a run id "
                 "compares runs of this store by their replicates: drop --repeat")
    if args.against is not None and args.sweep is not None and not runs_of_this_store:
        ap.error("--against compares two stores' latest measurements run by run; --sweep selects one "
                 "sweep of one store: give one")
    if args.against is not None and args.by_family:
        ap.error("--against compares two stores run by run; --by-family summarises one store: give one")
    if args.against is not None and not args.against.strip():
        ap.error("--against needs the URI of the other store, e.g. sqlite:///$PWD/all.db")
    if args.out is not None:
        out = Path(args.out)
        if not args.out.strip() or out.is_dir() or args.out.endswith(("/", os.sep)):
            ap.error(f"--out {args.out!r} is not a file name: give the Markdown file to write, e.g. "
                     "results/h200/main_job.md")
        if out.is_file() and _is_database(out):
            ap.error(f"--out {args.out} is a database (an MLflow store?) and would be overwritten: give "
                     "the Markdown file to write, e.g. results/h200/main_job.md")
        if out.suffix.lower() != ".md":         # never a store's side file (-journal, .lock) or a script
            ap.error(f"--out {args.out} is not a Markdown file name: give one that ends in .md, e.g. "
                     "results/h200/main_job.md")
    table = families_table if args.by_family else results_table
    try:
        uri = resolve_uri(args.uri, create=False)
        if runs_of_this_store:
            text = verdict_table(uri, args.experiment, args.sweep or "latest", args.against.strip())
        elif args.against is not None:
            other = resolve_uri(args.against, create=False)
            if other == uri or _same_file(other, uri):
                ap.error(f"--against names the same store as --uri ({uri}): give the store of the other "
                         "measurement")
            repeats = []
            for given in args.repeat or ():
                rep = resolve_uri(given, create=False) if given.strip() else ""
                earlier = (uri, other, *repeats)
                if rep in ("", *earlier) or any(_same_file(rep, u) for u in earlier):
                    ap.error("--repeat needs a store of its own, apart from --uri, --against and any other "
                             "--repeat: the first sweep run once more")
                repeats.append(rep)
            text = against_table(uri, other, args.experiment, tuple(repeats))
        elif args.static:
            text = static_table(uri, args.experiment, args.sweep)
        else:
            text = table(uri, args.experiment, args.sweep)
    except StoreError as exc:                  # no such store, run or sweep: the input, like a usage error
        print(f"Store error: {exc}", file=sys.stderr)
        return 2
    if text.startswith((NOTHING_MEASURED, NO_STATIC)):    # nothing to table: an --out file is kept
        print(text + (f"{args.out} left as it is.\n" if args.out else ""), end="", file=sys.stderr)
        return 2
    print(text)
    if args.out:
        try:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(text)
        except OSError as exc:
            folder = next((p for p in Path(args.out).parents if p.is_file()), None)
            why = f"{folder} is a file, not a folder" if folder else exc.strerror or exc
            print(f"Could not write --out {args.out}: {why}", file=sys.stderr)
            return 2                            # the --out as given, as a store that is not there
    return 0


if __name__ == "__main__":
    from experiments.cli import run_main
    sys.exit(run_main(main))
