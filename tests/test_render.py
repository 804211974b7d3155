"""experiments/families/mma_sync/render.py: every loader puts exactly the PTX ISA fragment into every register, and
rendered kernels compute the GEMM when the PTX is executed on a CPU (tests/ptx_interpreter.py).

A byte model of one shared-memory stage (what cp.async writes: A row r at r * pitch, B column n (col)
or K row k (row) after A) is read the way the ISA defines the loads (PTX ISA 9.0, 9.7.14.5.15): for
ldmatrix lane l supplies row l % 8 of matrix l / 8, thread t receives 32-bit word t % 4 of row t / 4
(or, with .trans, the 16-bit elements of column t / 4 in rows 2(t % 4) and 2(t % 4) + 1); scalar
loads read the bytes at the plan's offsets (4-bit K x N: the nibble of column groupID). The elements
each register ends up with must be those of "Matrix Fragments for mma.m16n8kK" (9.7.14.5.8-11):
A register i: row groupID (+8 for odd i), K bytes 4 * (lane % 4) (+16 for i >= 2); B register i:
column groupID, K bytes 4 * (lane % 4) (+16 for i = 1), in chunks of 32 (or 16) bytes of K. Since
all loaders produce the same bits, they give bit-identical C (tests/test_gpu.py checks that on a GPU).
"""
import re
from types import SimpleNamespace

import numpy as np
import pytest
from ptx_interpreter import run_gemm

from experiments.families.mma_sync.render import fragment_plan, lane_address, lane_bases, render, template_context
from experiments.spec import SpecError
from experiments.families.mma_sync.spec import KernelSpec, space
from experiments.families.mma_sync.domains import LOADERS
from experiments.dtypes import tolerance
from experiments.gpu.verify import check


def _unswizzle(s, r, byte):
    """The logical byte in row ``r`` of the physical ``byte`` (smem_layout=swizzled: 16-byte chunk j
    of row r is stored at j ^ ((r >> shift) & mask), spec.swizzle)."""
    if not s.swizzle:
        return byte
    sh, mask = s.swizzle
    return ((byte // 16) ^ ((r >> sh) & mask)) * 16 + byte % 16


def _byte(s, addr):
    """(region, row, byte in row) of a shared-memory byte of stage 0; padding fails the test."""
    a_bytes = s.bm * s.smem_stride
    if addr < a_bytes:
        r, kb = divmod(addr, s.smem_stride)
        assert kb < s.row_bytes and r < s.bm, f"A padding or beyond at {addr}"
        return "A", r, _unswizzle(s, r, kb)
    r, cb = divmod(addr - a_bytes, s.b_stride)
    rows, row_bytes = (s.bn, s.row_bytes) if s.b_layout == "col" else (s.ktile, s.b_row_bytes)
    assert r < rows and cb < row_bytes, f"B padding or beyond at {addr}"
    return ("B" if s.b_layout == "col" else "BR"), r, _unswizzle(s, r, cb)


def _along_k(s, srcs):
    """Bytes of one A row or B column, consecutive along K -> [(row, k)], low element first."""
    out = []
    if s.prec.bits == 16:
        for lo, hi in zip(srcs[0::2], srcs[1::2], strict=True):
            assert lo[:2] == hi[:2] and lo[2] % 2 == 0 and hi[2] == lo[2] + 1, (lo, hi)
            out.append((lo[1], lo[2] // 2))
        return out
    for _, r, kb in srcs:
        out += [(r, kb)] if s.prec.bits == 8 else [(r, 2 * kb), (r, 2 * kb + 1)]
    return out


def _register(s, lane, bases, ld, reg):
    """[(row or column, k)] that load ``ld`` leaves in register ``reg`` of ``lane``; ``bases``: the
    operands' per-lane addresses (lane_address of every lane)."""
    lanes = bases["a" if ld["base"] in ("%rd_a", "%sw_a") else "b"]
    addr = lambda lane: lanes[lane] ^ ld.get("xor", 0)  # noqa: E731  (swizzled chunks c > 0: base ^ 32c)
    t = lane
    if ld["kind"] == "ldsm":
        j = ld["regs"].index(reg)
        if not ld["trans"]:
            a0 = addr(8 * j + t // 4) + ld["off"] + 4 * (t % 4)
            return _along_k(s, [_byte(s, a0 + x) for x in range(4)])
        out = []
        for r in (2 * (t % 4), 2 * (t % 4) + 1):
            a0 = addr(8 * j + r) + ld["off"] + 2 * (t // 4)
            lo, hi = _byte(s, a0), _byte(s, a0 + 1)
            assert lo[0] == hi[0] == "BR" and lo[1] == hi[1] and lo[2] % 2 == 0
            out.append((lo[2] // 2, lo[1]))
        return out
    a0 = addr(t)
    if ld["kind"] == "pack16":
        srcs = [_byte(s, a0 + o + x) for o in ld["offs"] for x in range(2)]
        return [(srcs[i][2] // 2, srcs[i][1]) for i in (0, 2)] if srcs[0][0] == "BR" else _along_k(s, srcs)
    srcs = [_byte(s, a0 + o) for o in ld["offs"]]
    if srcs[0][0] != "BR":
        return _along_k(s, srcs)
    if ld["kind"] == "pack8":
        return [(nb, k) for _, k, nb in srcs]
    return [(2 * nb + ((t >> 2) & 1), k) for _, k, nb in srcs]         # nibble of column groupID


def _fragment(s, lane, warp, reg, chunk):
    """The PTX ISA fragment of ``reg`` in K chunk ``chunk``: [(row or column, k)], low element first."""
    op, tile, i = re.fullmatch(r"%([ab])\d[mn](\d+)_(\d)", reg).groups()
    tile, i = int(tile), int(i)
    g, tig, bits = lane >> 2, lane & 3, s.prec.bits
    kbyte = chunk * (32 if s.row_bytes % 32 == 0 else 16) + tig * 4
    if op == "a":
        row = warp[0] * s.warp_tile[0] + tile * 16 + g + 8 * (i % 2)
        return [(row, (kbyte + (i // 2) * 16) * 8 // bits + x) for x in range(32 // bits)]
    col = warp[1] * s.warp_tile[1] + tile * 8 + g
    return [(col, (kbyte + i * 16) * 8 // bits + x) for x in range(32 // bits)]


def _geometry(s):
    """The numbers of ``s`` that _register, _byte and _fragment read, read once (the spec derives them
    anew on every read, millions of times in _check)."""
    names = ("bm", "bn", "ktile", "b_layout", "row_bytes", "b_row_bytes", "smem_stride", "b_stride", "swizzle",
             "prec", "warp_tile")
    return SimpleNamespace(**{name: getattr(s, name) for name in names})


def _check(s, warps):
    n = 0
    g = _geometry(s)
    plan0, plan1 = fragment_plan(s, 0), fragment_plan(s, 1)
    assert str(plan1) == str(plan0).replace("%a0m", "%a1m").replace("%b0n", "%b1n")
    bases = {w: {op: [lane_address(b, lane, *w) for lane in range(32)] for op, b in lane_bases(s).items()}
             for w in warps}
    for c, ch in enumerate(plan0):
        loaded = []
        for ld in ch["loads"]:
            for reg in ld["regs"] if ld["kind"] == "ldsm" else [ld["reg"]]:
                loaded.append(reg)
                for warp in warps:
                    for lane in range(32):
                        got = _register(g, lane, bases[warp], ld, reg)
                        want = _fragment(g, lane, warp, reg, c)
                        assert got == want, (s.entry, c, reg, lane, warp, got, want)
                        n += 1
        assert len(loaded) == len(set(loaded))                        # each register loaded once
        assert {r for _, a, b in ch["mmas"] for r in a + b} <= set(loaded)
    return n


TILES = {"l4_32x64": (32, 64, 2, 4), "64x64": (64, 64, 2, 2)}


def _plans():
    """One spec per distinct fragment plan, from one walk of the space: padded (precision, ktile,
    mma, b_layout, loaders and tile) and swizzled (precision width, ktile, mma, tile)."""
    sp, seen, swizzled = space(["sm_90"], TILES), {}, {}
    for _, values, _ in sp.cells:
        s = sp.spec(values, 1)
        if s.smem_layout == "swizzled":
            swizzled.setdefault((s.prec.bits, s.ktile, s.mma_k, s.bm), s)
        else:
            seen.setdefault((s.precision, s.ktile, s.mma_k, s.b_layout, s.loader_a, s.loader_b, s.bm), s)
    return list(seen.values()), list(swizzled.values())


PLANS, SWIZZLED = _plans()


def _key(s):
    return (s.prec.bits, s.ktile, s.mma_k, s.b_layout, s.loader_a, s.loader_b, s.bm)


def test_types_of_one_width_share_the_plan():
    """The plan depends on the element width only: fp16 = bf16, and fp8 = int8 (m16n8k32)."""
    by = {}
    for s in PLANS:
        by.setdefault(_key(s), []).append(s)
    shared = 0
    for group in by.values():
        plans = {str(fragment_plan(s, 0)) for s in group}
        bases = {str(lane_bases(s)) for s in group}
        assert len(plans) == len(bases) == 1, [s.entry for s in group]
        shared += len(group) > 1
    # fp16 = bf16: 8 (ktile, mma) x 32 loader/layouts x 2 tiles; int8 = fp8_e4m3 = fp8_e5m2: ktile
    # 32/64/128 with k32 x 20 x 2 tiles
    assert shared == 8 * 32 * 2 + 3 * 20 * 2


@pytest.mark.parametrize("bits", [16, 8, 4])
def test_every_loader_loads_the_isa_fragment(bits):
    """Both study-tile (1 m16 x 2 n8 per warp) and 64x64 (2 x 4) plans; the first warp of each, the
    last warp of every fifth (the warp only shifts the base address)."""
    specs = list({_key(s): s for s in PLANS if s.prec.bits == bits}.values())
    checked = sum(_check(s, [(0, 0)] + [(s.warps_m - 1, s.warps_n - 1)] * (i % 5 == 0))
                  for i, s in enumerate(specs))
    layouts = {(s.loader_a, s.loader_b, s.b_layout) for s in specs}
    if bits == 16:
        assert len(layouts) == 4 * 4 * 2                             # .trans serves every 16-bit loader
    else:
        assert len(layouts) == 4 * 4 + 4                              # row B only with loader.b=manual
    assert checked > 10000


def test_swizzled_plans_load_the_isa_fragment():
    """smem_layout=swizzled: every register of every (width, ktile, mma, tile) gets its ISA fragment
    through the XOR-permuted chunks (rows of 32, 64, 128 and 256 bytes: every swizzle pattern)."""
    assert {s.row_bytes for s in SWIZZLED} == {32, 64, 128, 256}
    assert sum(_check(s, [(0, 0), (s.warps_m - 1, s.warps_n - 1)]) for s in SWIZZLED) > 5000


@pytest.mark.parametrize("layout", ["padded", "swizzled"])
def test_ldmatrix_rows_fall_in_eight_bank_groups(layout):
    """Each 8x8 matrix of an ldmatrix reads 8 rows of 16 bytes: with padded rows (+16 B) and with
    swizzled ones the 8 addresses fall in 8 different 16-byte bank groups (addr / 16 % 8), so the
    read takes one shared-memory wavefront; unpadded, unswizzled 128-byte rows would all collide."""
    specs = [s for s in (SWIZZLED if layout == "swizzled" else PLANS)
             if s.loader_a == s.loader_b == "x4" and s.b_layout == "col" and s.row_bytes >= 32]
    assert specs
    for s in specs:
        bases = {op: [lane_address(b, lane) for lane in range(32)] for op, b in lane_bases(s).items()}
        for ch in fragment_plan(s, 0):
            for ld in ch["loads"]:
                lanes = bases["a" if ld["base"] in ("%rd_a", "%sw_a") else "b"]
                for j in range(4):
                    groups = {((lanes[8 * j + r] ^ ld.get("xor", 0)) + ld["off"]) // 16 % 8 for r in range(8)}
                    assert len(groups) == 8, (s.entry, ld, j)


def test_swizzled_kernels_are_named_and_keyed_apart():
    """The layout is in the entry name (``_sw``), the run name (``sw``) and the run key of swizzled
    kernels; padded kernels keep the run key they had before the axis existed (no smem_layout in it)."""
    from experiments import families
    from experiments.store.record import run_name
    fam = families.get(families.DEFAULT)
    kw = dict(precision="int8", ktile=64, mma_k=32, bm=128, bn=256, warps_m=2, warps_n=4, stages=3,
              cache_op="cg", arch="sm_90", loader_a="x4", loader_b="x4")
    padded, swizzled = KernelSpec(**kw), KernelSpec(**kw, smem_layout="swizzled")
    assert swizzled.entry == "gemm_int8_bk64_m16n8k32_ldx4x4_cg_sw_bcol_s3_128x256_w2x4_g8"
    assert padded.entry == swizzled.entry.replace("_sw", "")
    assert run_name(fam, swizzled, (8192,) * 3) == "8192 int8 bk64 128x256 ldx4x4 sw w2x4 m16n8k32 s3"
    assert "smem_layout" not in dict(fam.identity(padded))
    assert dict(fam.identity(swizzled))["smem_layout"] == "swizzled"
    assert [kv for kv in fam.identity(swizzled) if kv[0] != "smem_layout"] == fam.identity(padded)


def test_l2_prefetch_kernels_are_named_keyed_and_assembled_apart(tmp_path, need_ptxas):
    """cache.l2_prefetch adds ``.L2::<size>`` to every cp.async (after the cache hint) and nothing else:
    the entry (``_pf256B``), the run name (``pf256B``) and the run key name it; without it the PTX,
    entry and run key are those the kernel had before the axis existed. ptxas takes it on sm_80 and sm_90."""
    import subprocess

    from experiments import families
    from experiments.store.record import run_name
    fam = families.get(families.DEFAULT)
    kw = dict(precision="fp16", ktile=32, mma_k=16, bm=128, bn=128, warps_m=2, warps_n=2, stages=3,
              cache_op="cg", arch="sm_90", l2_hint_b="evict_last")
    plain, pf = KernelSpec(**kw), KernelSpec(**kw, l2_prefetch="256B")
    assert pf.entry == "gemm_fp16_bk32_m16n8k16_ldx4x2_cg_l2xl_pf256B_bcol_s3_128x128_w2x2_g8"
    assert plain.entry == pf.entry.replace("_pf256B", "")
    assert run_name(fam, pf, (4096,) * 3) == "4096 fp16 128x128 l2xl pf256B w2x2 bk32 m16n8k16 s3"
    assert "l2_prefetch" not in dict(fam.identity(plain))
    assert [kv for kv in fam.identity(pf) if kv[0] != "l2_prefetch"] == fam.identity(plain)
    a, b = render(plain), render(pf)
    assert "cp.async.cg.shared.global [%dst_a+0], [%g_src], 16;" in a and ".L2::256B" not in a
    assert "cp.async.cg.shared.global.L2::256B [%dst_a+0], [%g_src], 16;" in b
    assert "cp.async.cg.shared.global.L2::cache_hint.L2::256B [%dst_b+0], [%g_src], 16, %pol_b;" in b
    assert b.replace(".L2::256B", "").replace(pf.entry, plain.entry) == a      # nothing else differs
    assert KernelSpec(**{**kw, "l2_hint_b": "none", "arch": "sm_80"}, l2_prefetch="64B").ptx_version == (7, 4)
    for spec in (pf, KernelSpec(**{**kw, "arch": "sm_80"}, l2_prefetch="64B")):
        path = tmp_path / f"{spec.entry}.ptx"
        path.write_text(render(spec))
        proc = subprocess.run([need_ptxas, f"-arch={spec.arch}", str(path), "-o", str(tmp_path / "k.cubin")],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    with pytest.raises(SpecError, match="cache.l2_prefetch=512B is not valid; valid values: none, 64B, 128B, 256B"):
        KernelSpec(**kw, l2_prefetch="512B")


def test_plan_counts():
    """(precision, ktile, mma) triples: 16 of 16-bit types, 7 int8, 5 int4, 6 fp8 = 34. Loaders per
    triple: 16-bit 4 x 4 x 2 layouts = 32; 8-/4-bit with 32-byte K chunks 4 x (4 col + manual row) = 20;
    with 16-byte rows (int8 ktile 16, int4 ktile 32) x4 needs 2 m16 / 4 n8 tiles: the study tile
    (1 m16, 2 n8) keeps 3 x (3 + 1) = 12, 64x64 (2 m16, 4 n8) all 20.
    Study tile: 16 x 32 + 2 x 12 + 16 x 20 = 856; 64x64: 16 x 32 + 18 x 20 = 872."""
    assert len(PLANS) == 856 + 872


def test_lane_bases_of_the_study_kernels():
    """The address arithmetic the template prints, for a few lanes (byte offsets in the stage)."""
    s = KernelSpec("int4", 64, 64, 32, 64, 2, 4, 2, "ca", "sm_89", group_m=1)
    a, b = lane_bases(s)["a"], lane_bases(s)["b"]
    # A: 32-byte rows, pitch 48; lane 17 -> row 1, K bytes 16; warp_m = 1 adds 16 rows
    assert lane_address(a, 17) == 48 + 16 and lane_address(a, 17, warp_m=1) == 17 * 48 + 16
    # B (N x K) after 32 A rows: lane 9 -> column 1, K bytes 16; lane 16 -> column 8
    assert lane_address(b, 9) == 32 * 48 + 48 + 16 and lane_address(b, 16) == 32 * 48 + 8 * 48
    # B stored K x N, 4-bit, manual: lane 13 (groupID 3, tig 1) -> K row 8, byte 1 of the row (pitch 48)
    s = KernelSpec("int4", 64, 64, 32, 64, 2, 4, 2, "ca", "sm_89", b_layout="row", loader_b="manual")
    assert lane_address(lane_bases(s)["b"], 13, warp_n=2) == 32 * 48 + 8 * 48 + 1 + 2 * 8


def test_template_prints_the_plan():
    s = KernelSpec("fp16", 16, 8, 32, 64, 2, 4, 2, "ca", "sm_89", group_m=1, loader_a="x2", loader_b="x1",
                   b_layout="row")
    ptx = render(s)
    ctx = template_context(s)
    loads = [ld for ch in ctx["chunks"][0] for ld in ch["loads"]]
    assert [ld["num"] for ld in loads] == ["x2", "x2", "x1", "x1", "x1", "x1"]
    assert ptx.count("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16") == 4 * 2    # prologue + loop
    assert ptx.count("ldmatrix.sync.aligned.m8n8.x2.shared.b16") == 2 * 2
    assert ptx.count("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32") == 4       # 2 n8 x 2 k8 per K tile
    assert "cp.async.ca.shared.global [%dst_b+0], [%g_src], 16;" in ptx


def test_template_l2_hints_and_f16_accumulation():
    s = KernelSpec("fp16", 32, 16, 64, 64, 2, 2, 3, "cg", "sm_80", acc="f16", l2_hint_a="evict_last",
                   l2_hint_b="evict_first")
    ptx = render(s)
    assert ".version 7.4" in ptx
    assert "mov.b64     %pol_a, 0x14F0000000000000;" in ptx          # evict_last
    assert "mov.b64     %pol_b, 0x12F0000000000000;" in ptx          # evict_first
    assert "cp.async.cg.shared.global.L2::cache_hint [%dst_a+0], [%g_src], 16, %pol_a;" in ptx
    assert "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%acc0_0_0, %acc0_0_1}" in ptx
    assert "st.global.b32       [%c_row+32], %acc0_2_0;" in ptx         # n8 tile 2: 16 halves = 32 B in
    assert "st.global.v2" not in ptx


# -- whole kernels on the PTX interpreter ----------------------------------------------------------

BASE = dict(bm=64, bn=64, warps_m=2, warps_n=2, stages=2, cache_op="cg", arch="sm_90")
STUDY = dict(bm=32, bn=64, warps_m=2, warps_n=4, cache_op="ca", group_m=1)
KERNELS = {
    "default_int8_256x128": dict(precision="int8", ktile=64, mma_k=32, bm=256, bn=128, warps_m=4, warps_n=2,
                                 stages=3),
    "fp16_row_x4x4_f16acc_hints": dict(precision="fp16", ktile=32, mma_k=16, b_layout="row", loader_b="x4",
                                       acc="f16", l2_hint_a="evict_last", l2_hint_b="evict_first"),
    "bf16_k8_row_x1x1_1stage": dict(STUDY, precision="bf16", ktile=16, mma_k=8, b_layout="row",
                                    loader_a="x1", loader_b="x1", stages=1),
    "bf16_partial_copy_pass_96x64": dict(precision="bf16", ktile=16, mma_k=16, bm=96, b_layout="row"),
    "fp16_manual_pack_row": dict(STUDY, precision="fp16", ktile=16, mma_k=16, b_layout="row",
                                 loader_a="manual", loader_b="manual"),
    "int8_k16_16byte_rows": dict(STUDY, precision="int8", ktile=16, mma_k=16, loader_a="x2", stages=3),
    "int8_manual_bk128": dict(precision="int8", ktile=128, mma_k=32, loader_a="manual", loader_b="manual"),
    "int8_row_manual_b": dict(precision="int8", ktile=64, mma_k=32, b_layout="row", loader_a="x1",
                              loader_b="manual"),
    "int4_study_trans": dict(STUDY, precision="int4", ktile=64, mma_k=64, b_layout="row", loader_b="manual"),
    "int4_k32_9_stages": dict(precision="int4", ktile=32, mma_k=32, loader_b="x4", stages=9),
    "int4_manual_x1_bk128": dict(precision="int4", ktile=128, mma_k=32, loader_a="manual", loader_b="x1"),
    "e4m3_x2x4_hints": dict(precision="fp8_e4m3", ktile=32, mma_k=32, loader_a="x2", loader_b="x4",
                            l2_hint_a="evict_normal", l2_hint_b="evict_normal"),
    "fp16_swizzled_128B_128x256": dict(precision="fp16", ktile=64, mma_k=16, bm=128, bn=256, warps_m=2,
                                       warps_n=4, stages=3, loader_b="x4", smem_layout="swizzled"),
    "int8_swizzled_64B_4_stages": dict(precision="int8", ktile=64, mma_k=32, loader_b="x4", stages=4,
                                       smem_layout="swizzled"),
    "int4_swizzled_32B_study": dict(STUDY, precision="int4", ktile=64, mma_k=64, loader_b="x4",
                                    smem_layout="swizzled"),
    "int8_l2_prefetch_128B_hints": dict(precision="int8", ktile=64, mma_k=32, l2_prefetch="128B",
                                        l2_hint_a="evict_first"),
    "e5m2_manual_row": dict(STUDY, precision="fp8_e5m2", ktile=64, mma_k=32, b_layout="row",
                            loader_a="manual", loader_b="manual"),
}


@pytest.mark.parametrize("name", KERNELS)
def test_kernel_computes_the_gemm(name):
    """Two blocks per direction (one for the 256-row tile), K of stages + 3 tiles so the stage ring
    wraps; C is checked like on the GPU (exact for integers, within tolerance for floats)."""
    s = KernelSpec(**{**BASE, **KERNELS[name]})
    m, n, k = s.bm * (1 if s.bm > 64 else 2), 2 * s.bn, s.ktile * (s.stages + 3)
    c, ops = run_gemm(s, render(s), m, n, k, seed=17)
    res = check(c, ops, s.prec.is_float, tolerance(s.precision, s.acc, k, 1e-3))
    assert res.ok, f"{s.entry}: {res.message()}"
    if not s.prec.is_float:
        assert res.max_error == 0.0


def test_rasterization_covers_every_block():
    """5 x 3 blocks in groups of 3 block rows (the last group partial): every C element is written."""
    s = KernelSpec(**{**BASE, **STUDY, "precision": "int8", "ktile": 32, "mma_k": 32, "group_m": 3})
    c, ops = run_gemm(s, render(s), 5 * 32, 3 * 64, 64, seed=2)
    res = check(c, ops, False, 0.0)
    assert res.ok and res.max_error == 0.0, res.message()


def test_swizzled_and_padded_give_bit_identical_c():
    """The layout moves bytes within shared memory only: C is the same bits (fp16, 256-byte rows)."""
    out = []
    for layout in ("padded", "swizzled"):
        s = KernelSpec(**{**BASE, "precision": "fp16", "ktile": 128, "mma_k": 16, "loader_b": "x4",
                          "stages": 2, "smem_layout": layout})
        c, ops = run_gemm(s, render(s), 128, 128, 4 * s.ktile, seed=5)
        assert check(c, ops, True, 1e-3).ok, s.entry
        out.append(c)
    assert np.array_equal(out[0].view(np.uint32), out[1].view(np.uint32))


@pytest.mark.parametrize("base", [
    dict(precision="fp16", ktile=32, mma_k=16),                       # 32-byte chunks, .trans for row B
    dict(precision="int4", ktile=32, mma_k=32, stages=3),              # 16-byte rows, nibble gathers
])
def test_loaders_and_layouts_give_bit_identical_c(base):
    """Every loader pair and B layout of one kernel leaves the same bits in C."""
    first = None
    for la in LOADERS:
        for lb in LOADERS:
            for layout in ("col", "row"):
                try:
                    s = KernelSpec(**{**BASE, **base, "loader_a": la, "loader_b": lb, "b_layout": layout})
                except SpecError:
                    continue
                c, ops = run_gemm(s, render(s), 128, 128, 4 * s.ktile, seed=23)
                assert check(c, ops, s.prec.is_float, 1e-3).ok, s.entry
                first = first if first is not None else (s.entry, c)
                assert np.array_equal(first[1].view(np.uint32), c.view(np.uint32)), (s.entry, first[0])


def test_the_interpreter_sees_a_pipeline_that_waits_too_little():
    """Self-check: with one wait_group too permissive the kernel reads stages before their copies
    land, which the interpreter (copies complete as late as allowed) turns into wrong results."""
    s = KernelSpec(**{**BASE, "precision": "int8", "ktile": 64, "mma_k": 32, "stages": 4})
    ptx = render(s)
    assert "cp.async.wait_group 2;" in ptx
    c, ops = run_gemm(s, ptx.replace("cp.async.wait_group 2;", "cp.async.wait_group 3;"), 128, 128, 512, seed=1)
    assert check(c, ops, False, 0.0).mismatches > 1000
