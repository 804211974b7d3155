"""Search over a family's declared space with Optuna, as Hydra's sweeper (``hydra/sweeper=search``).

The space is declared like any sweep, in ``hydra.sweeper.params`` (a preset's, e.g.
conf/experiment/search_wgmma.yaml) and sweeps on the command line: ``key: a,b,c``, ``choice(...)``,
``range(...)``, or ``axis`` for every value the family declares for the key (``Family.declared``). Each
point the sampler asks for is composed and checked as a single run would be
(:func:`experiments.runner.validate.spec_problem`); an invalid one is told to Optuna as PRUNED (the
sampler learns to avoid it) and another is asked, without counting against the budget. A valid point is
one job of the ordinary runner (run keys, reuse of what the store holds, claims) under the sweep's
parent run; its objective is read from its runs in the store (:func:`objective`): ``objective.metric``
of every run (one per problem size), combined by ``objective.combine``. A run that failed (verification,
a fault) makes a FAILED trial with its reason.

The sampler's state is an Optuna storage next to the store (``search.db`` beside a SQLite store, or
``hydra.sweeper.storage``), one study per sweep (its key) and objective: the same command continues the
search, a trial left RUNNING by an interrupted command runs again first (its finished runs are reused)
and a point already tried is not run again. The budget (``trials``: trials that ran a job; ``minutes``:
wall time from the command's start) covers every command of the sweep. Options:
conf/hydra/sweeper/search.yaml.
"""
from __future__ import annotations

import math
import os
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from ..store.track import HOST, process_ended

__all__ = ["SearchSweeper", "Space", "parse_space", "Points", "space_problem", "options_problem", "objective",
           "storage_url",
           "search", "sampler", "COMBINE", "COUNTED", "AXIS"]


AXIS = "axis"                # a param's value: every value the family declares for its key
# how the objective's values at several problem sizes make one
COMBINE = {"geomean": statistics.geometric_mean, "mean": statistics.fmean, "min": min, "max": max}
DIRECTIONS = ("maximize", "minimize")
# before the search, its points are tried for one that is valid: every one up to SCAN_LIMIT points, for
# SCAN_SECONDS at most
SCAN_LIMIT, SCAN_SECONDS = 200_000, 30.0


def _process_start() -> float:
    """When this process started (unix seconds; Linux's /proc), else now: the minutes budget's clock."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


STARTED = _process_start()


@dataclass
class Space:
    """The search space: ``params`` (key -> its values, as override strings, in declared order) and
    ``fixed`` (the command line's other overrides, given to every trial)."""
    params: dict
    fixed: list

    @property
    def size(self) -> int:
        """Points in the product of the params' values (valid or not)."""
        return math.prod(len(v) for v in self.params.values())


def parse_space(config: DictConfig, arguments: list | None = None) -> Space:
    """The space of the search sweep of ``config`` (composed, with its hydra node): its
    ``hydra.sweeper.params``, then the command line's sweep overrides (``arguments``, default the
    config's task overrides), which replace a param of the same key; plain overrides are fixed.
    Raises experiments.runner.validate.Invalid for a value that is not a list of values (interval) or
    ``axis`` for a key the family declares no values for, and for a space without a param."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from ..families import get
    from ..families.runner import family_name
    from .validate import Invalid
    parser = OverridesParser.create()
    if arguments is None:
        arguments = [str(o) for o in OmegaConf.to_container(config.hydra.overrides.task, resolve=False)]
    given = config.hydra.sweeper.get("params") or {}
    given = OmegaConf.to_container(given, resolve=False) if OmegaConf.is_config(given) else dict(given)
    params: dict = {}
    fixed: list = []
    for text in [f"{k}={v}" for k, v in given.items()] + list(arguments):
        try:
            override = parser.parse_override(text)
        except Exception as exc:  # noqa: BLE001 - Hydra's parse errors
            raise Invalid(f"{text!r} cannot be read as an override: {exc}") from None
        key = override.get_key_element()
        if override.is_interval_sweep():
            raise Invalid(f"{text!r}: a search takes the values of each key (a,b,c; choice(...); range(...); "
                          f"{AXIS}): the kernels' axes are discrete")
        if override.is_sweep_override():
            params[key] = list(override.sweep_string_iterator())
            if not params[key]:
                raise Invalid(f"{text!r} has no values (an empty range or choice): give at least one, "
                              f"e.g. {key}=range(2,5)")
        elif override.get_value_element_as_str() == AXIS:
            family = get(family_name(config))
            if not (values := family.declared(key)):
                raise Invalid(f"{text!r}: family={family.name} declares no values for {key}; {AXIS} takes "
                              f"precision, " + ("its root keys" if family.root_keys else "family.<option>")
                              + " (python run.py family=NAME --help lists them)")
            params[key] = [str(v) for v in values]
        elif key in params and text in arguments:     # the command line fixes a searched key
            params.pop(key)
            fixed.append(text)
        elif text in arguments:
            fixed.append(text)
        else:
            params[key] = [override.get_value_element_as_str()]
    if not params:
        raise Invalid("The search has no space: give hydra.sweeper.params (key: a,b,c | choice(...) | "
                      f"range(...) | {AXIS}) or sweeps on the command line, e.g. family.stages=2,3,4")
    return Space(params, [t for t in fixed if not _is_hydra(t)])


def _is_hydra(text: str) -> bool:
    return text.lstrip("+~").startswith("hydra.")


class Points:
    """The composed config of each point of a space and whether a kernel exists for it.

    Hydra composes the config once per combination of the config-group choices among the params (``tile``,
    ``family``); the other keys are set on that config as their overrides would set them, except the
    ``family.*`` options of a family that reads them as they are (``Family.spec_of`` not overridden),
    which go to its ``spec`` directly. ``gpu``: NVML's description of the GPU the trials run on (None:
    none), asked once."""

    def __init__(self, config: DictConfig, space: Space, loader, gpu: dict | None):
        from hydra.core.override_parser.overrides_parser import OverridesParser
        self.config, self.space, self.loader, self.gpu = config, space, loader, gpu
        self.groups = set(config.hydra.runtime.choices)
        self._composed: dict = {}
        self._values: dict = {}
        self._parser = OverridesParser.create()

    def _value(self, key: str, text: str):
        if (key, text) not in self._values:
            self._values[key, text] = self._parser.parse_override(f"{key}={text}").value()
        return self._values[key, text]

    def compose(self, point: dict, keep: tuple = ()) -> DictConfig:
        """The job config of ``point`` (key -> value string), the keys in ``keep`` left at the config's
        values. Raises Hydra's or OmegaConf's error for a value the config does not take."""
        groups = tuple(sorted((k, v) for k, v in point.items() if k.lstrip("+~") in self.groups))
        if groups not in self._composed:
            overrides = self.space.fixed + [f"{k}={v}" for k, v in groups]
            self._composed[groups] = [self.loader.load_sweep_config(self.config, overrides), {}, None]
        entry = self._composed[groups]
        cfg, applied = entry[0], entry[1]
        with read_write(cfg), open_dict(cfg):
            for key, text in point.items():
                if key.lstrip("+~") not in self.groups and key not in keep and applied.get(key) != text:
                    OmegaConf.update(cfg, key.lstrip("+~"), self._value(key, text), merge=False)
                    applied[key] = text
                    entry[2] = None                  # what _family read of it is out of date
        return cfg

    def problem(self, point: dict) -> str | None:
        """Why ``point`` has no kernel (a value the config does not take, or the family's SpecError), or
        None when it is valid: :func:`experiments.runner.validate.spec_problem`, or for the ``family.*``
        options of a family that reads them as they are, its ``spec`` and ``check_problem`` (what that
        calls)."""
        from ..families import Family, get
        from ..families.runner import family_name, family_shapes
        from ..spec import SpecError
        from .kernel import shapes_of, tile_is_auto
        from .validate import one_line, spec_problem
        options = {k: v for k, v in point.items() if k.startswith("family.")}
        try:
            cfg = self.compose(point, keep=tuple(options))
        except Exception as exc:  # noqa: BLE001 - Hydra's and OmegaConf's errors, one line
            return one_line(exc)
        entry = next(e for e in self._composed.values() if e[0] is cfg)
        if entry[2] is None:            # read once per config: the family, its options, the sizes
            fam = get(family_name(cfg))
            direct = type(fam).spec_of is Family.spec_of and not tile_is_auto(cfg)
            try:
                cc = self.gpu["compute_capability"] if self.gpu else None
                given = fam.options_of(cfg, cc) if direct else ()
            except SpecError as exc:
                given = str(exc)
            entry[2] = (fam, direct, given, shapes_of(cfg) if fam.sized else [])
        fam, direct, given, shapes = entry[2]
        if not direct:
            if options:
                self.compose(point)
            problem = spec_problem(cfg, self.gpu)
            return problem.removeprefix("Invalid configuration: ") if problem else None
        if isinstance(given, str):
            return given
        try:
            precision, base, arch = given
            spec = fam.spec(precision, {**base, **{k[7:]: v for k, v in options.items()}}, arch)
            family_shapes(fam, spec, shapes)
        except SpecError as exc:
            return str(exc)
        return None


def _gpu(config: DictConfig) -> dict | None:
    from ..gpu.worker import nvml_gpu
    from ..spec import value
    return None if value(config.backend) == "static" else nvml_gpu()


def space_problem(config: DictConfig) -> str | None:
    """Why the search sweep of ``config`` cannot start, before any work: its space or objective cannot be
    read, a declared value that the config does not take, an objective metric no run of this backend logs,
    or no valid point in the space for the target (every point tried, up to :data:`SCAN_LIMIT` in a
    random order: their reasons, the most frequent first); None when it can start."""
    from hydra.core.global_hydra import GlobalHydra

    from ..metrics import lookup
    from .validate import Invalid, config_problem, one_line
    opts = config.hydra.sweeper
    if problem := options_problem(opts):
        return problem
    try:
        space = parse_space(config)
    except Invalid as exc:
        return str(exc)
    metric, direction = str(opts.objective.metric), str(opts.objective.direction)
    if direction not in DIRECTIONS or str(opts.objective.combine) not in COMBINE:
        return (f"hydra.sweeper.objective: direction={direction}, combine={opts.objective.combine}; valid "
                f"directions: {', '.join(DIRECTIONS)}; combine: {', '.join(COMBINE)}")
    try:
        sampler(str(opts.sampler), 0)
    except ValueError as exc:
        return str(exc)
    gpu = _gpu(config)
    if (declared := lookup(metric)) is None:
        return (f"hydra.sweeper.objective.metric={metric} is no metric a run logs (experiments/metrics.py "
                "declares them); e.g. " + (f"without a GPU: {', '.join(_static_metrics())}" if gpu is None
                                           else "throughput"))
    if gpu is None and not declared.source.startswith("ptxas"):
        return (f"hydra.sweeper.objective.metric={metric} is measured on a GPU, and this search has none "
                "(backend=static, or no NVIDIA GPU found): its runs hold ptxas' resources only. Run it on a "
                "GPU, or search on a resource: hydra.sweeper.objective.metric=registers "
                "hydra.sweeper.objective.direction=minimize (without a GPU: "
                f"{', '.join(_static_metrics())}).")
    points = Points(config, space, GlobalHydra.instance().config_loader(), gpu)
    first = {k: v[0] for k, v in space.params.items()}
    for key, values in space.params.items():        # every declared value once, checked as a sweep's
        for v in values:
            try:
                cfg = points.compose({**first, key: v})
            except Exception as exc:  # noqa: BLE001 - Hydra's and OmegaConf's errors
                return f"The search space: {key}={v}: {one_line(exc)}"
            if problem := config_problem(cfg, [f"{key}={v}"]):
                return f"The search space: {problem}"
    reasons: dict = {}
    stop = time.time() + SCAN_SECONDS
    for point in _scan_order(space):
        if (problem := points.problem(point)) is None:
            return None
        reasons[problem] = reasons.get(problem, 0) + 1
        if time.time() > stop:
            break
    tried = sum(reasons.values())
    every = (f"every one of its {space.size} points" if tried == space.size else
             f"each of {tried} points drawn at random from its {space.size}")
    top = "; ".join(f"{n} x {why}" for why, n in sorted(reasons.items(), key=lambda x: -x[1])[:3])
    return (f"The search space ({_shape(space)}) has no valid "
            f"point for this target: {every} is invalid: {top}. Nothing was run or tracked; change the space "
            "or the target (target.arch, precision).")


def _static_metrics() -> list:
    """The metrics a run logs without a GPU (ptxas' resources): their names in experiments/metrics.py."""
    from ..metrics import DECLARED
    return [m.name for m in DECLARED if m.source.startswith("ptxas") and "<" not in m.name]


def _count(value, kind: type, low: float) -> bool:
    """Whether ``value`` is a number of ``kind`` (int: an integer; float: an integer or not), >= ``low``."""
    kinds = (int,) if kind is int else (int, float)
    return isinstance(value, kinds) and not isinstance(value, bool) and value >= low


def options_problem(opts) -> str | None:
    """What the search's options (``hydra.sweeper``, conf/hydra/sweeper/search.yaml) hold that no search
    takes, one line naming the key and its valid values; None when they are valid: a budget that is not a
    positive integer (trials) or number (minutes), none given, a seed or max_rejects that is not an integer
    (seed: 0 or more; max_rejects: 1 or more), a storage URL SQLAlchemy cannot open."""
    trials, minutes = opts.get("trials"), opts.get("minutes")
    checks = [("trials", trials, int, 1, "a positive integer (trials that run a job), or null"),
              ("minutes", minutes, float, 0, "a positive number of minutes, or null"),
              ("seed", opts.get("seed"), int, 0, "an integer, 0 or more"),
              ("max_rejects", opts.get("max_rejects"), int, 1, "a positive integer")]
    for key, value, kind, low, valid in checks:
        if (value is not None or key in ("seed", "max_rejects")) and not (
                _count(value, kind, low) and (key != "minutes" or value > 0)):
            return f"hydra.sweeper.{key}={value} is not valid; valid: {valid}"
    if trials is None and minutes is None:
        return ("The search has no budget (hydra.sweeper.trials=null, hydra.sweeper.minutes unset): give "
                "hydra.sweeper.trials or hydra.sweeper.minutes, e.g. hydra.sweeper.trials=50")
    if storage := opts.get("storage"):
        from sqlalchemy.engine import make_url
        try:
            make_url(str(storage)).get_dialect()
        except Exception as exc:  # noqa: BLE001 - SQLAlchemy's ArgumentError, NoSuchModuleError
            return (f"hydra.sweeper.storage={storage} is no database URL SQLAlchemy can open ({exc}); valid: "
                    "null (search.db beside a SQLite store) or a URL such as sqlite:////path/search.db")
    return None


def _shape(space: Space) -> str:
    return " x ".join(f"{k} {len(v)}" for k, v in space.params.items())


def _scan_order(space: Space):
    """The points of ``space`` in a random order (seeded: the same for every command): each once when
    there are at most :data:`SCAN_LIMIT`, else that many drawn."""
    keys, lists = list(space.params), list(space.params.values())
    rng = random.Random(0)
    if space.size > SCAN_LIMIT:
        for _ in range(SCAN_LIMIT):
            yield {k: rng.choice(v) for k, v in zip(keys, lists, strict=True)}
        return
    for index in rng.sample(range(space.size), space.size):
        point = {}
        for k, v in zip(keys, lists, strict=True):
            index, i = divmod(index, len(v))
            point[k] = v[i]
        yield point


def objective(runs: list, metric: str, combine: str) -> tuple[float | None, str, str]:
    """A trial's result from its ``runs`` (MLflow runs, one per problem size): (value, outcome, reason)
    with outcome ``measured`` (value: ``metric`` of every run combined by ``combine``, :data:`COMBINE`;
    one run's value as it is), ``unusable`` (the values cannot be combined so: a geometric mean with a
    value of 0 or less; the reason says which combine to use),
    ``invalid`` (the job found the combination impossible: a skipped run), ``failed`` (a run FAILED:
    verification, a fault, the assembler; or lacks the metric) or ``busy`` (another process measures a
    run now). reason names the run and says why."""
    if not runs:
        return None, "failed", "the job tracked no run (its log in the sweep's folder says why)"
    for r in runs:
        tags = r.data.tags
        if tags.get("outcome") == "skipped":
            return None, "invalid", tags.get("skip_reason", "a combination that cannot exist")
        if r.info.status == "FAILED" or tags.get("outcome") == "failed":
            why = (tags.get("error") or "no error tag").splitlines()[0]
            return None, "failed", f"run {r.info.run_id} ({r.info.run_name}) failed: {why}"
        if r.info.status != "FINISHED":
            return None, "busy", f"run {r.info.run_id} ({r.info.run_name}) is {r.info.status}"
    values = []
    for r in runs:
        if metric not in r.data.metrics:
            return None, "failed", (f"run {r.info.run_id} ({r.info.run_name}, outcome "
                                    f"{r.data.tags.get('outcome')}) has no metric {metric}")
        values.append(r.data.metrics[metric])
    if combine == "geomean" and len(values) > 1 and min(values) <= 0:
        return None, "unusable", (f"{metric} is {min(values):g} in a run: the geometric mean over the sizes "
                                "is not defined; use hydra.sweeper.objective.combine=mean (or min, max)")
    return float(values[0] if len(values) == 1 else COMBINE[combine](values)), "measured", ""


def storage_url(uri: str, given: str | None) -> str:
    """The Optuna storage of a search tracked in the store ``uri``: ``given`` when set, else the SQLite
    file ``search.db`` beside a SQLite store, else ``outputs/search.db`` of the working folder."""
    if given:
        return str(given)
    if uri.startswith("sqlite:///"):
        return f"sqlite:///{Path(uri.removeprefix('sqlite:///')).parent / 'search.db'}"
    folder = Path.cwd() / "outputs"
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'search.db'}"


def _distribution(values: list):
    """Optuna's distribution of a param: an IntDistribution over evenly spaced integers (the sampler
    then knows their order), else categorical over the value strings."""
    from optuna.distributions import CategoricalDistribution, IntDistribution
    try:
        ints = [int(v) for v in values]
    except ValueError:
        ints = []
    steps = {b - a for a, b in zip(ints, ints[1:], strict=False)}
    if len(ints) >= 3 and len(steps) == 1 and min(steps) > 0 and [str(i) for i in ints] == values:
        return IntDistribution(ints[0], ints[-1], step=steps.pop())
    return CategoricalDistribution(tuple(values))


class SearchSweeper(Sweeper):
    """Hydra's sweeper that searches a space with Optuna (see the module's docstring); its options are
    those of conf/hydra/sweeper/search.yaml."""

    def __init__(self, params=None, trials: int | None = 50, minutes: float | None = None,
                 sampler: str = "tpe", seed: int = 0, objective=None, storage: str | None = None,
                 max_rejects: int = 2000):
        self.params = params
        self.trials, self.minutes, self.sampler_name, self.seed = trials, minutes, str(sampler), int(seed)
        self.objective = dict(objective or {})
        self.storage, self.max_rejects = storage, int(max_rejects)
        self.job_idx = 0

    def setup(self, *, hydra_context, task_function, config: DictConfig) -> None:
        """Hydra's set-up: the config and the launcher that runs each trial's job."""
        from hydra.core.plugins import Plugins
        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list) -> list:
        """Search (:func:`search`) until the budget is spent, the space is exhausted or the sampler finds
        no new valid point; returns the JobReturns of the trials this command ran. Prints each trial
        and the best, and logs the best to the sweep's parent run."""
        import optuna

        from ..store.track import SWEEP_ENV, get_tracker
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        space = parse_space(self.config, arguments)
        metric, direction = str(self.objective["metric"]), str(self.objective["direction"])
        uri, key = os.environ[SWEEP_ENV["uri"]], os.environ[SWEEP_ENV["key"]]
        self.tracker = get_tracker(uri, os.environ[SWEEP_ENV["experiment"]])
        url = storage_url(uri, self.storage)
        # one study per sweep and objective: the values of one study are comparable
        name = f"{key} {metric} {direction} {self.objective['combine']}"
        study = optuna.create_study(study_name=name, storage=url, direction=direction, load_if_exists=True)
        again = _recover(study)
        study.sampler = sampler(self.sampler_name, self.seed + len(study.trials))   # resumed: draws anew
        points = Points(self.config, space, self.hydra_context.config_loader, _gpu(self.config))
        budget = " or ".join(([f"{self.trials} trials"] if self.trials is not None else [])
                             + ([f"{self.minutes:g} minutes"] if self.minutes is not None else []))
        print(f"Search: {space.size} points ({_shape(space)}), {metric} {direction[:3]} "
              f"({self.objective['combine']} over the sizes); budget {budget or 'none'}; study '{name}' "
              f"in {url}: {_counted(study)} trial(s) before"
              + (f", {again} interrupted one(s) run again" if again else "") + ".", flush=True)
        returns: list = []
        def measure(trial, point):
            return self._run(trial, point, space, metric, returns)
        stop = search(study, space, points.problem, measure, self._spent, self.max_rejects)
        if stop:
            print(f"Search stopped: {stop}.", flush=True)
        self._report(study, metric, direction, stop if stop.startswith("the objective cannot") else "")
        return returns

    def _spent(self, counted: int) -> bool:
        return ((self.trials is not None and counted >= self.trials)
                or (self.minutes is not None and time.time() - STARTED >= 60 * float(self.minutes)))

    def _run(self, trial, point: dict, space: Space, metric: str, returns: list) -> tuple:
        """Run the job of a valid point; its result (:func:`objective`)."""
        from hydra.core.utils import JobStatus
        overrides = space.fixed + [f"{k}={v}" for k, v in point.items()]
        shown = " ".join(f"{k}={v}" for k, v in point.items())
        trial.set_user_attr("overrides", shown)
        ret = self.launcher.launch([overrides], initial_job_idx=self.job_idx)[0]
        returns.append(ret)
        self.job_idx += 1
        if ret.status == JobStatus.FAILED:
            value, outcome, why = None, "failed", f"the job failed: {ret._return_value}"  # noqa: SLF001
        else:
            ids = list(dict.fromkeys(getattr(ret.return_value, "runs", [])))
            trial.set_user_attr("runs", ",".join(ids))
            value, outcome, why = objective([self.tracker.client.get_run(rid) for rid in ids], metric,
                                            str(self.objective["combine"]))
        result = f"{metric} {value:.6g}" if value is not None else f"{outcome}: {why}"
        print(f"Trial {trial.number} ({shown}): {result}", flush=True)
        return value, outcome, why

    def _report(self, study, metric: str, direction: str, error: str = "") -> None:
        """Print the best trial and log it to the sweep's parent run (tags ``search_*``; ``search_error``:
        ``error``, why this command's search could not go on, or '' — the command then exits 2)."""
        from ..store.track import SWEEP_ENV
        trials = study.get_trials(deepcopy=False)
        done = [t for t in trials if t.user_attrs.get("outcome") == "measured"]
        counted = _counted(study)
        invalid = sum(t.user_attrs.get("outcome") == "invalid" for t in trials)
        tags = {"search_study": study.study_name, "search_trials": str(counted),
                "search_invalid_points": str(invalid), "search_error": error}
        if done:
            best = study.best_trial
            tags.update(search_best=f"{metric} {best.value:.6g}: {best.user_attrs.get('overrides', '')}",
                        search_best_runs=best.user_attrs.get("runs", ""))
            print(f"Search: {counted} trial(s), {invalid} invalid point(s) skipped; best {metric} "
                  f"{best.value:.6g} (trial {best.number}): {best.user_attrs.get('overrides', '')}",
                  flush=True)
        else:
            print(f"Search: {counted} trial(s), none measured {metric}.", flush=True)
        if parent := os.environ.get(SWEEP_ENV["parent"]):
            self.tracker.log(parent, tags=tags)


COUNTED = ("measured", "failed")     # the outcomes of trials that ran a job: the budget counts them


def sampler(name: str, seed: int):
    """Optuna's sampler ``name`` (tpe, random) with ``seed``. Raises ValueError naming the valid ones."""
    import optuna
    kinds = {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler}
    if name not in kinds:
        raise ValueError(f"hydra.sweeper.sampler={name} is not valid; valid: {', '.join(kinds)}")
    return kinds[name](seed=seed)


def search(study, space: Space, problem, measure, spent, max_rejects: int) -> str:
    """The search loop of the sweeper, and of the replay tool (tools/search_replay.py): ask the study
    for a point of ``space``; a point tried before is told FAIL (outcome ``duplicate``) and a point
    drawn at random among those not tried is asked next instead (a sampler that has converged on a
    discrete space proposes its best again and again); a point ``problem(point)`` finds invalid (a
    reason) is told PRUNED; neither is counted. Else ``measure(trial, point)`` gives (value, outcome,
    reason), outcome ``measured`` (COMPLETE), ``invalid`` (PRUNED, not counted) or another (FAIL;
    ``failed`` is counted). Until ``spent(counted trials)``; returns '' then, or why it stopped before:
    every point of the space was tried, ``max_rejects`` proposals in a row were not new and valid, or a
    trial's objective could not be formed (outcome ``unusable``: the first such trial ends the search)."""
    import optuna
    State = optuna.trial.TrialState
    dists = {k: _distribution(v) for k, v in space.params.items()}
    trials = study.get_trials(deepcopy=False)
    tried = {_key(t.params) for t in trials if t.state.is_finished()
             and t.user_attrs.get("outcome") not in ("interrupted", "duplicate")}
    counted = sum(t.user_attrs.get("outcome") in COUNTED for t in trials)
    rng = random.Random(len(trials))
    rejects = 0
    while not spent(counted):
        trial = study.ask(dists)
        trial.set_user_attr("owner", OWNER)
        point = {k: str(trial.params[k]) for k in space.params}
        if _key(point) in tried:
            _tell(study, trial, State.FAIL, None, "duplicate", "a point tried before")
            if (other := _untried(space, tried, rng)) is not None:
                study.enqueue_trial(_external(dists, other))
        elif why := problem(point):
            tried.add(_key(point))
            _tell(study, trial, State.PRUNED, None, "invalid", why)
        else:
            rejects = 0
            tried.add(_key(point))
            value, outcome, why = measure(trial, point)
            state = {"measured": State.COMPLETE, "invalid": State.PRUNED}.get(outcome, State.FAIL)
            _tell(study, trial, state, value, outcome, why)
            counted += outcome in COUNTED
            if outcome == "unusable":
                return f"the objective cannot be formed: {why}"
            continue
        rejects += 1
        if len(tried) >= space.size:
            return f"every point of the space ({space.size}) was tried, {counted} ran"
        if rejects >= max_rejects:
            return (f"the last {rejects} points the sampler proposed were invalid or tried before; the space "
                    "holds few other valid points")
    return ""


def _key(params: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in params.items()))


def _external(dists: dict, point: dict) -> dict:
    """``point`` (key -> value string) as Optuna takes its params: an IntDistribution's as int."""
    return {k: v if hasattr(dists[k], "choices") else int(v) for k, v in point.items()}


def _untried(space: Space, tried: set, rng: random.Random) -> dict | None:
    """A point of ``space`` drawn at random that is not in ``tried`` (a few hundred draws at most)."""
    for _ in range(500):
        point = {k: rng.choice(v) for k, v in space.params.items()}
        if _key(point) not in tried:
            return point
    return None


def _counted(study) -> int:
    return sum(t.user_attrs.get("outcome") in COUNTED for t in study.get_trials(deepcopy=False))


def _tell(study, trial, state, value, outcome: str, reason: str) -> None:
    trial.set_user_attr("outcome", outcome)
    if reason:
        trial.set_user_attr("reason", reason[:1000])
    study.tell(trial, value if state.name == "COMPLETE" else None, state=state)


OWNER = f"{HOST}:{os.getpid()}"     # user attribute of a trial: the process that asked it


def _ended(owner: str | None) -> bool:
    """Whether the process ``owner`` (host:pid) that asked a trial has ended (track.process_ended); a
    trial of another host, or without an owner, counts as ended."""
    host, _, pid = (owner or "").rpartition(":")
    return host != HOST or not pid.isdigit() or process_ended(host, pid)


def _recover(study) -> int:
    """Trials an interrupted command left RUNNING (their process has ended: a command running the same
    search at the same time keeps its own): each told FAIL (outcome ``interrupted``, not counted) and its
    point enqueued to be asked first. Returns how many."""
    import optuna
    left = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
            if _ended(t.user_attrs.get("owner"))]
    for t in left:
        live = optuna.trial.Trial(study, t._trial_id)  # noqa: SLF001 - Optuna's handle of a stored trial
        live.set_user_attr("outcome", "interrupted")
        study.tell(t.number, state=optuna.trial.TrialState.FAIL)
        study.enqueue_trial(dict(t.params), skip_if_exists=False)
    return len(left)

