"""What each of the default family's keys changes in the kernel, and its restrictions: the text of
docs/axes.md under the family's table (:meth:`MmaSyncFamily.axes_markdown`). A new axis adds its entry here.
"""
from __future__ import annotations

__all__ = ["AXIS_DOCS"]

# key (or keys, comma-separated) -> what it changes, and its restriction (Markdown)
AXIS_DOCS = {
    'precision':
        'A/B element type. int4 packs two values per byte along the contiguous axis, the even index in '
        'the low nibble. FP8 `mma.sync` needs sm_89 and PTX ISA 8.4',
    'acc':
        'accumulator and C type (`auto`: f32 for float types, s32 for integers); with `f16` (fp16 only), '
        'C is fp16 in memory',
    'ktile':
        'BK: K depth (elements) of one shared-memory stage, at least 16 bytes of K (int4 and fp8: 32)',
    'mma':
        '`mma.sync.aligned` shape; `auto` = the largest whose K divides `ktile` (int8 `ktile=64` = two '
        'k32 MMAs per step)',
    'b_layout':
        '`col`: B stored N x K, K contiguous; `row`: K x N. 16-bit `row` is read with `ldmatrix.trans`; '
        '8- and 4-bit `row` needs `loader.b=manual` (`.trans` moves 16-bit elements only), so its cost '
        'shows instead of hiding in a host transpose',
    'loader.a, loader.b':
        'shared -> register fragment loads: `ldmatrix` of 1, 2 or 4 8x8 matrices per instruction, or '
        'scalar `ld.shared` of single elements packed into registers (`mov.b32`, `prmt`; 4-bit K x N B: '
        'nibble gathers). Every loader of a kernel computes bit-identical C. `x4` needs two m16 tiles per'
        ' warp for A (four n8 tiles for B) when rows are 16 bytes',
    'tile':
        "block tile and warp grid (presets of `conf/tile/`, `l4_32x64` being the L4 study's 2x4 warps of "
        '16x16 with row-major blocks; or `tile.block=[BM,BN] tile.warps=[WM,WN]`); warp tile = BM/WM x '
        'BN/WN. `tile.group_m` (default 8) groups block rows for L2 reuse; `tile=auto` chooses per size '
        '(below)',
    'smem_layout':
        'shared-memory rows of a stage: padded by 16 bytes (the 8 rows of an `ldmatrix` fall in 8 bank '
        "groups), or unpadded with the 16-byte chunk index XORed by the row (TMA's 32B/64B/128B swizzle "
        'patterns for rows of 32, 64, 128 and more bytes; conflict-free too, and no row straddles a '
        "128-byte line, so each warp's `cp.async` row reaches L2 as whole-line requests). `swizzled` "
        'needs rows of at least 32 bytes, `b_layout=col`, `loader.a=x4 loader.b=x4` and copy passes of '
        'whole groups of 8 rows (threads / (row bytes / 16) a multiple of 8); '
        '`experiment=h200_performance` uses it (its effect: `results/h200/main_loop_trials.md`)',
    'pipeline.stages':
        '`cp.async` stages in flight; 1 = load, wait, compute. At most 65 because `cp.async.wait_group` '
        'compiles to a scoreboard wait that counts at most 63 groups, and at most what shared memory '
        'allows on the target',
    'cache.op':
        '`cp.async` cache operator: L2 only (`cg`), or L1 and L2 (`ca`; the study calls this the '
        '"eviction policy")',
    'cache.l2_hint_a, cache.l2_hint_b':
        "L2 eviction priority of A's and B's copies: a cache-policy value (the one "
        '`createpolicy.fractional` gives for the whole access) on `cp.async ... .L2::cache_hint` (PTX ISA'
        ' 7.4)',
    'cache.l2_prefetch':
        'the `.L2::64B`, `.L2::128B` or `.L2::256B` qualifier of every `cp.async` of A and B (PTX ISA 7.4): '
        'on an L2 miss, DRAM is read in blocks of that size around the 16-byte chunk, so the lines of the '
        'next K tiles of a row arrive with the first. The main loop is the same instructions; the DRAM '
        'requests are fewer and larger (a lever on DRAM activity at a fixed main loop, beside '
        '`tile.group_m` and the L2 hints). `none` (default): no qualifier, the hardware\'s own choice',
    'target.arch':
        "`auto` = the GPU's own, `sm_90` without one; shared memory, warps and blocks per SM from the "
        'CUDA Programming Guide; `target.ptx_version` `auto` = the lowest the instructions and the target'
        ' need (sm_100: 8.6, sm_120: 8.7)',
}
