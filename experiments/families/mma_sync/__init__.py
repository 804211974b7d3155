"""The study's own family (the default): one mma.sync GEMM rendered from ``kernels_ptx/mma_sync_gemm.ptx.j2``.

Its options are the config's root keys (ktile, mma, acc, b_layout, smem_layout, tile.*, loader.*,
pipeline.*, cache.*), declared in :mod:`.config` from the domains in :mod:`.domains`, read by
:meth:`MmaSyncFamily.spec_of` (:func:`.spec.spec_from_config`), not ``family.*``. The spec type is
:class:`.spec.KernelSpec`; its axes and restrictions are data
(:mod:`.rules`), enumerated by the pruning walker :func:`.spec.space`; :mod:`.render` prints the
fragment plan through the template; :mod:`.cover` picks a covering subset of the space.
"""
from __future__ import annotations

import dataclasses
import time

from ...spec_tables import ARCHS, PRECISIONS
from ...gpu.timing import tflops
from ..base import Build, Family, Prepared, axis_docs_markdown, markdown_values
from .axis_docs import AXIS_DOCS
from .config import root_fields
from .domains import GROUP_M_RANGE, KTILES, MAX_STAGES
from .render import render
from .rules import RULES, make_axes
from .spec import NAME, KernelSpec, auto_tile, describe_space, space, spec_from_config

__all__ = ["MmaSyncFamily", "NAME", "ROOT_KEYS", "KernelSpec"]

# the config's root keys that hold this family's options (its axes besides precision and target.*)
ROOT_KEYS = tuple(name for name, _, _ in root_fields())
# run params: the values the config's ``auto`` resolved to, as ``spec.<key>`` (the other spec fields
# repeat config keys)
RESOLVED = ("mma", "arch", "ptx_version")
# axes added after runs were tracked, at the value those runs had: left out of the run key there, so a
# store's finished runs keep their keys
KEY_DEFAULTS = {"smem_layout": "padded", "l2_prefetch": "none"}

# run names: the values of the default kernel; a run name puts the axes that differ from them first
_SHORT = {"manual": "man", "none": "x", "evict_first": "f", "evict_last": "l", "evict_normal": "n"}
_DEFAULT_TOKENS = {"bk": "bk32", "s": "s3", "tile": "256x128", "ld": "ldx4x2", "cache": "cg", "l2": "",
                   "b": "", "acc": "", "sw": "", "pf": "", "w": "w4x2", "g": "g8"}

_LOADED: dict = {}       # (entry, PTX) -> (kernel, JIT seconds): one JIT per kernel per worker process


class MmaSyncFamily(Family):
    """The mma.sync GEMM family, every point a :class:`KernelSpec` (see the module docstring)."""
    name = NAME
    title = "mma.sync GEMM"
    axes = {"precision": tuple(PRECISIONS)}
    root_keys = ROOT_KEYS
    key_defaults = KEY_DEFAULTS
    param_drop = ()
    auto_keys = ("tile.block", "tile.warps")
    profiles_logged = True      # the PTX a run logged is what it measured
    tensor_cores = True
    pads_launch = True

    def root_fields(self) -> list:
        """The root keys' schema (:func:`.config.root_fields`): their Enums and sections."""
        return root_fields()

    # ------------------------------------------------------------------ space and validation

    def root_values(self) -> dict:
        """ktile's declared values (the other integer root keys are ranges checked by the spec)."""
        return {"ktile": KTILES}
    def spec_of(self, cfg, gpu_cc: int | None) -> KernelSpec:
        """The spec of the composed config from its root keys (:func:`.spec.spec_from_config`)."""
        return spec_from_config(cfg, gpu_cc)

    def spec(self, precision: str, options: dict, arch: str) -> KernelSpec:
        """A KernelSpec from its fields (``options``: every field besides precision and arch)."""
        return KernelSpec(precision=str(precision), arch=str(arch), **options)

    def respec(self, precision: str, arch: str, params) -> KernelSpec:
        """The resolved spec again from ``spec.params`` (the worker's and the profiler's copy)."""
        kw = dict(params)
        return KernelSpec(precision=precision, arch=arch, **{**kw, "ptx_version": tuple(kw["ptx_version"])})

    def spec_of_run(self, params: dict, tags: dict, config) -> KernelSpec:
        """The run's KernelSpec: from its ``spec.<field>`` params when it has them all, else rebuilt from
        its config (``config()``: the ``config.yaml`` artifact) as the sweep built it (``auto`` resolved
        for the run's arch). Raises ValueError naming the missing params and what the artifact gave."""
        kw, lacking = {}, []
        for f in dataclasses.fields(KernelSpec):
            v = params.get(f"spec.{f.name}")
            if v is None:       # runs tracked before an axis existed have its default
                if f.default is dataclasses.MISSING:
                    lacking.append(f"spec.{f.name}")
                continue
            kw[f.name] = tuple(int(x) for x in v.split(".")) if f.name == "ptx_version" else (
                int(v) if f.type in ("int", int) else v)
        if not lacking:
            return KernelSpec(**kw)
        try:
            arch = params.get("spec.arch") or tags.get("arch", "")
            return spec_from_config(config(), int(arch[3:]) if arch.startswith("sm_") else None)
        except Exception as exc:  # noqa: BLE001 - no artifact, an old config layout, an invalid spec
            raise ValueError(f"the kernel cannot be rebuilt: params {', '.join(lacking)} are missing and "
                             f"artifact config.yaml gave: {type(exc).__name__}: {exc}") from None

    def archs(self) -> tuple:
        """The archs on which some precision has a kernel."""
        return tuple(a for a, lim in ARCHS.items() if any(lim.sm >= p.min_arch for p in PRECISIONS.values()))

    def space(self, arch: str):
        """Every valid spec for ``arch`` (the pruning walker :func:`.spec.space`)."""
        sp = space(archs=[arch])
        free = [a for a in sp.axes if not a.shaping]
        for _, values, max_stages in sp.cells:
            for stages in range(1, max_stages + 1):
                for idx in _indices([len(a.values) for a in free]):
                    yield sp.spec(values, stages, idx)

    def declared(self, key: str) -> tuple:
        """The values the space enumerates for the root key ``key`` (:func:`.rules.make_axes`: ``tile``'s
        are the presets of conf/tile/, ``mma``'s m16n8kK), or ()."""
        return next((tuple(a.labels) for a in make_axes() if a.key == key), ())

    def describe(self) -> str:
        """Axes and rules as text (for ``--help``)."""
        return describe_space()

    def options_help(self) -> str:
        """The root keys that set this family, with their values (defaults in the config)."""
        ranges = {"pipeline.stages": f"1 ... {MAX_STAGES} (what shared memory allows)",
                  "tile.group_m": f"{GROUP_M_RANGE[0]} ... {GROUP_M_RANGE[1]}"}
        auto = {"target.arch", "acc", "mma", "tile"}       # keys that also take auto
        values = lambda a: ranges.get(a.key) or " | ".join(["auto"] * (a.key in auto) + list(a.labels))  # noqa: E731
        lines = [f"  {a.key}: {values(a)}"
                 + (" (presets), or tile.block=[BM,BN] tile.warps=[WM,WN]" if a.key == "tile" else "")
                 for a in make_axes()]
        return (f"(none: family={NAME} is set by the root keys; their values, defaults in the config "
                "below:)\n" + "\n".join(lines) + "\n")

    def axes_markdown(self) -> list[str]:
        """The root keys with the values the space enumerates and their meaning, then the rules in the
        order they are checked (docs/axes.md)."""
        out = [f"## family={NAME} (the default): the root keys", "",
               "| key | values the space enumerates | meaning |", "| --- | --- | --- |"]
        for ax in make_axes():
            vals = ax.labels if len(ax.labels) < 12 else (*ax.labels[:3], "...", ax.labels[-1])
            out.append(f"| `{ax.key}` | {markdown_values(vals)} | {ax.meaning} |")
        out += axis_docs_markdown(AXIS_DOCS)
        out += ["", "Rules, in the order they are checked:", ""]
        return out + [f"- `{r.name}`: {r.why}" for r in RULES]

    def auto_tile(self, cfg, m: int, n: int, k: int, sms: int, gpu_cc: int | None):
        """tile=auto's choice for M x N x K on ``sms`` SMs (:func:`.spec.auto_tile`)."""
        return auto_tile(cfg, m, n, k, sms=sms, gpu_cc=gpu_cc)

    def auto_settings(self, spec: KernelSpec) -> dict:
        """The config keys tile=auto sets to ``spec``'s tile (block, warps and group_m)."""
        return {"tile.block": [spec.bm, spec.bn], "tile.warps": [spec.warps_m, spec.warps_n],
                "tile.group_m": spec.group_m}

    # ------------------------------------------------------------------ names and params of a run
    def name_tokens(self, spec: KernelSpec) -> list:
        """The precision, then the axes that differ from the default kernel (e.g. ``s2`` in a sweep over
        stages; every axis the entry name spells, so that two kernels never share a name), then the
        others: ``int8 bk64 m16n8k32 s3 256x128``, ``int4 bk64 s2 32x64 ldx4man ca l2xl brow w2x4 g1
        m16n8k64``."""
        get = lambda name, default: getattr(spec, name, default)  # noqa: E731
        hints = (get("l2_hint_a", "none"), get("l2_hint_b", "none"))
        tokens = {"bk": f"bk{spec.ktile}", "mma": spec.mma_shape, "s": f"s{spec.stages}",
                  "tile": f"{spec.bm}x{spec.bn}",
                  "ld": "ld" + "".join(_SHORT.get(get(f"loader_{x}", d), get(f"loader_{x}", d)) for x, d in
                                       (("a", "x4"), ("b", "x2"))),
                  "cache": get("cache_op", "cg"),
                  "l2": "" if hints == ("none", "none") else "l2" + "".join(_SHORT[h] for h in hints),
                  "b": "" if get("b_layout", "col") == "col" else f"b{get('b_layout', 'col')}",
                  "acc": (f"acc{get('acc', 'auto')}" if get("acc", "auto") not in ("auto", "f32", "s32")
                          else ""),
                  "sw": "sw" if get("smem_layout", "padded") == "swizzled" else "",
                  "pf": "" if get("l2_prefetch", "none") == "none" else f"pf{get('l2_prefetch', 'none')}",
                  "w": f"w{get('warps_m', 4)}x{get('warps_n', 2)}", "g": f"g{get('group_m', 8)}"}
        differ = [v for k, v in tokens.items() if v and k in _DEFAULT_TOKENS and v != _DEFAULT_TOKENS[k]]
        usual = [tokens[k] for k in ("bk", "mma", "s", "tile") if tokens[k] not in differ]
        return [spec.precision] + differ + usual

    def run_params(self, config_params: dict, spec_flat: dict) -> dict:
        """The config's params (the root keys are this family's options), ``family`` and the
        ``spec.<key>`` values the config's ``auto`` resolved to (:data:`RESOLVED`)."""
        params = dict(config_params)
        params.update({f"spec.{k}": str(spec_flat[k]) for k in RESOLVED if k in spec_flat})
        params["family"] = self.name
        return params

    # ------------------------------------------------------------------ per spec
    def check_problem(self, spec: KernelSpec, m: int, n: int, k: int) -> None:
        """Multiples of BM, BN, BK, and below the 32-bit offset limit (:meth:`KernelSpec.check_problem`)."""
        spec.check_problem(m, n, k)

    def multiples(self, spec: KernelSpec) -> tuple[int, int, int]:
        """(BM, BN, BK)."""
        return spec.bm, spec.bn, spec.ktile

    def threads(self, spec: KernelSpec) -> int:
        """32 x the warps of the block."""
        return spec.threads

    def dyn_smem(self, spec: KernelSpec) -> int:
        """The pipeline's shared memory (bytes)."""
        return spec.smem_bytes

    def build(self, spec: KernelSpec) -> Build:
        """The PTX rendered from the template (:func:`.render.render`)."""
        return Build("ptx", render(spec), spec.entry)

    def unit(self, spec: KernelSpec) -> str:
        """TFLOP/s for float types, TOP/s for integer types."""
        return "TFLOP/s" if spec.prec.is_float else "TOP/s"

    def rate(self, spec: KernelSpec, m: int, n: int, k: int, us: float) -> float:
        """2 M N K / time (:func:`experiments.gpu.timing.tflops`)."""
        return tflops(m, n, k, us)

    def prepare(self, spec: KernelSpec, build: Build, m: int, n: int, k: int, seed: int,
                *, rtol: float = 1e-3, smem_pad: int = 0, data: str = "full") -> Prepared:
        """The PTX JIT-loaded through the driver (once per kernel in this process), operands drawn as
        ``data`` says with B laid out as ``b_layout`` says, C (the accumulator's dtype) poisoned.
        ``verify()`` checks integers exactly and floats within :func:`experiments.dtypes.tolerance`
        (``rtol``, or the f16-accumulation bound for K; data=zeros exactly:
        :func:`experiments.gpu.verify.data_tolerance`), then frees the float64 reference before timing.
        ``smem_pad``: bytes of dynamic shared memory added to each block's launch
        (launch.blocks_per_sm). ``info``: the JIT's seconds, registers and local bytes, and the
        tolerance used."""
        import cupy
        import numpy as np

        from ...gpu.launch import GemmLaunch
        from ...dtypes import tolerance
        from ...gpu.verify import check, data_tolerance, make_operands, poison
        from ..gpu import allow_smem, load_ptx
        key = (spec.entry, build.source)
        if key not in _LOADED:
            t0 = time.perf_counter()
            kern = load_ptx(build, spec.smem_bytes)
            _LOADED[key] = (kern, time.perf_counter() - t0)
        kern, jit_s = _LOADED[key]
        ops = make_operands(spec.precision, m, n, k, seed, b_layout=spec.b_layout, data=data)
        c = cupy.empty((m, n), dtype=np.dtype(spec.accum.c_dtype))
        poison(c)
        if smem_pad:
            allow_smem(kern, spec.smem_bytes + smem_pad)
        launch = GemmLaunch(kern, spec, ops.a, ops.b, c, m, n, k, smem_pad)
        tol = data_tolerance(data, tolerance(spec.precision, spec.acc, k, rtol))

        def verify():
            res = check(c, ops, spec.prec.is_float, tol)
            del ops.a_ref, ops.b_ref
            cupy.get_default_memory_pool().free_all_blocks()
            return res
        return Prepared(launch, verify, info={"verify_rtol": tol, "jit_s": jit_s,
                                              "jit_registers": kern.num_regs,
                                              "jit_local_bytes": kern.local_size_bytes})


def _indices(sizes: list):
    """Every index tuple of axes with ``sizes`` values, the last axis fastest."""
    if not sizes:
        yield ()
        return
    for i in range(sizes[0]):
        for rest in _indices(sizes[1:]):
            yield (i, *rest)

