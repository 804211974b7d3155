"""One Hydra job = one kernel configuration: validate, render, assemble, then per problem size
verify + time on the GPU (in the worker process) and track, or track the static resources.

Every run a job starts ends FINISHED, FAILED (tag ``error``, stage in ``failed_stage``) or KILLED
(tag ``skip_reason``). In a multirun an impossible configuration becomes a skipped run and a job
that cannot run (no GPU for ``backend=gpu``, an unexpected error) a FAILED run with
``failed_stage=job``; the sweep goes on and exits non-zero at its end.
"""
from __future__ import annotations

import functools
import os
import secrets
import time
import traceback
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf
from rich.console import Console

from . import record, track
from .assemble import Assembly, PtxasError, PtxasMissing, assemble, sass_summary
from .render import ptx_sha256, render
from .spec import KernelSpec, SpecError, spec_from_config, value
from .sweep import current_sweep
from .timing import tflops
from .toolchain import toolchain_tags
from .worker import GpuWorker, WorkerError, claim_gpu, gpu_lock, nvml_gpu

__all__ = ["run_job", "JobError"]

console = Console(highlight=False, soft_wrap=True)
_WORKER = GpuWorker()         # one GPU process per sweep process, kept across its jobs
_DEVICE: dict = {}            # what the worker reported of the GPU, asked once per process


class JobError(RuntimeError):
    """The job cannot run here (no GPU for backend=gpu, CuPy unusable); the message says what to do."""


class _Job:
    """What one job knows about itself: label, mode, its overrides, the store and its sweep."""

    def __init__(self, cfg):
        hc = HydraConfig.get() if HydraConfig.initialized() else None
        self.multirun = hc is not None and hc.mode.name == "MULTIRUN"
        num = hc.job.num if self.multirun else 0
        self.sweep = current_sweep()
        self.label = f"[{num + 1}/{self.sweep['jobs']}]"
        self.overrides = " ".join(o for o in (hc.overrides.task if hc else [])
                                  if not o.lstrip("+~").startswith("tracking."))
        self.out_dir = Path(hc.runtime.output_dir) if hc else Path.cwd()
        self.tr = track.get_tracker(track.resolve_uri(cfg.tracking.uri), cfg.tracking.experiment)
        self.params = record.params_of(track.flatten(cfg), {})
        self.rid: str | None = None        # the run in progress
        self.started = 0

    def parent(self) -> str:
        """The sweep's parent: made by the sweep's start (multirun), else found or made now."""
        return os.environ.get(track.SWEEP_ENV["parent"]) or self.tr.parent(self.sweep)

    def start(self, name: str, tags: dict, params: dict | None = None) -> str:
        self.rid = self.tr.start(name, params or self.params, tags, self.parent())
        self.started += 1
        return self.rid

    def claim(self, key: str, name: str, tags: dict, params: dict | None = None) -> tuple[str, str]:
        state, rid = self.tr.claim(key, name, params or self.params, tags, self.parent)
        if state == "new":
            self.rid, self.started = rid, self.started + 1
        return state, rid

    def end(self, outcome: str, note: str, reason: str | None = None, stage: str | None = None) -> None:
        """End the run in progress with its outcome (record.OUTCOMES) and its one-line description."""
        tags = {"outcome": outcome, "mlflow.note.content": note}
        if stage:
            tags["failed_stage"] = stage
        self.tr.log(self.rid, tags=tags)
        self.tr.end(self.rid, "FAILED" if outcome == "failed" else "FINISHED", reason)
        self.rid = None


def run_job(cfg) -> dict:
    """Run one job of the sweep for the composed config ``cfg``; returns counts of run outcomes.

    Outside a multirun, raises SpecError (an impossible configuration, before any work) or JobError.
    In a multirun both become runs with their reason (KILLED skipped, FAILED), as does any other
    exception, and the job returns; KeyboardInterrupt propagates (run.py closes the open runs).
    """
    job = _Job(cfg)
    try:
        return _run(cfg, job)
    except SpecError as exc:
        if not job.multirun:
            raise
        job.start(f"skipped {job.overrides}", {"backend": _backend_tag(cfg)})
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


def _backend_tag(cfg) -> str:
    return "static" if value(cfg.backend) == "static" or nvml_gpu() is None else "gpu"


def _shapes(cfg) -> list[tuple[int, int, int]]:
    return [tuple(int(x) for x in s) for s in cfg.problem.shapes] or [(n, n, n) for n in cfg.problem.sizes]


def _check_shapes(spec: KernelSpec, shapes) -> None:
    """Every problem size must fit the kernel, in every backend, before any work (SpecError)."""
    if not shapes:
        raise SpecError("problem.sizes and problem.shapes are both empty; give at least one size")
    bad = []
    for m, n, k in shapes:
        try:
            spec.check_problem(m, n, k)
        except SpecError as exc:
            bad.append(f"{m}x{n}x{k}: {str(exc).split(': ', 1)[-1]}")
    if bad:
        raise SpecError(f"{len(bad)} of {len(shapes)} problem sizes do not fit {spec.entry}: "
                        + " | ".join(bad))


def _static_metrics(spec: KernelSpec, asm: Assembly | None) -> dict:
    m = {"threads": spec.threads, "smem_dynamic_bytes": spec.smem_bytes}
    if asm is not None:
        m.update(registers=asm.registers, spill_stores_bytes=asm.spill_stores,
                 spill_loads_bytes=asm.spill_loads, stack_frame_bytes=asm.stack_frame,
                 smem_static_bytes=asm.static_smem, theoretical_occupancy=asm.occupancy,
                 blocks_per_sm=asm.blocks_per_sm)
        m.update(sass_summary(asm, spec)[0])
    return m


def _log_kernel_artifacts(tr: track.Tracker, rid: str, ptx: str, asm: Assembly | None, cfg) -> None:
    names = record.ARTIFACTS
    tr.artifact_text(rid, ptx, names["ptx"])
    tr.artifact_text(rid, OmegaConf.to_yaml(cfg), names["config"])
    if asm is not None:
        tr.artifact_text(rid, asm.report, names["ptxas"])
        if asm.sass:
            tr.artifact_text(rid, asm.sass, names["sass"])


def _run(cfg, job: _Job) -> dict:
    backend = value(cfg.backend)
    gpu = None
    if backend != "static":
        gpu = claim_gpu(lambda: console.print(f"{job.label} waiting for a free GPU"))
    if backend == "gpu" and gpu is None:
        raise JobError("backend=gpu but no NVIDIA GPU was found (NVML); use backend=auto or backend=static")
    use_gpu = gpu is not None
    spec = spec_from_config(cfg, gpu["compute_capability"] if gpu else None)
    shapes = _shapes(cfg)
    _check_shapes(spec, shapes)

    ptx = render(spec)
    sha = ptx_sha256(ptx)
    job.out_dir.mkdir(parents=True, exist_ok=True)
    ptx_path = job.out_dir / f"{spec.entry}.ptx"
    ptx_path.write_text(ptx)
    tools = toolchain_tags()
    tags = {"kernel": spec.entry, "ptx_sha256": sha, "arch": spec.arch,
            "backend": "gpu" if use_gpu else "static", **tools}
    if cfg.get("study_kernel"):
        tags["study_kernel"] = cfg.study_kernel
    if commit := git_commit():
        tags["git_commit"] = commit
    job.params = record.params_of(job.params, spec.flat())
    identity = (sorted(spec.flat().items()), sha, tools["ptxas_version"])
    asm = None
    try:
        asm = assemble(ptx, spec.entry, spec.arch, threads=spec.threads, dyn_smem=spec.smem_bytes,
                       workdir=job.out_dir / "ptxas")
    except PtxasMissing as exc:
        console.print(f"{job.label} [yellow]{exc}[/] Tracking the rendered kernel without resources.")
    except PtxasError as exc:
        job.start(record.run_name(spec), tags)
        _log_kernel_artifacts(job.tr, job.rid, ptx, None, cfg)
        job.end("failed", f"ptxas rejected the PTX:\n{exc}", str(exc), "assemble")
        console.print(f"{job.label} [red]ptxas failed[/] for {spec.entry}:\n{exc}")
        return {"failed": 1}
    static = _static_metrics(spec, asm)
    if asm is not None:
        tags.update(sass_summary(asm, spec)[1])
    if not use_gpu:
        return _run_static(cfg, job, spec, ptx, asm, static, tags, identity)
    return _run_gpu(cfg, job, spec, gpu, ptx, ptx_path, asm, static, tags, identity, shapes)


def _run_static(cfg, job, spec, ptx, asm, static, tags, identity) -> dict:
    key = track.run_key("static", *identity, tags["cuobjdump_version"], tags["nvdisasm_version"])
    name = record.run_name(spec)
    state, rid = (("new", job.start(name, {**tags, "run_key": key})) if cfg.tracking.rerun
                  else job.claim(key, name, tags))
    if state != "new":
        what = "already tracked" if state == "done" else "being tracked by another process"
        console.print(f"{job.label} {spec.entry}: {what} (run {rid}); tracking.rerun=true to redo")
        return {"done_before": 1}
    _log_kernel_artifacts(job.tr, rid, ptx, asm, cfg)
    job.tr.log(rid, static, {"ptxas": "missing" if asm is None else "ok"})
    occ = f"occupancy {asm.occupancy:.0%}" if asm else "no ptxas"
    regs = f"{asm.registers} regs, {asm.spill_stores} B spills" if asm else ""
    job.end("static", f"Assembled for {spec.arch} (no GPU: not run): {regs or 'no ptxas, no resources'}"
                      f"{', ' + occ if asm else ''}.")
    console.print(f"{job.label} {spec.entry}: {spec.arch} {regs} {occ} [dim](static)[/]")
    return {"finished": 1}


def _device(gpu: dict) -> dict:
    if not _DEVICE:
        try:
            _DEVICE.update(_WORKER.call("device_info", timeout=120))
        except WorkerError as exc:
            raise JobError(
                f"{gpu['gpu']} was found, but CuPy could not use it. Install the CuPy build for your "
                "CUDA major (pip install -e '.[cuda13]' or '.[cuda12]'), or run with backend=static.\n"
                f"{exc}") from None
    return _DEVICE


def _run_gpu(cfg, job, spec, gpu, ptx, ptx_path, asm, static, tags, identity, shapes) -> dict:
    dev = _device(gpu)
    tags.update(gpu=dev["gpu"], gpu_uuid=gpu.get("uuid", ""), pci_bus_id=gpu.get("pci_bus_id", ""),
                compute_capability=dev["compute_capability"], driver=gpu["driver"],
                cuda_driver=gpu["cuda_driver"], cuda_runtime=dev["cuda_runtime"], cupy=dev["cupy"])
    unit = "TFLOP/s" if spec.prec.is_float else "TOP/s"
    timing = {k: v for k, v in OmegaConf.to_container(cfg.timing).items() if k != "timeout_s"}
    counts = {"finished": 0, "failed": 0, "done_before": 0}
    for m, n, k in shapes:
        name = record.run_name(spec, (m, n, k))
        key = track.run_key("gpu", *identity, m, n, k, dev["gpu"], dev["compute_capability"],
                            gpu["driver"], sorted(timing.items()), cfg.verify.rtol)
        seed = cfg.verify.seed if cfg.verify.seed is not None else secrets.randbits(31)
        params = {**job.params, "problem.m": m, "problem.n": n, "problem.k": k, "verify.seed_used": seed}
        if cfg.tracking.rerun:
            state, rid = "new", job.start(name, {**tags, "run_key": key}, params)
        else:
            state, rid = job.claim(key, name, tags, params)
        if state != "new":
            what = "already measured" if state == "done" else "being measured by another process"
            console.print(f"{job.label} {name}: {what} (run {rid}); tracking.rerun=true to redo")
            counts["done_before"] += 1
            continue
        _log_kernel_artifacts(job.tr, rid, ptx, asm, cfg)
        try:
            with gpu_lock(gpu.get("pci_bus_id"), lambda who: console.print(
                    f"{job.label} waiting for the GPU ({who} is timing on it)")):
                t0 = time.time()
                res = _WORKER.call("measure", timeout=cfg.timing.timeout_s, ptx=ptx,
                                   ptx_path=str(ptx_path), spec=spec.as_kwargs(), m=m, n=n, k=k,
                                   timing=timing, rtol=cfg.verify.rtol, seed=seed,
                                   pci_bus_id=gpu.get("pci_bus_id"))
                t1 = time.time()
        except WorkerError as exc:
            job.tr.log(rid, static)
            job.end("failed", f"The GPU work failed: {exc}", str(exc), "gpu")
            console.print(f"{job.label} {name}: [red]FAILED[/] {str(exc).splitlines()[0]}")
            counts["failed"] += 1
            continue
        ver = {"verify_max_error": res["verify_max_error"], "verify_mismatches": res["verify_mismatches"],
               "jit_registers": res["jit_registers"], "jit_local_bytes": res["jit_local_bytes"],
               "jit_s": res["jit_s"]}
        window = {"gpu_start_unix": f"{t0:.3f}", "gpu_end_unix": f"{t1:.3f}"}
        if not res["verified"]:
            job.tr.log(rid, {**ver, **static}, {"verified": "false", **window})
            why = "verification failed: " + res["verify_message"]
            job.end("failed", f"Wrong result, not timed: {why}", why, "verify")
            console.print(f"{job.label} {name}: [red]WRONG[/] {res['verify_message']}")
            counts["failed"] += 1
            continue
        t = res["timing"]
        thr = tflops(m, n, k, t["median_us"])
        # results first: the run page lists metrics in logging order; rounded within the timing's noise
        metrics = {"throughput": round(thr, 2), "median_us": round(t["median_us"], 3),
                   "spread": round(t["spread"], 4), "min_us": round(t["min_us"], 3),
                   "max_us": round(t["max_us"], 3), **ver,
                   "launches_per_batch": t["launches_per_batch"], "batches": t["batches"]}
        reasons = [res[f"state_{w}"].pop("clock_event_reasons", None) for w in ("before", "after")]
        for when in ("before", "after"):
            metrics.update({f"{field}_{when}": v for field, v in res[f"state_{when}"].items()})
        clocks = record.clock_reasons(None if None in reasons else reasons[0] | reasons[1])
        metrics.update(static)
        job.tr.log(rid, metrics, {"verified": "true", "timing_method": t["method"], **window,
                                  "l2_flush": t["l2_flush"], "throughput_unit": unit,
                                  "clocks_throttled": clocks})
        job.tr.artifact_text(rid, "\n".join(f"{x:.3f}" for x in t["batch_us"]), record.ARTIFACTS["batches"])
        job.end("verified", record.result_line((m, n, k), t["median_us"], thr, unit, t["spread"], clocks))
        counts["finished"] += 1
        console.print(f"{job.label} {spec.entry} {m}x{n}x{k}: {t['median_us']:10.1f} us  {thr:8.1f} {unit}  "
                      f"spread {t['spread']:.1%}  [green]verified[/]")
    return counts


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The project's own commit (``-dirty`` with uncommitted changes), or None when the project
    folder is not the top of its own git repository (a copy, or a folder inside another repository)."""
    import subprocess
    root = str(track.PROJECT_ROOT)
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True,
                             text=True, timeout=10)
        if top.returncode != 0 or os.path.realpath(top.stdout.strip()) != os.path.realpath(root):
            return None
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head + ("-dirty" if dirty else "") if head else None
    except (OSError, subprocess.TimeoutExpired):
        return None
