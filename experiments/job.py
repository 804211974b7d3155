"""One Hydra job = one kernel configuration: validate, render, assemble, then per problem size
verify + time on the GPU (in the worker process) and track, or track the static resources."""
from __future__ import annotations

import os
import secrets
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf
from rich.console import Console

from . import track
from .assemble import Assembly, PtxasError, PtxasMissing, assemble
from .render import ptx_sha256, render
from .spec import KernelSpec, SpecError, spec_from_config, value
from .timing import tflops
from .worker import GpuWorker, WorkerError, nvml_gpu

__all__ = ["run_job"]

console = Console(highlight=False, soft_wrap=True)
_WORKER = GpuWorker()         # one GPU process for the whole sweep (basic launcher: same process)
_DEVICE: dict = {}


def _job_label() -> str:
    try:
        hc = HydraConfig.get()
        num = hc.job.num if hc.mode.name == "MULTIRUN" else 0
    except ValueError:
        return "[1/1]"
    return f"[{num + 1}/{os.environ.get(track.TOTAL_ENV, '?')}]"


def _static_metrics(spec: KernelSpec, asm: Assembly | None) -> dict:
    m = {"threads": spec.threads, "smem_dynamic_bytes": spec.smem_bytes}
    if asm is not None:
        m.update(registers=asm.registers, spill_stores_bytes=asm.spill_stores,
                 spill_loads_bytes=asm.spill_loads, stack_frame_bytes=asm.stack_frame,
                 smem_static_bytes=asm.static_smem, theoretical_occupancy=asm.occupancy,
                 blocks_per_sm=asm.blocks_per_sm)
        m.update({f"sass_{op}": n for op, n in asm.sass_counts.items()
                  if op in ("HMMA", "IMMA", "LDSM", "LDGSTS", "BAR", "IMAD", "LOP3", "CALL")})
    return m


def _log_kernel_artifacts(tr: track.Tracker, rid: str, ptx_path: Path, asm: Assembly | None,
                          cfg) -> None:
    tr.artifact_file(rid, ptx_path)
    tr.artifact_text(rid, OmegaConf.to_yaml(cfg), "config.yaml")
    if asm is not None:
        tr.artifact_text(rid, asm.report, "ptxas_report.txt")
        if asm.sass:
            tr.artifact_text(rid, asm.sass, "kernel.sass")


def run_job(cfg) -> dict:
    """Run one job of the sweep for the composed config ``cfg``; returns counts of run outcomes.

    Raises SpecError outside a multirun when the configuration cannot exist (before any work);
    in a multirun the job is recorded as a skipped (KILLED) run with the reason instead.
    """
    label = _job_label()
    multirun = HydraConfig.initialized() and HydraConfig.get().mode.name == "MULTIRUN"
    backend = value(cfg.backend)
    gpu = nvml_gpu() if backend != "static" else None
    if backend == "gpu" and gpu is None:
        raise RuntimeError("backend=gpu but no NVIDIA GPU was found (NVML); use backend=auto or static")
    use_gpu = gpu is not None
    uri = track.resolve_uri(cfg.tracking.uri)
    tr = track.get_tracker(uri, cfg.tracking.experiment)
    params = track.flatten(cfg)
    overrides = " ".join(HydraConfig.get().overrides.task) if HydraConfig.initialized() else ""
    try:
        spec = spec_from_config(cfg, gpu["compute_capability"] if gpu else None)
    except SpecError as exc:
        if not multirun:
            raise
        rid = tr.start(f"skipped {overrides}", params, {"backend": "gpu" if use_gpu else "static"},
                       track.open_parent(tr))
        tr.end(rid, "KILLED", str(exc))
        console.print(f"{label} [yellow]skipped[/] {overrides}: {exc}")
        return {"skipped": 1}
    parent = track.open_parent(tr)

    out_dir = Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else Path.cwd()
    ptx = render(spec)
    sha = ptx_sha256(ptx)
    ptx_path = out_dir / f"{spec.entry}.ptx"
    ptx_path.write_text(ptx)
    tags = {"kernel": spec.entry, "ptx_sha256": sha, "git_commit": track.git_commit(),
            "arch": spec.arch, "backend": "gpu" if use_gpu else "static"}
    params.update({f"spec.{k}": v for k, v in spec.flat().items()})
    asm, asm_error = None, None
    try:
        asm = assemble(ptx, spec.entry, spec.arch, threads=spec.threads, dyn_smem=spec.smem_bytes,
                       workdir=out_dir / "ptxas")
    except PtxasMissing as exc:
        asm_error = str(exc)
        console.print(f"{label} [yellow]{exc}[/] Tracking the rendered kernel without resources.")
    except PtxasError as exc:
        rid = tr.start(spec.entry, params, {**tags, "status_stage": "assemble"}, parent)
        _log_kernel_artifacts(tr, rid, ptx_path, None, cfg)
        tr.end(rid, "FAILED", str(exc))
        console.print(f"{label} [red]ptxas failed[/] for {spec.entry}:\n{exc}")
        return {"failed": 1}
    static = _static_metrics(spec, asm)

    if not use_gpu:
        key = track.run_key(sha, spec.arch, "static")
        if not cfg.tracking.rerun and (done := tr.finished_run(key)):
            console.print(f"{label} {spec.entry}: already tracked (run {done}); tracking.rerun=true to redo")
            return {"done_before": 1}
        rid = tr.start(spec.entry, params, {**tags, "run_key": key}, parent)
        _log_kernel_artifacts(tr, rid, ptx_path, asm, cfg)
        tr.log(rid, static, {"ptxas": "missing" if asm_error else "ok"})
        tr.end(rid)
        occ = f"occupancy {asm.occupancy:.0%}" if asm else "no ptxas"
        regs = f"{asm.registers} regs, {asm.spill_stores} B spills" if asm else ""
        console.print(f"{label} {spec.entry}: {spec.arch} {regs} {occ} [dim](static)[/]")
        return {"finished": 1}

    if not _DEVICE:
        try:
            _DEVICE.update(_WORKER.call("device_info", timeout=120))
        except WorkerError as exc:
            raise RuntimeError(
                f"{gpu['gpu']} was found, but CuPy could not use it. Install the CuPy build for your "
                "CUDA major (pip install -e '.[cuda13]' or '.[cuda12]'), or run with backend=static.\n"
                f"{exc}") from None
    dev = _DEVICE
    tags.update(gpu=dev["gpu"], compute_capability=dev["compute_capability"], driver=gpu["driver"],
                cuda_driver=gpu["cuda_driver"], cuda_runtime=dev["cuda_runtime"], cupy=dev["cupy"])
    shapes = [tuple(s) for s in cfg.problem.shapes] or [(n, n, n) for n in cfg.problem.sizes]
    unit = "TFLOP/s" if spec.prec.is_float else "TOP/s"
    timing = {k: v for k, v in OmegaConf.to_container(cfg.timing).items() if k != "timeout_s"}
    counts = {"finished": 0, "failed": 0, "done_before": 0}
    for m, n, k in shapes:
        name = f"{spec.entry} {m}x{n}x{k}"
        key = track.run_key(sha, m, n, k, dev["gpu"], "gpu")
        if not cfg.tracking.rerun and (done := tr.finished_run(key)):
            console.print(f"{label} {name}: already measured (run {done}); tracking.rerun=true to redo")
            counts["done_before"] += 1
            continue
        seed = cfg.verify.seed if cfg.verify.seed is not None else secrets.randbits(31)
        rid = tr.start(name, {**params, "problem.m": m, "problem.n": n, "problem.k": k,
                              "verify.seed_used": seed}, {**tags, "run_key": key}, parent)
        try:
            _log_kernel_artifacts(tr, rid, ptx_path, asm, cfg)
            tr.log(rid, static)
            spec.check_problem(m, n, k)
            res = _WORKER.call("measure", timeout=cfg.timing.timeout_s, ptx=ptx,
                               ptx_path=str(ptx_path), spec=spec.as_kwargs(), m=m, n=n, k=k,
                               timing=timing, rtol=cfg.verify.rtol, seed=seed,
                               pci_bus_id=gpu.get("pci_bus_id"))
        except (WorkerError, SpecError) as exc:
            tr.end(rid, "FAILED", str(exc))
            console.print(f"{label} {name}: [red]FAILED[/] {str(exc).splitlines()[0]}")
            counts["failed"] += 1
            continue
        except BaseException as exc:
            tr.end(rid, "FAILED", f"{type(exc).__name__}: {exc}")
            raise
        ver = {"verify_max_error": res["verify_max_error"], "verify_mismatches": res["verify_mismatches"],
               "jit_registers": res["jit_registers"], "jit_local_bytes": res["jit_local_bytes"],
               "jit_s": res["jit_s"]}
        if not res["verified"]:
            tr.log(rid, ver, {"verified": "false"})
            tr.end(rid, "FAILED", "verification failed: " + res["verify_message"])
            console.print(f"{label} {name}: [red]WRONG[/] {res['verify_message']}")
            counts["failed"] += 1
            continue
        t = res["timing"]
        thr = tflops(m, n, k, t["median_us"])
        metrics = {**ver, "median_us": t["median_us"], "min_us": t["min_us"], "max_us": t["max_us"],
                   "spread": t["spread"], "throughput": thr,
                   ("tflops" if spec.prec.is_float else "tops"): thr,
                   "launches_per_batch": t["launches_per_batch"], "batches": t["batches"]}
        for when in ("before", "after"):
            metrics.update({f"{field}_{when}": v for field, v in res[f"state_{when}"].items()})
        tr.log(rid, metrics, {"verified": "true", "timing_method": t["method"],
                              "l2_flush": t["l2_flush"], "throughput_unit": unit})
        tr.artifact_text(rid, "\n".join(f"{x:.3f}" for x in t["batch_us"]), "batch_us.txt")
        tr.end(rid)
        counts["finished"] += 1
        console.print(f"{label} {name}: {t['median_us']:10.1f} us  {thr:8.1f} {unit}  "
                      f"spread {t['spread']:.1%}  [green]verified[/]")
    return counts
