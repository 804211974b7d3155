"""Validation of a command's config, once, before any work: Hydra and OmegaConf check each key and its
type against the structured config (experiments/config.py); :func:`check` then checks the composed
configs of a whole sweep (or of the single run) at its start, before its parent run exists, against
what the families take; :func:`one_line` turns Hydra's and OmegaConf's errors into one line naming the
key, the value, the valid values and the fix. A refused command exits 2 and tracks nothing.
"""
from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from ..families import DEFAULT
from ..spec import case_match, did_you_mean
from ..store.track import MAX_WAIT_S

__all__ = ["Invalid", "one_line", "check", "job_overrides", "spec_problem", "config_problem"]

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
SEARCH_SWEEPER = "hydra_plugins.tca_search_sweeper.SearchSweeper"


class Invalid(SystemExit):
    """A config the command cannot run: exit status 2; ``str()`` is the one-line message."""

    def __init__(self, message: str):
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message


def one_line(exc: BaseException, argv: tuple = ()) -> str:
    """Hydra's or OmegaConf's error ``exc`` (composing the config, parsing or expanding an override)
    as one line: the key, the value given, the valid values (a config group's presets, an Enum's
    members, a node's keys) and how to fix it; ``argv``, the command line, names a --config-dir's group
    and folder. An error of another kind: its lines joined."""
    from hydra.errors import MissingConfigException, OverrideParseException
    import yaml
    cause = exc.__cause__ or exc
    text = str(exc).strip()
    if isinstance(exc, (yaml.YAMLError, UnicodeDecodeError)) or text.startswith("Invalid loaded object type"):
        return _file_problem(exc, argv)
    key = getattr(cause, "full_key", None)
    given = re.search(r"override (\S+=.*)$", text.splitlines()[0]) or re.search(r"use \+(\S+=.*)$", text)
    given = f" ({given.group(1)!r})" if given else ""
    msg = str(cause).splitlines()[0] if str(cause) else text
    missing = re.search(r"Could not find '(.+)/([^/']+)'", text)
    if isinstance(exc, MissingConfigException) and (m := missing):
        group, name = m.groups()
        listed = text.split("Available options", 1)[-1].split("Config search", 1)[0]
        options = re.findall(r"^\t(\S+)$", listed, re.M)
        arg = next((a for a in argv if a.lstrip("+~").partition("=")[0] == group), None)
        given = f" ({arg!r})" if arg else ""
        prefix = arg[:len(arg) - len(arg.lstrip("+~"))] if arg else ""      # +group=, as it was given
        folders = [str(d / group) for d in _config_dirs(argv)[1:] if (d / group).is_dir()]
        where = ", ".join([f"conf/{group}/"] * (_CONF / group).is_dir() + folders)
        if group == "variant":
            where += " and the variants conf/experiment/ presets list"
        return (f"{group}={name} is not a preset{given}; valid: {', '.join(options)} ({where})"
                f"{did_you_mean(prefix + group, name, options)}")
    if isinstance(exc, OverrideParseException):
        return (f"{text.splitlines()[0]}: Hydra cannot read this override; quote a value with spaces or "
                "special characters (key='value'), see https://hydra.cc/docs/advanced/override_grammar/basic/")
    in_preset = r"In '(\w+)/(\w+)': \w+ raised while composing config:\nKey '(\w+)' not in '(\w+)'"
    if (m := re.search(in_preset, text)) and m.group(4) == "Config" and m.group(1) == m.group(3):
        group, name = m.group(1), m.group(2)
        path = next(iter(_preset_files(group, name, argv)), f"{group}/{name}.yaml")
        return (f"{group}={name} ({path}) puts its keys under {group!r}, which the config has no key for: "
                "begin the file with '# @package _global_' to set the config's keys (precision, tile.block, "
                "...)")
    if m := re.search(in_preset, text):
        group, name, option, family = m.groups()
        from ..config import family_schema
        from ..families import names
        full = re.search(r"full_key: (\S+)", text)
        full = full.group(1) if full else option
        if not full.startswith("family."):       # another section's key (timing.foo) or a top-level one
            path = next(iter(_preset_files(group, name, argv)), f"{group}/{name}.yaml")
            parent = full.rpartition(".")[0]
            node = OmegaConf.select(OmegaConf.structured(_config()), parent) if parent else None
            kind = OmegaConf.get_type(node) if node is not None else _config()
            return (f"{group}={name} ({path}) sets {full}, which the config does not have; "
                    f"{_keys_of(kind, full)}")
        family = {family_schema(n).__name__: n for n in names()}.get(family, family)
        return (f"{group}={name} sets family.{option}, an option family={family} does not have: a family= on "
                f"the command line replaces the preset's family; drop it, or choose a {group} of "
                f"family={family} (conf/{group}/)")
    if m := re.match(r"Key '(.+)' not in '(\w+)'", msg):
        kind, key = getattr(cause, "object_type", None), key or m.group(1)
        swept = next((a for a in argv if a.partition("=")[0] == "family" and "," in a), None)
        if swept and key.startswith("family.") and given:
            owners = " or ".join(_owners(key[7:])) or "no family"
            return (f"{given.strip(' ()')} sets an option of {owners} in a sweep over several families "
                    f"({swept}): each job's family takes only its own options; sweep the families separately "
                    "(or put the option in a variant per family)")
        return f"Unknown key {key!r}{given}; {_keys_of(kind, key)}"
    if (m := re.search(r"override ~(\S+)", text)) and "does not support deletion" in msg:
        return removed(m.group(1))
    if "No match in the defaults list" in text and (m := re.search(r"Could not override '(\w+)'", text)):
        group = m.group(1)
        given = next((a for a in argv if a.partition("=")[0] == group), f"{group}=OPTION")
        dirs = ", ".join(map(str, _config_dirs(argv)[1:]))
        return (f"{group} is a config group of --config-dir {dirs}, not one of the config's defaults: add it "
                f"with +{given}")
    value = getattr(cause, "value", None)
    shown = f"{key}={value}" if key else ""
    typed = given.strip(" ()'").partition("=")      # the override as given: its value as typed (true)
    typed = typed[2] if given and typed[0].lstrip("+~") == key else None
    if m := re.match(r"Invalid value '(.*)', expected one of \[(.*)\]", msg):
        return (f"{key}={m.group(1)} is not valid{given}; valid: {_listed(key, m.group(2))}"
                f"{_axis_hint(key, m.group(1))}{_case_hint(key, m.group(1), m.group(2), argv)}")
    if m := re.match(r"Value '(.*?)' (of type '\w+' )?could not be converted to Integer", msg):
        if m.group(1) == "{}":          # family.bn.x=1: a key below an integer
            return f"{key} is an integer, with no keys below it{given}{_declared(cause, key)}"
        hint = _axis_hint(key, m.group(1))
        return f"{key}={typed or m.group(1)} is not an integer{given}{_declared(cause, key)}{hint}"
    if m := re.match(r"Value '(.*?)' (of type '\w+' )?could not be converted to Float", msg):
        valid = {"tracking.wait": f"; valid: 0 ... {MAX_WAIT_S} seconds",
                 "tracking.stale_after_s": "; valid: more than 0 seconds, finite"}.get(key, "")
        return f"{key}={typed or m.group(1)} is not a number{given}{valid}"
    if re.match(r"Value '(.*)' is not a valid bool", msg):
        return f"{shown or msg} is not valid{given}; valid: true, false"
    if re.match(r"field '.*' is not Optional", msg):
        example = (f"e.g. the default {key}={default}" if (default := _default(key)) is not None
                   else "as python run.py --help lists them")
        return f"{key} takes no null{given}; give a value, {example}"
    if "is not a ListConfig" in msg:
        return f"{key} takes a list{given}; give one in brackets, e.g. '{_example(key)}'"
    every = text.splitlines() + ([] if cause is exc else str(cause).splitlines())
    lines = [line.strip() for line in every if line.strip()
             and not re.match(r"(full_key|object_type|reference_type|Config search|provider=)", line.strip())]
    return "; ".join(dict.fromkeys(lines))


_CONF = Path(__file__).resolve().parents[2] / "conf"


def _listed(key: str, valid: str) -> str:
    """The valid values ``valid`` (comma-separated, as OmegaConf lists an Enum's) of ``key``; for
    ``precision``, a value that is not an element type names the families that take it (copy: peak)."""
    if key != "precision":
        return valid
    from ..dtypes import DType

    def shown(v: str) -> str:
        return v if v in DType.__members__ else f"{v} (family={','.join(_families_taking(v))})"
    return ", ".join(shown(v) for v in valid.split(", "))


def _families_taking(precision: str) -> list:
    """The families whose ``precision`` axis has ``precision``, in registry order."""
    from ..families import get, names
    return [n for n in names() if precision in map(str, get(n).axes["precision"])]


def _file_problem(exc, argv: tuple) -> str:
    """The message for a config file Hydra cannot load (``exc``: not YAML, not UTF-8, not a mapping): the
    preset of ``argv`` whose file it is (experiments.runner.variants.file_problem), else Hydra's text."""
    from .variants import file_problem
    for a in argv:
        key, eq, name = a.lstrip("+~").partition("=")
        for f in _preset_files(key, name, argv) if eq and not a.startswith("-") else ():
            if problem := file_problem(f):
                return problem
    return f"A config file cannot be loaded: {' '.join(str(exc).split())}"


def _preset_files(group: str, name: str, argv: tuple) -> list:
    """The files of preset ``group=name`` in conf/ and the --config-dir folders of ``argv``, in that order."""
    return [f for d in _config_dirs(argv) if (f := d / group / f"{name}.yaml").is_file()]


def removed(key: str) -> str:
    """The message for ``~key``, which leaves ``key`` without the value a run needs."""
    default = OmegaConf.select(OmegaConf.structured(_config()), key, default=None)
    if OmegaConf.is_dict(default) or default is None:
        return (f"'~{key}' leaves {key} without a value, which a run needs; leave it out for the default "
                "(python run.py --cfg job shows it)")
    return (f"'~{key}' leaves {key} without a value, which a run needs; give it one instead, e.g. "
            f"{_example(key) if OmegaConf.is_list(default) else f'{key}={_default(key)}'} (python run.py "
            "--help lists the values)")


def _config():
    from ..config import Config
    return Config


def _axis_hint(key: str, value: str) -> str:
    """For ``key=axis`` given where a value is expected: where a search takes ``axis``."""
    if value != "axis":
        return ""
    return (f"; axis (every value the family declares) is a search's, in its space: "
            f"'hydra.sweeper.params={{{key}: axis}}' with hydra/sweeper=search")


def _case_hint(key: str, value: str, valid: str, argv: tuple) -> str:
    """For a value that differs from a valid one only in case (``precision=INT8``): that one; for a
    precision the family of the command line (``family=``, else the default) does not take, the
    families that do (``precision=COPY``: ``family=peak precision=copy``)."""
    same = case_match(value, valid.split(", "))
    if key == "precision" and same:
        from ..families import DEFAULT, names
        chosen = next((a.partition("=")[2] for a in reversed(argv)
                       if a.lstrip("+").partition("=")[0] == "family"), DEFAULT)
        takes = _families_taking(same)
        if chosen in names() and chosen not in takes:
            if len(takes) == 1:
                return f"; did you mean family={takes[0]} precision={same}?"
            return f"; {key}={same} is for family={','.join(takes)}, not family={chosen}"
    return did_you_mean(key, value, valid.split(", "))


def _config_dirs(argv: tuple) -> list:
    """conf/ and each ``--config-dir`` (``-cd``) of the command line ``argv``."""
    dirs = [Path(a.partition("=")[2]) for a in argv if a.startswith("--config-dir=")]
    dirs += [Path(b) for a, b in zip(argv, argv[1:], strict=False) if a in ("--config-dir", "-cd")]
    return [_CONF, *dirs]


def _owners(option: str) -> list:
    """The families that have the option ``option``."""
    from ..config import family_schema
    from ..families import names
    return [n for n in names() if option in {f.name for f in dataclasses.fields(family_schema(n))}]


def _keys_of(kind, key: str) -> str:
    """The valid keys beside the unknown ``key``: the fields of ``kind``, its node's structured type."""
    fields = [f.name for f in dataclasses.fields(kind)] if dataclasses.is_dataclass(kind) else []
    parent = key.rpartition(".")[0]
    if parent == "family":
        options = [f for f in fields if f != "name"]
        name = _family_of(kind) or DEFAULT
        option = key.rpartition(".")[2]
        owners = _owners(option)
        also = f"; {option} is an option of family={' or '.join(owners)}" if owners else ""
        return (f"family={name} has the options: {', '.join(options)}{also}" if options else
                f"family={name} has no options" + (" (the root keys set it)" * (name == DEFAULT)) + also)
    where = f"keys of {parent}" if parent else "top-level keys"
    keys = ", ".join(f"{parent}.{f}" if parent else f for f in fields)
    return f"valid {where}: {keys} (python run.py --help)"


def _declared(cause, key: str) -> str:
    """"; valid: ..." for an integer key with declared values (ktile, a family's integer option)."""
    from ..families import get
    if values := get(DEFAULT).root_values().get(key):
        return f"; valid: {', '.join(map(str, values))}"
    family = _family_of(getattr(cause, "object_type", None))
    if family and key.startswith("family."):
        return f"; valid: {', '.join(map(str, get(family).axes.get(key[7:], ())))}"
    return ""


def _family_of(kind) -> str | None:
    """The family whose options the structured type ``kind`` holds (experiments.config.family_schema)."""
    from ..config import family_schema
    from ..families import names
    return next((n for n in names() if family_schema(n) is kind), None)


def _default(key: str):
    default = OmegaConf.select(OmegaConf.structured(_config()), key)
    return getattr(default, "name", None) or default


def _example(key: str) -> str:
    default = OmegaConf.select(OmegaConf.structured(_config()), key)
    default = OmegaConf.to_container(default) if OmegaConf.is_config(default) else default
    return f"{key}=[{','.join(map(str, default))}]" if default else f"{key}=[[4096,4096,1024]]"


def job_overrides(config: DictConfig, multirun: bool) -> list | None:
    """The override lists of the jobs :func:`check` composes: one for a single run; for a basic
    sweeper's multirun (the command line after a preset's ``hydra.sweeper.params``) as many as the
    longest sweep, job i taking the i-th value of each sweep (its last where shorter), so each value
    is composed once; None for another sweeper (its values are its own). Raises Invalid for a sweep
    the basic sweeper cannot expand (``range(1,4,0)``, ``interval(...)``)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    task = [str(o) for o in OmegaConf.to_container(config.hydra.overrides.task, resolve=False)]
    if not multirun:
        return [task]
    if config.hydra.sweeper.get("_target_") != BASIC_SWEEPER:
        return None
    params = config.hydra.sweeper.get("params")
    params = OmegaConf.to_container(params, resolve=False) if params else {}
    loader = GlobalHydra.instance().config_loader() if GlobalHydra.instance().is_initialized() else None
    lists: dict = {}
    for text in [f"{k}={v}" for k, v in params.items()] + task:
        try:
            override = OverridesParser.create(config_loader=loader).parse_overrides([text])[0]
            key = override.get_key_element()
            if override.is_interval_sweep():
                raise Invalid(f"{text!r}: interval(...) is for sweepers that sample (e.g. Optuna's); Hydra's "
                              "basic sweeper takes lists (a,b), range(...) and choice(...)")
            values = (override.sweep_string_iterator() if override.is_sweep_override()
                      else [override.get_value_element_as_str()])
            lists[key] = [f"{key}={v}" for v in values]
        except Invalid:
            raise
        except Exception as exc:  # noqa: BLE001 - Hydra's parser and sweep functions raise several kinds
            raise Invalid(f"{text!r} cannot be expanded: {one_line(exc)}") from None
    if not all(lists.values()):
        return []                           # no jobs: the sweep's start says so
    return [[values[min(i, len(values) - 1)] for values in lists.values()]
            for i in range(max(map(len, lists.values()), default=1))]


def check(config: DictConfig, multirun: bool) -> None:
    """Check the sweep (or single run) of ``config`` (composed, with its hydra node) before any work:
    each job's config (:func:`job_overrides`) is composed by Hydra, which refuses an unknown key, a
    value of the wrong type or outside an Enum, a preset that does not exist; then each composed
    config is checked for what no kernel can take: a boolean given as anything but true/false
    (OmegaConf reads 1 or on as true), a family option outside the family's declared values, an
    unknown top-level key added with '+', a timing or verification setting out of range
    (experiments.runner.kernel.setting_problem), an empty tracking.experiment or a negative tracking.wait,
    and a value of precision, target.* or problem.* that no family of the sweep takes
    (experiments.runner.kernel.value_problem). A combination of valid values some kernel cannot take is left
    to the jobs (a skipped run in a sweep). Raises Invalid naming the first problem."""
    from hydra.core.global_hydra import GlobalHydra

    from ..families import get
    from .kernel import VALUE_KEYS, value_problem
    jobs = job_overrides(config, multirun)
    configs = [(config, jobs[0] if jobs else [])] if not multirun else []
    for overrides in (jobs or []) if multirun else []:
        try:
            configs.append((GlobalHydra.instance().config_loader().load_sweep_config(config, overrides),
                            overrides))
        except Exception as exc:  # noqa: BLE001 - Hydra's and OmegaConf's errors, one line each
            raise Invalid(one_line(exc, tuple(overrides))) from None
    values: dict = {key: {} for key in VALUE_KEYS}
    families: dict = {}
    for cfg, overrides in configs:
        if problem := _problem(cfg, overrides):
            raise Invalid(problem)
        name = str(OmegaConf.select(cfg, "family.name", default=None) or DEFAULT)
        families[name] = None
        if problem := _root_value_problem(cfg, name, overrides):
            raise Invalid(problem)
        if get(name).sized and not OmegaConf.select(cfg, "problem.sizes") \
                and not OmegaConf.select(cfg, "problem.shapes"):
            raise Invalid("problem.sizes and problem.shapes are both empty; give at least one size, e.g. "
                          "'problem.sizes=[4096]'")
        for key in VALUE_KEYS:
            v = OmegaConf.select(cfg, key, throw_on_resolution_failure=False)
            v = OmegaConf.to_container(v) if OmegaConf.is_config(v) else getattr(v, "name", v)
            values[key].setdefault(repr(v), v)
    for key, seen in values.items():
        for v in seen.values():
            if problem := value_problem(key, v, list(families)):
                raise Invalid(problem)
    if not multirun and (problem := _spec_problem(config)):
        raise Invalid(problem)
    if multirun and config.hydra.sweeper.get("_target_") == SEARCH_SWEEPER:
        from .search import space_problem
        if problem := space_problem(config):
            raise Invalid(problem)


def config_problem(cfg: DictConfig, overrides: list) -> str | None:
    """What :func:`check` refuses in one composed config ``cfg`` made with ``overrides`` (a family option
    outside its declared values, a setting out of range, ...), or None: for a search's values."""
    return _problem(cfg, overrides)


def spec_problem(cfg: DictConfig, gpu: dict | None) -> str | None:
    """Why the single run of the composed config ``cfg`` has no kernel on the GPU ``gpu`` (NVML's
    description, None: none), or None when it has one: :func:`_spec_problem` without asking NVML again
    (a search checks many points of one sweep)."""
    return _spec_problem(cfg, gpu)


_ASK = object()         # _spec_problem: ask NVML for the GPU


def _spec_problem(cfg: DictConfig, gpu=_ASK) -> str | None:
    """Why the single run of ``cfg`` has no kernel: the family's spec refuses the combination or a size
    (SpecError: ``pipeline.stages=100``, ``precision=int8 mma=m16n8k64``, ``'tile.block=[100,128]'``,
    ``'problem.sizes=[]'``) for the target the run would use (with target.arch=auto the GPU's own, as
    NVML reports it, unless backend=static); or None. With tile=auto only the sizes are checked here (the
    tile is chosen per size by the job). In a sweep such a combination is a skipped run of its own
    (experiments.runner.job.run_job)."""
    from ..families import get
    from ..families.runner import family_name, family_shapes, family_spec
    from .kernel import shapes_of, tile_is_auto
    from ..spec import SpecError, value
    from ..gpu.worker import nvml_gpu
    try:
        shapes, fam = shapes_of(cfg), get(family_name(cfg))
        if fam.sized and not shapes:
            family_shapes(fam, None, shapes)        # raises: no size at all
        if not tile_is_auto(cfg):
            gpu = None if value(cfg.backend) == "static" else nvml_gpu() if gpu is _ASK else gpu
            fam, spec = family_spec(cfg, gpu["compute_capability"] if gpu else None)
            family_shapes(fam, spec, shapes if fam.sized else [])
    except SpecError as exc:
        return f"Invalid configuration: {exc}"
    return None


def _root_value_problem(cfg: DictConfig, family: str, overrides: list) -> str | None:
    """A root key of ``family`` with declared values (``Family.root_values``: ktile) given a value outside
    them (``ktile=33``, which no precision takes), naming the override and the valid values; or None."""
    from ..families import get
    for key, valid in get(family).root_values().items():
        v = OmegaConf.select(cfg, key, throw_on_resolution_failure=False)
        if v is not None and not isinstance(v, str) and v not in valid:
            given = next((f" ({o!r})" for o in overrides if o.lstrip("+~").partition("=")[0] == key), "")
            return f"{key}={v} is not valid{given}; valid: {', '.join(map(str, valid))}"
    return None


def _added_key(node, path: str = "") -> tuple | None:
    """(structured type, key) of the first key the structured type of its node does not have (one
    added with '+': Hydra takes it), or None."""
    kind = OmegaConf.get_type(node)
    fields = [f.name for f in dataclasses.fields(kind)] if dataclasses.is_dataclass(kind) else []
    for key in node.keys() if fields else ():
        full = f"{path}.{key}" if path else key
        if key not in fields and full != "hydra":
            return kind, full
        if key in fields and OmegaConf.is_dict(child := node._get_node(key)) \
                and (added := _added_key(child, full)):  # noqa: SLF001
            return added
    return None


def _problem(cfg: DictConfig, overrides: list) -> str | None:
    """check's per-config checks (all but value_problem), or None."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf.nodes import BooleanNode

    from ..families import get, names
    from .kernel import SETTING_KEYS, setting_problem
    if added := _added_key(cfg):
        return f"Unknown key {added[1]!r} (added with '+'); {_keys_of(*added)}"
    parser = OverridesParser.create()
    for text in overrides:
        try:
            override = parser.parse_override(text)
        except Exception:  # noqa: BLE001 - composed already, so Hydra read it
            continue
        key, v = override.key_or_group.lstrip("+~"), override.value()
        if key == "family.name" and v != (OmegaConf.select(cfg, "hydra.runtime.choices.family", default=None)
                                          or DEFAULT):
            valid = names()
            choose = (f"choose it with family={v}, which brings its options (python run.py family={v} --help)"
                      if v in valid else f"choose one with family=NAME; valid: {', '.join(valid)}")
            return f"{text!r} does not choose a family (family.name names the one family= chose); {choose}"
        if override.is_delete() and OmegaConf.select(cfg, key, default=None) is None \
                and OmegaConf.select(OmegaConf.structured(_config()), key, default=None) is not None:
            return removed(key)            # not a preset group without a default (~variant: none)
        parent, _, leaf = key.rpartition(".")
        parent = OmegaConf.select(cfg, parent) if parent else cfg
        node = parent._get_node(leaf) if OmegaConf.is_dict(parent) and leaf in parent else None  # noqa: SLF001
        if isinstance(node, BooleanNode) and not isinstance(v, bool) and v is not None:
            return f"{key}={override.get_value_element_as_str()} is not valid ({text!r}); valid: true, false"
    family = OmegaConf.select(cfg, "family.name", default=None)
    if family is None and (chosen := OmegaConf.select(cfg, "hydra.runtime.choices.family", default=None)):
        return (f"family={chosen} names no family (no family.name): a family preset starts from a family's "
                "schema, as those of conf/family/ do (defaults: [/schema/family/NAME@_here_, _self_]); "
                f"families: {', '.join(names())}")
    if family in names():
        for axis, declared in get(family).axes.items():
            v = OmegaConf.select(cfg, f"family.{axis}", default=None, throw_on_resolution_failure=False)
            v = getattr(v, "value", v)
            if axis != "precision" and str(v).lower() not in {str(d).lower() for d in declared}:
                given = next((f" ({o!r})" for o in overrides if o.lstrip("+~").partition("=")[0]
                              == f"family.{axis}"), "")
                return (f"family.{axis}={v} is not valid for family={family}{given}; valid: "
                        f"{', '.join(map(str, declared))}")
    for key in SETTING_KEYS:
        v = OmegaConf.select(cfg, key, throw_on_resolution_failure=False)
        if problem := setting_problem(key, v):
            return problem
    wait = OmegaConf.select(cfg, "tracking.wait", throw_on_resolution_failure=False)
    if isinstance(wait, (int, float)) and not 0 <= wait <= MAX_WAIT_S:
        return (f"tracking.wait={wait:.10g} is out of range; valid: 0 ... {MAX_WAIT_S} seconds (0: no "
                "waiting for the store's lock; at most SQLite's busy timeout, a 32-bit count of "
                "milliseconds)")
    stale = OmegaConf.select(cfg, "tracking.stale_after_s", throw_on_resolution_failure=False)
    if isinstance(stale, (int, float)) and not 0 < stale < math.inf:
        return (f"tracking.stale_after_s={stale:g} is out of range; valid: more than 0 seconds, finite (a "
                "RUNNING run without a heartbeat this long is closed KILLED and redone)")
    experiment = OmegaConf.select(cfg, "tracking.experiment", throw_on_resolution_failure=False)
    if isinstance(experiment, str) and not experiment.strip():
        return ("tracking.experiment is empty; give a name, e.g. tracking.experiment=ablation, or leave it "
                "out for the default")
    return None
