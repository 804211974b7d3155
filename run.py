"""Entry point: ``python run.py [-m] key=value ...`` (Hydra). See README.md and ``--help``.

Ctrl-C (or SIGTERM) closes the runs in progress as KILLED, says what was kept and exits 130 (143);
re-running the same command resumes: finished runs are skipped, new ones join the same parent run.
"""
import os
import signal
import sys
from pathlib import Path

import hydra
from omegaconf import OmegaConf

from experiments.config import register
from experiments.worker import JOBS_PER_GPU, gpu_count

register()
OmegaConf.register_new_resolver("pid", os.getpid, use_cache=True, replace=True)
# job processes of hydra/launcher=gpus: JOBS_PER_GPU per visible GPU (one GPU assumed without any)
OmegaConf.register_new_resolver("gpu_jobs", lambda: max(1, gpu_count()) * JOBS_PER_GPU, use_cache=True,
                                replace=True)


CONF = Path(__file__).parent / "conf"


def presets(group: str, dirs: tuple = (CONF,)) -> dict:
    """The presets of config group ``group`` in the config folders ``dirs``: name -> file (the first
    folder that has it wins, as Hydra's search path)."""
    found: dict = {}
    for d in dirs:
        for f in sorted((Path(d) / group).glob("*.yaml")):
            found.setdefault(f.stem, f)
    return dict(sorted(found.items()))


def config_groups() -> str:
    """The selectable config groups of conf/ and their presets, for --help (Hydra's own list also
    shows the metric sets of the ncu step and the family schemas, which a command line cannot pick)."""
    groups = ("family", "precision", "tile", "problem", "experiment", "variant", "hydra/launcher")
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


OmegaConf.register_new_resolver("config_groups", config_groups, use_cache=True, replace=True)
OmegaConf.register_new_resolver("family_options", family_options, use_cache=True, replace=True)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg) -> None:
    from experiments.config import Config
    from experiments.job import JobError, run_job
    from experiments.spec import SpecError
    known = set(OmegaConf.structured(Config).keys())
    if unknown := sorted(set(cfg.keys()) - known):
        raise SystemExit(f"Unknown config key(s): {', '.join(unknown)} (added with '+'?). "
                         f"Valid top-level keys: {', '.join(sorted(known))}; see python run.py --help")
    try:
        run_job(cfg)
    except SpecError as exc:   # single run: an impossible configuration stops before any work
        raise SystemExit(f"Invalid configuration: {exc}") from None
    except JobError as exc:
        raise SystemExit(f"Cannot run: {exc}") from None


def check_modes(argv: list) -> str | None:
    """The message for ``-m`` (``--multirun``) given with ``--cfg`` (``-c``), which Hydra refuses with a
    traceback (it takes one of --run, --multirun, --cfg, --info, --shell-completion); None otherwise.
    ``--cfg`` shows the config of one job: the message gives the command without ``-m`` (flags first,
    as Hydra's parser wants them; each sweep, a list, choice(...) or range(...), cut to its first
    value (:func:`_values`); one without a first value, e.g. interval(...) or glob(...), left out),
    and where a preset's sweep is shown (``--cfg hydra``)."""
    multirun = any(a in ("-m", "--multirun") for a in argv)
    if not (multirun and any(a in ("-c", "--cfg") or a.startswith("--cfg=") for a in argv)):
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


def check_override_keys(argv: list) -> str | None:
    """The message for a command-line override the config cannot take, naming what it can; None when
    every override is fine. Caught here, before Hydra (whose message suggests adding the key with '+',
    which would only hide the typo): a key the config does not have (``ktil=32``, ``pipeline.stage=3``,
    also with '+'), an option the chosen family does not have (``family=wgmma family.foo=1``) or a
    value outside its values (``family.bn=100``, ``family.persistent=2``), a family option in a sweep
    over several families, a value that is not an integer for an integer key (``ktile=32.5``), one
    other than true or false for a boolean key (``timing.l2_flush=1``, which OmegaConf reads as true)
    and one that is not a member of an enum key (``precision=int5``, also with --help); a value no
    kernel of the chosen family can take (:func:`_value_problem`); a non-ASCII value not quoted
    (:func:`_unquoted_problem`).
    The values of a sweep are checked one by one as Hydra's parser expands them (a,b; ``choice(...)``;
    ``range(...)``: :func:`_values`); ``glob(...)`` and ``interval(...)`` are left to Hydra, but for a
    sweep that cannot be expanded (:func:`_sweep_problem`)."""
    import dataclasses
    import re
    import typing
    from enum import Enum

    from experiments.config import Config
    from experiments.families import DEFAULT
    from experiments.spec_tables import KTILES
    dirs = _config_dirs(argv)
    groups = {d.name for cd in dirs or (CONF,) if Path(cd).is_dir() for d in Path(cd).iterdir() if d.is_dir()}
    groups -= {"hydra", "ncu"}              # a --config-dir's groups too: +group=option adds one
    nodes = {f.name: f.type for f in dataclasses.fields(Config)}
    known = set(nodes) | groups
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    family = next((a.split("=", 1)[1] for a in overrides if a.split("=", 1)[0] == "family"), None)
    if family and dirs and (problem := _variant_of_another_family(family, overrides, dirs)) is not None:
        return problem
    family = family or (_preset_family(overrides, dirs) if dirs else None) or DEFAULT
    for arg in overrides:
        key, value = arg.split("=", 1)
        if (problem := _unquoted_problem(arg)) is not None:
            return problem
        key = key.lstrip("+~")
        if key.startswith("hydra") or "/" in key:
            continue
        top, _, rest = key.partition(".")
        if (problem := _sweep_problem(arg, argv)) is not None:
            return problem
        if (problem := _setting_problem(key, arg)) is not None:
            return problem
        if top not in known and dirs is not None:     # hydra.searchpath: Hydra knows its groups
            return (f"Unknown key {top!r} in {arg!r}. Valid top-level keys: {', '.join(sorted(known))} "
                    "(python run.py --help shows them with their defaults).")
        if top in groups and not rest and dirs and (problem := _preset_problem(top, arg, dirs)) is not None:
            return problem
        if top in groups and not rest and dirs and (problem := _added_group_problem(top, arg, dirs)):
            return problem
        node = typing.get_type_hints(Config).get(top)
        if rest and dataclasses.is_dataclass(node):
            fields = {f.name: f.type for f in dataclasses.fields(node)}
            if rest not in fields:
                valid = ", ".join(f"{top}.{k}" for k in fields)
                return f"{top} has no key {rest!r} ({arg!r}); valid: {valid}"
            kind = typing.get_type_hints(node)[rest]
        elif top == "family" and rest:
            problem = _check_family_option(family, rest, arg)
            if problem:
                return problem
            continue
        else:
            kind = typing.get_type_hints(Config).get(top)
        values = _values(arg) if "${" not in value else None     # None: Hydra decides (glob, interpolation)
        if kind in (int, typing.Optional[int]) and values is not None:
            bad = [v for v in values                    # Hydra also reads '5', +5 and 1_000 as integers
                   if not re.fullmatch(r"""(['"]?)[+-]?\d+(_\d+)*\1|null""", v.strip())]
            if bad:
                valid = f"; valid: {', '.join(map(str, KTILES))}" if key == "ktile" else ""
                return f"{key}={bad[0]} is not an integer ({arg!r}){valid}"
        if kind in (float, typing.Optional[float]) and values is not None:
            if problem := _float_problem(key, arg, values):
                return problem
        if top == "tracking" and (problem := _tracking_problem(key, arg, values, argv)):
            return problem
        if kind is bool and values is not None and (bad := _outside(values, ("true", "false"))) is not None:
            return f"{key}={bad} is not valid ({arg!r}); valid: true, false"
        if typing.get_origin(kind) is list and values is not None \
                and (bad := next((v for v in values if not v.strip().startswith("[")), None)) is not None:
            from omegaconf import OmegaConf
            default = OmegaConf.to_container(OmegaConf.select(OmegaConf.structured(Config), key))
            example = (f"the default {key}={str(default).replace(' ', '')}" if default
                       else f"{key}=[[4096,4096,1024]]")
            return f"{key}={bad} is not a list ({arg!r}); give one in brackets, e.g. {example}"
        members = [m.name for m in kind] if isinstance(kind, type) and issubclass(kind, Enum) else []
        if members and values is not None and (bad := _outside(values, tuple(members))) is not None:
            return f"{key}={bad} is not valid ({arg!r}); valid: {', '.join(members)}"
        if (problem := _value_problem(key, arg, family)) is not None:
            return problem
    return None


def _float_problem(key: str, arg: str, values: list) -> str | None:
    """check_override_keys for a float key: a value that is no number; for tracking.wait (seconds) a
    negative one."""
    for v in values:
        text = v.strip().strip("'\"")
        try:
            number = None if text == "null" else float(text)
        except ValueError:
            return (f"{key}={v} is not a number ({arg!r})"
                    + ("; valid: 0 or more seconds" * (key == "tracking.wait")))
        if key == "tracking.wait" and number is not None and not number >= 0:
            return (f"{key}={v} is out of range ({arg!r}); valid: 0 or more seconds (0: no waiting for the "
                    "store's lock)")
    return None


def _tracking_problem(key: str, arg: str, values: list | None, argv: list) -> str | None:
    """check_override_keys for tracking.*: an empty experiment name (MLflow takes none), and a sweep
    over tracking.rerun or tracking.wait (set once for a sweep; a sweep over the store or experiment is
    refused at the sweep's start, experiments.sweep.tracking_target)."""
    if key == "tracking.experiment" and any(not v.strip().strip("'\"").strip() for v in values or ()):
        return (f"{arg!r}: the experiment name is empty; give one, e.g. tracking.experiment=ablation, or "
                "leave it out for the default")
    # uri, experiment: checked at the sweep's start
    override = _parsed(arg) if key in ("tracking.rerun", "tracking.wait") else None
    if override is None or not override.is_sweep_override() or not {"-m", "--multirun"} & set(argv):
        return None
    why = {"tracking.rerun": "whether finished runs are measured again is set once for the whole sweep",
           "tracking.wait": "the wait for the store's write lock is set once for the whole sweep"}[key]
    first = str((values or ["VALUE"])[0])
    first = first.lower() if first in ("True", "False") else first
    return (f"Cannot sweep {key} ({arg}): {why}. Give one value, e.g. {key}={first}, and run one sweep per "
            "value.")


def _value_problem(key: str, arg: str, family: str) -> str | None:
    """check_override_keys for a value no kernel of the chosen family (or of any family a sweep over
    families names) can take (experiments.kernel.value_problem: precision, target.arch, a size <= 0,
    a shape that is not [M, N, K]): an error before any work, also in a sweep, where each job would
    otherwise be a skipped run. A combination of valid values is left to the jobs."""
    from experiments.kernel import VALUE_KEYS, value_problem
    override = _parsed(arg) if key in VALUE_KEYS and "${" not in arg else None
    if override is None:
        return None
    try:
        values = list(override.sweep_iterator()) if override.is_sweep_override() else [override.value()]
    except Exception:  # noqa: BLE001 - glob(...), interval(...): Hydra decides
        return None
    families = _values(f"family={family}")
    for v in values:
        if problem := value_problem(key, v, families):
            return f"{problem} ({arg!r})"
    return None


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


def _sweep_problem(arg: str, argv: list) -> str | None:
    """Why the sweep of the override ``arg`` cannot be expanded (``range(1,4,0)``; ``interval(...)``
    with Hydra's basic sweeper, which only samplers take), or None; ``glob(...)`` is expanded by
    Hydra against the config's choices."""
    override = _parsed(arg)
    if override is None or not (override.is_interval_sweep() or override.is_range_sweep()
                                or override.is_choice_sweep()):
        return None
    if override.is_interval_sweep():
        if any(a.startswith(("hydra/sweeper=", "+hydra/sweeper=")) for a in argv):
            return None
        return (f"{arg!r}: interval(...) is for sweepers that sample (e.g. Optuna's); Hydra's basic sweeper "
                "takes lists (a,b), range(...) and choice(...)")
    try:
        list(override.sweep_iterator())
    except ValueError as exc:
        return f"{arg!r} cannot be expanded: {exc}"
    except Exception:  # noqa: BLE001 - left to Hydra
        pass
    return None


def _setting_problem(key: str, arg: str) -> str | None:
    """check_override_keys for the timing and verification settings (experiments.kernel.setting_problem):
    every value of the override ``arg`` (as Hydra's override parser reads it: a list, ``range(...)``,
    ``choice(...)``, a cast such as ``int(0)``, a quoted number) in range and finite, before any job
    (in a sweep each job would otherwise be a skipped run). Values that are no number are left to the
    type check and to Hydra."""
    from experiments.kernel import SETTING_KEYS, setting_problem
    # an interpolation is checked once the config is composed (experiments.kernel.check_settings)
    for v in (_values(arg) or ()) if key in SETTING_KEYS and "${" not in arg else ():
        text = v.strip().strip("'\"").strip()
        try:
            number = (None if text == "null" else text.lower() == "true" if text.lower() in ("true", "false")
                      else int(text) if text.lstrip("+-").isdigit() else float(text))
        except ValueError:
            continue                      # not a number: the type check (or Hydra) says so
        if problem := setting_problem(key, number):
            return problem
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


def _outside(values: list, valid: tuple) -> str | None:
    """The first of ``values`` (:func:`_values`) that is none of ``valid`` (an axis' declared values:
    integers compare as numbers, so 0128 is 128; true/false in any case, as Hydra reads them), or None."""
    for v in values:
        text = v.strip().strip("'\"")
        if isinstance(valid[0], int) and not isinstance(valid[0], bool):
            try:
                ok = int(text) in valid
            except ValueError:
                ok = False
        elif {str(x) for x in valid} == {"true", "false"}:
            ok = text.lower() in ("true", "false")
        else:
            ok = text in map(str, valid)
        if not ok:
            return v
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


def _preset_problem(group: str, arg: str, dirs: tuple) -> str | None:
    """The message for a ``group=name`` override naming no preset of the config folders ``dirs``
    (:func:`_config_dirs`), or None. Caught before the sweep is tracked: Hydra's own error came after
    it, and left a parent run without children in the store."""
    names = presets(group, dirs)
    bad = next((v for v in _values(arg) or [] if v.strip() not in names), None)
    if bad is None or not names:
        return None
    folders = ", ".join(sorted({str(f.parent) if Path(f).parent.parent != CONF else f"conf/{group}/"
                                for f in names.values()}))
    return f"{group}={bad} is not a preset ({arg!r}); valid: {', '.join(names)} ({folders})"


def _added_group_problem(group: str, arg: str, dirs: tuple) -> str | None:
    """The message for a config group that only a ``--config-dir`` has (not conf/), or None: chosen
    without '+' (not in the config's defaults: Hydra said "No match in the defaults list"), or with an
    option whose keys land under the group's name, which the config has no key for (no ``# @package``
    line: Hydra said "Key 'GROUP' not in 'Config'")."""
    import dataclasses
    import re

    from experiments.config import Config
    if (CONF / group).is_dir():
        return None
    where = ", ".join(str(d) for d in dirs[1:])
    if not arg.startswith("+"):
        return (f"{group} is a config group of --config-dir {where}, not one of the config's defaults: add "
                f"it with +{arg}")
    fields = {f.name for f in dataclasses.fields(Config)}
    for name in _values(arg) or []:
        path = presets(group, dirs).get(name.strip())
        package = group                 # Hydra reads '# @package' among the file's first '# @' lines only
        for line in (path.read_text() if path else "").splitlines():
            if line.strip() and not re.match(r"\s*#\s*@", line):
                break
            key, _, val = line.strip().lstrip("#").strip().partition(" ")
            package = val.strip() if key == "@package" else package
        if package != "_global_" and package.removeprefix("_global_.").split(".")[0] not in fields:
            return (f"{arg.lstrip('+')} ({path}) puts its keys under {package!r}, which the config has no "
                    "key for: begin the file with '# @package _global_' to set the config's keys (precision, "
                    "tile.block, ...)")
    return None


def _family_of_preset(y: dict) -> str | None:
    """The family a preset's YAML (loaded) chooses by ``override /family: X`` in its defaults, or None."""
    return next((d["override /family"] for d in y.get("defaults") or []
                 if isinstance(d, dict) and "override /family" in d), None)


def _preset_family(overrides: list, dirs: tuple) -> str | None:
    """The family the presets named on the command line choose: a ``variant=`` wins over an
    ``experiment=``, each by ``override /family: X`` in its defaults (its file in ``dirs``), else the
    default family; an experiment that sweeps variants itself (``hydra.sweeper.params.variant``)
    chooses theirs unless the command line names variants. "a,b" when the jobs of a sweep over
    presets get different ones. None when no preset is named, or one cannot be read (Hydra then has
    the last word)."""
    import yaml
    chosen: dict = {}
    swept: list = []            # variants an experiment sweeps
    files = {group: presets(group, dirs) for group in ("variant", "experiment")}

    def family_of(group, name):
        y = yaml.safe_load(files[group][name.strip()].read_text()) or {}
        params = ((y.get("hydra") or {}).get("sweeper") or {}).get("params") or {}
        if group == "experiment" and "variant" in params:
            swept.extend(str(params["variant"]).replace(" ", "").split(","))
        return _family_of_preset(y)
    try:
        for arg in overrides:
            group = arg.partition("=")[0]
            if group in ("variant", "experiment") and (values := _values(arg)) is not None:
                chosen[group] = [family_of(group, name) for name in values]
        if "variant" not in chosen and swept:
            chosen["variant"] = [family_of("variant", name) for name in swept if name]
    except (KeyError, OSError, yaml.YAMLError, AttributeError):
        return None
    if not chosen:
        return None
    from experiments.families import DEFAULT
    return ",".join(sorted({v or e or DEFAULT for v in chosen.get("variant", [None])
                            for e in chosen.get("experiment", [None])}))


def _variant_of_another_family(family: str, overrides: list, dirs: tuple) -> str | None:
    """The message for a ``family=`` on the command line beside a ``variant=`` that chooses another
    family and sets its options (``variant=gen_wgmma_group_16`` beside ``family=`` the default family):
    Hydra stopped with "Key 'group' not in 'MmaSyncConf'". None otherwise, or when a preset cannot be
    read."""
    import yaml
    files = presets("variant", dirs)
    for arg in overrides:
        if arg.partition("=")[0] != "variant" or (names := _values(arg)) is None:
            continue
        for name in names:
            try:
                y = yaml.safe_load(files[name.strip()].read_text()) or {}
            except (KeyError, OSError, yaml.YAMLError):
                return None
            own = _family_of_preset(y)
            options = sorted((y.get("family") or {}) if isinstance(y.get("family"), dict) else {})
            if own and options and {f.strip() for f in family.split(",")} != {own}:
                sets = ", ".join(f"family.{o}" for o in options)
                return (f"variant={name.strip()} is a variant of family={own} (it sets {sets}); "
                        f"family={family} on the command line replaces its family, which has no such option: "
                        f"drop family={family}, or choose a variant of that family (conf/variant/)")
    return None


def _check_family_option(family: str, option: str, arg: str) -> str | None:
    """check_override_keys for ``family.<option>=<value>`` with the chosen ``family``: the option must
    be one of the family's axes and each value one of the axis' declared values."""
    from experiments.config import family_schema
    from experiments.families import get, names
    owners = [n for n in names() if option in family_schema(n).__dataclass_fields__]
    if "," in family or "*" in family or "(" in family:
        return (f"{arg!r} sets an option of {', '.join(owners) or 'no family'} in a sweep over several "
                f"families ({family}): each job's family takes only its own options; sweep the families "
                "separately (or put the option in a variant per family)")
    try:
        fields = {k: f for k, f in family_schema(family).__dataclass_fields__.items() if k != "name"}
    except KeyError:        # an unknown family: Hydra names the valid ones
        return None
    if option not in fields:
        bare = f"none, family={family} is set by the root keys" if get(family).root_keys else "(none)"
        options = ", ".join(fields) or bare
        also = f"; {option} is an option of family={' or '.join(owners)}" if owners else ""
        return f"family={family} has no option {option!r} ({arg!r}); valid options: {options}{also}"
    valid = get(family).axes[option]
    if (values := _values(arg)) is not None and (bad := _outside(values, valid)) is not None:
        return f"family={family} {option}={bad} is not valid ({arg!r}); valid: {', '.join(map(str, valid))}"
    return None


def check_preset_sweep(argv: list) -> str | None:
    """The message for a preset that defines a sweep (``hydra.sweeper.params`` of conf/experiment/)
    given without ``-m``: Hydra then ignores the sweep and runs one job with the defaults of the swept
    keys, which belongs to no job of the sweep. None with ``-m``, with --help, when the command line
    sets every swept key (one job of the sweep), or without such a preset. The message gives the
    ``-m`` command and the command of the sweep's first job; with ``--cfg job`` (or ``all``) it is a
    YAML comment line saying where the sweep is shown (``--cfg hydra``, which needs none)."""
    import re

    import yaml
    if any(a in ("-m", "--multirun", "--help", "-h", "--hydra-help") for a in argv):
        return None
    dirs = _config_dirs(argv)
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    given = {a.split("=", 1)[0].lstrip("+~") for a in overrides}
    preset = next((a.split("=", 1)[1] for a in overrides if a.split("=", 1)[0] == "experiment"), None)
    try:
        y = yaml.safe_load(presets("experiment", dirs)[preset].read_text()) if dirs and preset else None
    except (KeyError, OSError, yaml.YAMLError):
        return None                        # no such preset: check_override_keys (or Hydra) says so
    params = (((y or {}).get("hydra") or {}).get("sweeper") or {}).get("params") or {}
    folded = {k: re.sub(r",\s+", ",", str(v).strip()) for k, v in params.items()}   # YAML's ">-" values
    missing = {k: _values(f"{k}={v}") or [v] for k, v in folded.items() if k not in given}
    if not missing:
        return None
    swept = ", ".join(f"{k} ({len(v)} values)" for k, v in missing.items())
    cfg = [i for i, a in enumerate(argv) if a in ("-c", "--cfg") or a.startswith("--cfg=")]
    shown = [argv[i].partition("=")[2] or (argv[i + 1] if i + 1 < len(argv) else "") for i in cfg]
    if "hydra" in shown:                   # --cfg hydra shows the sweep itself
        return None
    skip = set(cfg) | {i + 1 for i in cfg if "=" not in argv[i]}          # --cfg and its value
    rest = " ".join(a for i, a in enumerate(argv) if i not in skip)
    first = " ".join(f"{k}={v[0]}" for k, v in missing.items())
    if cfg:
        return (f"# experiment={preset} sweeps {swept}; this is one job's config with them at their "
                f"defaults. The sweep: python run.py --cfg hydra {rest} (hydra.sweeper.params); "
                f"run it: python run.py -m {rest}")
    keys = " and ".join(missing)
    return (f"experiment={preset} defines a sweep over {swept}; without -m Hydra would ignore it and run "
            f"a single job with {keys} at the config's default: nothing was run. Run the sweep: "
            f"python run.py -m {rest}   or one of its jobs: python run.py {rest} {first}")


def _terminate(signum, frame):
    raise KeyboardInterrupt(signum)


if __name__ == "__main__":
    from experiments.sweep import release_job_processes
    from experiments.track import StoreUnavailable, abort_open_runs, close_runs_of_ended_processes, trackers
    signal.signal(signal.SIGTERM, _terminate)
    if problem := check_override_keys(sys.argv[1:]) or check_modes(sys.argv[1:]):
        print(problem, file=sys.stderr)
        sys.exit(2)
    if problem := check_preset_sweep(sys.argv[1:]):
        if not problem.startswith("#"):            # --cfg shows the config after this comment line
            print(problem, file=sys.stderr)
            sys.exit(2)
        print(problem, flush=True)
    try:
        main()
    except KeyboardInterrupt as exc:
        signal.signal(signal.SIGINT, signal.SIG_IGN)     # a second Ctrl-C must not cut the cleanup
        term = exc.args == (signal.SIGTERM,)
        release_job_processes()                          # no job process writes a run after this
        stale = close_runs_of_ended_processes()          # the runs those processes had in progress
        ended, sweeps, kept = abort_open_runs("KILLED", "interrupted by " + ("SIGTERM" if term else "Ctrl-C"))
        release_job_processes()                          # one the launcher started meanwhile, if any,
        ended += stale + close_runs_of_ended_processes()  # ... and the run it had begun
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
