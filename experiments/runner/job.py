"""One Hydra job = one kernel configuration of any family: validate, build the source (the family's
build: a rendered template, or CUDA C++), assemble, then per problem size verify + time on the GPU
(in the worker process) and track, or track the static resources (experiments.runner.kernel builds it).

Every run a job starts ends FINISHED (a skipped run too: tag ``outcome=skipped``, reason in
``skip_reason``), FAILED (tag ``error``, stage in ``failed_stage``) or KILLED (interrupted: tag
``outcome=interrupted``). In a multirun an impossible configuration becomes a skipped run and a job
that cannot run (no GPU for ``backend=gpu``, an unexpected error) a FAILED run with
``failed_stage=job``; the sweep goes on and exits non-zero at its end.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import time
import traceback
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf
from rich.console import Console

from ..store import record, track
from ..reports.compare import relate
from ..families import get as get_family
from ..families import names as family_names
from ..families.runner import WGMMA, family_name
from .kernel import (Kernel, SourceRejected, auto_tile_plans, git_commit, make_kernel,
                     resolved, tile_is_auto)
from ..metrics import rounded
from ..spec import SpecError, sm_count, value
from ..gpu.timing import key_items, key_params
from ..gpu.worker import GpuWorker, WorkerError, claim_gpu, gpu_lock, nvml_gpu

__all__ = ["run_job", "Counts", "JobError", "git_commit", "warm_process", "skipped_key"]

console = Console(highlight=False, soft_wrap=True)
_WORKER = GpuWorker()         # one GPU process per sweep process, kept across its jobs


class JobError(RuntimeError):
    """The job cannot run here (no GPU for backend=gpu, CuPy unusable); the message says what to do."""


class Counts(dict):
    """What :func:`run_job` returns: the counts of its runs' outcomes (a dict, e.g. ``{"finished": 1}``)
    and in ``runs`` the ids of every run the job started or found done or under way (claim), in
    order: a search reads its trial's results from them (experiments.runner.search)."""

    def __init__(self, counts: dict, runs=()):
        super().__init__(counts)
        self.runs = list(runs)


class _Job:
    """What one job knows about itself: label, mode, its overrides, the store and its sweep."""

    def __init__(self, cfg):
        hc = HydraConfig.get() if HydraConfig.initialized() else None
        self.multirun = hc is not None and hc.mode.name == "MULTIRUN"
        num = hc.job.num if self.multirun else 0
        self.sweep = track.current_sweep()
        self.label = f"[{num + 1}/{self.sweep['jobs']}]"
        self.overrides = " ".join(o for o in (hc.overrides.task if hc else [])
                                  if not o.lstrip("+~").startswith("tracking."))
        self.out_dir = Path(hc.runtime.output_dir) if hc else Path.cwd()
        data = resolved(cfg)
        # the store and experiment the sweep's start resolved (experiments.runner.sweep.tracking_target), not
        # this job's tracking.* again: a relative URI would be relative to the job's folder (chdir)
        uri, experiment = self.sweep["uri"], self.sweep["experiment"]
        if not uri:                 # a job started without run.py's sweep start
            uri, experiment = track.resolve_uri(cfg.tracking.uri), cfg.tracking.experiment
        self.tr = track.get_tracker(uri, experiment, float(cfg.tracking.wait), restore=True,
                                    stale_after=float(cfg.tracking.stale_after_s))
        # the variant=NAME that chose this job's kernel (a file of conf/variant/ or a preset's list)
        self.variant = (hc.runtime.choices.get("variant") if hc else None) or record.NONE
        self.params = {**record.params_of(track.flatten(data), variant=self.variant),
                       "family": family_name(cfg)}
        self.rid: str | None = None        # the run in progress
        self.started = 0
        self.runs: list = []               # every run started or claimed (Counts.runs)

    def parent(self) -> str:
        """The sweep's parent: made by the sweep's start (multirun), else found or made now."""
        return os.environ.get(track.SWEEP_ENV["parent"]) or self.tr.parent(self.sweep)

    def start(self, name: str, tags: dict, params: dict | None = None) -> str:
        self.rid = self.tr.start(name, params or self.params, tags, self.parent())
        self.started += 1
        self.runs.append(self.rid)
        return self.rid

    def claim(self, key: str, name: str, tags: dict, params: dict | None = None) -> tuple[str, str]:
        state, rid = self.tr.claim(key, name, params or self.params, tags, self.parent)
        self.runs.append(rid)
        if state == "new":
            self.rid, self.started = rid, self.started + 1
        return state, rid

    def finished_run(self, key: str):
        """The FINISHED run of measurement ``key`` (an mlflow Run), now a member of this sweep as
        :meth:`claim` makes it, or None: a kernel whose runs all have one is not built again."""
        run = self.tr.finished_run(key, self.parent)
        if run is not None:
            self.runs.append(run.info.run_id)
        return run

    def reuse(self, rid: str) -> str:
        """What the run ``rid`` that claim found is to this sweep: ', reused by this sweep' when an
        earlier sweep measured it (it joins this one, track.Tracker.join), else '' (this sweep's own)."""
        return ", reused by this sweep" if rid in self.tr.reused else ""

    def end(self, outcome: str, note: str, reason: str | None = None, stage: str | None = None) -> None:
        """End the run in progress with its outcome (record.OUTCOMES) and its one-line description."""
        tags = {"outcome": outcome, "mlflow.note.content": note}
        if stage:
            tags["failed_stage"] = stage
        self.tr.log(self.rid, tags=tags)
        self.tr.end(self.rid, "FAILED" if outcome == "failed" else "FINISHED", reason)
        self.rid = None


def run_job(cfg) -> Counts:
    """Run one job of the sweep for the composed config ``cfg``; returns counts of run outcomes, with
    the ids of its runs (:class:`Counts`).

    Outside a multirun, raises SpecError (an impossible configuration, before any work) or JobError.
    In a multirun both become runs with their reason (FINISHED with outcome=skipped, FAILED), as does
    any other exception, and the job returns; KeyboardInterrupt propagates (run.py closes the open runs).
    """
    job = _Job(cfg)
    counts = _outcomes(cfg, job)
    return Counts(counts, job.runs)


def _outcomes(cfg, job: _Job) -> dict:
    """run_job's counts (see there)."""
    try:
        return _run(cfg, job)
    except SpecError as exc:
        if not job.multirun:
            raise
        # the combination, once per store
        key = skipped_key(job.params)
        state, rid = job.claim(key, f"skipped {job.overrides}", {"backend": _backend_tag(cfg)})
        if state != "new":
            console.print(f"{job.label} skipped {job.overrides}: already recorded "
                          f"(run {rid}{job.reuse(rid)})")
            return {"done_before": 1}
        job.tr.log(job.rid, tags={"skip_reason": str(exc)})
        job.end("skipped", f"Skipped, not a failure: this combination cannot exist. {exc}")
        console.print(f"{job.label} [yellow]skipped[/] {job.overrides}: {exc}")
        return {"skipped": 1}
    except Exception as exc:
        reason = str(exc) if isinstance(exc, JobError) else f"{type(exc).__name__}: {exc}"
        if job.rid is None:
            job.start(f"failed {job.overrides}", {"backend": _backend_tag(cfg)})
        job.tr.artifact_text(job.rid, traceback.format_exc(), "traceback.txt")
        job.end("failed", f"The job could not run: {reason}", reason, "job")
        console.print(f"{job.label} [red]job failed[/] {job.overrides}: {reason.splitlines()[0]}")
        if not job.multirun:
            raise
        return {"crashed": 1}


def skipped_key(params: dict) -> str:
    """The run key of a skipped combination (once per store): its params as a run key holds them
    (:func:`experiments.gpu.timing.key_params`), ``data=full`` (today's operands) left out as before the
    key existed, and the params the record adds for the UI (``variant``, ``size``; ``study_kernel``
    unset as the config gave it, ``null``) as they were before those params existed."""
    kept = {k: v for k, v in key_params(params).items()
            if (k, v) != ("data", "full") and k not in ("variant", "size")}
    if kept.get("study_kernel") == record.NONE:
        kept["study_kernel"] = "null"
    return track.run_key("skipped", sorted(kept.items()))


def warm_process(gpu: bool) -> int:
    """Make a job process of a parallel launcher ready before its first job
    (experiments.runner.sweep.prewarm).
    With ``gpu``: claim this process's GPU and start its GPU worker, which imports CuPy and pays the
    first-call costs there (worker.warm_up: CUDA context, cuBLAS, verification kernels; the GPU's lock
    held shared) while this process imports the store's modules (MLflow with its SQL store, seconds).
    Returns the pid. A GPU that cannot be used is left for the first job to report."""
    claimed = claim_gpu() if gpu else None
    if claimed is not None:
        _WORKER.submit("warm_up", pci_bus_id=claimed.get("pci_bus_id"))
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401 - what the job's Tracker opens
    if claimed is not None:
        with contextlib.suppress(WorkerError):
            _WORKER.wait("warm_up", timeout=120)
    return os.getpid()


def _backend_tag(cfg) -> str:
    return "static" if value(cfg.backend) == "static" or nvml_gpu() is None else "gpu"


def ignored_keys(overrides: str, family: str) -> list[str]:
    """The keys among the job's command-line ``overrides`` (space-separated ``key=value``) that only
    another family reads (its ``root_keys``: the default family's options), when ``family`` is not that
    one: they would change nothing. A family with tile=auto (``auto_keys``: wgmma) reads tile=auto
    (with ``tile.auto``, ``tile.sms``): it chooses its own block tile then."""
    fam = get_family(family)
    others = {k for name in family_names() if name != family for k in get_family(name).root_keys}
    others -= set(fam.root_keys)
    auto = {"tile=auto", "tile.auto", "tile.sms"} if fam.auto_keys else set()
    return [k for k, v in _override_pairs(overrides) if k.split(".", 1)[0] in others
            and f"{k}={v}" not in auto and k not in auto]


def _override_pairs(overrides: str) -> list[tuple[str, str]]:
    """(key, value) of each space-separated ``key=value`` override, without a leading + or ~."""
    return [(k, v) for k, _, v in (o.lstrip("+~").partition("=") for o in overrides.split())]


def auto_replaced_keys(overrides: str, family: str) -> list[str]:
    """The keys among the job's command-line ``overrides`` that tile=auto sets itself for ``family``
    (its ``auto_keys``): their values would not be used."""
    return [k for k, _ in _override_pairs(overrides) if k in get_family(family).auto_keys]


def _run(cfg, job: _Job) -> dict:
    if ignored := ignored_keys(job.overrides, family_name(cfg)):
        one = len(ignored) == 1
        tile = ("; of the tile keys it reads tile=auto and tile.sms only (tile rows per group: family.group)"
                if family_name(cfg) == WGMMA and any(k.split(".")[0] == "tile" for k in ignored) else "")
        owners = [n for n in family_names() if ignored[0].split(".", 1)[0] in get_family(n).root_keys]
        console.print(f"{job.label} [yellow]note:[/] {', '.join(ignored)} appl{'ies' if one else 'y'} to "
                      f"family={' or '.join(owners)} only; family={family_name(cfg)} ignores "
                      f"{'it' if one else 'them'} "
                      f"(its options are family.*: `python run.py family={family_name(cfg)} --help`{tile})")
    if replaced := auto_replaced_keys(job.overrides, family_name(cfg)) if tile_is_auto(cfg) else []:
        many = len(replaced) > 1
        console.print(f"{job.label} [yellow]note:[/] tile=auto chooses {' and '.join(replaced)} per problem "
                      f"size; the value{'s' if many else ''} given {'are' if many else 'is'} not used "
                      "(a fixed tile: drop tile=auto)")
    if cfg.tile.get("sms") is not None and not tile_is_auto(cfg) and get_family(family_name(cfg)).auto_keys:
        console.print(f"{job.label} [yellow]note:[/] tile.sms plans tile=auto only; with a fixed tile it "
                      "changes nothing")
    backend = value(cfg.backend)
    gpu = None
    if backend != "static":
        gpu = claim_gpu(lambda: console.print(f"{job.label} waiting for a free GPU"))
        if gpu is not None:
            _WORKER.start()           # CuPy imports in the worker while this process builds the kernel
    if backend == "gpu" and gpu is None:
        raise JobError("backend=gpu but no NVIDIA GPU was found (NVML); use backend=auto or backend=static")
    if not tile_is_auto(cfg):
        return _run_kernel(cfg, job, gpu)
    counts: dict = {}
    for sub, tags in _auto_tiles(cfg, job, gpu):
        job.params = {**record.params_of(track.flatten(sub), variant=job.variant), "family": family_name(sub)}
        for key, n in _run_kernel(sub, job, gpu, tags).items():
            counts[key] = counts.get(key, 0) + n
    return counts


def _auto_tiles(cfg, job, gpu) -> list[tuple[object, dict]]:
    """tile=auto: the configs of the tiles the sizes get (kernel.auto_tile_plans) on this GPU's SMs
    (asked of the GPU; without one, spec.sm_count's table or default), with the runs' tags."""
    given = cfg.tile.get("sms")
    if gpu is not None:
        sms, source = sm_count(gpu["gpu"], _device(gpu).get("sm_count") if given is None else None, given)
    else:
        sms, source = sm_count((nvml_gpu() or {}).get("gpu"), None, given)
    plans = auto_tile_plans(cfg, gpu["compute_capability"] if gpu else None, sms)
    chosen = "; ".join(", ".join("x".join(map(str, shape)) for shape, _ in group) + f" -> {group[0][1].name}"
                       for _, group in plans)
    notes = dict.fromkeys(choice.note for _, group in plans for _, choice in group if choice.note)
    chosen += "".join(f" ({note})" for note in notes)
    console.print(f"{job.label} tile=auto on {sms} SMs ({source}): {chosen}")
    return [(sub, {"tile_auto": "true", "tile_auto_sms": f"{sms} ({source})"}) for sub, _ in plans]


def _run_kernel(cfg, job: _Job, gpu, auto_tags: dict | None = None) -> dict:
    """Build the kernel of ``cfg`` and run it: static, or per size on the GPU. ``auto_tags``: the
    tile=auto tags (the choice is part of the run key, so it is measured as a run of its own). The kernel
    is assembled unless every run of it is FINISHED already: a sweep run again does not build the kernels
    it measured."""
    kern = make_kernel(cfg, job.out_dir, gpu["compute_capability"] if gpu else None, gpu is not None,
                       job.params, lambda text: console.print(f"{job.label} {text}"), assemble=False)
    given, job.params = job.params, kern.params
    if auto_tags:
        kern.tags.update(auto_tags)
        kern.identity = (*kern.identity, "tile_auto")
    counts: dict = {}
    try:
        if gpu is None:
            return _run_static(cfg, job, kern)
        return _run_gpu(cfg, job, kern, gpu, counts)
    except SpecError:           # a launch cap the kernel cannot take: skipped with the config's params
        job.params = given
        raise
    except SourceRejected as exc:
        job.start(exc.kernel.name(None), exc.kernel.tags)
        _log_kernel_artifacts(job.tr, job.rid, exc.kernel, cfg)
        job.end("failed", f"{exc.tool} rejected the source:\n{exc}", str(exc), "assemble")
        console.print(f"{job.label} [red]{exc.tool} failed[/] for {exc.kernel.entry}:\n{exc}")
        counts["failed"] = counts.get("failed", 0) + 1
        return {key: n for key, n in counts.items() if n}        # what came before it, and this failure


def _said_done(job: _Job, name: str, rid: str, what: str) -> None:
    console.print(f"{job.label} {name}: {what} (run {rid}{job.reuse(rid)}); tracking.rerun=true to redo")


def _log_kernel_artifacts(tr: track.Tracker, rid: str, kern: Kernel, cfg) -> None:
    names = record.ARTIFACTS
    for name, text in kern.sources.items():
        tr.artifact_text(rid, text, name)
    tr.artifact_text(rid, OmegaConf.to_yaml(cfg), names["config"])
    if kern.asm is not None:
        tr.artifact_text(rid, kern.asm.report, names["ptxas"])
        if kern.asm.sass:
            tr.artifact_text(rid, kern.asm.sass, names["sass"])


def _run_static(cfg, job, kern: Kernel) -> dict:
    tags = kern.tags
    key = track.run_key("static", *kern.identity, tags["cuobjdump_version"], tags["nvdisasm_version"])
    if not cfg.tracking.rerun and (run := job.finished_run(key)) is not None:
        _said_done(job, kern.entry, run.info.run_id, "already tracked")
        return {"done_before": 1}
    kern.assemble()
    name = kern.name(None)
    state, rid = (("new", job.start(name, {**tags, "run_key": key})) if cfg.tracking.rerun
                  else job.claim(key, name, tags))
    if state != "new":
        _said_done(job, kern.entry, rid,
                   "already tracked" if state == "done" else "being tracked by another process")
        return {"done_before": 1}
    _log_kernel_artifacts(job.tr, rid, kern, cfg)
    asm = kern.asm
    ptxas = "ok" if asm else ("not applicable" if kern.needs_gpu else "missing")
    job.tr.log(rid, kern.static, {"ptxas": ptxas})
    if kern.needs_gpu:
        job.end("static", f"Not run: {kern.static_note}.")
        console.print(f"{job.label} {kern.entry}: {kern.static_note} [dim](static)[/]")
        return {"finished": 1}
    occ = (f"occupancy {kern.static.get('theoretical_occupancy_pct', 0):.0f}%" if asm  # the launch's
           else "no ptxas")
    regs = f"{asm.registers} regs, {asm.spill_stores} B spills" if asm else ""
    what = regs or "no resources: " + kern.static_note
    job.end("static", record.emulated_note(tags)
            + f"Assembled for {kern.arch} (no GPU: not run): {what}{', ' + occ if asm else ''}.")
    console.print(f"{job.label} {kern.entry}: {kern.arch} {regs} {occ} [dim](static)[/]")
    return {"finished": 1}


def _device(gpu: dict) -> dict:
    """What the worker reports of the GPU (worker.device_info), once per worker process: its first
    call is worker.warm_up (CUDA context, cuBLAS, verification kernels; never while another process
    times on the GPU), so that every kernel is timed by a worker in the same state, in a sweep of one
    process as in a parallel one (whose job processes warm up before their first job), and after a
    worker was replaced following a fault."""
    if _WORKER.device is None:
        try:
            _WORKER.call("ready", timeout=120)           # started, CuPy imported: no GPU work yet
            _WORKER.call("warm_up", timeout=120, pci_bus_id=gpu.get("pci_bus_id"))
        except WorkerError as exc:
            raise JobError(
                f"{gpu['gpu']} was found, but CuPy could not use it. Install the CuPy build for your "
                "CUDA major (pip install -e '.[cuda13]' or '.[cuda12]'), or run with backend=static.\n"
                f"{exc}") from None
    return _WORKER.device


def _run_gpu(cfg, job, kern: Kernel, gpu, counts: dict) -> dict:
    """The runs of ``kern`` on the GPU, one per size, in ``counts`` (also when SourceRejected is raised
    part-way): a size FINISHED already is said and skipped, the kernel assembled for the first other
    size (in a process whose worker has not reported the GPU yet, at once: the worker imports CuPy
    meanwhile, and the run keys need its report). The GPU's tags go to the runs, not to ``kern.tags``
    (a kernel ptxas rejects is recorded the same wherever it comes in the process)."""
    if _WORKER.device is None:
        kern.assemble()
    dev = _device(gpu)
    on_gpu = dict(gpu=dev["gpu"], gpu_uuid=gpu.get("uuid", ""), pci_bus_id=gpu.get("pci_bus_id", ""),
                  compute_capability=dev["compute_capability"], driver=gpu["driver"],
                  cuda_driver=gpu["cuda_driver"], cuda_runtime=dev["cuda_runtime"], cupy=dev["cupy"])
    timing = {k: v for k, v in OmegaConf.to_container(cfg.timing, enum_to_str=True).items()
              if k != "timeout_s"}
    counts.update(finished=0, failed=0, done_before=0)
    data = value(cfg.get("data", "full"))
    # operand data other than today's is part of the measurement (and its name); full keeps the old keys
    drawn = () if data == "full" else (("data", data),)
    for shape in kern.shapes:
        m, n, k = shape or (0, 0, 0)
        key = track.run_key("gpu", *kern.identity, m, n, k, dev["gpu"], dev["compute_capability"],
                            gpu["driver"], key_items(timing), cfg.verify.rtol, *drawn)
        seed = cfg.verify.seed if cfg.verify.seed is not None else secrets.randbits(31)
        size = ({"problem.m": m, "problem.n": n, "problem.k": k, "size": record.size_label(shape)} if shape
                else {})
        params = {**job.params, **size, "verify.seed_used": seed}
        if not kern.assembled and not cfg.tracking.rerun and (run := job.finished_run(key)) is not None:
            # the name as assembling would give it: EMULATED as the run's SASS tags say
            emulated = record.emulated(run.data.tags)
            shown = kern.name(shape, emulated=emulated) + "".join(f" data={d}" for _, d in drawn)
            _said_done(job, shown, run.info.run_id, "already measured")
            counts["done_before"] += 1
            continue
        kern.assemble()
        tags = {**kern.tags, **on_gpu}
        name = kern.name(shape) + "".join(f" data={d}" for _, d in drawn)
        if cfg.tracking.rerun:
            state, rid = "new", job.start(name, {**tags, "run_key": key}, params)
        else:
            state, rid = job.claim(key, name, tags, params)
        if state != "new":
            _said_done(job, name, rid,
                       "already measured" if state == "done" else "being measured by another process")
            counts["done_before"] += 1
            continue
        _log_kernel_artifacts(job.tr, rid, kern, cfg)
        func, kwargs = kern.call
        try:
            with gpu_lock(gpu.get("pci_bus_id"), lambda who: console.print(
                    f"{job.label} waiting for the GPU ({who} is timing on it)")):
                t0 = time.time()
                res = _WORKER.call(func, timeout=cfg.timing.timeout_s, **kwargs, m=m, n=n, k=k,
                                   timing=timing, rtol=cfg.verify.rtol, seed=seed,
                                   pci_bus_id=gpu.get("pci_bus_id"), **dict(drawn))
                t1 = time.time()
        except WorkerError as exc:
            job.tr.log(rid, kern.static)
            job.end("failed", f"The GPU work failed: {exc}", str(exc), "gpu")
            console.print(f"{job.label} {name}: [red]FAILED[/] {str(exc).splitlines()[0]}")
            counts["failed"] += 1
            continue
        ok = _track_result(job, rid, kern, res, (m, n, k), shape is not None, (t0, t1))
        counts["finished" if ok else "failed"] += 1
        if ok:
            _relate(job, rid)
    return counts


def _track_result(job, rid, kern: Kernel, res: dict, mnk, sized: bool, window) -> bool:
    """Log a worker result (the dict of worker.measure / measure_family) to run ``rid`` and end it:
    FAILED when verification failed, else the timing, GPU state and results. Returns verified."""
    m, n, k = mnk
    ver = {key: res[key] for key in ("verify_max_error", "verify_mismatches", "jit_registers",
                                     "jit_local_bytes", "jit_s") if key in res}
    tags = {"gpu_start_unix": f"{window[0]:.3f}", "gpu_end_unix": f"{window[1]:.3f}"}
    if "verify_rtol" in res:        # a tag, not a metric beside the param verify.rtol it may differ from
        tags["verify_tolerance"] = record.tolerance_text(res["verify_rtol"])
    if res.get("note"):
        tags["family_note"] = res["note"]
    label = f"{kern.entry} {m}x{n}x{k}" if sized else kern.entry
    if not res["verified"]:
        job.tr.log(rid, {**ver, **kern.static}, {"verified": "false", **tags})
        why = "verification failed: " + res["verify_message"]
        job.end("failed", f"Wrong result, not timed: {why}", why, "verify")
        console.print(f"{job.label} {label}: [red]WRONG[/] {res['verify_message']}")
        return False
    t = res["timing"]
    thr = kern.rate(m, n, k, t["median_us"])
    # results first: the run page lists metrics in logging order; rounded within the timing's noise
    # (the decimals of experiments.metrics)
    clock = record.clock_metrics(thr, t)
    first = ("throughput_per_ghz", "sm_clock_mhz_window", "sm_clock_mhz_mean", "throughput_at_max_clock",
             "throughput_per_w")
    metrics = {"throughput": thr, **{f: clock[f] for f in first if f in clock},
               **{f: t[f] for f in ("median_us", "spread", "min_us", "max_us")}, **ver,
               "launches_per_batch": t["launches_per_batch"], "batches": t["batches"], **clock}
    reasons = [res[f"state_{w}"].pop("clock_event_reasons", None) for w in ("before", "after")]
    for when in ("before", "after"):
        metrics.update({f"{field}_{when}": v for field, v in res[f"state_{when}"].items()})
    clocks = record.clock_reasons(None if None in reasons else reasons[0] | reasons[1])
    metrics.update(kern.static)
    reps, series = record.replicate_metrics(t)
    metrics.update(reps)
    tags.update({k: t[v] for k, v in (("energy_source", "energy_source"), ("burst_idle", "idle")) if v in t})
    job.tr.log(rid, rounded(metrics), {"verified": "true", "timing_method": t["method"], **tags,
                              "l2_flush": t["l2_flush"], "throughput_unit": kern.unit,
                              "clocks_throttled": clocks}, series)
    job.tr.artifact_text(rid, "\n".join(f"{x:.3f}" for x in t["batch_us"]), record.ARTIFACTS["batches"])
    line = record.result_line(mnk, t["median_us"], thr, kern.unit, t["spread"], clocks, clock)
    line = line if sized else kern.entry + line[line.index(":"):]
    job.end("verified", record.emulated_note(kern.tags) + line)
    mhz = clock.get("sm_clock_mhz_window") or clock.get("sm_clock_mhz_mean")
    sm = f"  SM {mhz:.0f} MHz" if mhz else ""
    sm += f"  {clock['power_w_avg']:.0f} W" if clock.get("power_w_avg") else ""
    console.print(f"{job.label} {label}: {t['median_us']:10.1f} us  {thr:8.1f} {kern.unit}  "
                  f"spread {t['spread']:.1%}{sm}  [green]verified[/]")
    return True


def _relate(job, rid: str) -> None:
    """Speedups and pct_of_peak for the new run and the runs it is a reference of (compare.relate);
    a store error here is reported and does not change the run's outcome."""
    try:
        relate(job.tr, rid)
    except Exception as exc:  # noqa: BLE001 - the measurement stands; the relation can be redone
        console.print(f"{job.label} [yellow]speedups / pct_of_peak not logged for run {rid}:[/] "
                      f"{type(exc).__name__}: {exc}")
