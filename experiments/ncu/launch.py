"""Tracked kernels under Nsight Compute: the plan, the ncu command, the small program ncu runs.

    ncu --export R -k regex:'^(entryA|entryB)$' --launch-skip N --launch-count N --metrics ... \\
        python -m experiments.ncu.launch plan.json

The program (:func:`main`) rebuilds each kernel of the plan from its source and spec, loads all of
them first, then launches every item twice, in plan order: a warm-up pass (N launches that
``--launch-skip N`` leaves out) and a profiled pass (the N launches ncu profiles). No
verification and no timing loop run in it. It prints ``ncu_launch: start|done <pass> <i>``
around each launch, so that the launch that killed the process can be named; a kernel that
cannot be loaded is written to the plan's status file and the program exits 3 before any launch.
It writes nothing to MLflow: :mod:`experiments.ncu.profile` logs what :func:`profile_items` returns
(ncu's report read back as CSV, matched to the plan by kernel name in launch order).
"""
from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from collections import defaultdict, deque
from dataclasses import dataclass
from pathlib import Path

from . import CsvReport, MetricSet, parse_csv

__all__ = ["NoKernelsProfiled", "CounterPermissionError", "check_profile_output", "marker", "failed_launch",
           "kernel_filter", "ncu_command", "NcuRun", "run_ncu", "plan_item", "profile_items", "main"]

PROJECT_ROOT = Path(__file__).resolve().parents[2]
LOAD_FAILED = 3


class NoKernelsProfiled(RuntimeError):
    """ncu ran but profiled no kernel; the message names the kernel filter."""


class CounterPermissionError(RuntimeError):
    """ERR_NVGPUCTRPERM: the user may not read GPU performance counters; the message says how to allow it."""


PERMISSION_HELP = (
    "ncu may not read the GPU performance counters (ERR_NVGPUCTRPERM). Profile as root (sudo), or "
    "allow all users: add `options nvidia NVreg_RestrictProfilingToAdminUsers=0` to a file in "
    "/etc/modprobe.d/ and reload the nvidia module (or reboot); in a container, start it with "
    "--cap-add=SYS_ADMIN. See https://developer.nvidia.com/ERR_NVGPUCTRPERM")


def check_profile_output(text: str, kernel_filter: str) -> None:
    """Raise CounterPermissionError or NoKernelsProfiled (naming ``kernel_filter``) from ncu's output."""
    if "ERR_NVGPUCTRPERM" in text:
        raise CounterPermissionError(PERMISSION_HELP)
    if "No kernels were profiled" in text:
        raise NoKernelsProfiled(f"ncu profiled no kernel matching -k {kernel_filter} (\"No kernels "
                                "were profiled\"): the program launched none of them, or ncu's "
                                "--launch-skip/--launch-count skipped them all")


def marker(what: str, phase: str, index: int) -> str:
    """The progress line printed around launch ``index`` of ``phase`` (warmup, profile)."""
    return f"ncu_launch: {what} {phase} {index}"


def failed_launch(output: str) -> tuple[str, int] | None:
    """(phase, plan index) of the launch that started but did not finish, from the markers."""
    open_ = None
    for what, phase, i in re.findall(r"ncu_launch: (start|done) (\w+) (\d+)", output):
        open_ = (phase, int(i)) if what == "start" else None
    return open_


def kernel_filter(entries) -> str:
    """ncu's ``-k`` value: the exact entry names (PTX entries are unique per kernel spec)."""
    return "regex:^(" + "|".join(re.escape(e) for e in sorted(set(entries))) + ")$"


def ncu_command(ncu: str, plan_path: Path, report: Path, entries: list, mset: MetricSet, arch: str,
                settings: dict) -> list:
    """The ncu command line that profiles the plan's ``len(entries)`` launches once each.

    settings: clock_control (none|base), cache_control (all|none), replay_mode (kernel|application).
    ``report`` is the ``--export`` base name (ncu adds ``.ncu-rep``).
    """
    n = len(entries)
    cmd = [ncu, "--export", str(report), "--force-overwrite", "--target-processes", "all",
           "--clock-control", settings["clock_control"], "--cache-control", settings["cache_control"],
           "--replay-mode", settings["replay_mode"], "-k", kernel_filter(entries),
           "--launch-skip", str(n), "--launch-count", str(n)]
    if mset.section_set:
        cmd += ["--set", mset.section_set]
    return cmd + ["--metrics", ",".join(mset.ncu_names(arch)), sys.executable, "-m",
                  "experiments.ncu.launch", str(plan_path)]


@dataclass
class NcuRun:
    """One ncu process: its exit code, output (stdout + stderr), parsed CSV (None without a report),
    the report file, kernels the program could not load (run id -> reason) and ncu's errors."""
    returncode: int
    output: str
    csv: CsvReport | None
    report: Path | None
    load_failed: dict
    errors: list


def run_ncu(ncu: str, items: list, mset: MetricSet, arch: str, settings: dict, workdir: Path,
            index: int, timeout: float) -> NcuRun:
    """Profile ``items`` (dicts of :func:`plan_item`: run_id, entry, family, precision, arch, params,
    build, m, n, k, seed) in one ncu process, then read the report back with
    ``ncu --import R --csv --page raw --print-units base``.

    Files go to ``workdir``: plan_<index>.json, profile_<index>.ncu-rep, .log and .csv.
    Raises CounterPermissionError (ERR_NVGPUCTRPERM) and NoKernelsProfiled (naming the filter).
    """
    plan = workdir / f"plan_{index}.json"
    status = workdir / f"plan_{index}.status.json"
    plan.write_text(json.dumps({"items": items, "status": str(status)}, indent=1))
    base = workdir / f"profile_{index}"
    cmd = ncu_command(ncu, plan, base, [it["entry"] for it in items], mset, arch, settings)
    (workdir / f"profile_{index}.cmd").write_text(" ".join(cmd) + "\n")
    try:
        proc = subprocess.run(cmd, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=timeout)
        code, output = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"") + (exc.stderr or b"")
        code, output = -9, (out.decode(errors="replace") if isinstance(out, bytes) else out)
        output += f"\n==ERROR== ncu did not finish within {timeout:g} s (--timeout) and was stopped.\n"
    (workdir / f"profile_{index}.log").write_text(output)
    errors = [line for line in output.splitlines() if line.startswith("==ERROR==")]
    load_failed = json.loads(status.read_text()).get("failed", {}) if status.is_file() else {}
    rep = base.with_name(base.name + ".ncu-rep")
    report = None
    if rep.is_file():
        imp = subprocess.run([ncu, "--import", str(rep), "--csv", "--page", "raw", "--print-units",
                              "base"], capture_output=True, text=True, timeout=timeout)
        (workdir / f"profile_{index}.csv").write_text(imp.stdout)
        if '"ID",' in imp.stdout:
            report = parse_csv(imp.stdout)
        else:
            errors.append(f"==ERROR== ncu --import {rep} gave no CSV: {(imp.stdout + imp.stderr)[-500:]}")
    if report is None or not report.launches:
        check_profile_output(output, kernel_filter(it["entry"] for it in items))
    return NcuRun(code, output, report, rep if rep.is_file() else None, load_failed, errors)


def _artifact(key: str, default: str) -> str:
    """An artifact's name from the run record (experiments.store.record), else ``default``."""
    try:
        from ..store.record import ARTIFACTS
        return ARTIFACTS[key]
    except (ImportError, KeyError):
        return default


def _config_of(client, run, dst: Path):
    """The run's ``config.yaml`` artifact, loaded (raises what MLflow or OmegaConf raise)."""
    from omegaconf import OmegaConf
    return OmegaConf.load(client.download_artifacts(run.info.run_id, _artifact("config", "config.yaml"),
                                                    str(dst)))


def _logged_source(client, run, dst: Path, entry: str) -> str:
    """The PTX the run logged (artifact ``kernel.ptx.txt``, or ``<entry>.ptx`` for runs tracked before
    the run record), checked against tag ptx_sha256. Raises ValueError when it is gone or differs."""
    t = run.data.tags
    names = [_artifact("ptx", "kernel.ptx.txt"), f"{entry}.ptx"]   # runs tracked before the record
    try:
        found = {a.path for a in client.list_artifacts(run.info.run_id)} & set(names)
        name = next(n for n in names if n in found)
        ptx = dst / f"{entry}.ptx"
        ptx.write_bytes(Path(client.download_artifacts(run.info.run_id, name, str(dst))).read_bytes())
    except Exception as exc:  # noqa: BLE001 - MlflowException, OSError, none found: the PTX is gone
        raise ValueError(f"the kernel's PTX (artifact {' or '.join(names)}) could not be read: "
                         f"{str(exc) or 'not in the run'}") from None
    if t.get("ptx_sha256") and hashlib.sha256(ptx.read_bytes()).hexdigest() != t["ptx_sha256"]:
        raise ValueError(f"artifact {name} does not match tag ptx_sha256")
    return ptx.read_text()


def plan_item(client, run, workdir: Path) -> dict:
    """The launcher's plan entry of a run of any family (``experiments.families``; param ``family``,
    the default family for runs tracked before it existed): the spec rebuilt from the run
    (``Family.spec_of_run``: its params, or its ``config.yaml`` artifact), its source (the PTX the run
    logged where the family profiles that, ``Family.profiles_logged``, else built again and checked
    against tag ptx_sha256), problem size, verification seed, operand data and the shared memory its
    launch added (metric smem_padding_bytes: launch.blocks_per_sm). Raises ValueError saying what is
    missing or inconsistent, or for a library call (cuBLAS, memcpy: the library picks its kernels,
    which ncu's name filter cannot name)."""
    from ..families import DEFAULT, Build, get
    from ..families.base import ptx_sha256
    p, t = run.data.params, run.data.tags
    fam = get(p.get("family", DEFAULT))
    dst = workdir / run.info.run_id
    dst.mkdir(parents=True, exist_ok=True)
    spec = fam.spec_of_run(p, t, lambda: _config_of(client, run, dst))
    if spec.entry != t.get("kernel"):
        raise ValueError(f"the run's spec gives kernel {spec.entry}, its tag kernel is {t.get('kernel')}")
    build = fam.build(spec)
    if build.kind == "none":
        raise ValueError(f"{spec.entry} is a library call: the library chooses its own kernels, which "
                         "the profiler's kernel filter cannot name")
    if fam.profiles_logged:
        build = Build(build.kind, _logged_source(client, run, dst, spec.entry), build.entry, build.options)
    elif t.get("ptx_sha256") and ptx_sha256(build.source) != t["ptx_sha256"]:
        raise ValueError(f"{spec.entry}'s source built today differs from the run's (tag ptx_sha256): "
                         "the family's template changed since; re-run the sweep to profile it")
    size = [int(p.get(f"problem.{d}", 0)) for d in "mnk"]
    return {"run_id": run.info.run_id, "entry": spec.entry, "family": fam.name,
            "precision": spec.precision, "arch": spec.arch, "params": [list(x) for x in spec.params],
            "build": {"kind": build.kind, "source": build.source, "entry": build.entry,
                      "options": list(build.options)},
            "m": size[0], "n": size[1], "k": size[2], "seed": int(p.get("verify.seed_used", "0")),
            "smem_pad": int(run.data.metrics.get("smem_padding_bytes", 0)), "data": p.get("data", "full")}


def profile_items(ncu, items, mset, arch, settings, workdir, timeout, echo=print) -> tuple[dict, dict, list]:
    """Profile ``items`` in as few ncu processes as possible: one, unless the program dies (a kernel
    that faults under replay, a timeout); then that launch's run fails and the launches after it go
    to a new process. Returns ({run id: (Launch, CsvReport, report path)}, {run id: why it failed},
    [report paths])."""
    done, failed, reports, pending, index = {}, {}, [], list(items), 0
    while pending:
        echo(f"ncu process {index + 1}: {len(pending)} launch(es) of {len({i['entry'] for i in pending})} "
             f"kernel(s), {'--set ' + mset.section_set if mset.section_set else 'metric set ' + mset.name}")
        try:
            res = run_ncu(ncu, pending, mset, arch, settings, workdir, index, timeout)
        except (CounterPermissionError, NoKernelsProfiled) as exc:
            failed.update({it["run_id"]: str(exc) for it in pending})
            return done, failed, reports
        if res.report and res.csv is None:      # the report exists but could not be read back
            failed.update({it["run_id"]: "; ".join(res.errors[-2:]) for it in pending})
            return done, failed, reports
        if res.report:
            reports.append(res.report)
        queues = defaultdict(deque)
        for la in res.csv.launches if res.csv else []:
            queues[la.function].append(la)
        left = []
        for it in pending:
            if it["run_id"] in res.load_failed:
                failed[it["run_id"]] = "the kernel could not be loaded: " + res.load_failed[it["run_id"]]
            elif queues[it["entry"]]:
                done[it["run_id"]] = (queues[it["entry"]].popleft(), res.csv, res.report)
            else:
                left.append(it)
        if not left or res.load_failed:
            pending = left
        elif res.returncode == 0 and not res.errors:
            failed.update({it["run_id"]: "ncu returned no row for this launch" for it in left})
            pending = []
        else:       # the process died: the launch that did not finish failed, the rest go again
            where = failed_launch(res.output)
            culprit = pending[where[1]] if where and where[1] < len(pending) else left[0]
            culprit = culprit if culprit in left else left[0]
            errs = "; ".join(res.errors[-3:]) or f"ncu exited with code {res.returncode}"
            failed[culprit["run_id"]] = (f"the kernel failed under ncu ({where[0] if where else 'replay'} "
                                         f"launch): {errs}; log: {workdir}/profile_{index}.log")
            pending = [it for it in left if it is not culprit]
        index += 1
    return done, failed, reports


# ----------------------------------------------------------------------------- under ncu
def _launch_all(items: list, phase: str) -> None:
    import cupy
    for i, it in enumerate(items):
        # prepare compiles (cached) and makes the operands (the run's seed), as measure_family does
        launch = _family_launch(it)
        print(marker("start", phase, i), flush=True)
        launch()
        cupy.cuda.Device().synchronize()
        print(marker("done", phase, i), flush=True)
        del launch
        cupy.get_default_memory_pool().free_all_blocks()


def _family_parts(it: dict):
    """(family, spec, build) of an item of the plan."""
    from ..families import Build, get
    fam = get(it["family"])
    b = it["build"]
    return (fam, fam.respec(it["precision"], it["arch"], it["params"]),
            Build(b["kind"], b["source"], b["entry"], tuple(b.get("options", ()))))


def _family_launch(it: dict):
    """The launch closure of an item, made by the family's ``prepare`` (operands from the run's
    seed and data; the compiled kernel comes from CuPy's cache after :func:`_family_load`; the run's
    launch.blocks_per_sm padding, where it had one)."""
    fam, spec, build = _family_parts(it)
    extra = {"smem_pad": it["smem_pad"]} if it.get("smem_pad") else {}
    if it.get("data", "full") != "full":
        extra["data"] = it["data"]
    return fam.prepare(spec, build, it["m"], it["n"], it["k"], it["seed"], **extra).launch


def _family_load(it: dict) -> None:
    """Compile an item's source as ``prepare`` will (NVRTC for CUDA C++, the driver's JIT for
    PTX), without making its operands; raises what the compiler raises."""
    from ..families import gpu
    fam, spec, build = _family_parts(it)
    if build.kind == "cuda":
        gpu.compile_cuda(build)
    else:
        gpu.load_ptx(build, fam.dyn_smem(spec))


def main(argv=None) -> int:
    """Load every kernel of the plan, then launch each item once to warm up and once to profile."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m experiments.ncu.launch plan.json  (run by experiments.ncu.profile under ncu)",
              file=sys.stderr)
        return 2
    plan = json.loads(Path(argv[0]).read_text())
    items, failed = [], {}
    for it in plan["items"]:
        try:                # compiled here so that a kernel that cannot load fails first
            _family_load(it)
            items.append(it)
        except Exception as exc:  # noqa: BLE001 - every reason goes back to the run
            failed[it["run_id"]] = f"{type(exc).__name__}: {exc}"
    if failed:
        Path(plan["status"]).write_text(json.dumps({"failed": failed}))
        print(f"ncu_launch: {len(failed)} kernel(s) could not be loaded; nothing launched", file=sys.stderr)
        return LOAD_FAILED
    _launch_all(items, "warmup")
    _launch_all(items, "profile")
    return 0


if __name__ == "__main__":
    sys.exit(main())
