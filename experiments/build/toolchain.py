"""Versions of the tools that shape a result (ptxas, cuobjdump), recorded as tags and in run keys."""
from __future__ import annotations

import functools
import re
import subprocess

__all__ = ["tool_version", "toolchain_tags"]


@functools.lru_cache(maxsize=8)
def tool_version(path: str | None) -> str:
    """Version of a CUDA command-line tool from its ``--version`` output, e.g. '13.0.88'
    ('V13.0.88' in 'Cuda compilation tools, release 13.0, V13.0.88'); 'missing' without a path,
    'unknown' when the output has no version."""
    if not path:
        return "missing"
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    m = re.search(r"\bV(\d+(?:\.\d+)+)", out) or re.search(r"release (\d+(?:\.\d+)+)", out)
    return m.group(1) if m else "unknown"


def toolchain_tags() -> dict:
    """Tags ``ptxas_version``, ``cuobjdump_version``, ``nvdisasm_version`` of the tools in use."""
    from .assemble import find_ptxas, find_tool
    return {"ptxas_version": tool_version(find_ptxas()),
            "cuobjdump_version": tool_version(find_tool("cuobjdump", "cuda_cuobjdump")),
            "nvdisasm_version": tool_version(find_tool("nvdisasm", "cuda_nvdisasm"))}
