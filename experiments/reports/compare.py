"""Relations between runs in the store: speedups over the baseline families and the share of the
GPU's measured peak (docs/DESIGN.md, "Speedups and peaks"). Metric and tag names from record.py.

- Every verified GEMM run of a family that is neither a baseline nor ``peak`` (the default family, ...) gets
  ``speedup_vs_<b>`` = its throughput / the throughput of the best verified run of baseline family
  ``b`` (wmma, dp4a, cublas) on the same GPU (tag ``gpu``), problem size and precision, and the tag
  ``speedup_vs_<b>.run`` naming that run (id and name: it may be another sweep's). Baseline runs
  get no speedups. When a baseline run arrives later, the GEMM runs it is a reference of are updated.
- Every verified GEMM run (baselines too) gets ``pct_of_peak`` = 100 x its throughput / the
  throughput of a verified ``peak`` run of the same GPU, driver, precision and tensor-core generation,
  and the tag ``peak_run`` with that run's id. The generation is the instruction the family issues:
  runs of family ``wgmma`` divide by the peak measured with ``wgmma.mma_async`` (peak param
  ``spec.instruction=wgmma``), every other family (the default, wmma, dp4a, and cuBLAS as before) by the
  ``mma.sync`` peak (peak runs without the param are mma.sync peaks). The peak run is one of the same
  sweep (parent run) when the sweep measured one, else the latest in the store; of its shapes, the one
  the run itself issues (param ``spec.mma``) when measured, else the highest (the precision's
  ceiling). The runs of a sweep are those it measured and those it reused from earlier sweeps
  (experiments.store.track.sweep_runs); a report of one sweep takes that sweep's peak. A peak run that
  arrives later updates the GEMM runs its own sweep measured that divide by its generation (a reused
  run keeps what the sweep that measured it logged). Peak runs fed from shared memory (param
  ``spec.feed=ldmatrix``) are the ceiling of a main loop, not of the instruction: they divide nothing.
Runs tracked before the family param existed count as the default family (``families.DEFAULT``).
A speedup divides runs of the same operand data (param ``data``; ``full`` for runs without it).

Whether one run is faster than another: :func:`verdict` of their replicate medians (metric
``replicate_median_us``, one value per replicate of ``timing.repeats``; :func:`replicates` reads them)
says same, faster, slower or ambiguous, with its reason and numbers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..metrics import rounded
from ..families import DEFAULT
from ..store.record import BASELINES, PCT_OF_PEAK, PEAK, SPEEDUP, SPEEDUP_RUN
from ..store.track import sweeps_of

__all__ = ["relate", "family_of", "speedups", "peak_of", "verified_runs", "peak_instruction", "VERIFIED",
           "speedups_with_runs",
           "instruction_of_peak", "feed_of", "PEAK_INSTRUCTION", "data_of", "Verdict", "verdict",
           "replicates", "noise_of", "REPLICATES", "VERDICTS", "NOISE_FLOOR", "NOISE_TIMES",
           "CLOCK_TOLERANCE", "LEVEL", "NO_REPLICATES", "clock_of"]

# family -> the instruction of the peak its pct_of_peak divides by (experiments/families/peak.py,
# option instruction); every family not named here divides by the mma.sync peak, whose instruction
# value is the default family's name
PEAK_INSTRUCTION = {"wgmma": "wgmma"}
VERIFIED = "attributes.status = 'FINISHED' and tags.outcome = 'verified'"   # an MLflow filter


def family_of(run) -> str:
    """A run's family param (the default family for runs without one)."""
    return run.data.params.get("family", DEFAULT)


def data_of(run) -> str:
    """A run's operand data (param ``data``; ``full``, today's operands, for runs without it)."""
    return run.data.params.get("data", "full")


def _q(value: str) -> str:
    return "'" + str(value).replace("'", "\\'") + "'"


def verified_runs(tr, where: str) -> list:
    """The verified FINISHED runs of the tracker's experiment that also match the MLflow filter ``where``."""
    return tr.client.search_runs([tr.experiment_id], f"{VERIFIED} and {where}", max_results=50000)


def _thr(run) -> float | None:
    return run.data.metrics.get("throughput")


def _same_problem(run) -> str:
    p = run.data.params
    return (f"tags.gpu = {_q(run.data.tags.get('gpu', ''))} and params.precision = {_q(p.get('precision'))}"
            + "".join(f" and params.`problem.{d}` = {_q(p.get(f'problem.{d}'))}" for d in "mnk"))


def speedups(tr, run, only: tuple = BASELINES) -> dict:
    """``{speedup_vs_<b>: value}`` of a GEMM ``run`` for each baseline family b in ``only`` that has a
    verified run of the same GPU, size, precision and operand data with a positive throughput (the best
    of them)."""
    return speedups_with_runs(tr, run, only)[0]


def speedups_with_runs(tr, run, only: tuple = BASELINES) -> tuple[dict, dict]:
    """(:func:`speedups`, the tags that name the run each divides by: ``speedup_vs_<b>.run`` =
    '<run id> <run name>' of that baseline run, which may be of another sweep)."""
    out, refs = {}, {}
    if _thr(run) is None or "problem.m" not in run.data.params:
        return out, refs
    found = [r for r in verified_runs(tr, _same_problem(run))
             if family_of(r) in only and data_of(r) == data_of(run) and (_thr(r) or 0) > 0]
    for b in only:
        best = max((r for r in found if family_of(r) == b), key=_thr, default=None)
        if best is not None:
            out[SPEEDUP.format(b)] = _thr(run) / _thr(best)
            refs[SPEEDUP_RUN.format(b)] = f"{best.info.run_id} {best.info.run_name}"
    return rounded(out), refs


def peak_instruction(run) -> str:
    """The instruction of the peak a GEMM run relates to: wgmma for family wgmma, else mma.sync (the
    default family's name)."""
    return PEAK_INSTRUCTION.get(family_of(run), DEFAULT)


def instruction_of_peak(run) -> str:
    """The instruction a peak run measured (param ``spec.instruction``; mma.sync, the default family's
    name, without it)."""
    return run.data.params.get("spec.instruction", DEFAULT)


def feed_of(run) -> str:
    """How a peak run's instruction was fed (param ``spec.feed``; registers without it): only
    register-fed peaks are the instruction's ceiling, an ``ldmatrix``-fed one is a main loop's."""
    return run.data.params.get("spec.feed", "registers")


def peak_of(tr, run, instruction: str | None = None, sweep: str | None = None):
    """The peak run ``run``'s pct_of_peak divides by (see the module's rule), or None.
    ``instruction`` (mma.sync, named as the default family, or wgmma): that generation's peak instead of
    :func:`peak_instruction`'s;
    ``sweep``: the parent run id whose peaks (measured or reused) come first (default: ``run``'s
    parent; a report of a sweep passes it, as ``run`` may be one the sweep reused)."""
    t, p = run.data.tags, run.data.params
    want = instruction or peak_instruction(run)
    where = (f"params.family = 'peak' and tags.gpu = {_q(t.get('gpu', ''))} and "
             f"tags.driver = {_q(t.get('driver', ''))} and params.precision = {_q(p.get('precision'))}")
    peaks = [r for r in verified_runs(tr, where) if (_thr(r) or 0) > 0 and instruction_of_peak(r) == want
             and feed_of(r) == "registers"]
    sweep = sweep or t.get("mlflow.parentRunId")
    same = [r for r in peaks if sweep and sweep in sweeps_of(r)]
    peaks = same or peaks
    latest: dict = {}                       # per mma shape, the latest run
    for r in peaks:
        shape = r.data.params.get("spec.mma")
        if shape not in latest or r.info.start_time > latest[shape].info.start_time:
            latest[shape] = r
    if not latest:
        return None
    return latest.get(p.get("spec.mma")) or max(latest.values(), key=_thr)


def _log_peak(tr, run) -> dict:
    peak = peak_of(tr, run)
    if peak is None or _thr(run) is None:
        return {}
    pct = rounded({PCT_OF_PEAK: 100.0 * _thr(run) / _thr(peak)})[PCT_OF_PEAK]
    tr.log(run.info.run_id, {PCT_OF_PEAK: pct}, {"peak_run": peak.info.run_id})
    return {PCT_OF_PEAK: pct, "peak_run": peak.info.run_id}


def relate(tr, rid: str) -> dict:
    """Log the relations of the verified run ``rid`` (a :class:`experiments.store.track.Tracker`'s store)
    and of the runs it is a reference of. Returns {run id: {metric or tag: value}} of what was logged.

    A GEMM run gets its speedups and pct_of_peak; a baseline run its pct_of_peak, and the GEMM runs
    of the same GPU, size and precision their ``speedup_vs_<its family>``; a peak run updates the
    pct_of_peak of the GEMM runs of its sweep (same GPU, driver and precision) that divide by its
    instruction (:func:`peak_instruction`)."""
    run = tr.client.get_run(rid)
    fam, logged = family_of(run), {}
    if fam == PEAK:
        parent = run.data.tags.get("mlflow.parentRunId")
        if not parent:
            return logged
        where = (f"tags.mlflow.parentRunId = {_q(parent)} and tags.gpu = {_q(run.data.tags.get('gpu', ''))} "
                 f"and tags.driver = {_q(run.data.tags.get('driver', ''))} and "
                 f"params.precision = {_q(run.data.params.get('precision'))}")
        measured = instruction_of_peak(run)
        if feed_of(run) != "registers":
            return logged               # a main loop's ceiling (feed=ldmatrix) divides nothing
        for r in verified_runs(tr, where):
            if family_of(r) != PEAK and peak_instruction(r) == measured and (got := _log_peak(tr, r)):
                logged[r.info.run_id] = got
        return logged
    mine = _log_peak(tr, run)
    if fam in BASELINES:
        if "problem.m" in run.data.params:
            for r in verified_runs(tr, _same_problem(run)):
                if family_of(r) not in BASELINES + (PEAK,):
                    got, refs = speedups_with_runs(tr, r, (fam,))
                    if got:
                        tr.log(r.info.run_id, got, refs)
                        logged[r.info.run_id] = {**got, **refs}
    else:
        got, refs = speedups_with_runs(tr, run)
        if got:
            tr.log(rid, got, refs)
        mine.update({**got, **refs})
    if mine:
        logged[rid] = mine
    return logged


# ----------------------------------------------------------------------------- verdicts
REPLICATES = "replicate_median_us"   # one value per replicate of timing.repeats, MLflow steps 0..R-1
# a run's SM clock while it was timed: the SMs' own count over the timed windows, else NVML's mean
CLOCKS = ("sm_clock_mhz_window", "sm_clock_mhz_mean")
VERDICTS = ("same", "faster", "slower", "ambiguous")
LEVEL = 0.90            # the interval of the ratio: two one-sided tests at 5 % each
NOISE_TIMES = 3.0       # the equivalence margin: this many times the replicate noise ...
NOISE_FLOOR = 0.01      # ... and at least this (relative): below it no two runs are told apart
CLOCK_TOLERANCE = 0.01  # mean SM clocks further apart than this (relative): times compared as cycles
NO_REPLICATES = "no replicates (timing.repeats)"


@dataclass(frozen=True)
class Verdict:
    """How a second run compares with a first (:func:`verdict`). call: same | faster | slower |
    ambiguous (:data:`VERDICTS`); reason: why, with the numbers; ratio: second / first (times, or cycles
    where ``normalised``; of the geometric means of the replicate medians, of the medians without
    replicates); low, high: its interval at :data:`LEVEL` (None without replicates); margin:
    the equivalence margin (relative); noise: the replicate noise it came from (relative standard
    deviation of one replicate); replicates: (R of the first, R of the second); clocks: the two mean
    SM clocks (MHz) where known; normalised: times were multiplied by their clocks (cycles compared)."""
    call: str
    reason: str
    ratio: float
    low: float | None = None
    high: float | None = None
    margin: float | None = None
    noise: float | None = None
    replicates: tuple = (1, 1)
    clocks: tuple = (None, None)
    normalised: bool = False

    def cell(self) -> str:
        """The verdict in a table cell: the call and the ratio as a change (``slower +15.2 %``)."""
        return f"{self.call} {self.ratio - 1:+.1%}"


def _sd(logs: list) -> float:
    """Sample standard deviation of ``logs`` (0 for fewer than two)."""
    n = len(logs)
    if n < 2:
        return 0.0
    mean = sum(logs) / n
    return math.sqrt(sum((v - mean) ** 2 for v in logs) / (n - 1))


def noise_of(samples: list) -> float | None:
    """The replicate noise of one run: the standard deviation of the logs of its replicate medians
    (relative, e.g. 0.01 = 1 %); None for fewer than two replicates."""
    return _sd([math.log(v) for v in samples]) if len(samples) >= 2 else None


def _interval(x: list, y: list, level: float) -> tuple[float, float, float]:
    """Welch's interval of mean(y) - mean(x) at ``level``: (difference, low, high); the difference alone
    (low = high) when neither sample varies."""
    from scipy.stats import t
    nx, ny = len(x), len(y)
    d = sum(y) / ny - sum(x) / nx
    vx, vy = _sd(x) ** 2 / nx, _sd(y) ** 2 / ny
    if vx + vy == 0:
        return d, d, d
    df = (vx + vy) ** 2 / (vx ** 2 / (nx - 1) + vy ** 2 / (ny - 1))
    half = t.ppf((1 + level) / 2, df) * math.sqrt(vx + vy)
    return d, d - half, d + half


def verdict(first: list, second: list, *, clocks: tuple = (None, None), noise: float | None = None,
            floor: float = NOISE_FLOOR, times: float = NOISE_TIMES, level: float = LEVEL,
            clock_tolerance: float | None = CLOCK_TOLERANCE) -> Verdict:
    """Whether the second run is the same as, faster or slower than the first, from their replicate
    medians ``first`` and ``second`` (us; each replicate's median batch, :func:`replicates`).

    An equivalence test on the ratio second / first: the interval at ``level`` of the difference of the
    mean logs (Welch's t, the replicates of each run independent and log-normal; exp gives the ratio of
    the geometric means) against the margin +-(``times`` x ``noise``, at least ``floor``), ``noise``
    being the relative standard deviation of one replicate (default: pooled over the two runs; a report
    passes the median over all its runs, :func:`noise_of`); the interval is never narrower than that
    noise implies for the replicates at hand (normal quantile), so two runs whose few replicates agree
    by chance are not trusted beyond the noise of the others. same: the interval lies within the margin;
    slower (faster): it lies wholly above (below) it; ambiguous otherwise, and whenever a run has fewer
    than two replicates (reason "no replicates (timing.repeats)"): one run's batches, taken within a
    second, say nothing of how far a re-measurement moves. ``clocks`` (MHz, the runs' SM clocks while
    timed, :func:`clock_of`):
    where both are known and differ by more than ``clock_tolerance`` (relative; None: never), each
    time is multiplied by its run's clock and cycles are compared (a clock the kernel itself lowers, by
    its power, is then normalised away too), and the reason says so.

    Raises ValueError for an empty sample or a value that is not a finite time > 0."""
    for name, xs in (("first", first), ("second", second)):
        if not xs or not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in xs):
            raise ValueError(f"the {name} run's replicate medians {list(xs)} are not finite times > 0")
    a, b = list(first), list(second)
    ca, cb = clocks
    normalised = bool(clock_tolerance is not None and ca and cb and abs(cb / ca - 1) > clock_tolerance)
    note = ""
    if normalised:
        a, b = [v * ca for v in a], [v * cb for v in b]
        note = (f"; normalised by the SM clock ({ca:.0f} MHz first, {cb:.0f} MHz second, "
                f"{cb / ca - 1:+.1%}: cycles compared)")
    reps = (len(a), len(b))
    x, y = [math.log(v) for v in a], [math.log(v) for v in b]
    if min(reps) < 2:
        ratio = _median(b) / _median(a)
        which = ("both runs have" if max(reps) < 2 else
                 f"the {'first' if reps[0] < 2 else 'second'} run has")
        return Verdict("ambiguous", f"{NO_REPLICATES}: {which} R = 1; {ratio - 1:+.1%} is not told from "
                       f"noise{note}", ratio, replicates=reps, clocks=clocks, normalised=normalised)
    pooled = math.sqrt(((reps[0] - 1) * _sd(x) ** 2 + (reps[1] - 1) * _sd(y) ** 2) / (sum(reps) - 2))
    noise = pooled if noise is None else noise
    margin = max(floor, times * noise)
    d, lo, hi = _interval(x, y, level)
    from scipy.stats import norm
    half = max(hi - d, norm.ppf((1 + level) / 2) * noise * math.sqrt(1 / reps[0] + 1 / reps[1]))
    lo, hi = d - half, d + half
    edge = math.log1p(margin)
    if -edge < lo and hi < edge:
        call, where = "same", f"within +-{margin:.1%}"
    elif lo > edge:
        call, where = "slower", f"above +{margin:.1%}"
    elif hi < -edge:
        call, where = "faster", f"below -{margin:.1%}"
    else:
        call = "ambiguous"
        where = f"across the margin +-{margin:.1%}: more replicates (timing.repeats) narrow it"
    reason = (f"{math.exp(d) - 1:+.2%} ({level:.0%} interval {math.expm1(lo):+.2%} .. {math.expm1(hi):+.2%}) "
              f"{where} (margin {times:g} x replicate noise {noise:.2%}, at least {floor:.0%}); "
              f"R = {reps[0]}, {reps[1]}{note}")
    return Verdict(call, reason, math.exp(d), math.exp(lo), math.exp(hi), margin, noise, reps, clocks,
                   normalised)


def _median(xs: list) -> float:
    s, n = sorted(xs), len(xs)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def clock_of(run) -> float | None:
    """A run's SM clock while it was timed (MHz): ``sm_clock_mhz_window`` (the SMs' own count over the
    timed windows) where it was measured, else ``sm_clock_mhz_mean`` (NVML's samples); None without."""
    return next((run.data.metrics[c] for c in CLOCKS if run.data.metrics.get(c)), None)


def replicates(tr, run) -> list:
    """The replicate medians of ``run`` (us): metric ``replicate_median_us`` by step (0..R-1), the last
    value logged per step; a run without them (``timing.repeats`` = 1, or older) gives [median_us], one
    replicate; [] without a median."""
    history = tr.client.get_metric_history(run.info.run_id, REPLICATES)
    by_step = {}
    for m in sorted(history, key=lambda m: m.timestamp):
        by_step[m.step] = m.value
    if by_step:
        return [by_step[k] for k in sorted(by_step)]
    us = run.data.metrics.get("median_us")
    return [] if us is None else [us]
