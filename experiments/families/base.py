"""The kernel-family interface: one :class:`Family` per way of computing (or bounding) a GEMM.

A family declares its axes (name -> valid values) and restrictions (:class:`Rule`) as data, so one
function (:meth:`Family.space`) enumerates every valid point for tests and ``--help``. The runner only
sees this interface: ``spec`` validates, ``build`` produces source text (no GPU), ``prepare`` allocates,
compiles and returns the launch and verify closures (GPU), ``flops`` and ``unit`` give the throughput.
Family modules: the default family's package, :mod:`.wmma`, :mod:`.dp4a`, :mod:`.cublas`, :mod:`.peak`,
:mod:`.wgmma`; registry in the package.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from functools import lru_cache
from pathlib import Path

import jinja2

from ..dtypes import DType, tolerance
from ..hardware import ARCHS
from ..spec import SpecError, check_no_tails, resolve_arch
from ..gpu.verify import Data

__all__ = ["Family", "FamilySpec", "Build", "Prepared", "Rule", "SpecError", "render_template",
           "TEMPLATE_DIR", "sm_of", "axis_docs_markdown", "parse_pair", "ptx_sha256", "config_options",
           "markdown_values"]

TEMPLATE_DIR = Path(__file__).resolve().parent.parent.parent / "kernels_ptx"


@dataclass(frozen=True)
class FamilySpec:
    """One resolved, validated point of a family's space.

    params: sorted ((key, value), ...) of every option after defaults and ``auto`` are resolved
    (a dict is accepted and sorted). entry: the kernel's name, derived from family, precision and
    params (never written by hand), a valid C/PTX identifier; unique within one arch's space.
    """
    family: str
    precision: str
    arch: str
    params: tuple
    entry: str = field(init=False)

    def __post_init__(self):
        items = self.params.items() if isinstance(self.params, dict) else self.params
        object.__setattr__(self, "params", tuple(sorted((str(k), v) for k, v in items)))
        parts = [self.family, self.precision] + [f"{k}{v}" for k, v in self.params]
        object.__setattr__(self, "entry", re.sub(r"[^0-9A-Za-z_]", "_", "_".join(parts)))

    @property
    def p(self) -> dict:
        """params as a dict."""
        return dict(self.params)

    def flat(self) -> dict:
        """Plain dict for tracking: family, precision, arch, entry and every param."""
        return {"family": self.family, "precision": self.precision, "arch": self.arch,
                "entry": self.entry, **self.p}


@dataclass(frozen=True)
class Build:
    """What ``prepare`` compiles. kind: "ptx" (driver JIT), "cuda" (C++ through NVRTC) or "none"
    (a library call); options: NVRTC options for "cuda"."""
    kind: str
    source: str
    entry: str
    options: tuple = ()


@dataclass
class Prepared:
    """launch(): enqueue one launch on the current CuPy stream. verify(): after one launch and a
    synchronize, compare with the reference (an :class:`experiments.gpu.verify.VerifyResult`).
    note: what is not like-for-like with the default family's kernels ("" when nothing). clocks: where the
    kernel records its own cycles (the peak family's MMA loops), a function that waits for the device
    and returns the exact figures of the last launch (dict, :func:`experiments.families.peak.kernel_clock`);
    None elsewhere. info: fields the worker's result takes over as they are (the default family's
    JIT seconds and resources), {} elsewhere."""
    launch: Callable[[], None]
    verify: Callable[[], object]
    note: str = ""
    clocks: Callable[[], dict] | None = None
    info: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Rule:
    """A restriction: ``check(precision, params, arch)`` returns None, or the message naming the key,
    the value and the valid values. ``why`` is the one-line reason shown in help."""
    name: str
    why: str
    check: Callable[[str, dict, str], str | None]


def config_options(cfg) -> dict:
    """The ``family.*`` options of a composed config (without ``name``), Enum members by value."""
    node = cfg.get("family") or {}
    return {str(k): (v.value if isinstance(v, Enum) else v) for k, v in node.items() if k != "name"}


def markdown_values(values) -> str:
    """Values as a Markdown table cell: each in backticks, comma-separated."""
    return ", ".join(f"`{v}`" for v in values)


def axis_docs_markdown(docs: dict) -> list[str]:
    """docs/axes.md lines that say what each key changes (``docs``: key, or comma-separated keys ->
    Markdown text): a list under the heading "What each key changes"; [] when there is none."""
    if not docs:
        return []
    keys = lambda k: ", ".join(f"`{x.strip()}`" for x in k.split(","))  # noqa: E731
    return ["", "What each key changes in the kernel, and its restriction:", ""] + \
        [f"- {keys(k)}: {text}" for k, text in docs.items()]


def sm_of(arch: str) -> int:
    """'sm_90' -> 90 (also 'sm_90a' -> 90)."""
    return int(re.sub(r"[^0-9]", "", arch))


def parse_pair(text: str) -> tuple[int, int]:
    """'128x64' -> (128, 64)."""
    a, b = str(text).split("x")
    return int(a), int(b)


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)), trim_blocks=True,
                              lstrip_blocks=True, undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True)


def ptx_sha256(ptx: str) -> str:
    """Hex sha256 of a kernel's source text (PTX, or CUDA C++), the cache and tracking key of a kernel."""
    return hashlib.sha256(ptx.encode()).hexdigest()


def render_template(name: str, **context) -> str:
    """Render ``kernels_ptx/<name>`` with ``context`` (a missing variable raises)."""
    return _env().get_template(name).render(**context)


def _coerce(value, valid: tuple):
    """Config values arrive as str or int; match the axis' own type."""
    if valid and isinstance(valid[0], int) and not isinstance(value, bool):
        try:
            return int(value)
        except (TypeError, ValueError):
            return value
    return str(value)


class Family:
    """Base of every family; subclasses set the class attributes and implement build/prepare.

    name: registry key; title: what one kernel is, for messages ("cuBLAS GEMM"); axes: axis name ->
    valid values, ``precision`` first ("auto" where a value is derived); defaults: axis -> default
    (else the first value); rules: restrictions checked after :meth:`resolve`. sized: the work depends
    on M, N, K (False: one run per spec, the problem size is ignored); tensor_cores: the kernel's
    SASS should hold the tensor-core MMA of its precision (the runner checks it where it has SASS);
    narrow_accumulation: its instructions sum fp8 products in fewer bits than f32 (:meth:`tolerance`).

    How a family meets the config and the store: ``root_keys``, the config's root keys that hold its
    options (the default family's; () for the others, whose options are ``family.*``: :meth:`spec_of`);
    ``key_defaults``, axes added after runs were tracked, at the value those runs had, left out of the
    run key (:meth:`identity`); ``param_drop``, shared config keys (a trailing dot: a group) a run of this
    family does not log as params, besides the other families' root keys (:meth:`dropped_params`,
    :meth:`run_params`); ``axis_docs``, what each key changes in the kernel and its restrictions
    (docs/axes.md, :meth:`axes_markdown`); ``auto_keys``, the config keys tile=auto sets per
    problem size (() where the family has no tile=auto: :meth:`auto_tile`); ``data_kinds``, the values
    of the root key ``data`` (:class:`experiments.gpu.verify.Data`) its ``prepare`` draws operands for (a
    ``data`` keyword: every kind; a family whose kernels fix their own operands: ``full`` only), with
    ``data_why`` saying why where it takes fewer.
    """
    name: str = ""
    title: str = ""
    axes: dict = {}
    defaults: dict = {}
    rules: tuple = ()
    sized: bool = True
    tensor_cores: bool = False
    narrow_accumulation: bool = False
    root_keys: tuple = ()
    key_defaults: dict = {}
    # shared keys a run of this family does not log; :meth:`dropped_params` adds the other families' root keys
    param_drop: tuple = ("family.name", "tracking.")
    axis_docs: dict = {}
    # launch.blocks_per_sm: ``prepare`` takes ``smem_pad`` (bytes of dynamic shared memory added to each
    # block's launch, the kernel's instructions unchanged); False: :meth:`padding_refusal` says why not
    pads_launch: bool = False
    auto_keys: tuple = ()
    profiles_logged: bool = False   # the profiler takes the source a run logged (True), or builds it again
    data_kinds: tuple = tuple(Data.__members__)
    data_why: str = ""

    # ------------------------------------------------------------------ from the config and the store
    def root_fields(self) -> list:
        """The config's root keys this family declares, as ``(name, type, dataclasses.field)`` for
        ``experiments.config.Config`` (the default family's :attr:`root_keys`); [] for the others, whose
        options are ``family.*``."""
        return []

    def root_values(self) -> dict:
        """Integer root keys with declared values (config key -> valid values) for messages that name them;
        {} for families without root keys."""
        return {}

    def options_of(self, cfg, gpu_cc: int | None) -> tuple[str, dict, str]:
        """(precision, options, arch) of the composed config ``cfg`` for a GPU of compute capability
        ``gpu_cc`` (None: none): the options are ``family.*`` without ``name`` (Enum members by value),
        ``target.arch`` resolved (auto = the GPU's own, sm_90 without a GPU; SpecError for another)."""
        options = config_options(cfg)
        precision = cfg.precision.name if isinstance(cfg.precision, Enum) else str(cfg.precision)
        return precision, options, resolve_arch(str(cfg.target.arch), gpu_cc)

    def spec_of(self, cfg, gpu_cc: int | None):
        """The spec of the composed config ``cfg`` (:meth:`options_of` through :meth:`spec`).
        Raises SpecError naming the key, the value and the valid values."""
        return self.spec(*self.options_of(cfg, gpu_cc))

    def respec(self, precision: str, arch: str, params):
        """The resolved spec again from its ``params`` ((key, value) pairs of ``spec.params``), as the
        GPU worker and the profiler rebuild it; not validated again."""
        return FamilySpec(self.name, precision, arch, tuple((str(a), b) for a, b in params))

    def spec_of_run(self, params: dict, tags: dict, config: Callable):
        """The spec of a tracked run from its params (``family.<option>``, precision, ``spec.arch`` or
        tag arch); ``config()`` would load the run's config.yaml artifact (families whose params do not
        hold every option). Raises SpecError (ValueError) when the run's values make no valid spec."""
        options = {k.split(".", 1)[1]: v for k, v in params.items()
                   if k.startswith("family.") and k.split(".", 1)[1] in self.axes}
        return self.spec(params["precision"], options, params.get("spec.arch") or tags.get("arch", ""))

    def identity(self, spec) -> list:
        """The spec's part of the run key: sorted items of ``spec.flat()`` without :attr:`key_defaults`."""
        return sorted((k, v) for k, v in spec.flat().items() if self.key_defaults.get(k, object()) != v)

    def name_tokens(self, spec) -> list | None:
        """The family's own run-name rule (the words after the size), or None (the default): the
        family, the precision and the values of its axes (:func:`experiments.store.record.run_name`)."""
        return None

    def dropped_params(self) -> tuple:
        """Config keys (a trailing dot: a group) a run of this family does not log: :attr:`param_drop` and
        the root keys of every other registered family (a section as a group), except those in that
        family's :attr:`key_defaults` (axes added after runs were tracked stay params, as they were)."""
        from . import get, names
        out = list(self.param_drop)
        for name in names():
            other = get(name) if name != self.name else None
            for key, typ, _ in (other.root_fields() if other else []):
                if key not in other.key_defaults:
                    out.append(f"{key}." if dataclasses.is_dataclass(typ) else key)
        return tuple(out)

    def run_params(self, config_params: dict, spec_flat: dict) -> dict:
        """The run's params: the config's (``config_params``: flattened, ``tracking.*`` left out) without
        :meth:`dropped_params`, ``family``, and ``spec.<key>`` for every resolved spec value."""
        drop = self.dropped_params()
        keys = tuple(k for k in drop if not k.endswith("."))
        groups = tuple(k for k in drop if k.endswith("."))
        params = {k: v for k, v in config_params.items() if k not in keys and not k.startswith(groups)}
        params["family"] = self.name
        params.update({f"spec.{k}": str(v) for k, v in spec_flat.items() if k not in ("family", "precision")})
        return params

    def archs(self) -> tuple:
        """The archs on which some precision has a kernel with the default options."""
        def takes(precision, arch):
            try:
                self.spec(precision, {}, arch)
                return True
            except SpecError:
                return False
        return tuple(a for a in ARCHS if any(takes(p, a) for p in self.axes["precision"]))

    def options_help(self) -> str:
        """The options (``family.<option>``) and their valid values, the default first, for --help."""
        lines = []
        for axis, values in self.axes.items():
            if axis != "precision":
                default = self.defaults.get(axis, values[0])
                rest = [str(v) for v in values if str(v) != str(default)]
                lines.append(f"{axis}: {default} (default), {', '.join(rest)}" if rest
                             else f"{axis}: {default}")
        return "\n".join(lines or ["(none)"]) + "\n"

    def axes_markdown(self) -> list[str]:
        """The family's section of docs/axes.md (lines): its keys (``family.*``, the default value
        first) and values, then its rules."""
        out = [f"## family={self.name}: {self.title}", "",
               "| key | values (of `family.*`: the default first) |", "| --- | --- |"]
        for key, values in self.axes.items():
            if key == "precision":
                out.append(f"| `precision` | {markdown_values(values)} |")
                continue
            default = self.defaults.get(key, values[0])
            ordered = [default, *(v for v in values if str(v) != str(default))]
            out.append(f"| `family.{key}` | {markdown_values(ordered)} |")
        out += axis_docs_markdown({f"family.{k}": v for k, v in self.axis_docs.items()})
        if self.rules:
            out += ["", "Rules:", ""] + [f"- `{r.name}`: {r.why}" for r in self.rules]
        return out

    def auto_tile(self, cfg, m: int, n: int, k: int, sms: int, gpu_cc: int | None):
        """tile=auto: the :class:`experiments.spec.AutoTile` (preset name, spec, estimated time) for an
        M x N x K problem on ``sms`` SMs, ``cfg`` giving the other options. Raises SpecError: this
        family has no tile=auto (families that have one override this and :meth:`auto_settings`)."""
        raise SpecError(f"family={self.name} has no tile=auto: its tile is an option of its own (family.*)")

    def auto_settings(self, spec) -> dict:
        """The config keys (dotted) and values that give tile=auto's choice ``spec``."""
        raise SpecError(f"family={self.name} has no tile=auto")

    # ------------------------------------------------------------------ space and validation
    def spec(self, precision: str, options: dict, arch: str) -> FamilySpec:
        """Validate and resolve one point. options: axis -> value (missing -> default).

        Raises SpecError naming the key, the value and the valid values (unknown arch, precision,
        option key or value, or a rule that rejects the combination).
        """
        arch, precision = str(arch), str(precision)
        if arch not in ARCHS:
            raise SpecError(f"target.arch={arch!r} is not valid for family={self.name}; "
                            f"valid: {', '.join(ARCHS)}")
        precs = self.axes["precision"]
        if precision not in precs:
            raise SpecError(f"family={self.name}: no {self.title} for precision={precision}; "
                            f"valid: {', '.join(precs)}")
        opts = dict(options or {})
        keys = [k for k in self.axes if k != "precision"]
        unknown = sorted(set(opts) - set(keys))
        if unknown:
            raise SpecError(f"family={self.name} has no option {unknown[0]!r}; valid options: "
                            f"{', '.join(keys) or '(none)'}")
        params = {}
        for key in keys:
            valid = self.axes[key]
            value = _coerce(opts.get(key, self.defaults.get(key, valid[0])), valid)
            if value not in valid:
                raise SpecError(f"family={self.name} {key}={value!r} is not valid; "
                                f"valid: {', '.join(map(str, valid))}")
            params[key] = value
        params = self.resolve(precision, params, arch)
        for rule in self.rules:
            if msg := rule.check(precision, params, arch):
                raise SpecError(f"family={self.name} precision={precision} {arch}: {msg}")
        return FamilySpec(self.name, precision, arch, params)

    def resolve(self, precision: str, params: dict, arch: str) -> dict:
        """Replace "auto" values and add derived params (subclasses); may raise SpecError."""
        return params

    def space(self, arch: str) -> Iterator[FamilySpec]:
        """Every valid spec for ``arch``, each once (product of the axes, rules applied)."""
        seen = set()
        for values in itertools.product(*self.axes.values()):
            kw = dict(zip(self.axes, values, strict=True))
            try:
                s = self.spec(kw.pop("precision"), kw, arch)
            except SpecError:
                continue
            if s.entry not in seen:
                seen.add(s.entry)
                yield s

    def declared(self, key: str) -> tuple:
        """The values this family declares for the config key ``key`` (``precision``, ``family.<axis>``), in
        declared order, for a search over its space (experiments.runner.search); () for a key it does not
        declare."""
        axis = key.removeprefix("family.")
        return tuple(self.axes.get(axis, ())) if key == "precision" or key != axis else ()

    def describe(self) -> str:
        """Axes and rules as text (for ``--help``)."""
        lines = [f"family={self.name}: {self.title}"]
        lines += [f"  {k:<10} {', '.join(map(str, v))}" for k, v in self.axes.items()]
        lines += [f"  rule {r.name}: {r.why}" for r in self.rules]
        return "\n".join(lines)

    # ------------------------------------------------------------------ per spec
    def check_problem(self, spec: FamilySpec, m: int, n: int, k: int) -> None:
        """Raise SpecError unless this kernel handles an M x N x K problem: by default M, N, K must be
        positive multiples of :meth:`multiples` (no tails), any size where that is None."""
        if (tile := self.multiples(spec)) is not None:
            check_no_tails(spec.entry, (m, n, k), tile)

    def multiples(self, spec: FamilySpec) -> tuple[int, int, int] | None:
        """(BM, BN, BK): what M, N and K must be multiples of (:meth:`check_problem`, and the advice
        on sizes that do not fit); None (the default) where the kernel takes any size."""
        return None

    def padding_refusal(self, spec: FamilySpec) -> str:
        """Why launch.blocks_per_sm cannot cap the resident blocks of ``spec``'s launch (families whose
        :attr:`pads_launch` is False)."""
        return f"the launch of a {self.title} takes no extra dynamic shared memory"

    def threads(self, spec: FamilySpec) -> int:
        """Threads per block of the built kernel (for ptxas' occupancy); 0 for a library call."""
        return 0

    def dyn_smem(self, spec: FamilySpec) -> int:
        """Dynamic shared memory per block of the built kernel (bytes), for ptxas' occupancy and the
        static metrics; 0 (the default) for kernels with static shared memory only."""
        return 0

    def build(self, spec: FamilySpec) -> Build:
        """Source text and entry name; no GPU needed."""
        raise NotImplementedError

    def prepare(self, spec: FamilySpec, build: Build, m: int, n: int, k: int, seed: int) -> Prepared:
        """Operands, compiled kernel, launch and verify closures (worker side, needs CuPy)."""
        raise NotImplementedError

    def flops(self, spec: FamilySpec, m: int, n: int, k: int) -> int:
        """Operations of one launch: 2*M*N*K for a GEMM."""
        return 2 * m * n * k

    def tolerance(self, spec: FamilySpec, k: int, rtol: float) -> float:
        """The bound ``verify.check`` applies to C of ``spec`` at depth K, relative to (|A| |B|)_ij
        (0: exact): :func:`experiments.dtypes.tolerance` of its precision and accumulator (the ``acc``
        param, else the type's default), ``rtol`` the bound asked for f32 accumulation."""
        d = DType[spec.precision]
        return tolerance(d, spec.p.get("acc", d.acc), k, rtol, narrow=self.narrow_accumulation)

    def unit(self, spec: FamilySpec) -> str:
        """TFLOP/s for float types, TOP/s for integer types."""
        return DType[spec.precision].unit

    def rate(self, spec: FamilySpec, m: int, n: int, k: int, us: float) -> float:
        """Throughput in :meth:`unit` of one launch that takes ``us`` microseconds."""
        scale = 1e3 if self.unit(spec) == "GB/s" else 1e6
        return self.flops(spec, m, n, k) / us / scale
