"""Assemble PTX offline with ``ptxas -v``: resources, theoretical occupancy, SASS instruction mix.

Sources: ``ptxas --help`` (``-arch``, ``-v`` report lines), CUDA Occupancy Calculator rules
(register allocation per warp in units of 256, shared memory in units of 128 B plus 1 KiB reserved
per block on sm_8x and later), ``cuobjdump -sass`` / ``nvdisasm`` (CUDA Binary Utilities; without the
toolkit: the ``nvidia-cuda-cuobjdump`` / ``nvidia-cuda-nvdisasm`` wheels).
"""
from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..hardware import ARCHS

__all__ = ["PtxasError", "PtxasMissing", "Assembly", "assemble", "find_ptxas", "find_tool",
           "theoretical_occupancy", "smem_padding", "parse_ptxas_report", "disassemble", "sass_mix",
           "sass_opcodes", "sass_summary", "misaligned_descriptors", "SASS_OPS", "SASS_OPS_SM90A",
           "PTXAS_FATAL_INFOS", "fatal_infos"]

PTXAS_HINT = ("ptxas was not found. Install the CUDA toolkit (ptxas is in its bin/ folder) or "
              "`pip install nvidia-cuda-nvcc` (CUDA 13: nvidia-cuda-nvcc; CUDA 12: "
              "nvidia-cuda-nvcc-cu12), or set PTXAS=/path/to/ptxas.")


class PtxasMissing(RuntimeError):
    """No ptxas binary: the message says how to get one."""


class PtxasError(RuntimeError):
    """ptxas rejected the PTX. ``str()`` holds ptxas' message and the PTX lines around each error."""


@dataclass
class Assembly:
    """What ``ptxas -v`` reports for one entry, plus derived figures.

    registers: per thread; spill_stores/spill_loads/stack_frame: bytes per thread;
    static_smem: bytes per block (the kernel's dynamic shared memory is not included);
    occupancy: theoretical, fraction of the SM's warps (0..1) for the given dynamic smem.
    """
    arch: str
    registers: int
    spill_stores: int
    spill_loads: int
    stack_frame: int
    static_smem: int
    barriers: int
    report: str
    cubin: bytes = b""
    occupancy: float | None = None
    blocks_per_sm: int | None = None
    occupancy_limiter: str | None = None
    sass: str = ""
    sass_counts: dict = field(default_factory=dict)


def find_ptxas() -> str | None:
    """Path of ptxas: $PTXAS, then PATH, then the nvidia-cuda-nvcc wheel's bin/."""
    if os.environ.get("PTXAS"):
        return os.environ["PTXAS"]
    return find_tool("ptxas", "cuda_nvcc")


def find_tool(name: str, wheel: str) -> str | None:
    """Path of a CUDA tool (ptxas, cuobjdump, nvdisasm): PATH, then ``nvidia/<wheel>/bin`` (CUDA 12
    wheels) or ``nvidia/cu13/bin`` (CUDA 13 wheels) on sys.path; None when absent."""
    found = shutil.which(name)
    if found:
        return found
    for base in map(Path, sys.path):
        for sub in (f"nvidia/{wheel}/bin/{name}", f"nvidia/cu13/bin/{name}"):
            if (base / sub).is_file():
                return str(base / sub)
    return None


_NUM = r"(\d+)"


def parse_ptxas_report(text: str, entry: str) -> dict:
    """Parse the ``ptxas -v`` info lines of ``entry`` into integers (bytes, registers).

    Returns keys registers, spill_stores, spill_loads, stack_frame, static_smem, barriers.
    Raises ValueError when the report has no block for ``entry``.
    """
    m = re.search(rf"Compiling entry function '{re.escape(entry)}'", text) or \
        re.search(rf"Function properties for {re.escape(entry)}$", text, re.M)
    if m is None:
        raise ValueError(f"no ptxas -v report for entry {entry!r}")
    block = text[m.start():]
    nxt = block.find("Compiling entry function", 10)
    block = block if nxt < 0 else block[:nxt]

    def grab(pattern: str) -> int:
        m = re.search(pattern, block)
        return int(m.group(1)) if m else 0
    return dict(
        registers=grab(r"Used " + _NUM + r" registers"),
        spill_stores=grab(_NUM + r" bytes spill stores"),
        spill_loads=grab(_NUM + r" bytes spill loads"),
        stack_frame=grab(_NUM + r" bytes stack frame"),
        static_smem=grab(_NUM + r" bytes smem"),
        barriers=grab(r"used " + _NUM + r" barriers"),
    )


def fatal_infos(report: str) -> list[str]:
    """The lines of a ``ptxas -v`` report carrying one of :data:`PTXAS_FATAL_INFOS` (wgmma serialized,
    a wait or fence injected, setmaxnreg ignored); [] when there is none."""
    return [ln.strip() for ln in report.splitlines() if any(f"({c})" in ln or f" {c} " in ln
                                                            for c in PTXAS_FATAL_INFOS)]


def _error_context(ptx: str, stderr: str, path: str, around: int = 3) -> str:
    lines = ptx.splitlines()
    parts = [stderr.strip(), f"PTX file: {path}"]
    for ln in sorted({int(x) for x in re.findall(r"line (\d+);", stderr)})[:5]:
        lo, hi = max(1, ln - around), min(len(lines), ln + around)
        parts.append(f"--- PTX lines {lo}-{hi} ---")
        parts += [f"{'>' if i == ln else ' '}{i:5d}  {lines[i - 1]}" for i in range(lo, hi + 1)]
    return "\n".join(parts)


def theoretical_occupancy(arch: str, threads: int, registers: int, smem_bytes: int):
    """Theoretical occupancy of one kernel on ``arch``.

    threads: per block; registers: per thread; smem_bytes: static + dynamic per block (bytes).
    Returns (occupancy 0..1, resident blocks per SM, limiter in {'warps','registers','smem','blocks'}).
    Follows the CUDA Occupancy Calculator's allocation granularities.
    """
    lim = ARCHS[arch]
    warps = -(-threads // 32)
    regs_warp = -(-max(registers, 1) * 32 // lim.reg_alloc_unit) * lim.reg_alloc_unit
    by = {
        "warps": lim.max_warps_sm // warps,
        # registers live in 4 SM sub-partitions: warps fit per partition, then blocks per SM
        "registers": 4 * ((lim.regs_sm // 4) // regs_warp) // warps,
        "blocks": lim.max_blocks_sm,
    }
    smem = smem_bytes + lim.smem_reserved_block
    smem = -(-smem // lim.smem_alloc_unit) * lim.smem_alloc_unit
    by["smem"] = lim.smem_sm // smem
    limiter = min(by, key=by.get)
    blocks = by[limiter]
    return blocks * warps / lim.max_warps_sm, blocks, limiter


def smem_padding(arch: str, threads: int, registers: int, smem_bytes: int, blocks: int,
                 kernel: str = "this kernel") -> int:
    """Bytes of dynamic shared memory to add to each block's launch so that at most ``blocks`` blocks
    are resident per SM on ``arch`` (launch.blocks_per_sm), the kernel's instructions unchanged.

    threads: per block; registers: per thread; smem_bytes: the kernel's static + dynamic shared memory
    per block (bytes); kernel: its name, for the error. The padded block takes the least allocation
    (:func:`theoretical_occupancy`'s granularity, with the per-block reservation) of which the SM's
    shared memory holds ``blocks`` and not ``blocks + 1``; 0 when the kernel reaches exactly ``blocks``
    already. Raises :class:`experiments.spec.SpecError` naming the reachable maximum and its limiter
    when ``blocks`` is more than the kernel reaches without padding, or not positive."""
    from ..spec import SpecError
    reach, limiter = theoretical_occupancy(arch, threads, registers, smem_bytes)[1:]
    if not 1 <= blocks <= reach:
        raise SpecError(f"launch.blocks_per_sm={blocks} is not valid for {kernel} on {arch}: without "
                        f"padding it reaches {reach} resident block{'s' * (reach != 1)} per SM (limited by "
                        f"{limiter}: {threads} threads, {registers} registers per thread, {smem_bytes} bytes "
                        f"of shared memory per block); valid: 0 (as many as fit) or 1 ... {reach}")
    if blocks == reach:
        return 0
    lim = ARCHS[arch]
    alloc = (lim.smem_sm // (blocks + 1) // lim.smem_alloc_unit + 1) * lim.smem_alloc_unit
    return alloc - lim.smem_reserved_block - smem_bytes


# one SASS instruction: /*offset*/, an optional guard predicate, the mnemonic with its modifiers
# (shape modifiers such as HGMMA's .64x256x16 keep their lowercase x)
_SASS_OP = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+(?:x[0-9]+)*)*)")
# the instruction classes reported as metrics sass_<op> (tensor-core MMA, shared/global movement, ...)
SASS_OPS = ("HMMA", "IMMA", "QMMA", "HGMMA", "LDSM", "LDGSTS", "LDS", "STS", "CALL", "BAR", "F2FP")
# reported too for sm_90a kernels: the warpgroup MMA of int8 and fp8 and the TMA tile load / store
SASS_OPS_SM90A = ("IGMMA", "QGMMA", "UTMALDG", "UTMASTG")
# ptxas infos that make a wgmma / setmaxnreg kernel slower than written: the build fails with them
# (C7511, C7515: wgmma serialized; C7517, C7519: a missing wait / fence patched in; C7508: setmaxnreg
# ignored for want of a register cap at entry)
PTXAS_FATAL_INFOS = ("C7508", "C7511", "C7515", "C7517", "C7519")


def sass_opcodes(sass: str) -> dict:
    """Count full SASS mnemonics (e.g. ``IMMA.16832.S8.S8``) in ``cuobjdump -sass`` or ``nvdisasm``
    text. Instructions guarded by ``@!PT`` (never executed; ptxas pads with them) are not counted."""
    return dict(collections.Counter(m.group(2) + m.group(3) for m in _SASS_OP.finditer(sass)
                                    if (m.group(1) or "").strip() != "@!PT"))


def sass_mix(sass: str) -> dict:
    """Count SASS opcodes by base name (IMMA, HMMA, LDSM, LDGSTS, BAR, ...) as :func:`sass_opcodes`."""
    out = collections.Counter()
    for op, n in sass_opcodes(sass).items():
        out[op.split(".")[0]] += n
    return dict(out)


def disassemble(cubin: str | Path) -> str:
    """SASS text of a cubin: ``cuobjdump -sass``, else ``nvdisasm``; '' when neither is found or
    both fail (install the nvidia-cuda-cuobjdump or nvidia-cuda-nvdisasm wheel)."""
    for tool, wheel, args in (("cuobjdump", "cuda_cuobjdump", ["-sass"]), ("nvdisasm", "cuda_nvdisasm", [])):
        path = find_tool(tool, wheel)
        if path:
            res = subprocess.run([path, *args, str(cubin)], capture_output=True, text=True)
            if res.returncode == 0 and res.stdout.strip():
                return res.stdout
    return ""


def sass_summary(asm: Assembly, spec) -> tuple[dict, dict]:
    """Instruction mix and MMA execution of an assembled kernel.

    Returns (metrics, tags): metrics ``sass_<op>`` = count of each class of :data:`SASS_OPS`
    (0 when absent) and ``sass_instructions`` (all executed-able instructions); tags ``mma_native``
    ("true" when the SASS holds the tensor-core instruction of the spec's element type, e.g.
    IMMA.*.S4 for int4, QMMA.*.E4M3 for fp8_e4m3; "false" when ptxas emulates it, as it does for
    .s4 on sm_90 (IMMA.S8 plus integer code) and .e4m3/.e5m2 on sm_90/sm_100 (F2FP conversions plus
    HMMA)) and ``mma_native_reason`` (what was found). Without SASS (no cuobjdump/nvdisasm) the
    metrics are empty and mma_native is "unknown": missing, never zero.
    """
    if not asm.sass:
        return {}, {"mma_native": "unknown",
                    "mma_native_reason": "no SASS: cuobjdump or nvdisasm was not found"}
    ops = sass_opcodes(asm.sass)
    base = sass_mix(asm.sass)
    metrics = {f"sass_{op}": base.get(op, 0)
               for op in SASS_OPS + (SASS_OPS_SM90A if asm.arch == "sm_90a" else ())}
    metrics["sass_instructions"] = sum(ops.values())
    opcode, need, avoid = spec.prec.sass_mma
    # the warpgroup form (wgmma, sm_90a: HGMMA, IGMMA, QGMMA) runs the same type natively
    native = {op: n for op, n in ops.items() if op.split(".")[0] in (opcode, opcode[0] + "GMMA")
              and (not need or need in op.split(".")[1:]) and not set(avoid) & set(op.split(".")[1:])}
    want = f"{opcode}{'.*.' + need if need else ''}"
    mma = {op: n for op, n in ops.items()
           if op.split(".")[0] in ("HMMA", "IMMA", "QMMA", "HGMMA", "IGMMA", "QGMMA")}
    inst = "wgmma" if any(op.split(".")[0].endswith("GMMA") for op in mma) else "mma.sync"
    if native:
        found = ", ".join(f"{n} x {op}" for op, n in sorted(native.items()))
        return metrics, {"mma_native": "true",
                         "mma_native_reason": f"{found}: {inst} .{spec.prec.ptx} runs on the tensor cores"}
    other = ", ".join(f"{n} x {op}" for op, n in sorted(mma.items())) or "no tensor-core instruction"
    conv = f", {base.get('F2FP', 0)} x F2FP conversions" if base.get("F2FP") else ""
    calls = f", {base['CALL']} x CALL" if base.get("CALL") else ""
    return metrics, {"mma_native": "false",
                     "mma_native_reason": f"no {want} in the SASS for {inst} .{spec.prec.ptx} on "
                                          f"{asm.arch}: ptxas emulates it with {other}{conv}{calls}"}


def assemble(ptx: str, entry: str, arch: str, *, threads: int, dyn_smem: int,
             workdir: str | Path | None = None, with_sass: bool = True) -> Assembly:
    """Run ``ptxas -arch=<arch> -v`` on the PTX text and return the Assembly of ``entry``.

    ``dyn_smem`` (bytes per block) enters the occupancy. With ``with_sass`` and cuobjdump or nvdisasm
    available (:func:`disassemble`), the SASS text and its opcode counts are added.
    Raises PtxasMissing (with install hints) or PtxasError (ptxas' message and PTX context).
    """
    ptxas = find_ptxas()
    if ptxas is None:
        raise PtxasMissing(PTXAS_HINT)
    tmp = Path(workdir or tempfile.mkdtemp(prefix="ptxas_"))
    tmp.mkdir(parents=True, exist_ok=True)
    src, out = tmp / f"{entry}.ptx", tmp / f"{entry}.{arch}.cubin"
    src.write_text(ptx)
    proc = subprocess.run([ptxas, f"-arch={arch}", "-v", str(src), "-o", str(out)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise PtxasError(_error_context(ptx, proc.stderr or proc.stdout, str(src)))
    report = (proc.stdout + proc.stderr).strip()
    if fatal := fatal_infos(report):
        raise PtxasError(f"ptxas assembled {entry} for {arch} but reported what makes it slower than "
                         f"written (build checks {', '.join(PTXAS_FATAL_INFOS)}):\n" + "\n".join(fatal)
                         + f"\nPTX file: {src}")
    asm = Assembly(arch=arch, report=report, cubin=out.read_bytes(),
                   **parse_ptxas_report(report, entry))
    asm.occupancy, asm.blocks_per_sm, asm.occupancy_limiter = theoretical_occupancy(
        arch, threads, asm.registers, asm.static_smem + dyn_smem)
    if with_sass:
        asm.sass = disassemble(out)
        asm.sass_counts = sass_mix(asm.sass) if asm.sass else {}
        if bad := misaligned_descriptors(asm.sass):
            raise PtxasError(f"ptxas assembled {entry} for {arch} into SASS that cannot run: a 64-bit "
                             f"memory descriptor (the .L2::cache_hint policy) in an odd uniform register "
                             f"raises an illegal instruction on the GPU:\n" + "\n".join(bad[:4])
                             + f"\nPTX file: {src}")
    return asm


_ODD_DESC = re.compile(r"desc\[UR(\d*[13579])\]")


def misaligned_descriptors(sass: str) -> list[str]:
    """The SASS lines whose memory descriptor ``desc[URn]`` sits in an odd uniform register: a 64-bit
    operand needs an aligned pair, so the instruction faults (cudaErrorIllegalInstruction). ptxas 13.0
    emits this for ``cp.async ... .L2::cache_hint`` whose shared address it folds into ``[R+UR]``
    (seen on an H200); [] when there is none."""
    return [ln.strip() for ln in sass.splitlines() if _ODD_DESC.search(ln)]
