"""Typed schema of the Hydra config, registered in Hydra's ConfigStore as ``config_schema``.

``conf/config.yaml`` composes it with the groups in ``conf/`` (one per axis that has presets).
OmegaConf validates types on every override: ``ktile=32.5`` or ``precision=int5`` stop before any
work with the key, the value and (for enums) the valid values.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import List, Optional

from hydra.core.config_store import ConfigStore

__all__ = ["Precision", "CacheOp", "Backend", "Config", "register"]


class Precision(Enum):
    fp16 = "fp16"
    bf16 = "bf16"
    int8 = "int8"
    int4 = "int4"


class CacheOp(Enum):
    ca = "ca"   # cp.async.ca: cache in L1 and L2
    cg = "cg"   # cp.async.cg: cache in L2 only (16-byte copies)


class Backend(Enum):
    auto = "auto"      # gpu when one is found, else static
    gpu = "gpu"        # fail if there is no GPU
    static = "static"  # render + ptxas only, even with a GPU


@dataclass
class TileConf:
    block: List[int] = field(default_factory=lambda: [256, 128])   # BM, BN
    warps: List[int] = field(default_factory=lambda: [4, 2])       # warps along M, along N
    group_m: int = 8            # block rasterization: block rows per group (1 = row-major)


@dataclass
class PipelineConf:
    stages: int = 3             # cp.async stages in flight (1 = load, wait, compute)


@dataclass
class EvictionConf:
    cache: CacheOp = CacheOp.cg


@dataclass
class ProblemConf:
    sizes: List[int] = field(default_factory=lambda: [512, 1024, 2048, 4096, 8192])  # square M=N=K
    shapes: List[List[int]] = field(default_factory=list)   # explicit [M, N, K]; replaces sizes


@dataclass
class TargetConf:
    arch: str = "auto"          # auto = the GPU's own sm_XY; sm_90 without a GPU
    ptx_version: str = "auto"   # auto = the lowest the instructions and target need


@dataclass
class TimingConf:
    warmup: int = 3             # launches before timing (the first pays the JIT)
    batches: int = 10           # timed batches; the median batch gives the result
    min_batch_ms: float = 20.0  # launches per batch are chosen so one batch lasts at least this
    max_launches: int = 2000    # upper bound of launches per batch
    cuda_graph: bool = True     # replay the batch as one CUDA graph (no Python launch overhead)
    l2_flush: bool = False      # overwrite a buffer of twice the L2 size before each batch
    timeout_s: float = 600.0    # per problem size, verification + timing; then the run fails


@dataclass
class VerifyConf:
    rtol: float = 1.0e-3        # float types: |C - C_ref| <= rtol * (|A| |B|), element-wise
    seed: Optional[int] = None  # None: fresh random data per run (the seed is logged)


@dataclass
class TrackingConf:
    uri: Optional[str] = None   # default: $MLFLOW_TRACKING_URI, else sqlite:///<project>/outputs/mlflow.db
    experiment: str = "tensor-core-ablations"
    rerun: bool = False         # True: measure again runs already FINISHED for the same kernel, size, GPU


@dataclass
class Config:
    precision: Precision = Precision.fp16
    ktile: int = 32
    mma: str = "auto"           # auto = largest native m16n8kK whose K divides ktile
    backend: Backend = Backend.auto
    tile: TileConf = field(default_factory=TileConf)
    pipeline: PipelineConf = field(default_factory=PipelineConf)
    eviction: EvictionConf = field(default_factory=EvictionConf)
    problem: ProblemConf = field(default_factory=ProblemConf)
    target: TargetConf = field(default_factory=TargetConf)
    timing: TimingConf = field(default_factory=TimingConf)
    verify: VerifyConf = field(default_factory=VerifyConf)
    tracking: TrackingConf = field(default_factory=TrackingConf)


def register() -> None:
    """Store the schema as ``config_schema`` (first in conf/config.yaml's defaults); the presets in
    conf/tile/ and conf/problem/ merge into its typed ``tile`` and ``problem`` nodes."""
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
