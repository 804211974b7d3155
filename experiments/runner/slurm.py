"""Hydra's submitit Slurm launcher (``hydra/launcher=slurm``) with what a sweep on a cluster needs.

Before submitting (in the command that submits, on the login node):
- :func:`check_resources`: a GPU is asked for only where the backend uses one and the partition has
  one (``backend=gpu`` on a partition without GPUs is refused); resources no node of the partition has
  are refused with what its nodes have (``sinfo``), instead of an array that pends for ever;
- a job whose every run the sweep already holds FINISHED is not submitted again (tag ``job.<hash>``
  of the parent run, :func:`job_tag`, written by the job when it ended with no failure).
While the jobs run:
- Ctrl-C cancels them (``scancel``), waits until Slurm has ended them and closes their runs KILLED;
  the parent then ends KILLED (or, with no run, is deleted): no run is left under a deleted parent;
- when ``sacct`` cannot answer (Slurm accounting down), one line says so once (:data:`ACCOUNTING_DOWN`)
  and the sweep goes on, a job's end known from its result file or ``squeue``;
- a job that did not finish (cancelled, preempted and not requeued, its node failed) is one line
  naming its Slurm job and state; its runs still RUNNING are closed KILLED, and the command exits 1
  after the sweep's summary.
In each job (on a compute node):
- its runs carry tag ``slurm_job_id``; Slurm's SIGTERM (``scancel``, a node going down) and the USR2
  submitit asks Slurm to send before the time limit or on preemption close the runs in progress KILLED
  (outcome=interrupted, the reason in ``skip_reason``) before submitit requeues or the job ends;
- the job exits non-zero (``sacct``: FAILED) when any of its runs FAILED or it was interrupted.
"""
from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time

from hydra.core.utils import JobReturn, JobStatus
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as _Submitit

from ..store import track
from .validate import Invalid

__all__ = ["SlurmLauncher", "RunsFailed", "JobInterrupted", "check_resources", "job_tag", "lost_jobs"]

_LOST: list = []    # one line per job of this command's sweep that Slurm ended unfinished
_CANCELLED: list = []  # the runs of this command's jobs that ended KILLED when it cancelled them
ACCOUNTING_DOWN = ("Slurm accounting (slurmdbd) is not answering: restart it with bash "
                   "tools/slurm_one_node.sh (a cluster of your site: ask its administrators)")


class RunsFailed(RuntimeError):
    """A Slurm job ended with failed runs: raised so that the job exits non-zero."""


class JobInterrupted(RuntimeError):
    """Slurm ended a job (SIGTERM): its runs in progress were closed KILLED; the job exits non-zero."""


def lost_jobs() -> list[str]:
    """The lines saying which Slurm jobs of this command's sweep ended without finishing."""
    return list(_LOST)


def cancelled_runs() -> int:
    """How many runs of this command's Slurm jobs ended KILLED when Ctrl-C (or SIGTERM) cancelled them."""
    return sum(_CANCELLED)


def job_tag(overrides) -> str:
    """The parent-run tag that marks a job of a sweep as done: ``job.<hash of its overrides>`` (the
    ``tracking.*`` overrides left out); its value lists the job's FINISHED run ids."""
    kept = sorted(o for o in overrides if not o.lstrip("+~").startswith("tracking."))
    return "job." + hashlib.sha256("\n".join(kept).encode()).hexdigest()[:16]


def _number(text: str) -> int:
    """The leading integer of an ``sinfo`` field (``24105+``, ``2``), 0 when none."""
    return int(m.group()) if (m := re.match(r"\d+", text.strip())) else 0


def _gpus(gres: str) -> int:
    """GPUs per node in an ``sinfo`` GRES field (``gpu:4``, ``gpu:h100:8(S:0-1)``, ``(null)``)."""
    return sum(_number(item.split("(")[0].split(":")[-1]) for item in re.split(r",(?![^(]*\))", gres)
               if item.startswith("gpu:"))


def check_resources(params, backend: str = "auto", given: tuple = ()) -> dict:
    """The GPUs a job of the sweep asks for (``{"gpus_per_task": n, "gpus_per_node": m}``, the
    launcher settings to submit with), from the ``backend`` and what the partition's nodes have
    (``sinfo`` GRES): none for ``static``, nor for ``auto`` on a partition without GPUs (its jobs run
    static); else those of the launcher ``params`` (``hydra.launcher``: cpus_per_task, mem_gb,
    gpus_per_task or gpus_per_node, tasks_per_node, partition; None: the cluster's default
    partition). ``given``: the command's ``hydra.launcher.*`` overrides; a GPU asked for there
    (``hydra.launcher.gpus_per_task=1``) is not dropped on a partition without GPUs but refused.
    Raise validate.Invalid (exit status 2) when no node of the partition can give one task
    (``backend=gpu`` on a partition without GPUs included), naming what was asked, what the largest
    node has and the overrides that fit. When ``sinfo`` cannot answer, no check (Slurm says why at
    submission) and no GPU for ``static`` only."""
    partition = params.get("partition")
    none = {"gpus_per_task": None, "gpus_per_node": None}
    asked = none if backend == "static" else {k: params.get(k) for k in none}
    cmd = ["sinfo", "-h", "-o", "%P|%c|%m|%G"] + (["-p", str(partition)] if partition else [])
    try:
        lines = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return asked
    rows = [line.split("|") for line in lines if line.count("|") == 3]
    if not partition:
        rows = [r for r in rows if r[0].endswith("*")] or rows
    if not rows and partition:
        known = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True,
                               timeout=30).stdout.split()
        if known:
            raise Invalid(f"Slurm has no partition {partition}: hydra.launcher.partition= one of "
                             f"{', '.join(p.rstrip('*') for p in known)} (sinfo; * is the default, also "
                             "taken without hydra.launcher.partition). Nothing was submitted.")
    if not rows:
        return asked
    name = rows[0][0].rstrip("*")
    nodes = [{"cpus": _number(c), "mem": _number(m), "gpus": _gpus(g)} for _, c, m, g in rows]
    if backend == "gpu" and not any(n["gpus"] for n in nodes):
        raise Invalid(
            f"backend=gpu needs GPUs, and no node of Slurm partition {name} has one (sinfo GRES: "
            f"{', '.join(sorted({g for *_, g in rows}))}). Choose a partition with GPUs "
            "(hydra.launcher.partition=..., `sinfo -o '%P %G'` lists them), or backend=static (render and "
            "assemble only) or backend=auto (static where a node has no GPU). Nothing was submitted.")
    asked_here = [o for o in given if re.fullmatch(r"hydra\.launcher\.gpus_per_(task|node)=0*[1-9]\d*", o)]
    if backend == "auto" and not any(n["gpus"] for n in nodes) and not asked_here:
        asked = none
    tasks = int(params.get("tasks_per_node") or 1)
    want = {"cpus": int(params.get("cpus_per_task") or 1) * tasks,
            "mem": int(float(params.get("mem_gb") or 0) * 1024),
            "gpus": int(asked["gpus_per_node"] or 0) or int(asked["gpus_per_task"] or 0) * tasks}
    if any(all(n[k] >= v for k, v in want.items()) for n in nodes):
        return asked
    most = {k: max(n[k] for n in nodes) for k in want}
    fits = [f"hydra.launcher.cpus_per_task={max(1, most['cpus'] // tasks)}"] * (want["cpus"] > most["cpus"])
    fits += [f"hydra.launcher.mem_gb={max(1, most['mem'] // 1024)}"] * (want["mem"] > most["mem"])
    gpus = most["gpus"] // tasks or "null"                   # null: no GPU asked for (backend=auto: static)
    fits += [f"hydra.launcher.gpus_per_task={gpus}"] * (want["gpus"] > most["gpus"])
    raise Invalid(
        f"Slurm cannot run this sweep's jobs on partition {name}: each asks for {want['cpus']} CPU(s), "
        f"{want['mem']} MB and {want['gpus']} GPU(s), and its largest node has {most['cpus']} CPU(s), "
        f"{most['mem']} MB and {most['gpus']} GPU(s) (sinfo); the jobs would pend for ever. Ask for what a "
        f"node has: {' '.join(fits)}; or choose another partition (`sinfo -s`). Nothing was submitted.")


class SlurmLauncher(_Submitit):
    """Hydra's submitit SlurmLauncher (the module's docstring says what it adds)."""

    def launch(self, job_overrides, initial_job_idx):
        """Submit the jobs not yet in the store as one Slurm array and wait for them; returns one
        JobReturn per job (those of jobs not submitted, or that Slurm ended unfinished, COMPLETED
        with a note as their value: the store says what they left)."""
        import submitit
        from hydra.core.singleton import Singleton
        from omegaconf import OmegaConf
        from pathlib import Path
        todo = self._todo(job_overrides)
        returns = [_returned(o, {"done_before": 1}) for o in job_overrides]
        if not todo:
            return returns
        params = {k: v for k, v in self.params.items() if k not in ("submitit_folder", "max_num_timeout")}
        executor = submitit.AutoExecutor(cluster="slurm", folder=self.params["submitit_folder"],
                                         slurm_max_num_timeout=self.params["max_num_timeout"])
        base = set(OmegaConf.structured(
            __import__("hydra_plugins.hydra_submitit_launcher.config", fromlist=["x"]).BaseQueueConf).keys())
        executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items()})
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        args = [(list(job_overrides[i]), "hydra.sweep.dir", initial_job_idx + i,
                 f"job_id_for_{initial_job_idx + i}", Singleton.get_state()) for i in todo]
        try:
            jobs = executor.map_array(self, *zip(*args, strict=True))
        except (submitit.core.utils.FailedJobError, RuntimeError, OSError) as exc:
            first = next((x.strip() for x in str(exc).splitlines() if x.strip()), type(exc).__name__)
            part = self.params.get("partition")
            raise SystemExit(f"Slurm did not run the sweep: {first} ("
                             + (f"hydra.launcher.partition={part}" if part else
                                "no hydra.launcher.partition: the cluster's default")
                             + f"; `sinfo -s` lists the partitions; submitit's files: "
                             f"{str(self.params['submitit_folder']).removesuffix('/%j')})") from None
        print(f"Submitted Slurm job {jobs[0].job_id.split('_')[0]}: {len(jobs)} task(s).", flush=True)
        watcher = _accounting_watcher()
        for job in jobs:
            job.watcher = watcher
            watcher.register_job(job.job_id)
        try:
            self._wait(dict(zip(todo, jobs, strict=True)), job_overrides, returns)
        except KeyboardInterrupt:
            self._cancel(jobs, "the sweep was interrupted (Ctrl-C or SIGTERM of the submitting command)")
            raise
        return returns

    def _tracker(self):
        env = track.SWEEP_ENV
        return track.get_tracker(os.environ[env["uri"]], os.environ[env["experiment"]])

    def _todo(self, job_overrides) -> list[int]:
        """The indices of the jobs to submit: all with ``tracking.rerun``, else those whose runs the
        sweep does not hold FINISHED (no tag :func:`job_tag`, or one of its runs no longer FINISHED)."""
        parent = os.environ.get(track.SWEEP_ENV["parent"])
        if self.config.tracking.rerun or not parent:
            return list(range(len(job_overrides)))
        tr = self._tracker()
        tags = tr.client.get_run(parent).data.tags
        finished = {r.info.run_id for r in tr.sweep_runs(parent, "attributes.status = 'FINISHED'")}
        todo = [i for i, o in enumerate(job_overrides)
                if (ids := tags.get(job_tag(o))) is None or not set(filter(None, ids.split(","))) <= finished]
        if len(todo) < len(job_overrides):
            print(f"Slurm: {len(job_overrides) - len(todo)} of {len(job_overrides)} job(s) of this sweep "
                  f"are already in the store (parent run {parent}): "
                  + (f"submitting the other {len(todo)}." if todo else "nothing to submit."), flush=True)
        return todo

    def _wait(self, pending: dict, job_overrides, returns: list) -> None:
        """Wait until Slurm has ended each job of ``pending`` (index -> submitit Job) and put its
        JobReturn into ``returns``. A job no longer queued of which ``sacct`` knows nothing (an array
        task cancelled while pending has no record) counts as ended, cancelled."""
        missing: dict = {}
        while pending:
            queued = _queued(list(pending.values()))
            for i, job in list(pending.items()):
                gone = queued is not None and job.job_id not in queued and job.state in ("UNKNOWN", "PENDING")
                missing[i] = missing.get(i, 0) + 1 if gone else 0
                if job.done() or missing[i] >= 3:
                    returns[i] = self._result(job, job_overrides[i], done=missing[i] < 3)
                    del pending[i]
            if pending:
                time.sleep(2)

    def _result(self, job, overrides, done: bool = True) -> JobReturn:
        """The job's JobReturn once Slurm ended it (``done``: it left its result or an end state in
        ``sacct``); a job that ended unfinished is one line (and in :func:`lost_jobs`), its runs still
        RUNNING closed KILLED."""
        from submitit.core.utils import FailedJobError, UncompletedJobError
        try:
            if not done:
                raise UncompletedJobError("cancelled while pending (no accounting record)")
            return job.results()[0]
        except (FailedJobError, UncompletedJobError) as exc:
            if RunsFailed.__name__ in str(exc):        # its runs say what failed
                return _returned(overrides, {"failed": 1})
            state = job.state if done else "CANCELLED"
            shown = " ".join(o for o in overrides if not o.startswith("tracking."))
            said = [x.split(f"{JobInterrupted.__name__}: ", 1)[1] for x in str(exc).splitlines()
                    if f"{JobInterrupted.__name__}: " in x]
            first = said[-1] if said else next((x.strip() for x in reversed(str(exc).splitlines())
                                                if x.strip()), state)
            closed = self._close_runs([job.job_id], f"its Slurm job {job.job_id} ended {state}")
            line = (f"Slurm job {job.job_id} ({shown}) ended {state} without finishing"
                    + (f": {first[:200]}" if said or not state.startswith("CANCELLED") and state not in first
                       else "")
                    + (f"; {closed} run(s) it had in progress closed KILLED" if closed else ""))
            print(line, file=sys.stderr, flush=True)
            _LOST.append(line)
            return _returned(overrides, {"lost": 1})

    def _close_runs(self, job_ids: list, why: str, since_ms: int | None = None) -> int:
        """Close (KILLED, ``why``) the RUNNING runs of the Slurm jobs ``job_ids``; returns how many, or
        with ``since_ms`` how many of their runs ended KILLED since then (by the jobs or here)."""
        tr, n = self._tracker(), 0
        for jid in job_ids:
            for r in tr._runs(f"tags.slurm_job_id = '{jid}' and attributes.status = 'RUNNING'"):
                tr._close_orphan(r.info.run_id, why)
                n += 1
        if since_ms is not None:
            return sum(len(tr._runs(f"tags.slurm_job_id = '{jid}' and attributes.status = 'KILLED' and "
                                    f"attributes.end_time >= {since_ms}")) for jid in job_ids)
        return n

    def _cancel(self, jobs: list, why: str) -> None:
        """Cancel ``jobs`` (scancel), wait up to a minute until Slurm has ended them (their runs end
        KILLED in the job), then close the runs they left RUNNING. A second Ctrl-C waits meanwhile."""
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        since_ms = int(time.time() * 1000)
        try:
            ids = [j.job_id for j in jobs]
            print(f"\nCancelling {len(ids)} Slurm task(s) of this sweep (scancel {ids[0].split('_')[0]}) ...",
                  file=sys.stderr, flush=True)
            subprocess.run(["scancel", *ids], capture_output=True, timeout=60)
            deadline = time.time() + 60
            while time.time() < deadline:
                out = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(ids)], capture_output=True,
                                     text=True, timeout=30)
                if out.returncode or not out.stdout.strip():
                    break
                time.sleep(1)
            _CANCELLED.append(self._close_runs(ids, f"its Slurm job was cancelled: {why}", since_ms))
        finally:
            signal.signal(signal.SIGINT, old)

    def __call__(self, sweep_overrides, job_dir_key, job_num, job_id, singleton_state):
        """Run one job in its Slurm task (see the module's docstring); raises RunsFailed when a run of
        it FAILED or it was interrupted, so that the task exits non-zero."""
        import submitit
        env = submitit.JobEnvironment()
        track.OWNER["slurm_job_id"] = env.job_id
        stopping = _on_signals(env.job_id)
        before = {t: set(t.done) for t in track.trackers()}
        try:
            ret = super().__call__(sweep_overrides, job_dir_key, job_num, job_id, singleton_state)
        except KeyboardInterrupt:                    # Slurm's SIGTERM
            why = f"Slurm ended job {env.job_id} (SIGTERM: scancel, or its node is going down)"
            track.abort_open_runs("KILLED", why)
            raise JobInterrupted(why) from None
        if stopping:
            return ret
        counts = ret.return_value if ret.status == JobStatus.COMPLETED else None
        if not isinstance(counts, dict) or counts.get("failed") or counts.get("crashed"):
            raise RunsFailed(f"job {env.job_id} ({' '.join(sweep_overrides)}): a run failed ({counts}); "
                             "its run's error tag says why")
        parent = ret.hydra_cfg.hydra.job.env_set.get(track.SWEEP_ENV["parent"]) if ret.hydra_cfg else None
        for t in track.trackers():
            if parent and t.experiment_id:
                ids = ",".join(sorted(t.done - before.get(t, set())))
                t.log(parent, tags={job_tag(sweep_overrides): ids or ""})
                break
        return ret


def _queued(jobs: list) -> set | None:
    """The ids (``123_4``) of ``jobs`` that ``squeue`` still lists, or None when it cannot answer."""
    bases = sorted({j.job_id.split("_")[0] for j in jobs})
    try:
        out = subprocess.run(["squeue", "-h", "-r", "-o", "%i", "-j", ",".join(bases)], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return set(out.stdout.split()) if out.returncode == 0 else None


def _accounting_watcher():
    """submitit's ``sacct`` watcher of job states (imported here: submitit takes 0.1 s to import),
    saying once in one line (:data:`ACCOUNTING_DOWN`) when Slurm accounting does not answer, where
    submitit logs a warning and ``sacct`` its errors at every poll. Meanwhile a job's end is known from
    its result file or ``squeue`` (SlurmLauncher._wait)."""
    from submitit.slurm.slurm import SlurmInfoWatcher

    class Accounting(SlurmInfoWatcher):
        said = False

        def update(self) -> None:
            """submitit's update (one ``sacct`` for the jobs not yet ended), its errors captured."""
            command = self._make_command()
            if command is None:
                return
            self._num_calls += 1
            try:
                out = subprocess.run(command, capture_output=True, timeout=60, check=True).stdout
            except (OSError, subprocess.SubprocessError) as exc:
                if not self.said:
                    self.said = True
                    said = (getattr(exc, "stderr", None) or b"").decode(errors="replace").strip().splitlines()
                    print(f"{ACCOUNTING_DOWN} ({said[-1] if said else exc}). The sweep goes on: it follows "
                          "its jobs by squeue and their result files.", file=sys.stderr, flush=True)
            else:
                self._info_dict.update(self.read_info(out))
            self._last_status_check = time.time()
            for job_id in self._registered - self._finished:
                if self.is_done(job_id, mode="cache"):
                    self._finished.add(job_id)
    return Accounting(delay_s=60)


def _returned(overrides, value) -> JobReturn:
    ret = JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED)
    ret.return_value = value
    return ret


def _on_signals(job_id: str) -> list:
    """In a Slurm task: close the runs in progress KILLED on submitit's USR2 (preemption, the time
    limit near: submitit's own handler then requeues the task) and on SIGTERM (scancel; a
    KeyboardInterrupt ends the job). Returns a list that is not empty once USR2 came."""
    stopping: list = []
    usr2 = signal.getsignal(signal.SIGUSR2)

    def on_usr2(signum, frame):
        stopping.append(signum)
        track.abort_open_runs("KILLED", f"Slurm signalled job {job_id} to stop (USR2: preempted or at its "
                                        "time limit); submitit requeues it and it measures them again")
        if callable(usr2):
            usr2(signum, frame)

    def on_term(signum, frame):
        if not stopping:                  # during submitit's requeue, SIGTERM is its to ignore
            stopping.append(signum)
            raise KeyboardInterrupt(signum)
    signal.signal(signal.SIGUSR2, on_usr2)
    signal.signal(signal.SIGTERM, on_term)
    return stopping
