"""The Hopper family: GEMMs built from TMA loads, an mbarrier ring and ``wgmma.mma_async`` (sm_90a).

One PTX template (``kernels_ptx/wgmma_gemm.ptx.j2``, its contract in its header). A block computes a
BM x BN tile of C = A B^T (A: M x K, B: N x K, both K contiguous, as the default family's ``col`` B):
``consumers`` warpgroups each own 64 rows (BM = 64 x consumers) and issue one m64nBNkK wgmma per 32
bytes of K, both operands read from shared memory through matrix descriptors (K-major, swizzled);
accumulators stay in registers (f32, or s32 for int8). The operands arrive by TMA
(``cp.async.bulk.tensor.2d``, tensor maps passed by value) into a ring of ``stages`` stages, each
guarded by a full and an empty mbarrier; a stage is handed back to the loader only after the wgmma
that read it has completed (``wgmma.wait_group 1`` one iteration later). The loader is a separate
warpgroup that gives registers to the consumers with ``setmaxnreg`` (``producer=true``, warp
specialization) or thread 0 of the consumers (``producer=false``). ``swizzle`` sets the width of a
shared-memory row, hence BK (BK x element bytes = swizzle), the TMA swizzle mode and the
descriptors' layout field together. ``persistent=true`` launches one block per SM, each walking
tiles b, b + grid, ...; ``order`` maps a linear tile index to (tile row, tile column) in both modes:
``grouped`` walks ``group`` tile rows (8, 16 or 32) column by column, so the blocks running together
share A and B panels in L2; on an H200 at N = 8192 groups of 16 rows read 20 % less from DRAM per wave
than 8 (132 tiles over 16 x 8.25 instead of 8 x 16.5 tiles: A and B panels of 2 and 4 MB per tile row
and column at K = 8192) and were 1-4 % faster (nothing at 2048).
``tile=auto`` (:func:`auto_tile`) chooses ``consumers`` and ``bn`` per problem size.

``epilogue`` says how the accumulators reach C. ``registers``: ``st.global.v2`` straight from the
fragments; the warps wait until every store has left the SM. ``tma``: each consumer warpgroup writes
its 64 x BN tile in chunks of :data:`CHUNK_BOXES` boxes (8 columns x 64 rows each) with
``st.shared.v2`` into two staging buffers of its own after the ring, alternately; per chunk
``fence.proxy.async.shared::cta``, its first thread waits until the previous chunk's stores have read
the other buffer (``cp.async.bulk.wait_group.read 0``), a named barrier of the warpgroup
(``bar.sync 1 + wg, 128``), and that thread issues the chunk's TMA stores
(``cp.async.bulk.tensor.2d.global.shared::cta.bulk_group``, a third tensor map: C f32 / s32, box 8
columns x 64 rows, no swizzle) as one bulk group. The stores drain while the warpgroup goes on (in
persistent mode, to the next tile's wgmma); before the block exits it waits for the writes
(``cp.async.bulk.wait_group 0``). Why so:

- the staging is not part of the ring: in persistent mode the producer refills every stage with the
  next tile while this one is stored. Two buffers of 4 boxes (16 KiB a warpgroup, 32 KiB at the
  default tile) fit beside 4 stages; one chunk is written while the other is read by the TMA;
- boxes 8 columns wide (32 bytes a row, 2 KiB a box): a warp's ``st.shared.v2`` of one register pair
  covers 8 whole rows, 256 contiguous bytes, free of bank conflicts; rows of 32 or more columns lie
  128 bytes apart or a multiple, so the 8 rows meet in the same 8 banks, and 128B swizzle still
  leaves rows r and r ^ 1 on the same banks;
- ``stmatrix`` does not fit: it moves 16-bit halves (8 x 8 matrices of b16), so a thread's two 32-bit
  values of one row would land in two different matrices.

``schedule=streamk`` (persistent only): whole tiles fill the full waves (T / grid tiles per block), and
the K steps of the tiles left over are split evenly among all blocks (stream-K, Osama et al., PPoPP 2023:
its data-parallel + one stream-K wave form), so the last wave does not leave SMs idle; at N = 8192 the
default 128 x 256 tile gives 2048 tiles, 15.5 waves of the H200's 132 SMs. With fewer tiles than SMs the
grid is T x floor(SMs / T) blocks (:func:`persistent_grid`): no whole tiles, every tile's K steps split
evenly among floor(SMs / T) blocks, i.e. split-K. A block whose segment starts
past k = 0 stores its partial sums to its slot of a workspace and adds its step count to the tile's flag
(a release at GPU scope); the block whose segment starts at k = 0 waits for the flag (acquire), resets it
for the next launch and adds the slots before its epilogue. The workspace (:data:`FLAG_BYTES` of flags,
then a slot of consumers x 128 x BN / 2 x 4 bytes per block) is allocated, zeroed, with the operands.

``cluster=2``: two CTAs along M form a cluster (``.reqnctapercluster 2, 1, 1``, so a plain launch
works) and compute tile rows 2i and 2i + 1 of one tile column (M a multiple of 2 BM). Each loads its
own A and one half of the B box with ``.multicast::cluster`` into both CTAs; each CTA's full barrier
still expects the whole stage. A consumer warpgroup releases a stage on both CTAs' empty barriers
(``mapa`` + a remote ``mbarrier.arrive``; the empty count doubles), since either producer writes into
both. ``barrier.cluster`` arrive / wait after the barrier init and, by every thread, before exit.
``cluster=4``: 2 x 2 CTAs compute tiles (2i + a, 2j + b) (M a multiple of 2 BM, N of 2 BN); each loads
one half of its B box into the two CTAs of its tile column and one half of its A box into the two of
its tile row, so a CTA reads half of A and half of B from L2 (cluster=2: all of A, half of B), and
releases each stage on the empty barriers of all four. Clusters of 4 must fit one GPC: the persistent
grid is as many as the GPU runs at once (``cuOccupancyMaxActiveClusters``), which on an H200 is fewer
than 132 / 4.

Sources: PTX ISA 9.0, 9.7.15 (wgmma.mma_async, its shared-memory matrix descriptor and the D
register fragments), 9.7.9.25.5 (cp.async.bulk.tensor), 9.7.13.15 (mbarrier), 9.7.19.6 (setmaxnreg);
for the tma epilogue also the sections on cp.async.bulk.commit_group / cp.async.bulk.wait_group (bulk
async-groups), bar.sync (named barriers with a thread count) and membar / fence (fence.proxy.async:
generic-proxy writes made visible to the async proxy); for clusters those on cp.async.bulk.tensor's
.multicast::cluster, mapa, mbarrier.arrive on a shared::cluster address, barrier.cluster and the
.reqnctapercluster directive;
for stream-K the sections on ld.acquire / red.relaxed / fence.acq_rel (memory consistency model) and
Osama et al., "Stream-K: Work-centric Parallel Decomposition for Dense Matrix-Matrix Multiplication on
the GPU" (PPoPP 2023);
CUDA Driver API, cuTensorMapEncodeTiled (the map goes to CuPy's RawKernel by value, as a size-1 numpy
array of a 128-byte dtype; box dims <= 256 elements, inner box bytes a multiple of 16, and with a
swizzle at most the swizzle span; no limit on the inner bytes without one).
"""
from __future__ import annotations

import math

import numpy as np

from ..dtypes import Accum, DType
from ..hardware import ARCHS
from ..spec import NO_TAILS_ADVICE, check_no_tails
from .base import Build, Family, FamilySpec, Prepared, Rule, SpecError, render_template

__all__ = ["WgmmaFamily", "TYPES", "wgmma_types", "SWIZZLES", "geometry", "smem_bytes", "REGS", "ARCH",
           "encode_tiled", "persistent_grid", "auto_tile", "AUTO_TILES", "C_BOX_COLS",
           "CHUNK_BOXES", "OMITTED_DEFAULTS"]

ARCH = "sm_90a"             # wgmma and setmaxnreg exist only for the arch-specific target
# the element types wgmma takes (those with a wgmma K), in the order of the precision axis
TYPES = {d.name: d for d in (DType.fp16, DType.bf16, DType.fp8_e4m3, DType.fp8_e5m2, DType.int8)}
# swizzle width (bytes) -> (CUtensorMapSwizzle, descriptor layout field at bit 62)
SWIZZLES = {128: (3, 1), 64: (2, 2), 32: (1, 3)}
# registers per thread: cap at entry (producer variants, .maxnreg), producer after setmaxnreg.dec, and
# the consumers' setmaxnreg.inc target per consumer count. The per-CTA pool must cover the increase:
# 128 (168 - 40) >= 128 c (inc - 168): 240 for one consumer, 232 for two (64 x 256 = 128 x 128).
REGS = {"launch": 168, "producer": 40, "consumer": {1: 240, 2: 232}}
GROUP = 8                   # tile rows per group with order=grouped (the default of the group axis)
ALIGN_SLACK = 1024          # the ring starts at a 1024-byte boundary of dynamic shared memory
# epilogue=tma: the columns of one staging box of C (8 x 4 bytes: a warp's register pair covers 8 whole
# 32-byte rows, no bank conflict); C's CUtensorMapDataType is its accumulator's (Accum.tma)
C_BOX_COLS = 8
CHUNK_BOXES = 4             # boxes per chunk of the tma epilogue (BN / 8 is a multiple of 2 x 4 for every bn)
# axes added after runs were recorded: their default stays out of the spec (its params, hence the entry,
# the run name and the run key), so every point that existed before keeps its identity and PTX
OMITTED_DEFAULTS = {"epilogue": "registers", "cluster": 1, "schedule": "tiles", "group": GROUP}
# schedule=streamk: the workspace starts with one u32 flag per stream-K tile and CTA of a cluster (fewer
# than the grid, at most FLAG_BYTES / 4), then one slot of partial sums per CTA
FLAG_BYTES = 4096


def wgmma_types(precision: str) -> tuple[str, str]:
    """(type suffix dtype.atype.btype, operands after scale-d) of ``wgmma.mma_async`` for ``precision``
    (PTX ISA 9.0, 9.7.15.5.2): float types take imm-scale-a and imm-scale-b (1: no negation), 16-bit
    ones also imm-trans-a and imm-trans-b (0: K-major), integer types neither."""
    d = TYPES[precision]
    tail = (", 1, 1" + ", 0, 0" * (d.bits == 16)) if d.is_float else ""
    return f"{d.acc}.{d.ptx}.{d.ptx}", tail


def geometry(precision: str, p: dict) -> dict:
    """Block tile and derived sizes (bytes, threads) of one point. p: resolved params (a missing
    ``epilogue`` is ``registers``, a missing ``cluster`` 1). stage_bytes: one ring stage, (BM + BN) x SW;
    stg_wg: one consumer warpgroup's C staging with epilogue=tma, two buffers of :data:`CHUNK_BOXES`
    boxes of 64 x 8 x 4 bytes (0 with registers); stg_bytes: all of it; nchunks: chunks of a
    warpgroup's tile; CL: CTAs per cluster; nthr_c: consumer threads; slot_bytes: one CTA's partial sums
    with schedule=streamk, nthr_c x BN / 2 x 4."""
    nbytes = TYPES[precision].bits // 8
    sw, bn, cons, stages = p["swizzle"], p["bn"], p["consumers"], p["stages"]
    bm, bk = 64 * cons, sw // nbytes
    stage = (bm + bn) * sw
    box_bytes = 64 * C_BOX_COLS * 4
    stg_wg = 2 * CHUNK_BOXES * box_bytes if p.get("epilogue", "registers") == "tma" else 0
    return dict(BM=bm, BN=bn, BK=bk, SW=sw, STAGES=stages, stage_bytes=stage, a_bytes=bm * sw,
                ksteps=sw // 32, T=128 * (cons + (p["producer"] == "true")), stg_wg=stg_wg,
                stg_bytes=cons * stg_wg, box_bytes=box_bytes, chunk_boxes=CHUNK_BOXES,
                nchunks=bn // C_BOX_COLS // CHUNK_BOXES, CL=p.get("cluster", 1), nthr_c=128 * cons,
                slot_bytes=128 * cons * bn // 2 * 4)


def smem_bytes(precision: str, p: dict) -> int:
    """Dynamic shared memory of one block (bytes): alignment slack + stages x (BM + BN) x SW + the C
    staging (epilogue=tma: consumers x 2 x 4 boxes x 2048) + the barriers (2 x 8 bytes per stage)."""
    return _smem_of(geometry(precision, p))


def _smem_of(g: dict) -> int:
    """:func:`smem_bytes` of the :func:`geometry` ``g``."""
    return ALIGN_SLACK + g["STAGES"] * g["stage_bytes"] + g["stg_bytes"] + 16 * g["STAGES"]


def persistent_grid(p: dict, tiles: int, sms: int, clusters: int | None = None) -> int:
    """Blocks of a persistent launch (``persistent=true``) for ``tiles`` block tiles on ``sms`` SMs:
    one per SM, at most one per tile, in clusters of ``p['cluster']`` CTAs, at most ``clusters`` of
    them (those the GPU runs at once: :func:`experiments.families.gpu.max_active_clusters`; default
    sms / cluster). Every block is resident, which stream-K's waits need. With ``schedule=streamk``
    and fewer tiles (pair or quad tiles) than cluster slots, T x floor(slots / T) clusters instead:
    stream-K then has no whole tiles (T / G = 0) and splits every tile's K steps evenly among
    floor(slots / T) clusters, split-K, so small problems still occupy the GPU."""
    cl = p.get("cluster", 1)
    units, slots = tiles // cl, sms // cl if clusters is None else min(clusters, sms // cl)
    if p.get("schedule") == "streamk" and 0 < units < slots:
        return cl * units * (slots // units)
    return cl * min(units, slots)


# tile=auto (conf/tile/auto.yaml): the block tiles it chooses among, name -> (consumers, bn), largest first
AUTO_TILES = {"128x256": (2, 256), "128x128": (2, 128), "64x128": (1, 128), "64x64": (1, 64)}


def auto_tile(family: WgmmaFamily, precision: str, options: dict, m: int, n: int, k: int,
              sms: int, arch: str = ARCH):
    """tile=auto for the wgmma family: the block tile (consumers, bn) of :data:`AUTO_TILES` for an
    M x N x K problem on ``sms`` SMs, the other axes as ``options`` set them (``options``' own
    consumers and bn are replaced). Of the tiles that make a valid kernel (its rules: shared memory)
    and fit the size (:meth:`WgmmaFamily.check_problem`), the one of least estimated time
    (:func:`experiments.spec.waves_cost`: waves x BM x BN x (1 + G (1/BM + 1/BN)), the copies per K
    step against the MMA work), waves = ceil(tiles / SMs) with one block per SM (a producer and two
    consumer warpgroups hold 168 registers a thread from the launch on), with ``cluster`` c > 1
    ceil((tiles / c) / floor(SMs / c)); ties go to the larger tile. A GPU may run fewer clusters of 4
    than SMs / 4 (a cluster stays in one GPC: an H200 runs 30, not 33): ``tile.sms`` = 4 x that count
    plans for it.
    So a size gets the largest tile that still fills about one wave: on an H200 (132 SMs) 64x64 at
    512 (64 tiles), 64x128 at 1024 (128 tiles), 128x256 from 2048 on, the fastest of the four at each
    of these sizes for fp16, bf16, fp8_e4m3 and int8 (results/h200/generations.md).

    Returns an :class:`experiments.spec.AutoTile` (name, spec, estimated time, 1 block per SM,
    tiles). Raises SpecError when no tile fits: the one reason when every tile has it (a
    target.arch or an option the family does not have), else the sizes that fit when the size is
    what no valid tile takes, else each tile's reason."""
    from ..spec import AutoTile, waves_cost
    fits, rules, sizes = [], [], []
    for name, (consumers, bn) in AUTO_TILES.items():
        try:
            spec = family.spec(precision, {**options, "consumers": consumers, "bn": bn}, arch)
        except SpecError as exc:
            rules.append((name, str(exc)))
            continue
        try:
            family.check_problem(spec, m, n, k)
        except SpecError:
            sizes.append((math.lcm(*family.multiples(spec)), consumers * bn, name))
            continue
        g = geometry(precision, spec.p)
        tiles, cl = (m // g["BM"]) * (n // g["BN"]), g["CL"]
        at_once = max(1, sms // cl)
        cost = waves_cost(g["BM"], g["BN"], tiles // cl, at_once)       # waves of whole clusters
        note = "" if cl == 1 else f"waves of {at_once} cluster{'s' if at_once > 1 else ''} of {cl}" + (
            "; a GPU may run fewer clusters of 4, an H200 30: tile.sms = 4 x that plans for them" if cl == 4
            else "")
        fits.append((round(cost, 6), -g["BM"] * g["BN"], name, AutoTile(name, spec, cost, 1, tiles, note)))
    if fits:
        return min(fits, key=lambda f: f[:3])[3]
    if rules and not sizes and len({why for _, why in rules}) == 1:
        raise SpecError(rules[0][1])
    if sizes:
        lcm, _, name = min(sizes)
        raise SpecError(f"tile=auto: no wgmma block tile fits {m}x{n}x{k}: M must be a multiple of a tile's "
                        "BM (2 BM with cluster=2 or 4), N of its BN (2 BN with cluster=4) and K of BK; the "
                        f"smallest square sizes a tile takes are multiples of {lcm} ({name}), e.g. "
                        f"'problem.sizes=[{-(-max(m, n, k) // lcm) * lcm}]'")
    raise SpecError("tile=auto: no wgmma block tile makes a valid kernel with these options: "
                    + " | ".join(f"{name}: {why}" for name, why in rules))


def _smem_rule(precision, p, arch):
    g = geometry(precision, p)
    need, limit = _smem_of(g), ARCHS[arch].max_smem_block
    if need > limit:
        fit = (limit - ALIGN_SLACK - g["stg_bytes"]) // (g["stage_bytes"] + 16)
        staging = (f" + {g['stg_bytes']} of C staging ({p['consumers']} x {g['stg_wg']})"
                   if g["stg_bytes"] else "")
        epilogue = f" epilogue={p['epilogue']}" if "epilogue" in p else ""
        rest = ALIGN_SLACK + 16 * p["stages"]
        return (f"stages={p['stages']} needs {need} bytes of shared memory per block ({p['stages']} x "
                f"({g['BM']} + {g['BN']}) rows x {g['SW']} bytes{staging} + {rest}), "
                f"more than the {limit} (227 KiB) of {arch}; valid with bn={p['bn']} "
                f"consumers={p['consumers']} swizzle={p['swizzle']}{epilogue}: stages <= {fit}")
    return None


def _schedule_rule(precision, p, arch):
    if p.get("schedule", "tiles") == "streamk" and p["persistent"] != "true":
        return ("schedule=streamk splits the last wave's K steps among the persistent blocks: it needs "
                "persistent=true")
    return None


def _group_rule(precision, p, arch):
    if p.get("group", GROUP) != GROUP and p["order"] != "grouped":
        return (f"group={p['group']} sets the tile rows that order=grouped walks together; "
                f"order={p['order']} has no groups: use order=grouped, or leave group at its default")
    return None


def _bool(value) -> str:
    """Config booleans arrive as bool (Hydra) or text; the axes hold 'true' / 'false'."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).lower()


class WgmmaFamily(Family):
    """``family=wgmma`` (sm_90a): axes precision, bn (wgmma N), consumers (warpgroups of 64 rows),
    producer (a loading warpgroup with setmaxnreg, or thread 0), stages (ring depth), swizzle (bytes
    per smem row; BK follows), persistent (one block per SM), order (tile order), group (tile rows
    per group of order=grouped), epilogue (C from registers, or through shared memory and TMA
    stores), cluster (1; 2 CTAs along M sharing B by TMA multicast; 2 x 2 CTAs sharing A and B) and
    schedule (whole tiles, or stream-K with persistent=true). Sizes: multiples of BM (2 x BM with
    cluster=2 or 4), BN (2 x BN with cluster=4) and BK."""
    name = "wgmma"
    title = "wgmma GEMM"
    axes = {"precision": tuple(TYPES), "bn": (256, 192, 128, 64), "consumers": (2, 1),
            "producer": ("true", "false"), "stages": tuple(range(2, 9)), "swizzle": (128, 64, 32),
            "persistent": ("false", "true"), "order": ("grouped", "row"), "group": (8, 16, 32),
            "epilogue": ("registers", "tma"), "cluster": (1, 2, 4), "schedule": ("tiles", "streamk")}
    defaults = {"bn": 256, "consumers": 2, "producer": "true", "stages": 4, "swizzle": 128,
                "persistent": "false", "order": "grouped", "group": GROUP, "epilogue": "registers",
                "cluster": 1, "schedule": "tiles"}
    rules = (Rule("smem", "stages x (BM + BN) x swizzle bytes (+ consumers x 16 KiB of C staging with "
                          "epilogue=tma, 1 KiB alignment, barriers) must fit the 227 KiB of shared memory "
                          "per block", _smem_rule),
             Rule("schedule", "schedule=streamk needs persistent=true", _schedule_rule),
             Rule("group", "group (other than 8) needs order=grouped", _group_rule))
    axis_docs = {   # what each option changes in the kernel, and its restriction (docs/axes.md)
        'bn':
            'BN = the wgmma N; BN / 2 accumulators per thread; `tile=auto` chooses it per size with '
            '`consumers`',
        'consumers':
            'warpgroups of 64 rows each: BM = 64 x consumers',
        'producer':
            'true: an extra warpgroup loads (one thread issues TMA) and drops to 40 registers with '
            '`setmaxnreg`, the consumers rise to 232 (two) or 240 (one) from a cap of 168 at entry (the '
            'per-CTA pool must cover the rise); false: thread 0 of the consumers loads, `stages` ahead',
        'stages':
            'ring depth; rejected when 1 KiB (alignment) + stages x (BM + BN) x swizzle bytes + the '
            'barriers exceed 227 KiB (default tile: at most 4)',
        'swizzle':
            'bytes of one shared-memory row: BK = swizzle / element bytes (64 / 32 / 16 for 16-bit types,'
            " 128 / 64 / 32 for 8-bit); the TMA swizzle mode and the descriptors' layout field follow it",
        'persistent':
            'false: one block per tile; true: one block per SM walking tiles b, b + grid, ... (the '
            'producer loads the next tile during the epilogue)',
        'order':
            'tile order of the linear block / tile index: groups of `group` tile rows walked column by '
            'column (L2 reuse), or row by row',
        'group':
            'tile rows per group of `order=grouped` (pairs of rows with `cluster=2` or 4); needs '
            '`order=grouped` when not 8. The blocks running at once cover about group x (SMs / group) '
            'tiles, so the group sets the A and B panels a wave reads from DRAM: at N = 8192 on 132 SMs '
            '16 rows read 65 MB a wave against 82 MB with 8 (panels of 2 MB per tile row, 4 MB per tile '
            'column) (measured: `results/h200/generations.md`, `gen_wgmma_group_16`)',
        'epilogue':
            'registers: `st.global.v2` from the accumulators (the warps wait until every store has left);'
            ' tma: each consumer warpgroup writes its 64 x BN tile in chunks of 4 boxes (64 rows x 8 '
            'columns, no swizzle: no bank conflicts) with `st.shared.v2` into two 8 KiB buffers of its '
            'own after the ring, alternately; per chunk `fence.proxy.async`, its first thread waits until'
            " the previous chunk's stores have read the other buffer, a named barrier of the warpgroup, "
            "then that thread issues the chunk's `cp.async.bulk.tensor` stores through a tensor map of C."
            ' The stores drain while the next tile (persistent) computes. The staging (16 KiB per '
            'consumer) fits beside the default 4 stages',
        'cluster':
            '2: two CTAs of adjacent tile rows form a cluster (`.reqnctapercluster 2, 1, 1`); each loads '
            'its A and half of B, multicast to both (`.multicast::cluster`), and a consumer releases a '
            "stage on both CTAs' empty barriers (`mapa` + remote `mbarrier.arrive`, the count doubled); "
            'cluster barriers at start and end. M must be a multiple of 2 x BM. 4: 2 x 2 CTAs compute '
            'tiles (2i + a, 2j + b); each loads half of its A box into the two CTAs of its tile row and '
            'half of its B box into the two of its tile column, so a CTA reads half of A and half of B '
            "from L2 (2: all of A, half of B); releases go to all four CTAs' empty barriers; N must also "
            "be a multiple of 2 x BN. A cluster's CTAs share a GPC, so the persistent grid is as many "
            'clusters as run at once (`cuOccupancyMaxActiveClusters`): 30 clusters of 4 (120 of 132 SMs) '
            'on an H200 against 66 of 2, which makes 4 slower there (at 2048 its 32 clusters take two '
            'waves; measured: `results/h200/generations.md`, `results/h200/wgmma_8192_combinations.md`)',
        'schedule':
            'tiles: each block (cluster) computes whole tiles; streamk (needs `persistent=true`): whole '
            'tiles fill the full waves, and the K steps of the tiles left over are split evenly among all'
            ' blocks (Stream-K, Osama et al., PPoPP 2023, its data-parallel + one stream-K wave form). A '
            'segment that starts past k = 0 stores its partial sums to its slot of a workspace and adds '
            "its step count to the tile's flag (`fence.acq_rel.gpu` + `red.relaxed.gpu`); the segment "
            'that starts at k = 0 spins on the flag (`ld.acquire.gpu`), resets it for the next launch and'
            ' adds the slots before its epilogue. At N = 8192 the default tile gives 2048 tiles, 15.5 '
            'waves of 132 SMs. With fewer tiles T than SMs the grid is T x floor(SMs / T) blocks and '
            "every tile's K steps are split among floor(SMs / T) of them (split-K; on an H200 at 512-2048"
            ' slower than whole tiles: the partial sums cost more than the idle SMs)',
    }
    tensor_cores = True
    narrow_accumulation = True      # fp8 wgmma sums in about 14 significant bits (dtypes.FP8_RTOL)
    auto_keys = ("family.bn", "family.consumers")
    pads_launch = True

    def auto_tile(self, cfg, m: int, n: int, k: int, sms: int, gpu_cc: int | None):
        """tile=auto's choice for M x N x K on ``sms`` SMs (:func:`auto_tile`), the config's other
        ``family.*`` options kept."""
        precision, options, arch = self.options_of(cfg, gpu_cc)
        return auto_tile(self, precision, options, m, n, k, sms=sms, arch=arch)

    def auto_settings(self, spec: FamilySpec) -> dict:
        """family.consumers and family.bn of ``spec``."""
        return {"family.consumers": spec.p["consumers"], "family.bn": spec.p["bn"]}

    def spec(self, precision: str, options: dict, arch: str) -> FamilySpec:
        """As :meth:`Family.spec`; target.arch auto / sm_90 / sm_90a resolve to sm_90a, any other
        arch is a SpecError naming sm_90a."""
        arch = str(arch)
        if arch in ("auto", "sm_90", ARCH):
            arch = ARCH
        else:
            raise SpecError(f"family={self.name} needs target.arch=sm_90a (wgmma.mma_async and setmaxnreg "
                            f"exist only on sm_90a; auto and sm_90 resolve to it), not target.arch={arch}")
        opts = dict(options or {})
        for key in ("producer", "persistent"):
            if key in opts:
                opts[key] = _bool(opts[key])
        return super().spec(precision, opts, arch)

    def resolve(self, precision, params, arch):
        """Adds bk (swizzle / element bytes); drops the axes of :data:`OMITTED_DEFAULTS` at their
        default value."""
        params["bk"] = params["swizzle"] // (TYPES[precision].bits // 8)
        for axis, value in OMITTED_DEFAULTS.items():
            if params.get(axis) == value:
                del params[axis]
        return params

    def multiples(self, spec: FamilySpec) -> tuple[int, int, int]:
        """(BM, BN, BK) of the block tile; (2 BM, BN, BK) with cluster=2 (a cluster takes two tile rows),
        (2 BM, 2 BN, BK) with cluster=4 (2 x 2 tiles)."""
        g = geometry(spec.precision, spec.p)
        return g["BM"] * min(g["CL"], 2), g["BN"] * (2 if g["CL"] == 4 else 1), g["BK"]

    def check_problem(self, spec: FamilySpec, m: int, n: int, k: int) -> None:
        """Raise SpecError unless M, N, K are multiples of BM, BN, BK, and with cluster=2 the tile rows
        (M / BM) are even: the two CTAs of a cluster compute tile rows 2i and 2i + 1 of one column;
        with cluster=4 the tile columns (N / BN) too (tiles (2i + a, 2j + b), a, b in 0, 1)."""
        g = geometry(spec.precision, spec.p)
        check_no_tails(spec.entry, (m, n, k), (g["BM"], g["BN"], g["BK"]))
        bad = []
        for dim, size, tile, pairs in (("M", m, g["BM"], g["CL"] > 1), ("N", n, g["BN"], g["CL"] == 4)):
            if pairs and (size // tile) % 2:
                what = "row" if dim == "M" else "column"
                bad.append(f"{dim}={size} is {size // tile} tile {what}{'s' if size // tile > 1 else ''} of "
                           f"B{dim}={tile}, not a multiple of 2 (cluster={g['CL']}: the CTAs of a cluster "
                           f"take adjacent tile {what}s): {dim} must be a multiple of {2 * tile}")
        if bad:
            raise SpecError(f"{spec.entry} handles no tails: " + "; ".join(bad) + NO_TAILS_ADVICE)

    def threads(self, spec: FamilySpec) -> int:
        """128 x (consumers + 1 with a producer warpgroup)."""
        return geometry(spec.precision, spec.p)["T"]

    def dyn_smem(self, spec: FamilySpec) -> int:
        """Dynamic shared memory per block (bytes): the stage ring and the C staging, see
        :func:`smem_bytes`."""
        return smem_bytes(spec.precision, spec.p)

    def build(self, spec: FamilySpec) -> Build:
        p, g = spec.p, geometry(spec.precision, spec.p)
        d, (types, tail) = TYPES[spec.precision], wgmma_types(spec.precision)
        kk, acc = d.wgmma_k, d.acc
        layout = SWIZZLES[p["swizzle"]][1]
        desc_hi = (layout << 62) | ((8 * g["SW"] >> 4) << 32) | (1 << 16)
        producer = p["producer"] == "true"
        src = render_template(
            "wgmma_gemm.ptx.j2", entry=spec.entry, version="%d.%d" % ARCHS[ARCH].min_ptx, arch=ARCH,
            producer=producer, consumers=p["consumers"], persistent=p["persistent"] == "true",
            grouped=p["order"] == "grouped", group=p.get("group", GROUP) // min(g["CL"], 2),
            desc_hi=f"0x{desc_hi:016X}",
            wgmma_op=f"wgmma.mma_async.sync.aligned.m64n{g['BN']}k{kk}.{types}", wgmma_tail=tail,
            acc_t=acc, nacc=g["BN"] // 2, bk_shift=g["BK"].bit_length() - 1,
            bm_shift=g["BM"].bit_length() - 1, launch_regs=REGS["launch"], producer_regs=REGS["producer"],
            consumer_regs=REGS["consumer"][p["consumers"]], smem_bytes=smem_bytes(spec.precision, p),
            tma=p.get("epilogue") == "tma", box_cols=C_BOX_COLS, cluster=g["CL"],
            streamk=p.get("schedule") == "streamk", flag_bytes=FLAG_BYTES,
            done="CLUSTER_END" if g["CL"] > 1 else "EXIT", **g)
        return Build("ptx", src, spec.entry)

    def prepare(self, spec: FamilySpec, build: Build, m: int, n: int, k: int, seed: int,
                *, rtol: float = 1e-3, smem_pad: int = 0, data: str = "full") -> Prepared:
        """Operands as verify.make_operands draws them for ``data`` (B as N x K), C poisoned, tensor maps
        encoded (cuda-bindings, else ctypes on libcuda), the PTX loaded through the driver JIT with the
        dynamic shared memory allowed; with epilogue=tma a third map for C (f32 / s32, box
        :data:`C_BOX_COLS` x 64, no swizzle) replaces the C pointer; with cluster=2 B's box is BN / 2
        rows, with cluster=4 A's BM / 2 rows as well, and a persistent grid is whole clusters, as many
        as run at once (:func:`persistent_grid`, :func:`~experiments.families.gpu.max_active_clusters`); with
        schedule=streamk a zeroed workspace (flags, then a slot per block) follows C. fp16 and bf16
        are checked within ``rtol``, fp8 within the larger of ``rtol`` and its narrow accumulation's
        bound (:meth:`tolerance`), int8 (and data=zeros) exactly. ``smem_pad``: bytes of dynamic shared
        memory added to each block's launch after the kernel's own (launch.blocks_per_sm). Raises
        SpecError (a size that does not fit, a GPU older than sm_90)."""
        import cupy

        from ..gpu.verify import check, data_tolerance, make_operands
        from . import gpu
        gpu.check_device(spec)
        self.check_problem(spec, m, n, k)
        p, g = spec.p, geometry(spec.precision, spec.p)
        d = TYPES[spec.precision]
        nbytes, acc, dtype = d.bits // 8, Accum[d.acc], d.tma
        ops = make_operands(spec.precision, m, n, k, seed, data=data)
        c = gpu.poisoned((m, n), acc.np_dtype)
        smem = smem_bytes(spec.precision, p) + smem_pad
        kern = gpu.load_ptx(build, dyn_smem=smem)
        swz = SWIZZLES[p["swizzle"]][0]
        cl = g["CL"]
        tmap_a = encode_tiled(ops.a.data.ptr, m, k, g["BM"] // (2 if cl == 4 else 1), g["BK"], dtype, nbytes,
                              swz)
        tmap_b = encode_tiled(ops.b.data.ptr, n, k, g["BN"] // min(cl, 2), g["BK"], dtype, nbytes, swz)
        tiles = (m // g["BM"]) * (n // g["BN"])
        grid = tiles
        if p["persistent"] == "true":
            resident = gpu.max_active_clusters(kern, g["T"], smem, cl) if cl > 1 else None
            grid = persistent_grid(p, tiles, gpu.sm_count(), resident)
        if p.get("epilogue") == "tma":
            out = encode_tiled(c.data.ptr, m, n, 64, C_BOX_COLS, acc.tma, 4, 0)
        else:
            out = c
        ws = ()
        if p.get("schedule") == "streamk":
            if grid * 4 > FLAG_BYTES:
                raise SpecError(f"schedule=streamk supports up to {FLAG_BYTES // 4} blocks, not {grid}")
            # flags zero once: each launch's owners leave them zero again
            ws = (cupy.zeros(FLAG_BYTES + grid * g["slot_bytes"], dtype=np.uint8),)
        args = (tmap_a, tmap_b, out, *ws, np.uint32(m), np.uint32(n), np.uint32(k))
        block = (g["T"], 1, 1)

        def launch():
            kern((grid, 1, 1), block, args, shared_mem=smem)

        tol = data_tolerance(data, self.tolerance(spec, k, rtol))

        def verify():
            return check(c, ops, not acc.exact, tol)
        launch.operands = (ops, ws)  # the tensor maps and args hold raw pointers into A, B, C, the workspace
        launch.output = c
        notes = [f"persistent: {grid} blocks for {tiles} tiles"] if grid != tiles else []
        if d.narrow_rtol and tol != rtol:
            notes.append(f"fp8 wgmma accumulates in reduced precision: verified within rtol={tol:.3g}")
        note = "; ".join(notes)
        return Prepared(launch, verify, note=note)


# ---------------------------------------------------------------------------------- tensor maps
TMAP_DTYPE = np.dtype([("opaque", np.uint64, (16,))])      # CUtensorMap: 128 opaque bytes
L2_PROMOTION_256B = 3


def encode_tiled(ptr: int, rows: int, cols: int, box_rows: int, box_cols: int, dtype: int, nbytes: int,
                 swizzle: int):
    """A 2-D CUtensorMap of a row-major rows x cols tensor at device address ``ptr`` (cols
    contiguous), box box_rows x box_cols, the given swizzle; a (1,) array of :data:`TMAP_DTYPE`
    that CuPy passes by value. cuda.bindings.driver when importable, else ctypes on libcuda.
    Raises RuntimeError with the CUresult when the driver refuses the map."""
    if ptr % 16 or (cols * nbytes) % 16:
        raise ValueError(f"TMA needs 16-byte aligned rows: address {ptr:#x}, row of {cols * nbytes} bytes")
    try:
        from cuda.bindings import driver as drv
    except ImportError:
        return _encode_ctypes(ptr, rows, cols, box_rows, box_cols, dtype, nbytes, swizzle)
    import ctypes
    u64, u32 = drv.cuuint64_t, drv.cuuint32_t
    err, tmap = drv.cuTensorMapEncodeTiled(
        drv.CUtensorMapDataType(dtype), 2, ptr, [u64(cols), u64(rows)], [u64(cols * nbytes)],
        [u32(box_cols), u32(box_rows)], [u32(1), u32(1)],
        drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, drv.CUtensorMapSwizzle(swizzle),
        drv.CUtensorMapL2promotion(L2_PROMOTION_256B),
        drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeTiled({rows}x{cols}, box {box_rows}x{box_cols}, "
                           f"swizzle {swizzle}): {err}")
    return np.frombuffer(ctypes.string_at(int(tmap.getPtr()), 128), dtype=TMAP_DTYPE).copy()


def _encode_ctypes(ptr, rows, cols, box_rows, box_cols, dtype, nbytes, swizzle):
    import ctypes
    lib = ctypes.CDLL("libcuda.so.1")
    fn = lib.cuTensorMapEncodeTiled
    p64, p32 = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, p64, p64, p32, p32,
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    raw = np.zeros(128 + 64, dtype=np.uint8)              # the host CUtensorMap must be 64-byte aligned
    lo = (-raw.ctypes.data) % 64
    out = raw[lo:lo + 128]
    rc = fn(out.ctypes.data, dtype, 2, ctypes.c_void_p(ptr), (ctypes.c_uint64 * 2)(cols, rows),
            (ctypes.c_uint64 * 1)(cols * nbytes), (ctypes.c_uint32 * 2)(box_cols, box_rows),
            (ctypes.c_uint32 * 2)(1, 1), 0, swizzle, L2_PROMOTION_256B, 0)
    if rc:
        raise RuntimeError(f"cuTensorMapEncodeTiled({rows}x{cols}, box {box_rows}x{box_cols}, "
                           f"swizzle {swizzle}) returned CUresult {rc}")
    return out.view(TMAP_DTYPE).copy()
