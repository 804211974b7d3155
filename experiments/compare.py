"""Relations between runs in the store: speedups over the baseline families and the share of the
GPU's measured peak (docs/DESIGN.md, "Speedups and peaks"). Metric and tag names from record.py.

- Every verified GEMM run of a family that is neither a baseline nor ``peak`` (the default family, ...) gets
  ``speedup_vs_<b>`` = its throughput / the throughput of the best verified run of baseline family
  ``b`` (wmma, dp4a, cublas) on the same GPU (tag ``gpu``), problem size and precision. Baseline runs
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
  (experiments.track.sweep_runs); a report of one sweep takes that sweep's peak. A peak run that
  arrives later updates the GEMM runs its own sweep measured that divide by its generation (a reused
  run keeps what the sweep that measured it logged). Peak runs fed from shared memory (param
  ``spec.feed=ldmatrix``) are the ceiling of a main loop, not of the instruction: they divide nothing.
Runs tracked before the family param existed count as the default family (``families.DEFAULT``).
"""
from __future__ import annotations

from .metrics import rounded
from .families import DEFAULT
from .record import BASELINES, PCT_OF_PEAK, PEAK, SPEEDUP
from .track import sweeps_of

__all__ = ["relate", "family_of", "speedups", "peak_of", "verified_runs", "peak_instruction", "VERIFIED",
           "instruction_of_peak", "feed_of", "PEAK_INSTRUCTION"]

# family -> the instruction of the peak its pct_of_peak divides by (experiments/families/peak.py,
# option instruction); every family not named here divides by the mma.sync peak, whose instruction
# value is the default family's name
PEAK_INSTRUCTION = {"wgmma": "wgmma"}
VERIFIED = "attributes.status = 'FINISHED' and tags.outcome = 'verified'"   # an MLflow filter


def family_of(run) -> str:
    """A run's family param (the default family for runs without one)."""
    return run.data.params.get("family", DEFAULT)


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
    verified run of the same GPU, size and precision with a positive throughput (the best of them)."""
    out = {}
    if _thr(run) is None or "problem.m" not in run.data.params:
        return out
    found = [r for r in verified_runs(tr, _same_problem(run)) if family_of(r) in only and (_thr(r) or 0) > 0]
    for b in only:
        best = max((_thr(r) for r in found if family_of(r) == b), default=None)
        if best:
            out[SPEEDUP.format(b)] = _thr(run) / best
    return rounded(out)


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
    """Log the relations of the verified run ``rid`` (a :class:`experiments.track.Tracker`'s store)
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
                if family_of(r) not in BASELINES + (PEAK,) and (got := speedups(tr, r, (fam,))):
                    tr.log(r.info.run_id, got)
                    logged[r.info.run_id] = got
    else:
        got = speedups(tr, run)
        if got:
            tr.log(rid, got)
        mine.update(got)
    if mine:
        logged[rid] = mine
    return logged
