"""Variants that a preset lists instead of one file of conf/variant/ each.

A preset of conf/experiment/ names the points of its sweep under ``hydra.callbacks.tracking.variants``,
name -> overrides::

    hydra:
      callbacks:
        tracking:
          variants:
            gen_wgmma: {family: wgmma}
            gen_wgmma_stages_2: {family: wgmma, family.stages: 2, problem.sizes: [2048, 8192]}
      sweeper:
        params:
          precision: fp16,bf16,int8,fp8_e4m3

Each entry becomes an option of the config group ``variant``, the same config a file
``conf/variant/<name>.yaml`` would hold (a key naming a config group, ``family``, ``tile`` or
``problem``, chooses its preset; every other key, dotted or nested, sets a value), stored in Hydra's
ConfigStore by :func:`register`. So ``variant=gen_wgmma_stages_2`` selects one point anywhere, as a
file did, and the sweep of the preset sweeps them all: at its start
(:func:`experiments.runner.sweep.sweep_variants`) ``variant=<the names in order>`` joins the preset's
``hydra.sweeper.params`` after its own keys, and Hydra's basic sweeper runs every point with every
combination of those (above: 4 precisions x 2 points). Named study kernels keep their files in
conf/variant/ (``study_kernel: ...``).

run.py calls :func:`register` after :func:`experiments.config.register`, as must any program that
composes the config with a listed variant; the job processes of a parallel launcher get them with
Hydra's state. One sweep key over the points keeps Hydra's basic sweeper, which experiments.runner.sweep
counts and names sweeps with; the list sweepers for Hydra zip lists of values (no group choice per
point) or replace the basic sweeper.
"""
from __future__ import annotations

import dataclasses
import functools
import re
import typing
from pathlib import Path

import yaml
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from ..config import Config, family_schema
from ..families import DEFAULT

__all__ = ["VariantError", "KEY", "GROUPS", "variant_node", "listed", "register", "names", "swept_params"]

CONF = Path(__file__).resolve().parents[2] / "conf"
KEY = "hydra.callbacks.tracking.variants"     # where a preset lists its variants
GROUPS = ("family", "tile", "problem")        # keys that choose a preset of conf/<group>/ by its name
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


class VariantError(ValueError):
    """A listed variant that cannot be a config: the message names the preset, the entry and the key,
    and what would be valid."""


def variant_node(name: str, entry, where: str, dirs: tuple = (CONF,), typed: bool = False) -> dict:
    """The config of the listed variant ``name`` (its ``entry``: a mapping of overrides, or None for
    none) as a file of conf/variant/ would hold it: ``defaults`` with ``override /<group>: <preset>``
    for each key of :data:`GROUPS` given a name, every other key as a nested value. ``where`` names
    the preset in messages; ``dirs``: the config folders whose group presets may be chosen.

    Raises VariantError for a name Hydra cannot take as an option, an entry that is not a mapping, a
    key the config does not have (the valid ones listed; ``tracking.*``, set once for a whole sweep,
    and ``family.name``, chosen with ``family: NAME``), a preset a group does not have, and with
    ``typed`` a value of the wrong type for its key (OmegaConf's message; some 30 ms a variant, so a
    sweep checks them at its start, and a job's composition does anyway)."""
    at = f"{where}: variant {name}"
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise VariantError(f"{where}: variant name {name!r}: use letters, digits, '_', '.' and '-' (the "
                           "name selects it: variant=NAME)")
    if entry is None:
        entry = {}
    if not isinstance(entry, dict):
        raise VariantError(f"{at}: {entry!r} is not a mapping of overrides; give one, e.g. "
                           f"{name}: {{family: wgmma, problem.sizes: [2048, 8192]}} ({{}} for none)")
    flat = _flatten(entry)
    defaults, values = [], {}
    for key, value in flat.items():
        if key in GROUPS and isinstance(value, str):
            options = sorted({p.stem for d in dirs for p in (Path(d) / key).glob("*.yaml")})
            if value not in options:
                raise VariantError(f"{at}: {key}: {value} is not a preset of conf/{key}/; valid: "
                                   f"{', '.join(options)}")
            defaults.append({f"override /{key}": value})
        else:
            values[key] = value
    family = next((d["override /family"] for d in defaults if "override /family" in d), DEFAULT)
    for key in values:
        if problem := _key_problem(key, family):
            raise VariantError(f"{at}: {problem}")
    node: dict = {"defaults": defaults} if defaults else {}
    for key, value in values.items():
        *path, last = key.split(".")
        at_node = node
        for part in path:
            at_node = at_node.setdefault(part, {})
        at_node[last] = value
    if typed:
        _check_types(at, node, family)
    return node


def _flatten(entry: dict, prefix: str = "") -> dict:
    """``entry`` with nested mappings as dotted keys ({loader: {a: x4}} is {loader.a: x4})."""
    out = {}
    for key, value in entry.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _key_problem(key: str, family: str) -> str | None:
    """Why the dotted ``key`` is no key a variant of ``family`` can set, with the valid ones; or None."""
    nodes = _hints()
    top, _, rest = key.partition(".")
    if top == "tracking":
        return (f"{key}: a sweep is tracked in one store and experiment, set once for all its jobs: give "
                "tracking.* on the command line instead")
    if top not in nodes:
        return f"unknown key {key!r}; valid: {', '.join(sorted(k for k in nodes if k != 'tracking'))}"
    if top == "family":
        options = [f"family.{k}" for k in family_schema(family).__dataclass_fields__ if k != "name"]
        if rest == "name" or not rest:
            return f"{key}: choose the family by its name (family: wgmma), then set its options (family.KEY)"
        if f"family.{rest}" not in options:
            valid = ", ".join(options) or f"none (family={DEFAULT} is set by the root keys)"
            return f"family={family} has no option {rest!r} ({key}); valid: {valid}"
        return None
    node = nodes[top]
    if dataclasses.is_dataclass(node):
        fields = ", ".join(f"{top}.{f.name}" for f in dataclasses.fields(node))
        if not rest:
            named = f"a preset of conf/{top}/ by its name, or " if top in GROUPS else ""
            return f"{top}: give {named}its keys ({top}.KEY: VALUE); valid: {fields}"
        if f"{top}.{rest}" not in fields.split(", "):
            return f"{top} has no key {rest!r} ({key}); valid: {fields}"
    elif rest:
        return f"{top} takes a value, not keys ({key}); give {top}: VALUE"
    return None


@functools.cache
def _hints() -> dict:
    """The config's keys and their types (Config's fields)."""
    return typing.get_type_hints(Config)


def _check_types(at: str, node: dict, family: str) -> None:
    """VariantError when a value of ``node`` does not fit its key's type (OmegaConf's message)."""
    base = OmegaConf.structured(Config)
    with open_dict(base):
        base.family = OmegaConf.structured(family_schema(family))
    try:
        OmegaConf.merge(base, {k: v for k, v in node.items() if k != "defaults"})
    except OmegaConfBaseException as exc:
        raise VariantError(f"{at}: {getattr(exc, 'full_key', '')}: {str(exc).splitlines()[0]}") from None


def listed(dirs: tuple = (CONF,)) -> dict:
    """The variants the presets of ``experiment/`` in the config folders ``dirs`` list: name -> (the
    preset's file, its config as :func:`variant_node` makes it), in the order of the files and of
    their entries. Raises VariantError for a bad entry, and for a name that is also a file of
    ``variant/`` or that two presets list (one option per name)."""
    files = {p.stem: p for d in dirs for p in sorted((Path(d) / "variant").glob("*.yaml"))}
    out: dict = {}
    for d in dict.fromkeys(Path(d).resolve() for d in dirs):      # a folder given twice: once
        for path in sorted((Path(d) / "experiment").glob("*.yaml")):
            entries = _load(path)
            for part in KEY.split("."):
                entries = entries.get(part) if isinstance(entries, dict) else None
            if entries is None:
                continue
            where = f"{path.parent.name}/{path.name}"
            if not isinstance(entries, dict):
                raise VariantError(f"{where}: {KEY} is not a mapping of variant names to overrides")
            for name, entry in entries.items():
                other = files.get(name) or out.get(name, (None,))[0]
                if other is not None:
                    raise VariantError(f"{where}: variant {name} is also {other.parent.name}/{other.name}; "
                                       "give it another name")
                out[name] = (path, variant_node(name, entry, where, dirs))
    return out


def _load(path: Path) -> dict:
    """A preset's YAML (libyaml's parser where PyYAML has it: every command reads every preset). Raises
    VariantError naming the file, the problem and where (:func:`file_problem`) for one that cannot be
    read as YAML."""
    try:
        return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    except (yaml.YAMLError, UnicodeDecodeError):
        raise VariantError(file_problem(path) or f"{path} cannot be read") from None


def file_problem(path: Path) -> str | None:
    """Why the config file ``path`` is not one Hydra can load: not UTF-8 text, not YAML (the parser's
    problem, line and column; a key given twice, which OmegaConf's loader refuses), or YAML whose top is
    not a mapping; None when it loads (or cannot be read: Hydra's own message follows)."""
    from omegaconf._utils import get_yaml_loader
    try:
        loaded = yaml.load(path.read_text(encoding="utf-8"), Loader=get_yaml_loader())
    except UnicodeDecodeError as exc:
        return f"{path} is not UTF-8 text (byte {exc.start}); a preset is a YAML file"
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        return f"{path} is not valid YAML: {getattr(exc, 'problem', None) or exc}{where}; fix the file"
    except OSError:
        return None
    if loaded is not None and not isinstance(loaded, dict):
        return (f"{path} holds one value ({type(loaded).__name__}), not a mapping of keys to values; fix "
                "the file")
    return None


def register(variants: dict | None = None, where: str = "", dirs: tuple = (CONF,)) -> list:
    """Store variants as options of the config group ``variant`` (Hydra's ConfigStore, package
    ``_global_``, as a file of conf/variant/): ``variants`` (name -> overrides, as a preset lists
    them; ``where`` names the preset in messages; their values' types checked too), or when None
    those every preset of ``dirs`` lists (:func:`listed`). Returns their names in order; raises
    VariantError for a bad entry."""
    nodes = ({n: node for n, (_, node) in listed(dirs).items()} if variants is None
             else {n: variant_node(n, e, where, dirs, typed=True) for n, e in variants.items()})
    store = ConfigStore.instance()
    for name, node in nodes.items():
        store.store(group="variant", name=name, node=node, package="_global_")
    return list(nodes)


def names(preset: dict) -> list:
    """The names of the variants ``preset`` (a preset's YAML, loaded) lists (:data:`KEY`), in order."""
    for part in KEY.split("."):
        preset = preset.get(part) if isinstance(preset, dict) else None
    return list(preset) if isinstance(preset, dict) else []


def swept_params(preset: dict) -> dict:
    """What a sweep of ``preset`` (its YAML, loaded) sweeps: ``hydra.sweeper.params`` and, after them,
    ``variant`` over the variants it lists, as :func:`experiments.runner.sweep.sweep_variants` adds it at the
    sweep's start."""
    params = dict(((preset.get("hydra") or {}).get("sweeper") or {}).get("params") or {})
    if listed_names := names(preset):
        params["variant"] = ",".join(listed_names)
    return params
