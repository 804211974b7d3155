"""Facts about the GPUs: each target architecture with its limits, and SM counts by GPU name.

Sources: PTX ISA 9.0, section 13 (release notes: ``.target`` sm_86 needs PTX ISA 7.1, sm_89/sm_90 7.8,
sm_90a 8.0, sm_100 8.6, sm_120 8.7); CUDA Programming Guide, "Technical Specifications per Compute
Capability" (shared memory, warps, blocks and registers per SM); for SM counts the CUDA Programming
Guide and the vendors' data sheets. Every minimum was also checked with ``ptxas 13.0``, which names the
version or target a feature needs when it is missing.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ArchLimits", "ARCHS", "SM_COUNTS", "DEFAULT_SMS"]


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

# SMs per GPU by (a part of) its NVML name, for when the GPU itself cannot be asked; the first entry
# whose text is in the name wins
SM_COUNTS = {"H100 PCIe": 114, "H100 NVL": 132, "H100": 132, "H200": 132, "H800": 132, "GH200": 132,
             "B200": 148, "A100": 108, "A800": 108, "A30": 56, "A10": 72, "L40S": 142, "L40": 142,
             "L4": 58, "RTX 4090": 128, "RTX 6000 Ada": 142}
DEFAULT_SMS = 132          # H100 SXM / H200
