"""Facts the default family (``experiments.families.DEFAULT``) is built from, each in one table: element
types, accumulators, target architectures and the domains of the axes.

Sources: PTX ISA 9.0, section 9.7.14.5 (``mma.sync.aligned`` shapes and types; FP8 ``.e4m3``/``.e5m2``
since PTX ISA 8.4, sm_89), 9.7.14.5.15 (``ldmatrix``), 9.7.9.25.3.1 (``cp.async``, ``.L2::cache_hint``
since PTX ISA 7.4), 9.7.9.18 (``createpolicy``, PTX ISA 7.4, sm_80), 13 (release notes: ``.target``
sm_86 7.1, sm_89/sm_90 7.8, sm_100 8.6, sm_120 8.7); CUDA Programming Guide, "Technical Specifications
per Compute Capability" (shared memory, warps and blocks per SM). Every minimum was also checked with
``ptxas 13.0``, which names the version or target a feature needs when it is missing.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

__all__ = ["Precision", "PRECISIONS", "Accumulator", "ACCUMULATORS", "ArchLimits", "ARCHS", "KTILES",
           "LOADERS", "CACHE_OPS", "L2_HINTS", "B_LAYOUTS", "SMEM_LAYOUTS", "MAX_STAGES", "GROUP_M_RANGE",
           "tile_presets"]


@dataclass(frozen=True)
class Precision:
    """Element type of A and B as ``mma.sync`` names it.

    sass_mma: (opcode, modifier it must carry, modifiers it must not carry) of the tensor-core SASS
    instruction that executes this type natively, e.g. ("IMMA", "S4", ()) for ``IMMA.16864.S4.S4``.
    """
    name: str          # config value
    bits: int          # bits per element in global and shared memory
    ptx: str           # PTX type of A/B in mma.sync
    acc: str           # default accumulator (C type)
    accs: tuple        # accumulators mma.sync offers with this type (and this template supports)
    mma_k: tuple       # K of the native m16n8kK shapes, ascending
    is_float: bool
    min_arch: int      # lowest compute capability (x10) of mma.sync with this type
    min_ptx: tuple     # lowest PTX ISA of mma.sync with this type
    sass_mma: tuple


PRECISIONS = {p.name: p for p in (
    Precision("fp16", 16, "f16", "f32", ("f32", "f16"), (8, 16), True, 80, (7, 0),
              ("HMMA", "", ("BF16", "TF32"))),
    Precision("bf16", 16, "bf16", "f32", ("f32",), (8, 16), True, 80, (7, 0), ("HMMA", "BF16", ())),
    Precision("int8", 8, "s8", "s32", ("s32",), (16, 32), False, 80, (7, 0), ("IMMA", "S8", ())),
    Precision("int4", 4, "s4", "s32", ("s32",), (32, 64), False, 80, (7, 0), ("IMMA", "S4", ())),
    Precision("fp8_e4m3", 8, "e4m3", "f32", ("f32",), (32,), True, 89, (8, 4), ("QMMA", "E4M3", ())),
    Precision("fp8_e5m2", 8, "e5m2", "f32", ("f32",), (32,), True, 89, (8, 4), ("QMMA", "E5M2", ())),
)}


@dataclass(frozen=True)
class Accumulator:
    """C and D of mma.sync: PTX type, NumPy dtype of C in memory, bytes per element, registers
    per thread for one m16n8 tile (PTX ISA 9.7.14.5.x, "Matrix Fragments for mma.m16n8kK")."""
    name: str
    ptx: str
    c_dtype: str
    c_bytes: int
    regs_per_tile: int


ACCUMULATORS = {a.name: a for a in (
    Accumulator("f32", "f32", "float32", 4, 4),
    Accumulator("s32", "s32", "int32", 4, 4),
    Accumulator("f16", "f16", "float16", 2, 2),      # two .f16x2 registers per thread
)}


@dataclass(frozen=True)
class ArchLimits:
    """Per-SM and per-block limits of one compute capability (CUDA Programming Guide)."""
    sm: int                     # e.g. 90
    min_ptx: tuple              # lowest PTX ISA that accepts `.target sm_XX`
    max_smem_block: int         # opt-in dynamic shared memory per block, bytes
    smem_sm: int                # shared memory per SM usable by blocks, bytes
    max_warps_sm: int
    max_blocks_sm: int
    regs_sm: int = 65536
    max_regs_thread: int = 255
    smem_reserved_block: int = 1024   # reserved by the system per resident block
    reg_alloc_unit: int = 256         # registers, per warp
    smem_alloc_unit: int = 128        # bytes


ARCHS = {
    "sm_80": ArchLimits(80, (7, 0), 163 * 1024, 164 * 1024, 64, 32),
    "sm_86": ArchLimits(86, (7, 1), 99 * 1024, 100 * 1024, 48, 16),
    "sm_89": ArchLimits(89, (7, 8), 99 * 1024, 100 * 1024, 48, 24),
    "sm_90": ArchLimits(90, (7, 8), 227 * 1024, 228 * 1024, 64, 32),
    # the arch-specific target (wgmma, setmaxnreg; PTX ISA 8.0): the same chip, the same limits
    "sm_90a": ArchLimits(90, (8, 0), 227 * 1024, 228 * 1024, 64, 32),
    "sm_100": ArchLimits(100, (8, 6), 227 * 1024, 228 * 1024, 64, 32),
    "sm_120": ArchLimits(120, (8, 7), 99 * 1024, 100 * 1024, 48, 32),
}

KTILES = (16, 32, 64, 128)
# shared -> register loader of one operand: ldmatrix with 1, 2 or 4 8x8 matrices, or scalar ld.shared
# of single elements (bytes for 4-bit types) packed into the fragment registers
LOADERS = ("x1", "x2", "x4", "manual")
CACHE_OPS = ("ca", "cg")
L2_HINTS = ("none", "evict_first", "evict_last", "evict_normal")
B_LAYOUTS = ("col", "row")
# shared-memory rows of a stage: "padded" (16 bytes after each row, so the 8 row addresses of an ldmatrix
# fall in 8 bank groups) or "swizzled" (no padding, the 16-byte chunk index XORed with bits of the row:
# the patterns of TMA's 32B/64B/128B swizzles, Geometry.swizzle; conflict-free too, and no row straddles
# a 128-byte line)
SMEM_LAYOUTS = ("padded", "swizzled")
# cp.async.wait_group N compiles to `DEPBAR.LE SB0, N`, whose counter holds at most 63 (ptxas 13.0
# clamps larger N to 63): S stages wait with N = S - 2, so at most 65 stages can be in flight.
MAX_STAGES = 65
GROUP_M_RANGE = (1, 64)

_TILE_DIR = Path(__file__).resolve().parent.parent / "conf" / "tile"


@lru_cache(maxsize=1)
def tile_presets() -> dict:
    """The presets of ``conf/tile/*.yaml``: name -> (BM, BN, warps along M, warps along N)."""
    from omegaconf import OmegaConf
    out = {}
    for path in sorted(_TILE_DIR.glob("*.yaml")):
        c = OmegaConf.load(path)
        out[path.stem] = (int(c.block[0]), int(c.block[1]), int(c.warps[0]), int(c.warps[1]))
    return out


def tile_group_m() -> dict:
    """The presets of ``conf/tile/*.yaml`` that set ``group_m``: name -> group_m (e.g. l4_32x64: 1)."""
    from omegaconf import OmegaConf
    return {path.stem: int(c.group_m) for path in sorted(_TILE_DIR.glob("*.yaml"))
            if "group_m" in (c := OmegaConf.load(path))}
