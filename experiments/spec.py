"""KernelSpec: one fully resolved, validated point of the ablation space.

Every axis value is checked here, before anything is rendered, so that an impossible
combination stops with a message naming the axis, the value and the valid values.
Sources: PTX ISA 9.0, section 9.7.14.5 (``mma.sync.aligned`` shapes and types),
9.7.9.25 (``cp.async``), 9.7.14.5.15 (``ldmatrix``); CUDA C Programming Guide,
"Compute Capabilities" table (shared memory per block, registers, warps per SM).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum

__all__ = [
    "PRECISIONS", "ARCHS", "SpecError", "KernelSpec", "Precision", "ArchLimits",
    "valid_ktiles", "spec_from_config", "resolve_arch",
]


class SpecError(ValueError):
    """An axis value that cannot exist; the message names key, value and the valid values."""


@dataclass(frozen=True)
class Precision:
    """Element type of A and B as the PTX ``mma`` instruction names it."""
    name: str          # config value
    bits: int          # bits per element in global/shared memory
    ptx: str           # PTX type of A/B in mma.sync (f16, bf16, s8, s4)
    acc: str           # accumulator / C type (f32 or s32)
    mma_k: tuple       # native K of m16n8kK shapes, ascending (PTX ISA 9.7.14.5)
    is_float: bool


PRECISIONS = {
    "fp16": Precision("fp16", 16, "f16", "f32", (8, 16), True),
    "bf16": Precision("bf16", 16, "bf16", "f32", (8, 16), True),
    "int8": Precision("int8", 8, "s8", "s32", (16, 32), False),
    "int4": Precision("int4", 4, "s4", "s32", (32, 64), False),
}


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
}

KTILES = (16, 32, 64, 128)
CACHE_OPS = ("ca", "cg")
MAX_STAGES = 4


def resolve_arch(arch: str, gpu_cc: int | None) -> str:
    """``auto`` -> the GPU's own ``sm_XY`` (or ``sm_90`` without a GPU); else validate the name.

    Raises SpecError for an unknown architecture, naming the supported ones.
    """
    if arch == "auto":
        arch = f"sm_{gpu_cc}" if gpu_cc else "sm_90"
    if arch not in ARCHS:
        raise SpecError(f"target.arch={arch!r} is not supported; valid: auto, {', '.join(ARCHS)}")
    return arch


def valid_ktiles(prec: Precision) -> list[int]:
    """K-tile depths (elements) this template accepts for a precision.

    A stage row holds ``ktile * bits / 8`` bytes, copied in 16-byte ``cp.async`` chunks and read
    by ``ldmatrix`` in 16-byte rows: it must be a power of two of at least 16 bytes.
    """
    return [k for k in KTILES if k * prec.bits // 8 >= 16 and k % prec.mma_k[0] == 0]


@dataclass(frozen=True)
class KernelSpec:
    """One kernel of the ``mma_sync_gemm`` family, every axis resolved.

    Derived properties give the numbers the template needs (warp tile, fragments, bytes).
    Build it with :func:`spec_from_config`, which validates; direct construction also validates.
    """
    precision: str
    ktile: int
    mma_k: int
    bm: int
    bn: int
    warps_m: int
    warps_n: int
    stages: int
    cache_op: str
    arch: str
    ptx_version: tuple = field(default=(0, 0))
    group_m: int = 8

    def __post_init__(self):
        _validate(self)

    # -- derived quantities --------------------------------------------------------------
    @property
    def prec(self) -> Precision:
        return PRECISIONS[self.precision]

    @property
    def mma_shape(self) -> str:
        return f"m16n8k{self.mma_k}"

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    @property
    def warp_tile(self) -> tuple[int, int]:
        """(rows, cols) of C computed by one warp."""
        return self.bm // self.warps_m, self.bn // self.warps_n

    @property
    def row_bytes(self) -> int:
        """Bytes of one A (or B) row in one K stage."""
        return self.ktile * self.prec.bits // 8

    @property
    def mma_k_bytes(self) -> int:
        """Bytes of K consumed by one mma.sync (16 or 32)."""
        return self.mma_k * self.prec.bits // 8

    @property
    def smem_stride(self) -> int:
        """Shared-memory row pitch in bytes. 16-byte rows pack 8 rows into 128 B (conflict-free);
        longer rows get 16 B of padding so 8 ldmatrix row addresses fall in 8 different bank groups."""
        return 16 if self.row_bytes == 16 else self.row_bytes + 16

    @property
    def stage_bytes(self) -> int:
        return (self.bm + self.bn) * self.smem_stride

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory per block, bytes."""
        return self.stages * self.stage_bytes

    @property
    def entry(self) -> str:
        """PTX entry name, unique per spec (DESIGN.md, Kernel contract)."""
        return (f"gemm_{self.precision}_bk{self.ktile}_{self.mma_shape}_ldx4x2_{self.cache_op}_bcol"
                f"_s{self.stages}_{self.bm}x{self.bn}_w{self.warps_m}x{self.warps_n}_g{self.group_m}")

    def as_kwargs(self) -> dict:
        """Constructor arguments (picklable), e.g. to rebuild the spec in the GPU worker."""
        return asdict(self)

    def flat(self) -> dict:
        """Plain dict of the axes (for tracking)."""
        d = asdict(self)
        d["ptx_version"] = "%d.%d" % self.ptx_version
        d["mma"] = self.mma_shape
        return d

    def check_problem(self, m: int, n: int, k: int) -> None:
        """Raise SpecError unless M, N, K fit this kernel: multiples of BM, BN, BK (no tails)
        and below 2^31 bytes per operand row/offset."""
        bad = [f"{name}={v} is not a multiple of {name_t}={t}"
               for name, v, name_t, t in (("M", m, "BM", self.bm), ("N", n, "BN", self.bn),
                                          ("K", k, "BK", self.ktile)) if v <= 0 or v % t]
        if bad:
            raise SpecError(f"{self.entry} handles no tails: " + "; ".join(bad)
                            + ". Choose problem sizes that are multiples of the block tile.")
        if max(m, n) * k * self.prec.bits // 8 >= 2 ** 32 or m * n * 4 >= 2 ** 40:
            raise SpecError(f"problem {m}x{n}x{k} is too large for 32-bit offsets in {self.entry}")


def _choose(key: str, value, valid, given: str = "") -> None:
    if value not in valid:
        raise SpecError(f"{key}={value} is not valid{' with ' + given if given else ''}; valid values: "
                        + ", ".join(str(v) for v in valid))


def _validate(s: KernelSpec) -> None:
    _choose("precision", s.precision, list(PRECISIONS))
    p = PRECISIONS[s.precision]
    _choose("ktile", s.ktile, valid_ktiles(p), f"precision={s.precision}")
    shapes = [f"m16n8k{k}" for k in p.mma_k]
    _choose("mma", f"m16n8k{s.mma_k}", shapes, f"precision={s.precision}")
    if s.ktile % s.mma_k:
        ok = [f"m16n8k{k}" for k in p.mma_k if s.ktile % k == 0]
        raise SpecError(f"mma=m16n8k{s.mma_k} does not divide ktile={s.ktile}: ktile must be a "
                        f"multiple of the MMA's K; valid mma for ktile={s.ktile}: {', '.join(ok)}")
    _choose("eviction.cache", s.cache_op, CACHE_OPS)
    _choose("pipeline.stages", s.stages, list(range(1, MAX_STAGES + 1)))
    _choose("target.arch", s.arch, list(ARCHS))
    for key, v in (("tile.block", (s.bm, s.bn)), ("tile.warps", (s.warps_m, s.warps_n))):
        if min(v) <= 0:
            raise SpecError(f"{key}={list(v)} must be positive")
    wm, wn = s.warp_tile
    if s.bm % s.warps_m or s.bn % s.warps_n or wm % 16 or wn % 8:
        raise SpecError(
            f"tile.block={[s.bm, s.bn]} with tile.warps={[s.warps_m, s.warps_n]} gives a warp tile "
            f"of {s.bm / s.warps_m:g}x{s.bn / s.warps_n:g}; it must be a multiple of 16x8 "
            "(m16n8 MMA tiles). Valid examples: block [128,128] warps [2,4]; [64,64] [2,2].")
    if not 1 <= s.group_m <= 64:
        raise SpecError(f"tile.group_m={s.group_m} must be between 1 (row-major) and 64")
    if s.threads > 1024:
        raise SpecError(f"tile.warps={[s.warps_m, s.warps_n]} gives {s.threads} threads; at most 1024")
    if s.row_bytes == 16 and ((wm // 16) % 2 or (wn // 8) % 2):
        raise SpecError(
            f"ktile={s.ktile} gives 16-byte rows, read with ldmatrix.x4 over two m16 tiles and .x2 "
            f"over two n8 tiles; the warp tile {wm}x{wn} needs an even number of both. "
            "Use a larger ktile or a warp tile of 32x16 multiples.")
    acc, frags = (wm // 16) * (wn // 8) * 4, 2 * ((wm // 16) * 4 + (wn // 8) * 2)
    if acc + frags > 224:
        raise SpecError(f"warp tile {wm}x{wn} needs {acc} accumulator and {frags} fragment registers "
                        "per thread; more than 224 leave too few of the 255 for addresses. Use more warps.")
    lim = ARCHS[s.arch]
    if s.smem_bytes > lim.max_smem_block:
        raise SpecError(
            f"{s.entry} needs {s.smem_bytes} bytes of shared memory per block "
            f"({s.stages} stages x {s.stage_bytes} B); {s.arch} allows {lim.max_smem_block}. "
            "Reduce pipeline.stages, ktile or tile.block.")
    need = _min_ptx(s)
    if s.ptx_version == (0, 0):
        object.__setattr__(s, "ptx_version", need)
    elif s.ptx_version < need:
        raise SpecError(f"target.ptx_version={'%d.%d' % s.ptx_version} is below "
                        f"{'%d.%d' % need}, the lowest that {s.arch} and mma.{s.mma_shape}.{p.ptx} need")


def _min_ptx(s: KernelSpec) -> tuple:
    """Lowest PTX ISA version for the instructions used (PTX ISA, 'PTX ISA Notes' of each
    instruction): cp.async 7.0, ldmatrix 6.5, mma m16n8k16/k32/k64 and bf16 7.0, m16n8k8 f16 6.5;
    and for the `.target` (sm_80 7.0, sm_86 7.1, sm_89/sm_90 7.8)."""
    return max((7, 0), ARCHS[s.arch].min_ptx)


def _parse_version(v: str) -> tuple:
    if v == "auto":
        return (0, 0)
    try:
        major, minor = (int(x) for x in str(v).split("."))
    except ValueError:
        raise SpecError(f"target.ptx_version={v!r} must be 'auto' or MAJOR.MINOR, e.g. 7.8") from None
    return (major, minor)


def value(v) -> str:
    """Config value as its plain string (Enum members by name)."""
    return v.name if isinstance(v, Enum) else str(v)


def spec_from_config(cfg, gpu_cc: int | None = None) -> KernelSpec:
    """Build and validate a KernelSpec from the composed Hydra config (see ``experiments.config``).

    ``gpu_cc`` is the compute capability as an int (90 for an H200) or None without a GPU.
    Raises SpecError naming the axis, the value and the valid values.
    """
    p = PRECISIONS.get(value(cfg.precision))
    if p is None:
        _choose("precision", value(cfg.precision), list(PRECISIONS))
    ktile = int(cfg.ktile)
    mma = str(cfg.mma)
    if mma == "auto":
        fits = [k for k in p.mma_k if ktile % k == 0]
        if not fits:
            _choose("ktile", ktile, valid_ktiles(p), f"precision={p.name}")
        mma_k = fits[-1]
    else:
        shapes = {f"m16n8k{k}": k for k in p.mma_k}
        if mma not in shapes:
            _choose("mma", mma, ["auto"] + list(shapes), f"precision={p.name}")
        mma_k = shapes[mma]
    block, warps = list(cfg.tile.block), list(cfg.tile.warps)
    if len(block) != 2 or len(warps) != 2:
        raise SpecError(f"tile.block={block} and tile.warps={warps} must each be two integers, "
                        "e.g. tile.block=[128,128] tile.warps=[2,4]")
    return KernelSpec(
        precision=p.name, ktile=ktile, mma_k=mma_k, bm=int(block[0]), bn=int(block[1]),
        warps_m=int(warps[0]), warps_n=int(warps[1]), stages=int(cfg.pipeline.stages),
        cache_op=value(cfg.eviction.cache), arch=resolve_arch(str(cfg.target.arch), gpu_cc),
        ptx_version=_parse_version(str(cfg.target.ptx_version)), group_m=int(cfg.tile.group_m),
    )
