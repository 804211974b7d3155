"""Profile tracked runs under Nsight Compute and add the counters to the same MLflow runs.

    python -m experiments.profile [--parent ID | --filter STR] [--set default|full|FILE.yaml]
        [--clock-control none|base] [--uri URI] [--experiment NAME] [--rerun] [--dry-run]
    python -m experiments.profile --import-text FILE... [--experiment NAME] [--gpu NAME]

Selects runs (default: the children of the latest sweep), profiles each (kernel, size) once in
as few ncu processes as possible (one, unless a kernel faults: the rest are profiled again in a
new process), and logs ``ncu.*`` metrics (conf/ncu/metrics.yaml), ``ncu_over_event_time`` =
ncu.duration_us / median_us, the run's CSV row and ncu's settings as tags (``ncu=done``, or
``ncu=failed`` with ``ncu_error``; ``ncu.missing`` lists metrics that did not come back).
The ``.ncu-rep`` of each ncu process goes to the parent run of the sweep its runs belong to (measured
or reused; to each run when they belong to no one sweep; tag ``ncu.report`` on every
run; ``ncu.report_id`` is the run's launch in it). Only FINISHED, verified GPU runs are profiled;
their timings are never changed. Exit status: 0 all profiled, 1 some runs failed or metrics are
missing, 2 nothing was done (the message says why).
"""
from __future__ import annotations

import argparse
import contextlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from . import NcuConfigError, NcuParseError, canonical, load_set, load_table
from .launch import kernel_filter, ncu_command, plan_item, profile_items
from ..metrics import rounded
from ..store.track import (PROJECT_ROOT, StoreError, StoreUnavailable, check_schema, get_tracker, resolve_uri,
                    sweep_runs, sweeps_of)

__all__ = ["ProfileError", "open_store", "select_runs", "triage", "main"]

NCU_MISSING = ("ncu (Nsight Compute CLI) was not found on PATH. Install Nsight Compute (it ships "
               "with the CUDA toolkit, e.g. /usr/local/cuda/bin/ncu) and put it on PATH, or pass "
               "--ncu /path/to/ncu.")
NO_GPU = ("no NVIDIA GPU found (NVML): ncu profiles on the GPU the runs were measured on. Run this "
          "there, or use --dry-run to see the plan.")


class ProfileError(RuntimeError):
    """Nothing can be profiled as asked; the message says why and what to do."""


def open_store(uri: str | None, experiment: str):
    """(MlflowClient, experiment id) of an existing store and experiment; ProfileError otherwise."""
    import mlflow
    try:
        uri = resolve_uri(uri)
    except (RuntimeError, ValueError) as exc:      # e.g. a file store, which MLflow 3 cannot open
        raise ProfileError(str(exc)) from None
    db = Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None
    if db is not None and not db.is_file():
        raise ProfileError(f"no store at {db}: give the tracking URI that run.py printed (--uri)")
    try:
        check_schema(uri, write=True)         # an older store is copied before MLflow upgrades it
    except StoreError as exc:
        raise ProfileError(str(exc)) from None
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        names = ", ".join(e.name for e in client.search_experiments()) or "none"
        raise ProfileError(f"experiment {experiment!r} is not in {uri}; it holds: {names} (--experiment)")
    return client, exp.experiment_id, uri


def select_runs(client, exp_id: str, parent: str | None, filter_string: str | None) -> tuple[list, str]:
    """The runs to consider and a description: the runs of the sweep ``parent`` (those it reused from
    earlier sweeps included: experiments.store.track.sweep_runs), the runs matching the MLflow
    ``filter_string``, or (neither) the runs of the latest sweep (tag kind=sweep). Raises
    ProfileError for a ``parent`` that is not a run id in the store, or a run of a sweep (its
    parent named), and when nothing matched."""
    from mlflow.exceptions import MlflowException
    search = lambda f: client.search_runs([exp_id], f, max_results=50000)  # noqa: E731
    if filter_string:
        try:
            runs = search(filter_string)
        except MlflowException as exc:
            raise ProfileError(f"--filter {filter_string!r} is not a valid MLflow filter: {exc.message} "
                               "Example: --filter \"params.precision = 'int8'\"") from None
        what = f"runs matching {filter_string!r}"
    else:
        if parent is None:
            latest = client.search_runs([exp_id], "tags.kind = 'sweep'", max_results=1,
                                        order_by=["attributes.start_time DESC"])
            if not latest:
                raise ProfileError("no sweep in the store yet: run `python run.py -m ...` first, or "
                                   "select runs with --filter")
            parent = latest[0].info.run_id
        else:
            try:
                given = client.get_run(parent)
            except MlflowException:
                raise ProfileError(f"--parent {parent} is not a run id in {client.tracking_uri}; give a "
                                   "sweep's parent run id (run.py -m prints it), or leave --parent out for "
                                   "the latest sweep") from None
            if (up := given.data.tags.get("mlflow.parentRunId")) and given.data.tags.get("kind") != "sweep":
                raise ProfileError(f"--parent {parent} is a run of the sweep {up}, not a sweep: give "
                                   f"--parent {up}, or --filter \"attributes.run_id = '{parent}'\" for this "
                                   "run")
        runs = sweep_runs(client, [exp_id], parent)      # those it reused from earlier sweeps too
        what = f"the runs of sweep {parent}"
    runs = [r for r in runs if r.data.tags.get("kind") != "sweep"]
    if not runs:
        raise ProfileError(f"the selection matched no run: {what}. List runs with `mlflow ui` or "
                           "`python -m experiments.report`; give --parent ID or --filter STR.")
    return runs, what


def _sized(family: str | None) -> bool:
    """Whether runs of ``family`` (None: the default family, for runs tracked before the param) have a
    problem size (the peak family has none)."""
    from ..families import DEFAULT, get
    try:
        return get(family or DEFAULT).sized
    except ValueError:      # a family this version does not know: ncu_launch says so
        return True


def triage(runs: list, gpu: str | None, rerun: bool) -> tuple[list, list]:
    """Split runs into (to profile, [(run, why not)]): only FINISHED, verified GPU runs measured on
    this GPU (``gpu``; None: not checked) and not profiled before (tag ncu=done, unless ``rerun``)."""
    todo, skipped = [], []
    for r in runs:
        t, status = r.data.tags, r.info.status
        err = (t.get("error") or "").splitlines()[:1]
        if t.get("outcome") == "skipped":
            why = f"skipped (cannot exist: {t.get('skip_reason', '?')[:80]}): never measured"
        elif t.get("backend") != "gpu":
            why = f"backend={t.get('backend', '?')}: never measured on a GPU"
        elif status != "FINISHED" or t.get("verified") != "true":
            why = (f"not verified (status {status}, verified={t.get('verified', 'unknown')}"
                   f"{': ' + err[0][:120] if err else ''}): only FINISHED, verified runs are profiled")
        elif "problem.m" not in r.data.params and _sized(r.data.params.get("family")):
            why = "no problem size (params problem.m/n/k)"
        elif gpu is not None and t.get("gpu") != gpu:
            why = f"measured on {t.get('gpu')}, this machine has {gpu}"
        elif t.get("ncu") == "done" and not rerun:
            why = "already profiled (ncu=done); --rerun profiles it again"
        else:
            todo.append(r)
            continue
        skipped.append((r, why))
    return todo, skipped


def _hold(gpu: dict):
    """The GPU lock of the sweeps (experiments.gpu.worker.gpu_lock), so no timing runs while ncu
    replays kernels; nothing where that lock is not available (no fcntl)."""
    try:
        import fcntl  # noqa: F401 - gpu_lock needs it

        from ..gpu.worker import gpu_lock
    except ImportError:
        return contextlib.nullcontext()
    return gpu_lock(gpu.get("pci_bus_id"), lambda who: print(f"Waiting for the GPU ({who} holds it).",
                                                             flush=True))


def _log(client, rid: str, metrics: dict, tags: dict, text: dict | None = None) -> None:
    from mlflow.entities import Metric, RunTag
    now = int(time.time() * 1000)
    client.log_batch(rid, metrics=[Metric(k, v, now, 0) for k, v in metrics.items()],
                     tags=[RunTag(k, str(v)[:5000]) for k, v in tags.items()])
    for name, body in (text or {}).items():
        client.log_text(rid, body, name)


def _args(argv):
    ap = argparse.ArgumentParser(prog="python -m experiments.profile", description=(
        "Profile tracked runs under Nsight Compute (ncu) and log the counters into the same MLflow "
        "runs; or load ncu text reports as a reference experiment (--import-text)."))
    sel = ap.add_mutually_exclusive_group()
    sel.add_argument("--parent", help="profile the runs of this sweep (parent run id)")
    sel.add_argument("--filter", help="profile the runs matching this MLflow filter string")
    sel.add_argument("--import-text", nargs="+", metavar="FILE", help="load ncu text reports instead")
    ap.add_argument("--set", default="default", help="metric set: default, full, or a YAML file")
    ap.add_argument("--clock-control", choices=["none", "base"], default="none",
                    help="none: the clocks of the timing (default); base: ncu locks base clocks")
    ap.add_argument("--cache-control", choices=["all", "none"], default="all",
                    help="all: ncu flushes the caches before each replay pass (default)")
    ap.add_argument("--replay-mode", choices=["kernel", "application"], default="kernel",
                    help="kernel: ncu replays each kernel (default); application: reruns the launcher")
    ap.add_argument("--uri", help="tracking URI (default: as run.py resolves it)")
    ap.add_argument("--experiment", default=None, help="experiment (default tensor-core-ablations; "
                    "ncu-reference for --import-text)")
    ap.add_argument("--rerun", action="store_true", help="profile runs already profiled again")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and the ncu command only")
    ap.add_argument("--ncu", help="the ncu executable (default: ncu on PATH)")
    ap.add_argument("--gpu", help="--import-text: the GPU the reports come from (tag gpu)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per ncu process")
    ap.add_argument("--workdir", help="where plans, ncu logs, CSVs and reports go (default outputs/ncu)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    """The command line; returns the exit status (0 ok, 1 runs failed or metrics missing, 2 nothing done)."""
    a = _args(argv)
    try:
        if a.import_text:
            from .text import import_reports
            missing = [f for f in a.import_text if not Path(f).is_file()]
            if missing:
                raise ProfileError(f"no such file: {', '.join(missing)}")
            uri, experiment = resolve_uri(a.uri), a.experiment or "ncu-reference"
            get_tracker(uri, experiment)        # StoreError for a store that cannot be used, at once
            import_reports(a.import_text, uri, experiment, a.gpu, a.rerun)
            return 0
        return _main(a)
    except (ProfileError, NcuConfigError, NcuParseError, StoreError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except StoreUnavailable as exc:         # locked by another process, or a full disk
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _main(a) -> int:
    from ..gpu.worker import nvml_gpu
    table = load_table()
    mset = load_set(a.set, table)
    client, exp_id, uri = open_store(a.uri, a.experiment or "tensor-core-ablations")
    runs, what = select_runs(client, exp_id, a.parent, a.filter)
    gpu = None if a.dry_run else nvml_gpu()
    todo, skipped = triage(runs, gpu["gpu"] if gpu else None, a.rerun)
    print(f"Selected {len(runs)} run(s), {what}, in {uri}: {len(todo)} to profile, {len(skipped)} not.")
    for r, why in skipped:
        print(f"  not profiled: {r.info.run_name} ({r.info.run_id[:8]}): {why}")
    if not todo:
        if any(why.startswith("already profiled") for _, why in skipped):
            print("Nothing left to profile.")
            return 0
        raise ProfileError("no run of the selection can be profiled (reasons above)")
    ncu = shutil.which(a.ncu or "ncu")
    missing = f"--ncu {a.ncu} is not an executable file." if a.ncu else NCU_MISSING
    problems = [] if a.dry_run else [NO_GPU] * (gpu is None) + [missing] * (ncu is None)
    if problems:
        raise ProfileError("\n".join(problems))
    cc = gpu["compute_capability"] if gpu else todo[0].data.tags.get("compute_capability", "90")
    arch = table.arch(f"sm_{cc}")
    base = Path(a.workdir or PROJECT_ROOT / "outputs" / "ncu")
    base.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S-"), dir=base))
    stamp = workdir.name
    items, failed = [], {}
    for r in todo:
        try:
            items.append(plan_item(client, r, workdir))
        except ValueError as exc:
            failed[r.info.run_id] = f"not profiled: {exc}"
    settings = {"clock_control": a.clock_control, "cache_control": a.cache_control,
                "replay_mode": a.replay_mode}
    if a.dry_run:
        print("Would run (report and logs in " + str(workdir) + "):\n  " + " ".join(ncu_command(
            ncu or "ncu", workdir / "plan_0.json", workdir / "profile_0", [i["entry"] for i in items],
            mset, arch, settings)))
        for why in failed.values():
            print("  " + why)
        if ncu is None:
            print("  (not runnable here: " + missing + ")")
        return 0
    version = subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout
    tags = {"ncu.version": (re.findall(r"Version (\S+)", version) or ["unknown"])[0], "ncu.set": mset.name,
            "ncu.section_set": mset.section_set or "none", "ncu.arch": arch,
            **{f"ncu.{k}": v for k, v in settings.items()}}
    print(f"Profiling in {workdir} (ncu {tags['ncu.version']}, clock control {a.clock_control}).")
    with _hold(gpu):
        done, bad, reports = profile_items(ncu, items, mset, arch, settings, workdir, a.timeout)
    failed.update(bad)
    return _record(client, todo, done, failed, reports, mset, arch, tags, stamp, kernel_filter(
        i["entry"] for i in items), uri)


def _record(client, todo, done, failed, reports, mset, arch, tags, stamp, kfilter, uri) -> int:
    """Log results into the runs, print the summary; returns the exit status."""
    runs = {r.info.run_id: r for r in todo}
    where = {}
    for i, rep in enumerate(reports):
        rids = [rid for rid, (_, _, path) in done.items() if path == rep]
        # the sweep(s) all these runs belong to (measured or reused), else each run
        common = set.intersection(*(sweeps_of(runs[rid]) for rid in rids)) if rids else set()
        targets = sorted(common) or rids
        for t in targets:
            client.log_artifact(t, str(rep), f"ncu/{stamp}_{i}")
        where.update({rid: f"runs:/{targets[0] if common else rid}/ncu/{stamp}_{i}/{rep.name}"
                      for rid in rids})
    not_returned = defaultdict(list)
    for rid, (la, csv, _) in done.items():
        r = runs[rid]
        metrics, missing = canonical(la, mset.metrics, arch)
        median = r.data.metrics.get("median_us")
        if median and "ncu.duration_us" in metrics:
            metrics["ncu_over_event_time"] = metrics["ncu.duration_us"] / median
        for k, why in missing.items():
            if why.endswith("not returned"):
                not_returned[(k, why)].append(r.info.run_name)
        lost = "; ".join(f"{k} ({v})" for k, v in missing.items()) or "none"
        metrics = rounded(metrics)          # as experiments.metrics declares: % to 2 decimals, rates 5 digits
        _log(client, rid, metrics, {**tags, "ncu": "done", "ncu.missing": lost, "ncu.report_id": la.id,
                                    "ncu.report": where.get(rid, ""), "ncu.kernel_filter": kfilter},
             {"ncu/ncu_raw.csv": csv.launch_csv(la)})
        if "ncu_error" in r.data.tags:
            client.delete_tag(rid, "ncu_error")
        ratio = metrics.get("ncu_over_event_time")
        print(f"  {r.info.run_name}: {len(metrics)} metrics, {len(missing)} missing"
              + (f"; ncu duration / median time = {ratio:.3f}" if ratio else ""))
    for rid, why in failed.items():
        _log(client, rid, {}, {**tags, "ncu": "failed", "ncu_error": why})
    print(f"Nsight Compute: {len(done)} run(s) profiled, {len(failed)} failed.")
    by_reason = defaultdict(list)
    for rid, why in failed.items():
        by_reason[why].append(f"{runs[rid].info.run_name} ({rid[:8]})")
    for why, names in by_reason.items():
        print(f"  FAILED {', '.join(names)} (timing kept): {why}")
    for (k, why), names in not_returned.items():
        print(f"  MISSING {k}: {why} in {len(names)} run(s). ncu drops metric names it does not know "
              f"without an error: check the name in conf/ncu/metrics.yaml or the set file against "
              f"`ncu --query-metrics --chips {load_table().archs.get(arch, arch)}`.")
    print(f"Browse: mlflow ui --backend-store-uri {shlex.quote(uri)}")
    return 1 if failed or not_returned else 0


if __name__ == "__main__":
    from experiments.cli import run_main
    sys.exit(run_main(main))
