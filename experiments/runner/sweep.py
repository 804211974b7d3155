"""The sweep around the jobs: what identifies it, how many jobs it has, and the Hydra callback that
opens the store at its start and closes the parent run at its end with a summary.

A sweep is identified by its overrides (``hydra.sweeper.params`` of a preset plus the command line,
``tracking.*`` left out) and the experiment: the same command run again continues under the same
parent run. The callback hands the identity to the jobs through environment variables
(:data:`experiments.store.track.SWEEP_ENV`), which also reach the processes of a parallel launcher.
"""
from __future__ import annotations

import collections
import contextlib
import copy
import hashlib
import os
import pickle
import re
import shlex
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from ..store.record import (ARTIFACTS, MEMBER, NEW, failure_summary, outcome_of, plotting, reused_count,
                            sweep_note, throughput_figure)
from ..reports.compare import replicates
from ..reports.report import static_command
from .job import warm_process
from .kernel import resolved
from ..spec import value
from ..store.track import SWEEP_ENV, StoreError, UriError, get_tracker, resolve_uri, unwritable
from ..store.view import description_link, publish, sweep_link
from .validate import SEARCH_SWEEPER, Invalid, check, removed
from .variants import VariantError
from .variants import register as register_variants

__all__ = ["count_jobs", "job_dir_name", "sweep_info", "tracking_target", "gpu_time",
           "prewarm", "SweepCallback", "values_as_run", "check_output_dirs", "guard_slurm", "sweep_variants",
           "compose_once"]


def gpu_time(runs: list, start: float, end: float) -> tuple[str, dict]:
    """Where a sweep's wall time went: per GPU, the seconds its runs held it (the window of
    verification and timing, tags ``gpu_start_unix`` / ``gpu_end_unix``), and how many pairs of
    runs held one GPU at the same time (0 by :func:`experiments.gpu.worker.gpu_lock`).

    ``runs``: MLflow runs; ``start``, ``end``: the sweep's wall clock (unix seconds). Returns ('' and
    {} when no run held a GPU) a line such as ``GPU time: 7.4 s on 1 GPU(s) of 15.9 s wall (47%); no
    two runs on one GPU at once`` and the parent's metrics ``sweep_wall_s``, ``gpu_busy_s`` (the sum over
    GPUs), ``gpu_busy_share`` (gpu_busy_s / (wall x GPUs)), ``gpus``, ``gpu_overlaps``."""
    by_gpu = collections.defaultdict(list)
    for r in runs:
        t = r.data.tags
        if "gpu_start_unix" in t and "gpu_end_unix" in t:
            by_gpu[t.get("gpu_uuid") or t.get("pci_bus_id") or "gpu"].append(
                (float(t["gpu_start_unix"]), float(t["gpu_end_unix"])))
    if not by_gpu:
        return "", {}
    wall = max(end - start, 1e-9)
    busy = {g: sum(b - a for a, b in w) for g, w in by_gpu.items()}
    overlaps = 0
    for w in by_gpu.values():
        w.sort()
        overlaps += sum(b[0] < a[1] for a, b in zip(w, w[1:], strict=False))
    total = sum(busy.values())
    share = total / (wall * len(busy))
    each = ("" if len(busy) == 1
            else " (" + ", ".join(f"{g[-8:]} {s:.1f} s" for g, s in sorted(busy.items())) + ")")
    line = (f"GPU time: {total:.1f} s on {len(busy)} GPU(s){each} of {wall:.1f} s wall ({share:.0%}); "
            + ("no two runs on one GPU at once" if not overlaps else f"{overlaps} overlapping GPU windows"))
    return line, {"sweep_wall_s": round(wall, 2), "gpu_busy_s": round(total, 2),
                  "gpu_busy_share": round(share, 4), "gpus": len(busy), "gpu_overlaps": overlaps}


def prewarm(launcher: DictConfig, gpu: bool, jobs: int | None = None) -> threading.Thread | None:
    """Start the job processes of Hydra's joblib launcher (``hydra/launcher=gpus`` or ``joblib``) now,
    while the sweep opens its store, instead of after it: the same ``joblib.Parallel`` arguments the
    launcher will use (so joblib's reusable loky executor is the one its jobs then run in) with one
    :func:`experiments.runner.job.warm_process` per process that will get a job (``jobs``: the sweep's count,
    None when unknown). Returns the thread doing it (join it before the jobs are launched; its ``pids``
    then lists the processes warmed), or None for another launcher and for one job process (joblib
    then runs the jobs in this process).
    Raises validate.Invalid (exit 2) for an ``n_jobs`` joblib cannot use (0), naming the values it takes."""
    if "JoblibLauncher" not in str(launcher.get("_target_", "")):
        return None
    from hydra.utils import instantiate
    from hydra_plugins.hydra_joblib_launcher._core import process_joblib_cfg
    from joblib import Parallel, delayed, effective_n_jobs

    args = dict(instantiate(launcher).joblib)           # as JoblibLauncher.launch passes them
    args["backend"] = "loky"
    process_joblib_cfg(args)
    try:
        n = effective_n_jobs(args["n_jobs"])
    except ValueError as exc:
        raise Invalid(f"hydra.launcher.n_jobs={args['n_jobs']}: {exc} (a positive count of job "
                         "processes, or -1 for one per CPU)") from None
    if n == 1:
        return None
    n = min(n, jobs or n)

    def start() -> None:
        try:
            thread.pids = Parallel(**args)(delayed(warm_process)(gpu) for _ in range(n))
        except BaseException:  # noqa: BLE001 - a process interrupted (Ctrl-C reaches them too) or
            pass               # failed: the jobs start their processes themselves then
    thread = threading.Thread(target=start, daemon=True, name="prewarm")
    thread.pids = []
    _PREWARM.append(thread)
    thread.start()
    return thread


_PREWARM: list = []     # the threads of prewarm, until release_job_processes has waited for them


def release_job_processes() -> None:
    """End the job processes of the joblib launcher at once: when its jobs are done (they would
    otherwise wait for joblib's idle timeout, or make the command wait at exit while each stops its
    GPU worker), and when the command ends otherwise (Ctrl-C, an error), also while the sweep starts
    them (:func:`prewarm`), so none is left behind. Their GPU workers end when they see their process
    gone."""
    while _PREWARM:                  # the processes it starts must exist before they can be ended
        _PREWARM.pop().join(120)
    reusable_executor = sys.modules.get("joblib.externals.loky.reusable_executor")
    executor = getattr(reusable_executor, "_executor", None)
    if executor is None:
        return
    for proc in list(getattr(executor, "_processes", {}).values()):   # loky's own kill wants psutil
        with contextlib.suppress(OSError):
            os.kill(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):          # already shut down, or broken: its processes are gone
        executor.shutdown(wait=True)


def compose_once() -> None:
    """Let Hydra compose each config once per command instead of up to four times, and read each config
    file once.

    Hydra composes the same config (same config name, overrides and mode) again at each step of a
    command: to read ``hydra.mode``, for the sweep, and per job once in the sweeper's check that the
    batch composes and once more in the basic launcher (about 0.1-0.2 s of CPU each). This keeps each
    composition, keyed by the loader and everything it reads (config name, overrides, run mode,
    working folder, environment), and hands out a copy on a repeat; the override checks Hydra runs
    before composing still run on every call. Each composition also parses every YAML file of its
    defaults list again (about a third of its time): a file's parsed config is kept, keyed by its path,
    size and modification time, and each reader gets a copy (Hydra edits what it loaded). Installed
    once per process; idempotent."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.sources_registry import SourcesRegistry
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.plugins import Plugins
    from hydra.plugins.config_source import ConfigResult
    compose = ConfigLoaderImpl.load_configuration
    if getattr(compose, "composes_once", False):
        return
    Plugins.instance()      # its plugin scan runs Hydra's config-source modules again: patch what it made
    files: dict = {}

    def file_key(self, config_path):
        path = os.path.realpath(os.path.join(self.path, self._normalize_file_name(config_path)))
        stat = os.stat(path)
        return path, stat.st_size, stat.st_mtime_ns, stat.st_ino

    def reading_once(read, key_of):
        if getattr(read, "reads_once", False):
            return read

        def load_config(self, config_path):
            try:
                key = key_of(self, config_path)
            except OSError:
                return read(self, config_path)       # Hydra's own error for a file that is not there
            if key not in files:
                done = read(self, config_path)
                files[key] = (pickle.dumps(done.config), done.path, done.provider, done.header)
            config, path, provider, header = files[key]
            return ConfigResult(config=pickle.loads(config), path=path, provider=provider,
                                header=dict(header))
        load_config.reads_once = True
        return load_config

    for scheme, key_of in (("file", file_key), ("pkg", lambda self, path: ("pkg", self.path, path))):
        source = SourcesRegistry.instance().resolve(scheme)       # pkg: files of installed packages
        source.load_config = reading_once(source.load_config, key_of)

    def load_configuration(self, config_name, overrides, run_mode, from_shell=True,
                           validate_sweep_overrides=True):
        key = (config_name, tuple(overrides), run_mode, from_shell, os.getcwd(),
               frozenset(os.environ.items()))
        done = self.__dict__.setdefault("_composed", {})
        if key not in done:
            cfg = compose(self, config_name, overrides, run_mode, from_shell, validate_sweep_overrides)
            done[key] = pickle.dumps(cfg)
            return cfg
        if validate_sweep_overrides:
            parsed = OverridesParser.create(config_loader=self).parse_overrides(list(overrides))
            self.validate_sweep_overrides_legal(overrides=parsed, run_mode=run_mode, from_shell=from_shell)
        return pickle.loads(done[key])

    load_configuration.composes_once = True
    ConfigLoaderImpl.load_configuration = load_configuration


NAME_MAX = 255      # bytes of one file name on Linux and macOS file systems


def job_dir_name(num, overrides: str) -> str:
    """The name of a job's folder in a sweep (``hydra.sweep.subdir``): ``<num>_<overrides>`` (Hydra's
    ``hydra.job.override_dirname``), or, when that is longer than a file name may be
    (:data:`NAME_MAX` bytes; ``problem.shapes`` of 16 shapes), its start and a hash of the whole, so that
    two jobs never share a folder. The job's overrides are in its ``.hydra/overrides.yaml``."""
    name = f"{num}_{overrides}"
    data = name.encode()
    if len(data) <= NAME_MAX:
        return name
    digest = hashlib.sha256(data).hexdigest()[:16]
    return data[:NAME_MAX - len(digest) - 4].decode(errors="ignore") + "..._" + digest


# registered here, where the callback lives: a job process of a parallel launcher (joblib, Slurm) has
# it once it unpickles the callbacks, before Hydra resolves the job's folder
OmegaConf.register_new_resolver("job_dir", job_dir_name, replace=True)


def count_jobs(overrides) -> int:
    """Number of jobs the basic sweeper makes from ``overrides`` (product of the sweep lengths).

    Handles every sweep form of Hydra's override grammar (``a,b``, ``range()``, ``choice()``, and
    ``glob()`` over a config group when Hydra is initialised). Raises HydraException / ValueError
    on overrides the basic sweeper cannot expand.
    """
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    loader = GlobalHydra.instance().config_loader() if GlobalHydra.instance().is_initialized() else None
    parsed = OverridesParser.create(config_loader=loader).parse_overrides(list(overrides))
    return len(BasicSweeper.split_arguments(parsed, None)[0])


def sweep_variants(config: DictConfig, variants: dict) -> None:
    """Add the variants a preset lists (``variants``: name -> overrides, its
    ``hydra.callbacks.tracking.variants``; experiments.runner.variants) to the sweep of ``config`` (a
    multirun's composed config, before Hydra's sweeper reads it): each is stored as an option of the
    config group ``variant`` and ``variant=<their names>`` joins ``hydra.sweeper.params`` after the
    preset's own keys, so that every variant runs with every combination of those. A ``variant=`` on
    the command line chooses among them, as it overrides any swept key. Nothing for no variants.
    Raises SystemExit for a bad entry (which preset, variant and key, and the valid ones) and for a
    preset that also sweeps ``variant`` in its params."""
    if not variants:
        return
    where = f"experiment={config.hydra.runtime.choices.get('experiment')}"
    try:
        names = register_variants(variants, where)
    except VariantError as exc:
        raise Invalid(f"Invalid preset: {exc}") from None
    params = config.hydra.sweeper.params
    if params and "variant" in params:
        raise Invalid(f"Invalid preset: {where} both lists variants ({', '.join(names)}) and sweeps "
                         f"variant={params.variant} in hydra.sweeper.params: list them in one place")
    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra.sweeper.params = {**(params or {}), "variant": ",".join(names)}


def _tracking_key(override: str) -> bool:
    return override.lstrip("+~").startswith("tracking.")


# Hydra's values that differ from job to job of a multirun
_PER_JOB = ("job.num", "job.id", "job.override_dirname", "runtime.output_dir", "sweep.subdir")


def tracking_target(config: DictConfig, multirun: bool) -> tuple[str | None, str]:
    """Where the sweep (or run) of ``config`` is tracked: ``tracking.uri`` and ``tracking.experiment``
    as plain strings, their interpolations resolved once, enum values by their names
    (``abl-${precision}`` is ``abl-int8``, not ``abl-Precision.int8``). Every job writes there.

    One sweep is tracked in one experiment of one store, so in a multirun no ``tracking.*`` key may
    differ between jobs: raises SystemExit, before any work, for a sweep over one (``tracking.experiment=
    a,b``, also in a preset's ``hydra.sweeper.params``) and for a ``tracking.*`` value that
    interpolates a key the sweep varies or a per-job Hydra value (``${hydra:job.num}``); the message
    says to run one sweep per experiment. Also for an interpolation that cannot be resolved."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException
    if "tracking" not in config:            # ~tracking
        raise Invalid(removed("tracking"))
    if multirun:
        _refuse_per_job_tracking(config)
    plain = OmegaConf.create(OmegaConf.to_container(OmegaConf.masked_copy(config, [k for k in config
                                                                                   if k != "hydra"]),
                                                    resolve=False, enum_to_str=True))
    try:
        uri, experiment = plain.tracking.uri, plain.tracking.experiment
    except OmegaConfBaseException as exc:
        raise Invalid(f"Invalid configuration: tracking: {str(exc).splitlines()[0]}") from None
    return (None if uri is None else str(uri)), str(experiment)


def _refuse_per_job_tracking(config: DictConfig) -> None:
    """tracking_target's check of a multirun: validate.Invalid (exit 2, as any value the sweep cannot
    take) when a tracking.* key varies per job."""
    from omegaconf import OmegaConf
    task, given = _overrides(config, True)
    swept = {}                          # key -> the override that sweeps it
    for text in given:
        with contextlib.suppress(Exception):   # another sweeper's syntax: Hydra has the last word
            override = _parse(text)
            if override.is_sweep_override():
                swept[override.key_or_group.lstrip("+~")] = (text, override)
    once = "a sweep is tracked in one store and experiment, set at its start"
    for key, (text, override) in swept.items():
        if key.startswith("tracking."):
            first = next(iter(override.sweep_string_iterator()), "VALUE")
            first = first.lower() if first in ("True", "False") else first
            command = " ".join(["python run.py -m", *(o for o in task if o != text), f"{key}={first}"])
            why = {"tracking.rerun":
                   "whether finished runs are measured again is set once for the whole sweep",
                   "tracking.wait": "the wait for the store's write lock is set once for the whole sweep",
                   "tracking.stale_after_s": "how long a RUNNING run may go without a heartbeat before it is "
                                             "redone is set once for the whole sweep"}
            raise Invalid(
                f"Cannot sweep {key} ({text}): {why.get(key, once)}. Run one sweep per value instead: "
                f"{command}, then the next value.")
    for key, raw in OmegaConf.to_container(config.tracking, resolve=False).items():
        for hydra, ref in re.findall(r"\$\{\s*(hydra:)?\s*([\w./-]+)\s*\}", str(raw)):
            # a preset swept by experiment= or variant= may set any key
            by = ([] if hydra else [t for k, (t, _) in swept.items() if k in ("experiment", "variant")
                                    or ref.split(".")[0] == k.split(".")[0]])
            if (hydra and ref in _PER_JOB) or by:
                preset = by and not by[0].startswith(ref.split(".")[0] + "=")     # a preset may set it
                where = (f"{'hydra:' * bool(hydra)}{ref} {'may differ' if preset else 'differs'} from job "
                         "to job" + (f" ({by[0]})" if by else ""))
                raise Invalid(f"Cannot use tracking.{key}={raw} in this sweep: {where}, and {once}. Run "
                                 f"one sweep per value, or give tracking.{key} a value that is the same for "
                                 "every job.")


def _overrides(config: DictConfig, multirun: bool) -> tuple[list, list]:
    """The command line's task overrides, and those after a preset's sweep (``hydra.sweeper.params``,
    in a multirun), as written: their interpolations are not resolved (a job resolves them)."""
    from omegaconf import OmegaConf
    task = [str(o) for o in OmegaConf.to_container(config.hydra.overrides.task, resolve=False)]
    params = config.hydra.sweeper.get("params") if multirun else None
    params = OmegaConf.to_container(params, resolve=False) if params else {}
    return task, [f"{k}={v}" for k, v in params.items()] + task


# the default objective of a search (conf/hydra/sweeper/search.yaml): not in its sweep key
SEARCH_OBJECTIVE = ["hydra.sweeper.objective.metric=throughput", "hydra.sweeper.objective.direction=maximize",
                    "hydra.sweeper.objective.combine=geomean"]


def _search_option(text: str) -> bool:
    """Whether the Hydra override ``text`` chooses or sets the search sweeper (kept in its command)."""
    key = text.lstrip("+~").split("=", 1)[0]
    return key == "hydra/sweeper" or key.startswith("hydra.sweeper.")


def _parse(text: str):
    from hydra.core.override_parser.overrides_parser import OverridesParser
    return OverridesParser.create().parse_override(text)


def sweep_info(config: DictConfig, multirun: bool) -> dict:
    """Identity of the sweep (or single run) of ``config`` (the composed config with its hydra node).

    Returns strings: key (hash of experiment, mode and the sorted overrides without ``tracking.*``),
    name (``sweep precision=int4,int8 ktile=32,64``), jobs (count, or '?' for a sweeper whose jobs
    cannot be counted beforehand), overrides (the command line's task overrides) and values (''; or
    for a sweep Hydra expands otherwise than it is written, :func:`values_as_run`, what runs:
    ``pipeline.stages=sort(range(1,6,2),reverse=true) runs as 4,2,0 (written: 5,3,1)``). The name
    shows such a sweep with the values that run (``sweep pipeline.stages=4,2,0``), never values that
    did not.
    """
    task, given = _overrides(config, multirun)
    kept = [o for o in given if not _tracking_key(o)]
    jobs = "1"
    if multirun and config.hydra.sweeper.get("_target_") == SEARCH_SWEEPER:
        jobs = str(config.hydra.sweeper.get("trials") or "?")      # a search: its budget of trials
        # a search's objective is part of its identity (its own parent and tags); the default's keeps the
        # key it had. Its command keeps the sweeper's overrides, so that running it again continues it.
        goal = config.hydra.sweeper.get("objective") or {}
        goal = [f"hydra.sweeper.objective.{k}={goal.get(k)}" for k in ("metric", "direction", "combine")]
        kept += [] if goal == SEARCH_OBJECTIVE else goal
        task = [str(o) for o in config.hydra.overrides.hydra if _search_option(str(o))] + task
    elif multirun:
        try:
            jobs = str(count_jobs(given))
        except Exception:  # noqa: BLE001 - another sweeper's syntax: the count is unknown
            jobs = "?"
    key = hashlib.sha256("|".join([tracking_target(config, False)[1], str(multirun), *sorted(kept)])
                         .encode()).hexdigest()[:24]
    # the name shows what runs: a preset's sweep value that the command line overrides is left out
    # (`experiment=h200_performance precision=fp16` sweeps fp16 only); the key keeps both as before
    overridden = {o.lstrip("+~").split("=", 1)[0] for o in task}
    shown = [o for o in kept if o in task or o.split("=", 1)[0] not in overridden]
    # a preset's value folded over lines in its YAML (">-") carries ", " between values
    shown = [o if o in task else re.sub(r",\s+", ",", o) for o in shown]
    differ = values_as_run(shown) if multirun else {}
    shown = [f"{differ[o][0]}={','.join(differ[o][1])}" if o in differ else o for o in shown]
    values = "; ".join(f"{o} runs as {','.join(ran)} (written: {','.join(written)})"
                       for o, (_, ran, written) in differ.items())
    name = ("sweep " if multirun else "run ") + (" ".join(shown) or "(defaults)")
    return {"key": key, "name": name, "jobs": jobs, "overrides": " ".join(task), "values": values}


def _parser_as_written():
    """Hydra's override parser with ``sort`` of a range sorting the range's values. Hydra 1.3.8's sort
    moves a range's ends instead, wrong for a range whose length is no multiple of its step:
    sort(range(1,6,2),reverse=true) expands to 4,2,0."""
    from hydra._internal.grammar import grammar_functions
    from hydra.core.override_parser.overrides_parser import OverridesParser, create_functions
    from hydra.core.override_parser.types import ChoiceSweep, RangeSweep

    def values(arg):
        return (ChoiceSweep(list=list(arg.range()), shuffle=arg.shuffle) if isinstance(arg, RangeSweep)
                else arg)

    def sort(*args, sweep=None, list=None, reverse=False):  # noqa: A002 - Hydra's keyword names
        return grammar_functions.sort(*map(values, args), sweep=values(sweep), list=list, reverse=reverse)
    functions = create_functions()
    functions.functions["sort"] = sort
    return OverridesParser(functions)


def values_as_run(overrides) -> dict:
    """The sweeps among ``overrides`` (strings) whose values Hydra's sweeper runs otherwise than they
    are written (:func:`_parser_as_written`): override -> (key, the values that run, the values
    written), each a list of strings. A shuffled sweep compares as a set; a sweep Hydra expands
    against the config (glob) is left out."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    hydra_parser, written_parser = OverridesParser.create(), _parser_as_written()
    found = {}
    for text in overrides:
        try:
            override = hydra_parser.parse_override(text)
            if not override.is_sweep_override():
                continue
            ran = list(override.sweep_string_iterator())
            written = list(written_parser.parse_override(text).sweep_string_iterator())
        except Exception:  # noqa: BLE001 - glob(...) needs the config; Hydra reports what it cannot parse
            continue
        if getattr(override.value(), "shuffle", False):
            ran, written = sorted(ran), sorted(written)
        if ran != written:
            found[text] = (override.get_key_element(), ran, written)
    return found


def check_output_dirs(config: DictConfig, multirun: bool) -> None:
    """Raise SystemExit ("Invalid configuration: KEY: ...", as for a job's key) when Hydra's output
    folder (``hydra.sweep.dir`` and ``hydra.sweep.subdir``, or ``hydra.run.dir``) cannot be resolved,
    e.g. an interpolation of a key that does not exist: Hydra's own error was a traceback. The subdir
    is tried as job 0 (its ``hydra.job.*`` keys are set per job)."""
    import copy

    from omegaconf import open_dict, read_write
    from omegaconf.errors import OmegaConfBaseException
    probe = copy.deepcopy(config)
    with read_write(probe), open_dict(probe):
        probe.hydra.job.num, probe.hydra.job.override_dirname = 0, ""
    for key in ("hydra.sweep.dir", "hydra.sweep.subdir") if multirun else ("hydra.run.dir",):
        try:
            OmegaConf.select(probe, key, throw_on_resolution_failure=True)
        except OmegaConfBaseException as exc:
            raise Invalid(f"Invalid configuration: {key}: {str(exc).splitlines()[0]} (Hydra's output "
                          f"folder; python run.py --cfg hydra shows the keys it can use)") from None


def guard_slurm(launcher: DictConfig) -> None:
    """For Hydra's submitit launchers (``hydra/launcher=slurm``): raise validate.Invalid (exit 2) when
    Slurm's sbatch or srun is not on PATH, and make a failure of Slurm during the sweep (sbatch refusing
    the jobs, an invalid partition, a job that did not complete) end the command with one line naming it
    and the launcher's settings, not submitit's traceback. The parent run, without children then, is
    removed on the way out (run.py)."""
    import shutil
    target = str(launcher.get("_target_", ""))
    if "hydra_submitit_launcher" not in target and "SlurmLauncher" not in target:
        return
    if "Slurm" in target and (missing := [t for t in ("sbatch", "srun") if shutil.which(t) is None]):
        raise Invalid(f"hydra/launcher=slurm submits the jobs with Slurm's {' and '.join(missing)}, "
                         "not on PATH here: run the command on a node of the Slurm cluster, or leave "
                         "hydra/launcher out to run the jobs on this machine. Nothing was tracked.")
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher
    if getattr(BaseSubmititLauncher.launch, "guarded", False):
        return
    launch = BaseSubmititLauncher.launch

    def guarded(self, *args, **kwargs):
        from submitit.core.utils import FailedJobError, UncompletedJobError
        try:
            return launch(self, *args, **kwargs)
        except (FailedJobError, UncompletedJobError, RuntimeError, OSError) as exc:
            first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            folder = str(self.params.get("submitit_folder", "")).removesuffix("/%j")
            where = f"submitit's files: {folder}"
            if self._EXECUTOR == "slurm":
                partition = self.params.get("partition")
                where = (f"hydra.launcher.partition={partition}" if partition else "no hydra.launcher."
                         "partition: the cluster's default") + f"; `sinfo -s` lists the partitions; {where}"
            who = "Slurm" if self._EXECUTOR == "slurm" else "submitit"
            raise SystemExit(f"{who} did not run the sweep: {first} ({where})") from None
    guarded.guarded = True
    BaseSubmititLauncher.launch = guarded


def _hand_to_jobs(config: DictConfig, env: dict) -> None:
    """Set ``env`` here and in every job of the sweep, also jobs a launcher runs in other processes
    or on other hosts (Slurm): as ``hydra.job.env_set`` overrides, which Hydra carries into each
    job's config and applies around the job."""
    from omegaconf import open_dict, read_write
    os.environ.update(env)
    quoted = {k: _quoted(v) for k, v in env.items()}
    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra.overrides.hydra.extend([f"++hydra.job.env_set.{k}={v}" for k, v in quoted.items()])


def _quoted(text: str) -> str:
    """``text`` as a quoted value of Hydra's override grammar that OmegaConf reads back unchanged, any
    character kept: Hydra takes a backslash as an escape only before a quote or at the end of the
    string, OmegaConf only before ``${`` (an interpolation, escaped too)."""
    text = re.sub(r"(\\+)(?='|\$\{|$)", lambda m: m.group(1) * 2, text)
    return "'" + text.replace("'", "\\'").replace("${", "\\${") + "'"


def _unwritable_output(config: DictConfig, multirun: bool) -> str | None:
    """The message for a Hydra output folder (``hydra.sweep.dir``, ``hydra.run.dir`` of one run) that
    this process cannot make or write, before anything is tracked (Hydra's own error is a traceback
    after the sweep has started), with the store's error where it cannot be written either; None when
    the folder can be written, or when its path cannot be resolved (Hydra says so)."""
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    try:
        folder = Path(str(OmegaConf.select(config, key, throw_on_missing=True)))
    except Exception:  # noqa: BLE001 - an interpolation that fails: left to Hydra
        return None
    if (blocked := unwritable(folder)) is None:
        return None
    problem = (f"{key}={folder} cannot be made or written: {blocked} is read-only for this user. Give a "
               f"writable folder for Hydra's job configs and logs: {key}=PATH")
    try:                                  # a read-only project folder holds the default store too
        resolve_uri(config.tracking.uri)
    except StoreError as exc:
        problem += f"\nStore error: {exc}"
    return problem


def _emulated(runs) -> list:
    """'KERNEL on ARCH: why' for each kernel of ``runs`` that runs an emulated MMA (tag mma_native=false)."""
    return sorted({f"{r.data.tags.get('kernel')} on {r.data.tags.get('arch')}: "
                   f"{r.data.tags.get('mma_native_reason', '')}"
                   for r in runs if r.data.tags.get("mma_native") == "false"})


class SweepCallback(Callback):
    """Resolves the store once, prints the GPU and where results go, and closes the parent run.

    The parent's summary (tag ``runs``, its description, the figure, metric ``runs_reused``) covers
    every run of the sweep, the runs it reused from earlier sweeps included (counted as "N reused");
    its GPU time covers the runs it measured.

    A multirun's parent run is found again (the same sweep ran before) or created at the start and
    handed to the jobs; a single run's is made by its job once the configuration is valid. A parent
    that ends without children is deleted, so no empty parent stays.

    ``benchmark`` ({goal, out}; a preset sets it as ``hydra.callbacks.tracking.benchmark``, e.g.
    conf/experiment/h200_performance.yaml): at the end of a sweep that measured on a GPU, run
    :func:`experiments.reports.performance.check` on it (goal: share of peak, 0..1; out: where the report
    goes) and exit 1 when it fails.

    ``variants`` (name -> overrides; a preset lists them as ``hydra.callbacks.tracking.variants``,
    experiments.runner.variants): the points of its sweep, added to it at the start (:func:`sweep_variants`).
    """

    def __init__(self, benchmark=None, variants=None):
        self.benchmark = dict(benchmark) if benchmark else None
        self.variants = OmegaConf.to_container(variants) if OmegaConf.is_config(variants) else variants
        self.measured = False

    def _open(self, config: DictConfig, multirun: bool) -> None:
        from ..gpu.worker import nvml_gpu
        self.t0 = time.time()           # the sweep's wall time counts from here, its set-up included
        if multirun:
            sweep_variants(config, self.variants)     # before the sweep's identity and Hydra's sweeper
        remote = "SlurmLauncher" in str(config.hydra.launcher.get("_target_", ""))   # jobs on other nodes
        gpu = nvml_gpu() if value(config.backend) != "static" and not remote else None
        from hydra.core.hydra_config import HydraConfig
        if not HydraConfig.initialized():     # ${hydra:runtime.cwd} and the like resolve here as in a job
            HydraConfig.instance().set_config(copy.deepcopy(config))     # a copy: it makes hydra read-only
        given_uri, experiment = tracking_target(config, multirun)   # stops a sweep over tracking.*
        resolved(config)                # stops the sweep on an interpolation that cannot be resolved
        check_output_dirs(config, multirun)
        if problem := _unwritable_output(config, multirun):
            raise Invalid(problem)
        guard_slurm(config.hydra.launcher)
        if remote:
            from .slurm import check_resources
            with read_write(config.hydra.launcher):    # the GPUs its jobs ask for: backend and partition
                config.hydra.launcher.update(check_resources(config.hydra.launcher, value(config.backend),
                                                             tuple(config.hydra.overrides.hydra)))
        check(config, multirun)         # every job's config, before anything is tracked
        info = sweep_info(config, multirun)
        if multirun and info["jobs"] == "0":
            raise Invalid(f"The sweep has no jobs: its overrides ({info['overrides']}) expand to no "
                             "combination (a glob(...) that matches no value, or an empty range(...)?). "
                             "Nothing was tracked.")
        warming = (prewarm(config.hydra.launcher, gpu is not None,
                           int(info["jobs"]) if info["jobs"].isdigit() else None) if multirun else None)
        if value(config.backend) == "gpu" and gpu is None and not remote:
            raise Invalid("Cannot run: backend=gpu but no NVIDIA GPU was found (NVML); "
                             "use backend=auto or backend=static")
        try:
            uri = resolve_uri(given_uri)
            tracker = get_tracker(uri, experiment, float(config.tracking.wait),
                                  stale_after=float(config.tracking.stale_after_s))
        except UriError as exc:         # the URI as written: refused as a bad value is (exit 2)
            from_env = given_uri is None and os.environ.get("MLFLOW_TRACKING_URI")
            whence = " (from $MLFLOW_TRACKING_URI)" if from_env else ""
            raise Invalid(f"Store error{whence}: {exc}") from None
        except StoreError as exc:
            raise SystemExit(f"Store error: {exc}") from None
        self.uri, self.experiment = uri, experiment
        self.measured = gpu is not None or remote and value(config.backend) != "static"
        self.key = info["key"]
        self.search = multirun and config.hydra.sweeper.get("_target_") == SEARCH_SWEEPER
        self.command = "python run.py " + ("-m " if multirun else "") + info["overrides"]
        os.environ.update({SWEEP_ENV[k]: v for k, v in info.items()})
        os.environ.pop(SWEEP_ENV["parent"], None)
        # every job writes to this store and experiment, also in another process or folder (chdir)
        handoff = {"MLFLOW_TRACKING_URI": uri, SWEEP_ENV["uri"]: uri, SWEEP_ENV["experiment"]: experiment,
                   SWEEP_ENV["key"]: info["key"], SWEEP_ENV["jobs"]: info["jobs"]}
        known = tracker.find_parent(self.key)
        if multirun:
            handoff[SWEEP_ENV["parent"]] = tracker.parent(info)
            # the summary figure's libraries load while the jobs run (seconds, otherwise at the end)
            threading.Thread(target=plotting, daemon=True).start()
        _hand_to_jobs(config, handoff)
        if value(config.backend) == "static":
            line = "backend=static: rendering and assembling with ptxas only (no verification or timing)."
        elif remote and not (config.hydra.launcher.gpus_per_task or config.hydra.launcher.gpus_per_node):
            line = (f"backend={value(config.backend)}: the jobs ask Slurm for no GPU (the partition's nodes "
                    "have none, or hydra.launcher.gpus_per_task=null): " + ("static runs (ptxas only)." if
                    value(config.backend) == "auto" else "their runs fail where no GPU is visible."))
        elif remote:
            line = (f"backend={value(config.backend)}: the jobs run on the Slurm partition's nodes and use "
                    "their GPUs (a job on a node without one: " + ("its runs fail)." if value(config.backend)
                                                                   == "gpu" else "static runs)."))
        elif gpu:
            line = f"GPU: {gpu['gpu']} (sm_{gpu['compute_capability']}, driver {gpu['driver']})."
        else:
            line = ("No NVIDIA GPU found: rendering and assembling with ptxas for the target arch "
                    "only (runs tagged backend=static).")
        print(line, flush=True)
        if stale := tracker.close_stale():
            print(f"Closed {stale} run(s) left RUNNING by a process that has ended (status KILLED).")
        where = f"Tracking {info['jobs']} job(s) in {uri}"
        if known:
            where += f", continuing parent run {known}"
        elif multirun:
            where += f" (parent run {handoff[SWEEP_ENV['parent']]})"
        print(where + ".", flush=True)
        if info["values"]:
            print(f"Note: Hydra expands a sweep otherwise than it is written: {info['values']}. The jobs run "
                  "the values Hydra gives them, and the sweep is named and tagged (sweep_values) with those; "
                  "write the values themselves to run the ones written.", flush=True)
        if warming is not None:
            warming.join()

    def _close(self, failed_job: bool = False) -> None:
        """End the parent run this sweep added runs to (in the one store and experiment of the sweep,
        :func:`tracking_target`), with a summary. Any run of this command FAILED (rejected by the
        assembler, a wrong result, a GPU fault, a job that could not run): the parent ends FAILED with
        the count as its reason and the command exits 1, after every job ran; skipped runs are no
        failure, but a sweep whose every job was skipped (combinations that cannot exist) exits 2. A
        parent or experiment deleted while the sweep ran is restored first (:meth:`Tracker.keep_live`)."""
        slurm = sys.modules.get("experiments.runner.slurm")
        lost = slurm.lost_jobs() if slurm else []
        closed, failures, total, emulated, outcomes = self._end_parent(failed_job or bool(lost))
        if emulated:
            print(f"Note: {len(emulated)} kernel(s) of this sweep run an emulated MMA on their target "
                  f"(tag mma_native=false), e.g. {emulated[0]}. Conclusions about them are about the "
                  "emulation, not the tensor cores.", flush=True)
        failed = self._benchmark() if self.benchmark and self.measured and closed else None
        if failures:
            first = "; ".join(r.data.tags.get("error", "?").splitlines()[0] for r in failures[:3])
            failed = "\n".join([f"{failure_summary(failures, total)} ({first}); each run's error tag says "
                                 "why, the same command runs them again", *([failed] if failed else [])])
        if lost:
            failed = "\n".join([f"{len(lost)} Slurm job(s) of this sweep ended without finishing "
                                 "(each said so "
                                 "above; their runs in progress are KILLED); the same command submits them "
                                 "again", *([failed] if failed else [])])
        if failed:
            raise SystemExit(failed)
        tracker = get_tracker(self.uri, self.experiment) if getattr(self, "search", False) else None
        if tracker and (parent := tracker.find_parent(self.key)) and (
                error := tracker.client.get_run(parent).data.tags.get("search_error")):
            # a search whose objective could not be formed: the first such trial stopped it
            print(f"The search stopped: {error}. Exit status 2.", file=sys.stderr, flush=True)
            raise SystemExit(2)
        if set(outcomes) == {"skipped"}:
            # nothing the command asks for can exist: exit 2, as for a value no kernel takes (run.py),
            # apart from 1, a run or job that failed
            print(f"Every job of this sweep was skipped ({outcomes['skipped']} combination(s) that cannot "
                  "exist; see their runs' skip_reason): nothing was built or measured. Exit status 2.",
                  file=sys.stderr, flush=True)
            raise SystemExit(2)

    def _end_parent(self, failed_job: bool) -> tuple:
        """End the sweep's parent run in its store and experiment (see :meth:`_close`), print its
        summary and links (also when nothing was added: a re-run of a finished sweep shows where its
        results are); returns (parents ended: 0 or 1, the runs this command had FAILED, how many
        runs it made, the emulated kernels it ran, the outcome counts over each measurement's latest
        run)."""
        nothing = "Nothing new was tracked: every run of this sweep is already in the store."
        uri, experiment = self.uri, self.experiment
        tracker = get_tracker(uri, experiment)
        tracker.keep_live(None)          # a deleted experiment first: its runs are found again
        parent = tracker.parents.get(self.key) or tracker.find_parent(self.key)
        if parent is not None:
            tracker.keep_live(parent)
        runs = tracker.sweep_runs(parent) if parent else []     # reused ones too
        new = [r for r in runs if r.info.start_time >= self.t0 * 1000 - 1]
        # each measurement once: the latest run per run key, or per name and config for a run that
        # failed before it had one (tracking.rerun=true and a retried failure each add a run)
        latest = {r.data.tags.get("run_key") or (r.info.run_name, *sorted(r.data.params.items())): r
                  for r in runs}.values()
        outcomes = collections.Counter(outcome_of(r) for r in latest)
        if parent is not None and not runs:          # made at the start, nothing joined it
            tracker.end(parent, "KILLED", "no run joined this sweep")
            tracker.client.delete_run(parent)
            print(nothing, flush=True)
            return 0, [], 0, [], outcomes
        reused = reused_count(runs, parent)
        summary = ", ".join(f"{n} {s}" for s, n in sorted(outcomes.items())) + (
            f"; {reused} of them reused" if reused else "")
        # added: runs it made now, or runs it reused now (the summary it recorded before differs)
        if parent is None or not new and tracker.client.get_run(parent).data.tags.get("runs") == summary:
            if parent in tracker.open:                # reopened at the start; nothing was added
                tracker.end(parent)
            print(nothing, flush=True)
            if parent is not None:
                print(f"Parent run {parent}: {summary}.", flush=True)
                self._links(tracker.experiment_id, parent)
            return 0, [], 0, _emulated(latest), outcomes
        emulated = _emulated(new)
        mine = [r for r in new if r.info.status == "FAILED"]
        for r in runs:      # runs tracked before the membership tag: the UI's view filters by it
            if MEMBER.format(parent) not in r.data.tags:
                tracker.client.set_tag(r.info.run_id, MEMBER.format(parent), NEW)
        busy_line, busy = gpu_time(new, self.t0, time.time())
        exp = tracker.experiment_id
        note = description_link(exp, parent) + "\n\n" + sweep_note(self.command, runs, parent,
                                                                    lambda r: replicates(tracker, r))
        if best := tracker.client.get_run(parent).data.tags.get("search_best"):    # a search's result
            note += f"\n\nSearch result: best {best}."
        tracker.log(parent, {**busy, "runs_reused": reused},
                    tags={"runs": summary, "mlflow.note.content": note})
        with tempfile.TemporaryDirectory() as tmp:
            fig = Path(tmp) / ARTIFACTS["figure"]
            if throughput_figure(runs, fig):
                tracker.artifact_file(parent, fig)
        if mine or failed_job:
            why = failure_summary(mine, len(new)) if mine else "a job could not run or did not finish"
            tracker.end(parent, "FAILED", why + "; see their runs' error tag")
        else:
            tracker.end(parent)
        print(f"Parent run {parent}: {summary}.", flush=True)
        if busy_line:
            print(busy_line, flush=True)
        publish(tracker.client, exp, parent, runs)
        self._links(exp, parent)
        return 1, mine, len(new), emulated, outcomes

    def _links(self, exp: str, parent: str) -> None:
        """Print where the sweep's results are: the UI command (or the tracking server), the links to
        the sweep's view and to every run of experiment id ``exp``, and without a GPU the table command
        of its static runs."""
        uri = self.uri
        if uri.startswith(("http://", "https://")):     # a tracking server is its own UI
            ui = uri.rstrip("/") + "/"
            print(f"Browse the results on the tracking server {uri}:", flush=True)
        else:
            ui = "http://127.0.0.1:5000/"
            print(f"Browse the results:  mlflow ui --backend-store-uri {shlex.quote(uri)}", flush=True)
        print(f"  this sweep: {sweep_link(exp, parent, ui)}\n  all runs:   {ui}#/experiments/{exp}/runs",
              flush=True)
        if not self.measured:                    # no GPU: the resources of its static runs
            print(f"  as a table: {static_command(uri, self.experiment, parent)}", flush=True)

    def _benchmark(self) -> str | None:
        """The performance check of this sweep (``benchmark``); returns why it failed, or None."""
        from ..reports.performance import NothingMeasured, check
        tracker = get_tracker(self.uri, self.experiment)
        parent = tracker.parents.get(self.key) or tracker.find_parent(self.key)
        try:
            res = check(self.uri, self.experiment, parent, float(self.benchmark.get("goal", 0.8)))
        except NothingMeasured as exc:       # every GEMM run failed or was skipped
            return f"Performance check: {exc}"
        print(res.markdown, flush=True)
        if out := self.benchmark.get("out"):
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(out).write_text(res.markdown)
            print(f"Performance report written to {out}.", flush=True)
        return None if res.ok else "Performance check failed: " + "; ".join(res.failures)

    def _start(self, config: DictConfig, multirun: bool) -> None:
        # Hydra turns a callback's exception into a warning and goes on; a sweep that cannot be
        # tracked must stop before any work instead
        try:
            self._open(config, multirun)
        except SystemExit:
            raise
        except Exception as exc:  # noqa: BLE001
            raise SystemExit(f"Could not start the sweep: {type(exc).__name__}: {exc}") from exc

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self._start(config, multirun=True)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        try:
            self._close()
        finally:
            release_job_processes()

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        self._start(config, multirun=False)

    def on_run_end(self, config: DictConfig, job_return=None, **kwargs) -> None:
        from hydra.core.utils import JobStatus
        self._close(failed_job=job_return is not None and job_return.status == JobStatus.FAILED)
