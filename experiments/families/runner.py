"""What the runner (``experiments.runner.job``) needs of a registered family, from the composed config:
the family's name and options, the validated spec, the problem sizes it runs, and the resources
ptxas reports for its source without a GPU.

Resources: PTX goes to :func:`experiments.build.assemble.assemble` as it is; CUDA C++ is first compiled to
PTX with ``nvcc -arch=<arch> -ptx`` where nvcc exists (the GPU compiles the same source with NVRTC);
a library call (``Build.kind == "none"``: cuBLAS, memcpy) has nothing to assemble and needs a GPU.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

from ..build.assemble import Assembly, PtxasError, PtxasMissing, assemble, smem_padding
from ..dtypes import DType
from ..spec import SpecError, misfit_message
from . import DEFAULT, get
from .base import Build, Family, FamilySpec, config_options

__all__ = ["WGMMA", "family_name", "family_options", "family_spec", "family_shapes", "resources",
           "sass_subject", "launch_padding", "NvccError"]

WGMMA = "wgmma"


class NvccError(RuntimeError):
    """nvcc rejected a CUDA C++ source; the message holds its output."""


def family_name(cfg) -> str:
    """The config's family (``family.name``); the default family when the config has no family node."""
    node = cfg.get("family")
    return str(node.name) if node is not None and node.get("name") else DEFAULT


def family_options(cfg) -> dict:
    """The family's options from the config (``family.*`` without ``name``), Enum members by value."""
    return config_options(cfg)


def family_spec(cfg, gpu_cc: int | None) -> tuple[Family, FamilySpec]:
    """(family, spec) for the config: ``families.get(name).spec_of(cfg, gpu_cc)``, the family reading
    its options as it declares (``family.*``, or the default family's root keys) and ``target.arch``
    resolved (auto = the GPU's own, sm_90 without a GPU).

    Raises SpecError naming the key, the value and the valid values (e.g. ``family=cublas
    precision=int4``: no cuBLAS GEMM for precision=int4; valid: fp16, bf16, int8)."""
    fam = get(family_name(cfg))
    return fam, fam.spec_of(cfg, gpu_cc)


def family_shapes(fam: Family, spec: FamilySpec, shapes: list) -> list:
    """The sizes to measure: ``shapes`` checked with the family's ``check_problem`` (SpecError naming
    every size that does not fit), or ``[None]`` for a family whose work ignores the size (peak)."""
    if not fam.sized:
        return [None]
    if not shapes:
        raise SpecError("problem.sizes and problem.shapes are both empty; give at least one size")
    bad = []
    for m, n, k in shapes:
        try:
            fam.check_problem(spec, m, n, k)
        except SpecError as exc:
            bad.append(((m, n, k), exc))
    if bad:
        raise SpecError(misfit_message(spec.entry, shapes, bad, fam.multiples(spec),
                                       lambda n: _takes(fam, spec, n)))
    return shapes


def _takes(fam: Family, spec: FamilySpec, n: int) -> bool:
    """Whether the family's kernel ``spec`` takes the square problem N x N x N."""
    try:
        fam.check_problem(spec, n, n, n)
        return True
    except SpecError:
        return False


def resources(fam: Family, spec: FamilySpec, build: Build, workdir: Path) -> tuple[Assembly | None, str]:
    """ptxas' resources of a family's kernel for ``spec.arch``, without a GPU: (assembly, note).

    The assembly is None when there is nothing to assemble (a library call: note says it needs a GPU)
    or a tool is missing (note names it). Raises PtxasError or NvccError when a tool rejects the source.
    """
    if build.kind == "none":
        return None, f"needs a GPU: {fam.title} {spec.entry} is a library call, there is no kernel source"
    ptx = build.source
    if build.kind == "cuda":
        nvcc = shutil.which("nvcc")
        if nvcc is None:
            return None, "nvcc not found: the CUDA C++ source is compiled by NVRTC on the GPU only"
        workdir.mkdir(parents=True, exist_ok=True)
        src, out = workdir / f"{spec.entry}.cu", workdir / f"{spec.entry}.ptx"
        src.write_text(build.source)
        proc = subprocess.run([nvcc, f"-arch={spec.arch}", "-ptx", str(src), "-o", str(out)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise NvccError(f"nvcc -arch={spec.arch} -ptx {src.name} failed:\n{proc.stderr or proc.stdout}")
        ptx = out.read_text()
    try:
        return assemble(ptx, build.entry, spec.arch, threads=fam.threads(spec), dyn_smem=fam.dyn_smem(spec),
                        workdir=workdir), "ok"
    except PtxasMissing as exc:
        return None, str(exc)
    except PtxasError:
        raise


def sass_subject(fam: Family, spec: FamilySpec):
    """What :func:`experiments.build.assemble.sass_summary` checks the SASS against (an object with
    ``prec``), or None when the family's kernel is not meant to run on the tensor cores."""
    if fam.tensor_cores and spec.precision in DType.__members__:
        return SimpleNamespace(prec=DType[spec.precision])
    return None


def launch_padding(fam: Family, spec: FamilySpec, asm: Assembly | None, blocks: int, note: str = "") -> int:
    """Bytes of dynamic shared memory the launch of ``spec`` adds per block so that at most ``blocks``
    blocks are resident per SM (launch.blocks_per_sm; :func:`experiments.build.assemble.smem_padding` from
    ptxas' registers and static shared memory, the family's threads and dynamic shared memory).

    Raises SpecError when the family's launch takes no padding (:attr:`Family.pads_launch`, the reason
    from :meth:`Family.padding_refusal`) or the kernel reaches fewer blocks without padding (naming the
    maximum); RuntimeError when there are no resources (``note``: why, e.g. no ptxas or nvcc)."""
    if not fam.pads_launch:
        raise SpecError(f"launch.blocks_per_sm={blocks} is not valid for family={fam.name}: "
                        f"{fam.padding_refusal(spec)}; valid: 0")
    if asm is None:
        raise RuntimeError(f"launch.blocks_per_sm={blocks} needs the registers and static shared memory of "
                           f"{spec.entry} from ptxas, which are missing: {note}")
    smem = asm.static_smem + fam.dyn_smem(spec)
    return smem_padding(spec.arch, fam.threads(spec), asm.registers, smem, blocks, spec.entry)
