"""Entry point: ``python run.py [-m] key=value ...`` (Hydra). See README.md and ``--help``.

Ctrl-C (or SIGTERM) closes the runs in progress as KILLED, says what was kept and exits 130 (143);
re-running the same command resumes: finished runs are skipped, new ones join the same parent run.
"""
import copy
import gc
import os
import signal
import sys
from pathlib import Path

import hydra
import hydra._internal.utils as hydra_utils
from hydra._internal.hydra import Hydra
from omegaconf import OmegaConf

from experiments.config import register
from experiments.runner.variants import KEY as VARIANTS_KEY
from experiments.runner.variants import VariantError, file_problem, listed, names, swept_params
from experiments.runner.variants import register as register_variants
from experiments.gpu.worker import JOBS_PER_GPU, gpu_count

register()
try:
    register_variants()             # the variants conf/experiment/ lists, options of variant= as its files
except VariantError as exc:
    print(f"Invalid preset: {exc}", file=sys.stderr)
    sys.exit(2)
OmegaConf.register_new_resolver("pid", os.getpid, use_cache=True, replace=True)
# job processes of hydra/launcher=gpus: JOBS_PER_GPU per visible GPU (one GPU assumed without any)
OmegaConf.register_new_resolver("gpu_jobs", lambda: max(1, gpu_count()) * JOBS_PER_GPU, use_cache=True,
                                replace=True)


CONF = Path(__file__).parent / "conf"
_run_and_report = hydra_utils.run_and_report
_hydra_show_cfg, _hydra_hydra_help = Hydra.show_cfg, Hydra.hydra_help


def presets(group: str, dirs: tuple = (CONF,)) -> dict:
    """The presets of config group ``group`` in the config folders ``dirs``: name -> file (the first
    folder that has it wins, as Hydra's search path); for ``variant`` also those the presets of
    ``experiment/`` list (experiments.runner.variants): name -> the preset's file."""
    found: dict = {}
    for d in dirs:
        for f in sorted((Path(d) / group).glob("*.yaml")):
            found.setdefault(f.stem, f)
    if group == "variant":
        found.update({name: path for name, (path, _) in listed(dirs).items()})
    return dict(sorted(found.items()))


def _preset_yaml(group: str, name: str, dirs: tuple) -> dict:
    """The config of preset ``name`` of ``group`` in ``dirs`` as its file holds it (loaded), or for a
    variant a preset lists, as experiments.runner.variants makes it. Raises KeyError for no such preset,
    OSError or yaml.YAMLError for a file that cannot be read."""
    import yaml
    if group == "variant" and (entry := listed(dirs).get(name)) is not None:
        return entry[1]
    return yaml.safe_load(presets(group, dirs)[name].read_text()) or {}


def config_groups() -> str:
    """The selectable config groups of conf/ and their presets, for --help (Hydra's own list also
    shows the metric sets of the ncu step and the family schemas, which a command line cannot pick)."""
    groups = ("family", "precision", "tile", "problem", "experiment", "variant", "hydra/launcher",
              "hydra/sweeper")
    lines = [f"{group}: {', '.join(names)}" for group in groups if (names := presets(group))]
    return "\n".join(lines) + "\n"


def family_options(name: str) -> str:
    """The options (family.<option>) of family ``name`` and their valid values, the default first, for
    --help (the family's ``options_help``: the default family has none, its root keys are listed with
    their values instead)."""
    from experiments.families import get
    try:
        fam = get(name)
    except Exception:  # noqa: BLE001 - an unknown family: Hydra names the valid ones
        return "-\n"
    return fam.options_help()


def shared_options() -> str:
    """The settings every family takes and their valid values, the default first, for --help: operand
    data (experiments.gpu.verify.Data), the timing regime and replicates, the launch's block cap."""
    from experiments import families
    from experiments.gpu.timing import REGIMES
    from experiments.gpu.verify import Data
    padded = ", ".join(n for n in families.names() if families.get(n).pads_launch)
    lines = [f"data: {' | '.join(Data.__members__)}",
             f"timing.regime: {' | '.join(REGIMES)}",
             "timing.repeats: 1 | 2 ... (replicates of the timed measurement; verdicts need 2 or more)",
             f"launch.blocks_per_sm: 0 (as many as fit) | 1 ... what the kernel reaches ({padded})"]
    return "\n".join(f"  {line}" for line in lines) + "\n"


def search_options(sweeper: str) -> str:
    """The options of the search sweeper (hydra.sweeper.<key>: default, meaning), as
    conf/hydra/sweeper/search.yaml holds and comments them, for --help when ``sweeper`` (the chosen
    sweeper's _target_) is the search; else how to choose it."""
    from experiments.runner.validate import SEARCH_SWEEPER
    if sweeper != SEARCH_SWEEPER:
        return "  (python run.py hydra/sweeper=search --help lists the search's options)\n"
    lines, parent = [], ""
    for line in (Path(__file__).parent / "conf/hydra/sweeper/search.yaml").read_text().splitlines():
        if not line.strip() or line.startswith(("#", "_target_")) or line.lstrip().startswith("#"):
            continue
        key, _, rest = line.strip().partition(":")
        value, _, meaning = rest.partition("#")
        parent = key if not line.startswith(" ") and not value.strip() else parent * line.startswith(" ")
        name = f"hydra.sweeper.{parent + '.' if line.startswith(' ') else ''}{key}"
        if value.strip():
            lines.append(f"  {name}={value.strip()}" + (f"  ({meaning.strip()})" if meaning.strip() else ""))
    return "\n".join(lines) + "\n"


OmegaConf.register_new_resolver("config_groups", config_groups, use_cache=True, replace=True)
OmegaConf.register_new_resolver("search_options", search_options, use_cache=True, replace=True)
OmegaConf.register_new_resolver("shared_options", shared_options, use_cache=True, replace=True)
OmegaConf.register_new_resolver("family_options", family_options, use_cache=True, replace=True)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg) -> None:
    from experiments.runner.job import JobError, run_job
    from experiments.spec import SpecError
    try:
        return run_job(cfg)      # the counts of its runs' outcomes (a Slurm job's exit status says them)
    except SpecError as exc:   # single run: an impossible configuration stops before any work, exit 2
        print(f"Invalid configuration: {exc}", file=sys.stderr)     # as validate's refusals at the start
        raise SystemExit(2) from None
    except JobError as exc:
        raise SystemExit(f"Cannot run: {exc}") from None


_MODES = {"--run": ("--run", "-r"), "--multirun": ("--multirun", "-m"), "--cfg": ("--cfg", "-c"),
          "--info": ("--info", "-i"), "--shell-completion": ("--shell-completion", "-sc")}


def check_modes(argv: list) -> str | None:
    """The message for two of Hydra's modes given together (``--run``, ``--multirun``, ``--cfg``,
    ``--info``, ``--shell-completion``), which Hydra refuses with a traceback; None otherwise. For ``-m``
    (``--multirun``) given with ``--cfg`` (``-c``):
    ``--cfg`` shows the config of one job: the message gives the command without ``-m`` (flags first,
    as Hydra's parser wants them; each sweep, a list, choice(...) or range(...), cut to its first
    value (:func:`_values`); one without a first value, e.g. interval(...) or glob(...), left out),
    and where a preset's sweep is shown (``--cfg hydra``)."""
    modes = {mode for a in argv for mode, flags in _MODES.items()
             if a in flags or a.startswith(tuple(f"{f}=" for f in flags if f.startswith("--")))}
    if len(modes) > 1 and modes != {"--multirun", "--cfg"}:
        return (f"Hydra takes one of {', '.join(f'{m} ({_MODES[m][-1]})' for m in _MODES)}; this command "
                f"gives {' and '.join(m for m in _MODES if m in modes)}: keep one")
    if modes != {"--multirun", "--cfg"}:
        return None
    flags, overrides = [], []
    for a in argv:
        key, eq, value = a.partition("=")
        if a in ("-m", "--multirun"):
            continue
        if not eq or a.startswith("-"):
            flags.append(a)
            continue
        if (override := _parsed(a)) is not None and override.is_sweep_override():
            if not (values := _values(a)):      # interval(...), glob(...), an empty range: left out
                continue
            a = f"{key}={values[0]}"
        overrides.append(a)
    preset = next((a for a in argv if a.startswith("experiment=")), "experiment=NAME")
    return ("--cfg shows one job's config and Hydra does not take it with -m: drop -m to see one job's "
            f"config (python run.py {' '.join(flags + overrides)}), or see a preset's sweep params in "
            f"hydra.sweeper.params with python run.py --cfg hydra {preset}")


def check_group_values(argv: list) -> str | None:
    """The message for a config group (a folder of presets: family, tile, ...) given anything but one
    preset's name, also as a value of a sweep: a list (``tile=[1]``, ``family=[]``: Hydra takes a list as
    several presets at once), null or a number (``tile=null``, ``family=5``), an empty name, a path
    (``family=../tile/64x64``: another group's preset); for a chosen preset whose file does not load as a
    mapping (experiments.runner.variants.file_problem); and for an override without a key (``=5``).
    Hydra ends some of these in a traceback and runs others with a config of no family. None otherwise
    (a name that is no preset: Hydra's message lists them; a deletion ``~tile``)."""
    dirs = _config_dirs(argv) or (CONF,)
    for a in argv:
        key, eq, _ = a.lstrip("+~").partition("=")
        if a.startswith("-") or not eq:
            continue
        if not key:
            return f"{a!r} has no key; give key=value (python run.py --help lists the keys)"
        if not (valid := presets(key, dirs)) or (override := _parsed(a)) is None or override.is_delete():
            continue
        try:
            values = list(override.sweep_iterator()) if override.is_sweep_override() else [override.value()]
        except Exception:  # noqa: BLE001 - glob(...), interval(...): Hydra has the last word
            continue
        if any(not isinstance(v, str) or not v or "/" in v for v in values):
            return f"{a!r}: {key} takes one preset's name; valid: {', '.join(valid)}"
        for v in values:            # its file: a scalar or a list at the top is no preset
            if v in valid and (problem := file_problem(valid[v])):
                return problem
    return None


# Hydra's options that take the next argument as their value
_VALUED = ("-cd", "--config-dir", "-cp", "--config-path", "-cn", "--config-name", "-c", "--cfg", "-p",
           "--package")


def _overrides(argv: list) -> list:
    """The overrides of the command line ``argv``: its arguments but Hydra's options and their values."""
    return [a for i, a in enumerate(argv) if not a.startswith("-") and (i == 0 or argv[i - 1] not in _VALUED)]


def _override_problem(arg: str, error: str) -> str | None:
    """The message for an override of the command line that Hydra's grammar cannot read (``error``, its
    parser's message), where that message names the cause only in the grammar's terms: no ``=``
    (``precision``: "missing EQUAL"), an empty value in a sweep (``precision=int8,``, ``ktile=,32``:
    "mismatched input", "extraneous input ','"), or characters the grammar takes only quoted
    (:func:`_unquoted_problem`); None for another argument or cause (Hydra's message follows)."""
    import re
    key, eq, value = arg.partition("=")
    if not eq:
        if f"override '{arg}'" in error and "missing EQUAL" in error:
            if ":" in arg:               # key:value, as YAML writes it
                return f"{arg!r} has no '=': write {arg.replace(':', '=', 1)}"
            return (f"{arg!r} has no value: write {arg}=VALUE (python run.py --help lists the keys and their "
                    "values)")
        return None
    parts = value.split(",")
    plain = not re.search(r"""[\[\](){}'"\\]""", value)        # no list, call, quotes or escapes
    if plain and len(parts) > 1 and "" in parts and _parsed(arg) is None:
        given = [p for p in parts if p]
        fix = f"{key}={','.join(given)}" if given else f"{key}=VALUE"
        if given and _parsed(fix) is None:         # the values need more than the comma removed (quotes)
            return f"{arg!r}: a value of the sweep is empty (a comma too many): remove it"
        return f"{arg!r}: a value of the sweep is empty (a comma too many); give {fix}"
    return _unquoted_problem(arg)


def _unquoted_problem(arg: str) -> str | None:
    """The message for an override whose value holds characters Hydra's override grammar takes only
    quoted (any non-ASCII letter: ``tracking.experiment=tëst``; ``~``, ``#`` and the like:
    ``tracking.uri=sqlite:///~/x.db``; each ended in LexerNoViableAltException), with the quoted
    override to give instead; None otherwise (also where quoting would not help)."""
    import re
    import shlex
    key, _, value = arg.partition("=")
    if not key.isascii() or _parsed(arg) is not None:
        return None
    if value.isascii():                        # a plain value (no list, sweep or quotes): quote it whole
        quoted = f'{key}="{value}"'
        if re.search(r"""[\[\](){},'"]""", value) or _parsed(quoted) is None:
            return None                        # quoting is not enough: Hydra's message follows
        return (f"{arg!r}: Hydra reads this value only in quotes; give {quoted} "
                f"(in the shell: {shlex.quote(quoted)})")
    # each word of the grammar (between , [ ] ( ) { } and spaces) that holds such a character, quoted
    quoted = f"{key}=" + re.sub(r"""[^\s,\[\](){}'"]*[^\x00-\x7f][^\s,\[\](){}'"]*""", r"'\g<0>'", value)
    if _parsed(quoted) is None:
        return None                            # quoting is not enough: Hydra's message follows
    return (f"{arg!r}: Hydra reads a value with non-ASCII characters only in quotes; give {quoted} "
            f"(in the shell: \"{quoted}\")")


def _parsed(arg: str):
    """The override ``arg`` as Hydra's override parser reads it, or None when it cannot (Hydra's own
    parse error follows)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    try:
        return OverridesParser.create().parse_override(arg)
    except Exception:  # noqa: BLE001
        return None


def _values(arg: str) -> list | None:
    """The values of the override ``arg`` as Hydra's override parser reads them: one for a plain value,
    each of a sweep (a,b; choice(...); range(...)); None where Hydra expands the sweep against the
    config or a sampler (glob(...), interval(...)) or cannot parse it (its own message follows)."""
    override = _parsed(arg)
    if override is None:
        return None
    if not override.is_sweep_override():
        return [override.get_value_element_as_str()]
    try:
        return list(override.sweep_string_iterator())
    except Exception:  # noqa: BLE001 - glob(...) needs the config, interval(...) has no values
        return None


def _config_dirs(argv: list) -> tuple | None:
    """The config folders the presets come from: conf/ and each ``--config-dir`` (``-cd``); None when a
    ``hydra.searchpath`` override adds others (Hydra then has the last word on presets)."""
    if any(a.lstrip("+").startswith("hydra.searchpath") for a in argv):
        return None
    dirs = [CONF]
    for i, a in enumerate(argv):
        if a.startswith("--config-dir="):
            dirs.append(Path(a.split("=", 1)[1]))
        elif a in ("--config-dir", "-cd") and i + 1 < len(argv):
            dirs.append(Path(argv[i + 1]))
    return tuple(dirs)


def _own_sweep(preset: str, dirs: tuple | None, given: set) -> tuple[dict, dict] | None:
    """(its YAML, {key: values} of what it sweeps besides the keys ``given``) of the preset
    ``experiment=preset`` in the config folders ``dirs`` (:func:`_config_dirs`); None when it is not
    found there (Hydra says so) or ``dirs`` is None (a ``hydra.searchpath`` override: Hydra's presets)."""
    import re

    import yaml
    if dirs is None:
        return None
    try:
        y = yaml.safe_load(presets("experiment", dirs)[preset].read_text()) or {}
    except (KeyError, OSError, yaml.YAMLError):
        return None
    folded = {k: re.sub(r",\s+", ",", str(v).strip()) for k, v in swept_params(y).items()}  # YAML's ">-"
    return y, {k: _values(f"{k}={v}") or [v] for k, v in folded.items() if k not in given}


def check_preset_sweep(argv: list) -> str | None:
    """The message for a preset that defines a sweep (``hydra.sweeper.params`` of conf/experiment/)
    given without ``-m``: Hydra then ignores the sweep and runs one job with the defaults of the swept
    keys, which belongs to no job of the sweep; with ``-m``, the message of :func:`_presets_swept`.
    None with --help, when the command line sets every swept key (one job of the sweep), or without
    such a preset. The message gives the ``-m`` command and the command of the sweep's first job; with
    ``--cfg job`` (or ``all``) it is a YAML comment line saying where the sweep is shown (``--cfg
    hydra``, which needs none)."""
    if any(a in ("--help", "-h", "--hydra-help") for a in argv):
        return None
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    given = {a.split("=", 1)[0].lstrip("+~") for a in overrides}
    arg = next((a for a in overrides if a.split("=", 1)[0] == "experiment"), None)
    if arg is None:
        return None
    if any(a in ("-m", "--multirun") for a in argv):
        return _presets_swept(argv, arg, _config_dirs(argv), given)
    preset = arg.split("=", 1)[1]
    if (own := _own_sweep(preset, _config_dirs(argv), given)) is None or not own[1]:
        return None
    y, missing = own
    swept = ", ".join(f"{k} ({len(v)} values)" for k, v in missing.items())
    cfg = [i for i, a in enumerate(argv) if a in ("-c", "--cfg") or a.startswith("--cfg=")]
    shown = [argv[i].partition("=")[2] or (argv[i + 1] if i + 1 < len(argv) else "") for i in cfg]
    if "hydra" in shown:                   # --cfg hydra shows the sweep itself
        return None
    skip = set(cfg) | {i + 1 for i in cfg if "=" not in argv[i]}          # --cfg and its value
    rest = " ".join(a for i, a in enumerate(argv) if i not in skip)
    first = " ".join(f"{k}={v[0]}" for k, v in missing.items())
    if {"override /hydra/sweeper": "search"} in ((y or {}).get("defaults") or []):   # a sampler's points
        what = f"experiment={preset} is a search (hydra/sweeper=search) over {', '.join(missing)}"
        return (f"# {what}; this is one job's config with them at their defaults. The search: python run.py "
                f"--cfg hydra {rest}; run it: python run.py -m {rest}" if cfg else
                f"{what}: it runs with -m, one job per trial; nothing was run. Run it: python run.py -m "
                f"{rest}")
    if cfg:
        listing = f"; its variants: {VARIANTS_KEY}" if "variant" in missing and names(y or {}) else ""
        return (f"# experiment={preset} sweeps {swept}; this is one job's config with them at their "
                f"defaults. The sweep: python run.py --cfg hydra {rest} (hydra.sweeper.params{listing}); "
                f"run it: python run.py -m {rest}")
    keys = " and ".join(missing)
    return (f"experiment={preset} defines a sweep over {swept}; without -m Hydra would ignore it and run "
            f"a single job with {keys} at the config's default: nothing was run. Run the sweep: "
            f"python run.py -m {rest}   or one of its jobs: python run.py {rest} {first}")


def _presets_swept(argv: list, arg: str, dirs: tuple | None, given: set) -> str | None:
    """The message for ``-m experiment=A,B`` (the override ``arg``, a sweep over presets) where a preset
    defines a sweep of its own over keys not ``given`` on the command line: Hydra's sweeper then takes
    only the command line's sweep and runs one job per preset with those keys at the config's default,
    none of the presets' kernels. None otherwise (one preset, or every key the presets sweep given)."""
    values = _values(arg)
    if not values or len(values) < 2:
        return None
    own = {}
    for preset in values:
        if (found := _own_sweep(preset, dirs, given)) is not None and found[1]:
            own[preset] = ", ".join(f"{k} ({len(v)} values)" for k, v in found[1].items())
    if not own:
        return None
    rest = [a for a in argv if a != arg and a not in ("-m", "--multirun")]
    runs = "; ".join(f"python run.py -m {' '.join([*rest, f'experiment={p}'])}" for p in values)
    return (f"{arg} sweeps presets that define sweeps of their own ("
            + "; ".join(f"{p}: {what}" for p, what in own.items())
            + "): Hydra would run one job per preset with those keys at the config's default, none of the "
            f"presets' kernels; nothing was run. Run each preset's sweep: {runs}")


def _reported(func):
    """Hydra's ``run_and_report`` with its errors about the config (composing it, reading or expanding
    an override) as one line (experiments.runner.validate.one_line; for a value Hydra's lexer takes only
    quoted, the quoted override to give): raises experiments.runner.validate.Invalid (exit 2)."""
    from hydra.errors import HydraException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    from experiments.runner.validate import Invalid, one_line
    import yaml
    try:
        return func()
    except (HydraException, OmegaConfBaseException, yaml.YAMLError, UnicodeDecodeError) as exc:
        unquoted = (next((p for a in _overrides(sys.argv[1:]) if (p := _override_problem(a, str(exc)))), None)
                    if isinstance(exc, OverrideParseException) else None)
        raise Invalid(unquoted or one_line(exc, tuple(sys.argv[1:]))) from None
    except OSError as exc:      # Hydra's for a preset file whose YAML is not a mapping
        if not str(exc).startswith("Invalid loaded object type"):
            error = exc
        else:
            raise Invalid(one_line(exc, tuple(sys.argv[1:]))) from None
    except Exception as exc:  # noqa: BLE001 - any other error: Hydra reports it as it does
        error = exc
    return _run_and_report(lambda: _raise(error))


def _raise(error: BaseException):
    raise error


def _checked(hydra, config_name: str | None, overrides: list, multirun: bool):
    """The config of ``overrides`` as Hydra composes it for the command (with -m in MULTIRUN mode: the
    swept keys at their defaults), after the checks a run makes at its start
    (experiments.runner.validate.check; with -m and Hydra's basic sweeper on each job's config; a
    search's own check, which also asks for a GPU, is left to its start): raises validate.Invalid (exit
    2) for what a run refuses, Hydra's errors for a config it cannot compose."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from experiments.runner.validate import BASIC_SWEEPER, check
    cfg = hydra.compose_config(config_name=config_name, overrides=overrides,
                               run_mode=RunMode.MULTIRUN if multirun else RunMode.RUN)
    HydraConfig.instance().set_config(copy.deepcopy(cfg))    # ${hydra:...} resolves as in a run
    check(cfg, multirun and cfg.hydra.sweeper.get("_target_") == BASIC_SWEEPER)
    return cfg


def _app_help(self, config_name, args_parser, args) -> None:
    """Hydra's --help (``Hydra.app_help``) for the config the command would run, refused as the run would
    be (:func:`_checked`; Hydra's errors as one line, :func:`_reported`): ``precision=int9 --help`` and
    ``ktile=48 --help`` exit 2 with the run's message. With -m it shows the sweep's config (Hydra's own
    composes a sweep as a single run and refuses it)."""
    cfg = _reported(lambda: _checked(self, config_name, args.overrides, args.multirun))
    print(self.get_help(cfg.hydra.help, self.get_sanitized_cfg(copy.deepcopy(cfg), "job"), args_parser,
                        resolve=args.resolve))


def _show_cfg(self, config_name, overrides, cfg_type, package, resolve=False) -> None:
    """Hydra's --cfg (``Hydra.show_cfg``, run under :func:`_reported`) once the config passes the checks a
    run makes (:func:`_checked`): ``--cfg job ktile=48`` exits 2 with the run's message, as the run would."""
    _checked(self, config_name, overrides, multirun=False)
    if (note := check_preset_sweep(sys.argv[1:])) and note.startswith("#"):    # a preset's sweep: where it is
        print(note, flush=True)
    _hydra_show_cfg(self, config_name=config_name, overrides=overrides, cfg_type=cfg_type, package=package,
                    resolve=resolve)


def _hydra_help(self, config_name, args_parser, args) -> None:
    """Hydra's --hydra-help (``Hydra.hydra_help``) once the command's config passes the checks a run makes
    (:func:`_checked`); Hydra's help composes Hydra's own config only, so the command's other overrides
    (``precision=int8``, which it refuses with a traceback) are left out of it."""
    _reported(lambda: _checked(self, config_name, args.overrides, args.multirun))
    args.overrides = [o for o in args.overrides if o.lstrip("+~").startswith(("hydra.", "hydra/"))]
    _reported(lambda: _hydra_hydra_help(self, config_name=config_name, args_parser=args_parser, args=args))


def _terminate(signum, frame):
    raise KeyboardInterrupt(signum)


if __name__ == "__main__":
    from experiments.runner.sweep import release_job_processes
    from experiments.store.track import (StoreUnavailable, abort_open_runs, close_runs_of_ended_processes,
                                         trackers)
    from experiments.runner.validate import Invalid
    signal.signal(signal.SIGTERM, _terminate)
    from experiments.runner.sweep import compose_once
    compose_once()                       # Hydra's repeated compositions of the same config, done once
    gc.freeze()         # what is imported so far lives as long as the command: collections skip it (~7% CPU)
    hydra_utils.run_and_report = _reported
    Hydra.app_help, Hydra.show_cfg, Hydra.hydra_help = _app_help, _show_cfg, _hydra_help
    try:        # the variants that presets of a --config-dir list, beside conf/'s
        if len(dirs := _config_dirs(sys.argv[1:]) or ()) > 1:
            register_variants(dirs=dirs)
    except VariantError as exc:
        print(f"Invalid preset: {exc}", file=sys.stderr)
        sys.exit(2)
    if problem := check_modes(sys.argv[1:]) or check_group_values(sys.argv[1:]):
        print(problem, file=sys.stderr)
        sys.exit(2)
    if (problem := check_preset_sweep(sys.argv[1:])) and not problem.startswith("#"):  # '#': _show_cfg's
        print(problem, file=sys.stderr)
        sys.exit(2)
    try:
        main()
    except Invalid as exc:                # the config, refused before any work (experiments.runner.validate)
        print(exc, file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as exc:
        signal.signal(signal.SIGINT, signal.SIG_IGN)     # a second Ctrl-C must not cut the cleanup
        term = exc.args == (signal.SIGTERM,)
        release_job_processes()                          # no job process writes a run after this
        stale = close_runs_of_ended_processes()          # the runs those processes had in progress
        ended, sweeps, kept = abort_open_runs("KILLED", "interrupted by " + ("SIGTERM" if term else "Ctrl-C"))
        release_job_processes()                          # one the launcher started meanwhile, if any,
        ended += stale + close_runs_of_ended_processes()  # ... and the run it had begun
        slurm = sys.modules.get("experiments.runner.slurm")
        ended += slurm.cancelled_runs() if slurm else 0  # those of the Slurm jobs it cancelled
        sweep = "; the sweep is marked KILLED" if sweeps else ""
        print(f"\nInterrupted: {kept} run(s) finished in this command are kept; {ended} run(s) in progress "
              f"marked KILLED (outcome=interrupted){sweep}. Run the same command again to resume (finished "
              "runs are skipped, the sweep continues).", file=sys.stderr, flush=True)
        sys.exit(143 if term else 130)
    except StoreUnavailable as exc:      # locked by another process past tracking.wait, or a full disk
        release_job_processes()
        ended, sweeps, kept = abort_open_runs("KILLED", f"the store became unavailable: {exc}")
        left = [rid in t.parents.values() for t in trackers() for rid in t.open]
        for t in trackers():
            t.open.clear()               # runs it would not take now: the next command closes them
        done = [f"{kept} run(s) finished in this command are kept"]
        done += [f"{ended} run(s) in progress marked KILLED (outcome=interrupted)"] * bool(ended)
        done += ["the sweep is marked KILLED"] * bool(sweeps)
        done += [f"{len(left)} run(s) ({left.count(True)} of them the sweep's parent) stay RUNNING until the "
                 "next command on this store closes them"] * bool(left)
        print(f"\nStore unavailable: {exc}. {'; '.join(done)}. Run the same command again once the store "
              "takes writes to resume.", file=sys.stderr, flush=True)
        sys.exit(1)
    finally:
        release_job_processes()           # a parallel launcher's processes, however the command ends
        abort_open_runs("FAILED", "the command ended without closing this run")
