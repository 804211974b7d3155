"""Typed schema of the Hydra config, registered in Hydra's ConfigStore as ``config_schema``.

``conf/config.yaml`` composes it with the groups in ``conf/`` (one per axis that has presets).
OmegaConf validates types on every override: ``ktile=32.5`` or ``precision=int5`` stop before any
work with the key, the value and (for enums) the valid values.
"""
from __future__ import annotations

from dataclasses import dataclass, field, is_dataclass, make_dataclass
from enum import Enum
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore

from .dtypes import DType
from .gpu.verify import Data

__all__ = ["Precision", "Backend", "Regime", "Data", "Config", "register", "family_schema"]


def _precisions() -> dict:
    """Every precision some family takes: the element types (:class:`experiments.dtypes.DType`), then
    the values a family adds that are not element types (``copy``: the peak family's copy bandwidth)."""
    from .families import get, names
    out = {d.name: d.name for d in DType}
    for name in names():
        out.update({str(p): str(p) for p in get(name).axes["precision"] if str(p) not in out})
    return out


# the ``precision`` key's values (fp16, ..., fp8_e5m2, copy), derived from experiments.dtypes
Precision = Enum("Precision", _precisions(), module=__name__)


class Backend(Enum):
    auto = "auto"      # gpu when one is found, else static
    gpu = "gpu"        # fail if there is no GPU
    static = "static"  # render + ptxas only, even with a GPU


@dataclass
class ProblemConf:
    sizes: List[int] = field(default_factory=lambda: [512, 1024, 2048, 4096, 8192])  # square M=N=K
    shapes: List[List[int]] = field(default_factory=list)   # explicit [M, N, K]; replaces sizes


@dataclass
class TargetConf:
    arch: str = "auto"          # auto = the GPU's own sm_XY; sm_90 without a GPU
    ptx_version: str = "auto"   # auto = the lowest the instructions and target need


class Regime(Enum):
    sustained = "sustained"   # long batches: a large GEMM reaches the GPU's power cap (today's figures)
    burst = "burst"           # a short window on a GPU that has idled back


@dataclass
class TimingConf:
    warmup: int = 3             # launches before timing (the first pays the JIT)
    batches: int = 10           # timed batches; the median batch gives the result
    min_batch_ms: float = 20.0  # launches per batch are chosen so one batch lasts at least this
    max_launches: int = 2000    # upper bound of launches per batch
    cuda_graph: bool = True     # replay the batch as one CUDA graph (no Python launch overhead)
    l2_flush: bool = False      # overwrite a buffer of twice the L2 size before each batch
    timeout_s: float = 600.0    # per problem size, verification + timing; then the run fails
    # sustained: the batches above (a long GEMM runs at the power-capped clock); burst: wait for the GPU
    # to idle back, then a short window (experiments.gpu.timing); in the run key only when burst
    regime: Regime = Regime.sustained
    repeats: int = 1            # replicates of the whole timed measurement, apart in time (run key: when > 1)
    repeat_pause_s: float = 1.0  # idle GPU before each replicate after the first (sustained)
    burst_batches: int = 5      # burst: timed batches ...
    burst_batch_ms: float = 4.0  # ... of at least this long each (tens of ms in all)
    idle_wait_s: float = 10.0   # burst: the longest wait for the GPU to idle back (then it times anyway)
    idle_s: float = 1.0         # burst: how long its power must stay near idle first


@dataclass
class LaunchConf:
    blocks_per_sm: int = 0      # 0: as many as fit; N: at most N resident blocks per SM, by extra dynamic
                                # shared memory at launch (the kernel's instructions unchanged)


@dataclass
class VerifyConf:
    rtol: float = 1.0e-3        # float types: |C - C_ref| <= rtol * (|A| |B|), element-wise
    seed: Optional[int] = None  # None: fresh random data per run (the seed is logged)


@dataclass
class TrackingConf:
    uri: Optional[str] = None   # default: $MLFLOW_TRACKING_URI, else sqlite:///<project>/outputs/mlflow.db
    experiment: str = "tensor-core-ablations"
    rerun: bool = False         # True: measure again runs already FINISHED for the same kernel, size, GPU
    wait: float = 30.0          # seconds a write to a SQLite store waits for another process's write lock
    stale_after_s: float = 300.0    # a RUNNING run without a heartbeat this long: closed KILLED, redone


def _make_schema(name: str) -> type:
    from .families import get
    fam = get(name)
    fields = [("name", str, field(default=name))]
    for axis, values in fam.axes.items():
        if axis == "precision":
            continue
        default = fam.defaults.get(axis, values[0])
        if set(map(str, values)) == {"true", "false"}:   # a switch: typed bool (Hydra parses true/false)
            fields.append((axis, bool, field(default=str(default) == "true")))
            continue
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            # a number: typed int, shown as one (bn: 256); the values are checked at the sweep's start
            # (experiments.runner.validate) and by the family's spec (SpecError naming them) for every config
            fields.append((axis, int, field(default=int(default))))
            continue
        enum = Enum(f"{name}_{axis}", {str(v): v for v in values}, module=__name__)
        # importable by name: configs pickle (joblib, submitit, the composition cache of runner.sweep)
        globals()[enum.__name__] = enum
        fields.append((axis, enum, field(default=enum[str(default)])))
    schema = make_dataclass("".join(w.capitalize() for w in name.split("_")) + "Conf", fields)
    schema.__module__ = __name__
    globals()[schema.__name__] = schema
    return schema


def family_schema(name: str) -> type:
    """Typed options of family ``name``, derived from its declared axes (``experiments.families``):
    a dataclass with ``name`` and one field per axis other than precision, default as the family
    declares it. A true/false axis is a bool, an axis of integers an int (``family.bn=128``; its values
    are checked by ``experiments.runner.validate`` and the family's ``spec``), any other an Enum of its
    values,
    so that ``family.block=99x99`` stops before any work with the valid values. The classes are made once,
    when this module is imported. Raises KeyError for an unknown family."""
    return _SCHEMAS[name]


def _make_config() -> type:
    """The root of the schema: the shared keys and the root keys families declare
    (:meth:`experiments.families.Family.root_fields`: the default family's ktile, ..., cache), in the
    order ``--cfg job`` shows them: a family's scalars after ``precision``, its sections before
    ``problem``."""
    from .families import get, names
    declared = [f for n in names() for f in get(n).root_fields()]
    scalars = [f for f in declared if not is_dataclass(f[1])]
    sections = [f for f in declared if is_dataclass(f[1])]
    fields = [
        ("family", Any, field(default=None)),     # conf/family/<name>.yaml: name and typed options
        ("precision", Precision, field(default=Precision.fp16)),
        *scalars,
        ("backend", Backend, field(default=Backend.auto)),
        # what A and B hold (experiments.gpu.verify.Data); full: today's operands
        ("data", Data, field(default=Data.full)),
        # the published kernel a variant reproduces (docs/l4_mapping.md)
        ("study_kernel", Optional[str], field(default=None)),
        *sections,
        ("problem", ProblemConf, field(default_factory=ProblemConf)),
        ("target", TargetConf, field(default_factory=TargetConf)),
        ("timing", TimingConf, field(default_factory=TimingConf)),
        ("launch", LaunchConf, field(default_factory=LaunchConf)),
        ("verify", VerifyConf, field(default_factory=VerifyConf)),
        ("tracking", TrackingConf, field(default_factory=TrackingConf)),
    ]
    config = make_dataclass("Config", fields)
    config.__module__ = __name__
    return config


Config = _make_config()


def _all_schemas() -> dict:
    from .families import names
    return {n: _make_schema(n) for n in names()}


_SCHEMAS = _all_schemas()     # made once per process; read-only after


def _singleton_copy(store: ConfigStore, memo: dict) -> ConfigStore:
    return store


def register() -> None:
    """Store the schema as ``config_schema`` (first in conf/config.yaml's defaults); the presets in
    conf/tile/ and conf/problem/ merge into its typed ``tile`` and ``problem`` nodes, those in
    conf/experiment/ and conf/variant/ (``# @package _global_``) into the root. Each family's typed
    options are stored as ``schema/family/<name>``, which ``conf/family/<name>.yaml`` extends.

    A deep copy of the ConfigStore is the ConfigStore itself: Hydra 1.3 deep-copies its config
    repository, and with it the store, for every group it lists and every config it composes
    (``CachingConfigRepository``); ``--help`` listed 90 groups in 2.0 CPU-s, now 0.7. Hydra's main
    branch stopped holding the store there (facebookresearch/hydra#2928, not in a 1.3 release)."""
    ConfigStore.__deepcopy__ = _singleton_copy
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    for name, schema in _SCHEMAS.items():     # conf/family/<name>.yaml extends schema/family/<name>
        cs.store(group="schema/family", name=name, node=schema)
