"""One job's kernel, whatever its family: validated spec, source, ptxas' resources, run names, run
identity and the worker call that verifies and times it (:class:`Kernel`), for ``experiments.runner.job``.

Every family is built through the registry (``experiments.families``: spec from the config as the
family reads it, build, unit, rate, names and params), so the runner's static and GPU paths and the
tracking after them are shared.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..store import record, track
from ..build.assemble import SASS_OPS, Assembly, PtxasError, sass_summary, theoretical_occupancy
from ..families import get as get_family
from ..families import names as family_names
from ..families.base import ptx_sha256
from ..families.runner import (NvccError, family_name, family_shapes, family_spec, launch_padding, resources,
                              sass_subject)
from ..hardware import ARCHS
from ..metrics import rounded
from ..spec import SpecError, _parse_version, did_you_mean
from ..build.toolchain import toolchain_tags
from ..gpu.verify import Data

__all__ = ["Kernel", "SourceRejected", "make_kernel", "git_commit", "tile_is_auto", "auto_tile_plans",
           "value_problem", "VALUE_KEYS", "data_problem"]


@dataclass
class Kernel:
    """What the runner needs of one kernel: how it is named, identified, built (sources for the
    artifacts, ptxas' resources), called in the worker and rated; and the run's params and tags."""
    entry: str
    arch: str
    sources: dict             # artifact name -> text (the PTX, or the CUDA C++)
    identity: tuple           # spec, source hash, ptxas version: the run key's kernel part
    unit: str                 # of throughput: TFLOP/s, TOP/s or GB/s
    name: Callable            # size (or None) -> run name
    call: tuple               # (worker function, its kwargs besides the size and the settings)
    rate: Callable            # (m, n, k, us) -> throughput in unit
    shapes: list              # sizes to measure; [None] where the work ignores the size
    params: dict
    tags: dict
    asm: Assembly | None = None
    static: dict = field(default_factory=dict)   # static metrics (threads, registers, SASS counts)
    static_note: str = ""     # why there are no resources (no ptxas or nvcc, or a library call)
    needs_gpu: bool = False   # a library call: nothing to assemble, only a GPU can run it
    pending: Callable | None = None     # what assemble() still has to do (make_kernel's assemble=False)

    def assemble(self) -> None:
        """Run what :func:`make_kernel` left for later (``assemble=False``): nvcc and ptxas, the SASS tags,
        the static metrics, the launch cap's padding; once. Raises SourceRejected (nvcc or ptxas rejected
        the source), SpecError (a launch cap the kernel cannot take) or RuntimeError (a launch cap without
        ptxas' resources to compute it from)."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending()

    @property
    def assembled(self) -> bool:
        return self.pending is None


class SourceRejected(RuntimeError):
    """ptxas or nvcc rejected the kernel's source. ``kernel`` holds what is known (name, tags,
    sources) so the job can track the failed run; ``tool`` names the tool."""

    def __init__(self, kernel: Kernel, tool: str, message: str):
        super().__init__(message)
        self.kernel, self.tool = kernel, tool


def shapes_of(cfg) -> list[tuple[int, int, int]]:
    """problem.shapes, else the square problem.sizes, as (M, N, K) tuples of positive ints.

    Raises SpecError for a shape that is not [M, N, K] or a size that is not positive
    (:func:`value_problem`'s message)."""
    from omegaconf import OmegaConf
    given = OmegaConf.to_container(cfg.problem) if OmegaConf.is_config(cfg.problem) else cfg.problem
    for key in ("shapes", "sizes"):
        if problem := value_problem(f"problem.{key}", list(given[key])):
            raise SpecError(problem)
    return [tuple(s) for s in given["shapes"]] or [(n, n, n) for n in given["sizes"]]


# value_problem's keys
VALUE_KEYS = ("precision", "target.arch", "target.ptx_version", "problem.sizes", "problem.shapes", "data")


def value_problem(key: str, v, families: list | None = None) -> str | None:
    """Why ``v`` is a value of ``key`` (:data:`VALUE_KEYS`) that no kernel of ``families`` (names;
    None: any family) can take, naming the valid values; None when some kernel can (also for another
    key). Such a value is an error before any work, in a single run and in a sweep alike; a valid
    value that only some combinations cannot take is left to the family's spec (a skipped run in a
    sweep). Checked: precision (the families' precisions), target.arch (auto, or an arch on which
    some precision of the families has a kernel with its default options), target.ptx_version (auto or
    MAJOR.MINOR), problem.sizes (positive integers), problem.shapes ([M, N, K] of positive integers) and
    data (the operand data some family draws: :func:`data_problem`)."""
    families = list(families or family_names())
    if key == "data":
        valid = {d: None for f in families for d in get_family(f).data_kinds}
        return None if str(v) in valid else data_problem(get_family(families[0]), v, tuple(valid))
    if key == "precision":
        valid = {p: None for f in families for p in _precisions(f)}
        if str(v) in valid:
            return None
        owners = [f for f in family_names() if str(v) in _precisions(f)]
        other = f" ({v} is a precision of family={' or '.join(owners)})" if owners else ""
        return (f"precision={v} is not valid for family={','.join(families)}; valid: {', '.join(valid)}"
                f"{other}")
    if key == "target.arch":
        valid = [a for a in ARCHS if any(a in _archs(f) for f in families)]
        if str(v) == "auto" or str(v) in valid:
            return None
        return (f"target.arch={v} is not valid for family={','.join(families)}; valid: auto, "
                f"{', '.join(valid)}{did_you_mean(key, v, ['auto', *valid])}")
    if key == "target.ptx_version":
        try:
            _parse_version(str(v))
        except SpecError as exc:
            return str(exc)
        return None
    if key == "problem.sizes":
        if isinstance(v, (list, tuple)) and all(isinstance(x, int) and not isinstance(x, bool) and x > 0
                                                for x in v):
            return None
        return (f"problem.sizes={_shown(v)} is not valid: square sizes M=N=K must be positive integers, "
                "e.g. 'problem.sizes=[512,1024]'")
    if key == "problem.shapes":
        ok = lambda s: (isinstance(s, (list, tuple)) and len(s) == 3     # noqa: E731
                        and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in s))
        if isinstance(v, (list, tuple)) and all(ok(s) for s in v):
            return None
        bad = next((s for s in v if not ok(s)), v) if isinstance(v, (list, tuple)) else v
        return (f"problem.shapes={_shown(v)} is not valid: entry {_shown(bad)} is not [M, N, K] of positive "
                "integers; e.g. 'problem.shapes=[[4096,4096,1024],[512,2048,512]]'")
    return None


def data_problem(fam, v, valid: tuple | None = None) -> str | None:
    """Why the family ``fam`` cannot run with operand data ``v`` (the root key ``data``), naming the valid
    values (``valid``, default the family's ``data_kinds``); None when it can."""
    valid = valid or fam.data_kinds
    v = getattr(v, "name", v)
    if v in valid:
        return None
    why = f": {fam.data_why}" if fam.data_why and v in Data.__members__ else ""
    return f"data={v} is not valid for family={fam.name}{why}; valid: {', '.join(valid)}"


def _shown(v) -> str:
    return str(list(v) if isinstance(v, tuple) else v).replace(" ", "")


def _precisions(family: str) -> tuple:
    return tuple(get_family(family).axes["precision"])


@functools.lru_cache(maxsize=None)
def _archs(family: str) -> tuple:
    """The archs of ``family``: those where some precision has a kernel with the default options."""
    return get_family(family).archs()


def tile_is_auto(cfg) -> bool:
    """Whether ``cfg`` asks tile=auto (conf/tile/auto.yaml) of a family that has one (its
    ``auto_keys``: the default family's tile.block and tile.warps, wgmma's family.consumers and
    family.bn); the other families have tiles of their own (``family.*``) and ignore it."""
    return bool(get_family(family_name(cfg)).auto_keys) and bool(cfg.tile.get("auto", False))


def auto_tile_plans(cfg, gpu_cc: int | None, sms: int) -> list[tuple[object, list]]:
    """tile=auto: one config per distinct tile the problem sizes get on ``sms`` SMs (the family's
    ``auto_tile``), in the order of the sizes, each with the keys the family's ``auto_settings`` names
    (``tile.block``/``tile.warps``, wgmma: ``family.consumers``/``family.bn``) set to the choice and
    ``problem.sizes`` (or ``problem.shapes``) to the sizes that chose it.

    Returns [(config, [(size, AutoTile), ...]), ...]. Raises SpecError (a bad size; no preset fits)."""
    import copy

    from omegaconf import OmegaConf, read_write
    plans: dict = {}
    fam = get_family(family_name(cfg))
    shapes = shapes_of(cfg)
    if not shapes:
        raise SpecError("problem.sizes and problem.shapes are both empty; give at least one size")
    for shape in shapes:
        choice = fam.auto_tile(cfg, *shape, sms=sms, gpu_cc=gpu_cc)
        plans.setdefault(choice.name, []).append((shape, choice))
    out = []
    for group in plans.values():
        sub = copy.deepcopy(cfg)
        with read_write(sub):
            for key, val in fam.auto_settings(group[0][1].spec).items():
                OmegaConf.update(sub, key, val)
            if cfg.problem.shapes:
                sub.problem.shapes = [list(shape) for shape, _ in group]
            else:
                sub.problem.sizes = [shape[0] for shape, _ in group]
        out.append((sub, group))
    return out


# timing, verification and launch settings: (key, lowest valid value, whether the bound itself is valid)
SETTING_BOUNDS = (("timing.warmup", 0, True), ("timing.batches", 1, True), ("timing.min_batch_ms", 0, False),
                  ("timing.max_launches", 1, True), ("timing.timeout_s", 0, False), ("verify.rtol", 0, False),
                  ("timing.repeats", 1, True), ("timing.repeat_pause_s", 0, True),
                  ("timing.burst_batches", 1, True), ("timing.burst_batch_ms", 0, False),
                  ("timing.idle_wait_s", 0, True), ("timing.idle_s", 0, True),
                  ("launch.blocks_per_sm", 0, True))


SETTING_KEYS = tuple(name for name, _, _ in SETTING_BOUNDS) + ("verify.seed",)   # setting_problem's keys


def setting_problem(key: str, v) -> str | None:
    """Why ``v`` is not valid for the timing or verification setting ``key`` (SETTING_BOUNDS, and
    verify.seed), or None (also for another key): out of range (timing.batches=0), not finite
    (verify.rtol=nan would pass any result) or a seed NumPy cannot take."""
    import math
    if key == "verify.seed":
        if v is not None and not 0 <= v < 2 ** 32:
            return (f"verify.seed={v} is not valid; it must be null (a fresh seed per run) or an integer "
                    "from 0 to 2**32 - 1")
        return None
    for name, low, inclusive in SETTING_BOUNDS:
        if name != key:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < low \
                or (v == low and not inclusive):
            shown, op = "null" if v is None else v, ">=" if inclusive else ">"
            kind = "a whole number" if isinstance(v, int) and not isinstance(v, bool) else "a finite number"
            return f"{key}={shown} is not valid; it must be {kind} {op} {low}"
    return None


def resolved(cfg) -> dict:
    """The config as plain data (enums as their names), its interpolations resolved, Hydra's own node
    aside. Raises experiments.runner.validate.Invalid (exit 2, "Invalid configuration: KEY: ...")
    when an interpolation cannot be resolved or its value does not fit the key
    (``verify.seed=${verify.rtol}``): no run can be recorded without its params, so the run or sweep
    stops before anything is tracked."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from .validate import Invalid
    try:
        return OmegaConf.to_container(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]),
                                      resolve=True, enum_to_str=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None)
        raise Invalid(f"Invalid configuration: {key + ': ' if key else ''}{str(exc).splitlines()[0]}") \
            from None


def _static_metrics(threads: int, dyn_smem: int, asm: Assembly | None, subject) -> dict:
    m = {"threads": threads, "smem_dynamic_bytes": dyn_smem} if threads else {}
    if asm is not None:
        m.update(registers=asm.registers, spill_stores_bytes=asm.spill_stores,
                 spill_loads_bytes=asm.spill_loads, stack_frame_bytes=asm.stack_frame,
                 smem_static_bytes=asm.static_smem, theoretical_occupancy_pct=100 * asm.occupancy,
                 blocks_per_sm=asm.blocks_per_sm)
        if subject is not None:
            m.update(sass_summary(asm, subject)[0])
        elif asm.sass:
            m.update({f"sass_{op}": asm.sass_counts.get(op, 0) for op in SASS_OPS})
    return rounded(m)


def _base_tags(entry: str, sha: str, arch: str, use_gpu: bool, cfg) -> tuple[dict, dict]:
    tools = toolchain_tags()
    tags = {"kernel": entry, "ptx_sha256": sha, "arch": arch, "backend": "gpu" if use_gpu else "static",
            **tools}
    if cfg.get("study_kernel"):
        tags["study_kernel"] = cfg.study_kernel
    if commit := git_commit():
        tags["git_commit"] = commit
    return tags, tools


def make_kernel(cfg, out_dir: Path, gpu_cc: int | None, use_gpu: bool, params: dict, say,
                assemble: bool = True) -> Kernel:
    """The Kernel of the composed config ``cfg`` (family ``family.name``, default
    ``experiments.families.DEFAULT``) for a GPU of compute capability ``gpu_cc`` (None: none): spec as
    the family reads it from the config, source from the family's build, resources through nvcc and
    ptxas where they apply. ``params``: the run params of the config (record.params_of); ``say(text)``
    prints a line for the job. ``assemble=False`` leaves nvcc, ptxas and what follows from them to
    :meth:`Kernel.assemble`: the identity (the run key's kernel part), names, params and the tags but
    the SASS ones are known before, so that a run measured already is found without building its
    kernel. Raises SpecError (an impossible combination or size, naming key, value and valid values)
    and, when assembling, what :meth:`Kernel.assemble` raises."""
    fam, spec = family_spec(cfg, gpu_cc)
    if problem := data_problem(fam, cfg.get("data", Data.full)):
        raise SpecError(problem)
    shapes = family_shapes(fam, spec, shapes_of(cfg) if fam.sized else [])
    build = fam.build(spec)
    sha = ptx_sha256(build.source)
    tags, tools = _base_tags(spec.entry, sha, spec.arch, use_gpu, cfg)
    art = {"ptx": record.ARTIFACTS["ptx"], "cuda": record.ARTIFACTS["cuda"]}.get(build.kind)  # none: none
    call = ("measure_family", {"family": fam.name, "precision": spec.precision, "arch": spec.arch,
                               "params": [list(p) for p in spec.params],
                               "build": {"kind": build.kind, "source": build.source, "entry": build.entry,
                                         "options": list(build.options)}})
    # a launch cap is part of the run key (only a cap that is set: the keys of uncapped runs stay)
    cap = int(cfg.get("launch", {}).get("blocks_per_sm", 0) or 0)
    capped = (("launch.blocks_per_sm", cap),) if cap else ()
    identity = (fam.identity(spec), sha, tools["ptxas_version"], *capped)
    kern = Kernel(spec.entry, spec.arch, {art: build.source} if art else {}, identity, fam.unit(spec),
                  functools.partial(_run_name, fam, spec, params.get("variant"), cap, tags), call,
                  functools.partial(fam.rate, spec), shapes,
                  record.params_of(params, fam, spec.flat()), tags)
    kern.needs_gpu = build.kind == "none"
    kern.pending = functools.partial(_assemble, kern, fam, spec, build, out_dir / "ptxas", say, cap)
    if assemble:
        kern.assemble()
    return kern


def _run_name(fam, spec, variant, cap: int, tags: dict, shape, emulated: bool | None = None) -> str:
    """The run name of ``spec`` at ``shape`` (record.run_name): EMULATED where the kernel's SASS tags
    (``tags``, once assembled) or ``emulated`` say so, and a launch cap: the same kernel at another
    occupancy."""
    name = record.run_name(fam, spec, shape, variant=variant,
                           emulated=record.emulated(tags) if emulated is None else emulated)
    return f"{name} blocks_per_sm={cap}" if cap else name


def _assemble(kern: Kernel, fam, spec, build, workdir: Path, say, cap: int) -> None:
    """:meth:`Kernel.assemble`'s work: resources (nvcc, ptxas), the SASS summary's tags, the static metrics
    and a launch cap's padding."""
    try:
        kern.asm, note = resources(fam, spec, build, workdir)
    except (PtxasError, NvccError) as exc:
        raise SourceRejected(kern, "nvcc" if isinstance(exc, NvccError) else "ptxas", str(exc)) from None
    if kern.asm is None:
        kern.static_note = note
        if not kern.needs_gpu:
            say(f"[yellow]{note}[/] Tracking the kernel without resources.")
    subject = sass_subject(fam, spec)
    if kern.asm is not None and subject is not None:
        kern.tags.update(sass_summary(kern.asm, subject)[1])
    kern.static = _static_metrics(fam.threads(spec), fam.dyn_smem(spec), kern.asm, subject)
    if cap:
        _cap_blocks(kern, fam, spec, cap)


def _cap_blocks(kern: Kernel, fam, spec, cap: int) -> None:
    """launch.blocks_per_sm=cap: the padding the worker adds to the launch (``smem_pad``) and the occupancy
    with the padding (the run key's part and the name's are :func:`make_kernel`'s).
    Raises SpecError (the family's launch cannot be padded; a cap above what the kernel reaches) or
    RuntimeError (no ptxas resources to compute it from)."""
    pad = launch_padding(fam, spec, kern.asm, cap, kern.static_note)
    kern.call[1]["smem_pad"] = pad
    occupancy, blocks, _ = theoretical_occupancy(spec.arch, fam.threads(spec), kern.asm.registers,
                                                 kern.asm.static_smem + fam.dyn_smem(spec) + pad)
    kern.static.update(rounded({"theoretical_occupancy_pct": 100 * occupancy, "blocks_per_sm": blocks,
                                "smem_padding_bytes": pad}))


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The project's own commit (``-dirty`` with uncommitted changes), or None when the project
    folder is not the top of its own git repository (a copy, or a folder inside another repository)."""
    import subprocess
    root = str(track.PROJECT_ROOT)
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True,
                             text=True, timeout=10)
        if top.returncode != 0 or os.path.realpath(top.stdout.strip()) != os.path.realpath(root):
            return None
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head + ("-dirty" if dirty else "") if head else None
    except (OSError, subprocess.TimeoutExpired):
        return None
