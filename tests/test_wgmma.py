"""The wgmma family (experiments.families.wgmma, kernels_ptx/wgmma_gemm.ptx.j2).

CPU: the space and its messages; a covering subset of the space (every value of every axis for every
precision, plus every producer x persistent x consumers combination) rendered and assembled with
``ptxas -arch=sm_90a -v`` through experiments.build.assemble (which fails a build on the C75xx infos: wgmma
serialized, a wait or fence injected, setmaxnreg ignored), none spilling, registers within the cap;
with epilogue=tma every precision x bn x consumers x producer x persistent at the most stages (up to
4) that fit, with its TMA store and shared-store counts; cluster=2 with every producer x persistent x
consumers x epilogue and every bn (fp16, int8), with its multicast loads, remote arrivals and cluster
barriers; one static sweep and one static tma run through run.py (registers, HGMMA / UTMALDG /
UTMASTG counts, a skipped point with its reason). The defaults epilogue=registers and cluster=1 leave
every earlier point's entry, params and PTX as they were.
GPU (``gpu`` marker): every precision verified at 512, 1024 and 2048 for the default point and for
axis variations; int8 exactly, floats within rtol (fp8 within dtypes.FP8_RTOL); epilogue=tma and
cluster=2 verified at 128 ... 1024 (and persistent blocks that walk several tiles), each bit-identical
to the same point with epilogue=registers / cluster=1.
"""
import itertools
import random
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_cli import empty_store_at, run_cli

from experiments import families
from experiments.build.assemble import PtxasError, assemble, fatal_infos
from experiments.dtypes import FP8_RTOL
from experiments.families.wgmma import (FLAG_BYTES, OMITTED_DEFAULTS, REGS, TYPES, auto_tile, geometry,
                                       persistent_grid, smem_bytes)
from experiments.spec import SpecError

ROOT = Path(__file__).resolve().parent.parent
FAM = families.get("wgmma")
DEFAULT = {"bn": 256, "consumers": 2, "producer": "true", "stages": 4, "swizzle": 128,
           "persistent": "false", "order": "grouped"}
AXIS_DEFAULT = {**DEFAULT, **OMITTED_DEFAULTS}     # epilogue=registers stays out of a spec's params


def _spec(precision="fp16", arch="sm_90", **opts):
    return FAM.spec(precision, opts, arch)


# ------------------------------------------------------------------ space and validation
def test_auto_tile_chooses_the_largest_tile_that_fills_a_wave():
    """tile=auto on 132 SMs: 64x64 at 512 (64 tiles), 64x128 at 1024 (128 tiles: one wave, against 256
    tiles of 64x64 in two), 128x256 from 2048 (128 tiles; 2048 in 16 waves at 8192, where 128x128 ties
    it in waves x area and loses on the copies). The other options stay; a tile that breaks a rule or does
    not fit the size is passed over, and none fitting names each one's reason."""
    def name(n, opts=None, m=None, sms=132):
        return auto_tile(FAM, "fp16", opts or {}, m or n, n, n, sms).name
    assert [name(n) for n in (512, 1024, 2048, 4096, 8192)] == ["64x64", "64x128", "128x256", "128x256",
                                                                "128x256"]
    # 58 SMs (tile.sms plans for another GPU): 512 fills a wave with 64x128 (32 tiles), 1024 with 128x256
    # (32 tiles: 32768 x 1.75), not 128x128 (64 tiles, two waves: 2 x 16384 x 2)
    assert [name(n, sms=58) for n in (512, 1024)] == ["64x128", "128x256"]
    # 6 stages of 384 rows x 128 bytes (288 KiB) break the smem rule: 128x128 is next at 2048; at 8 stages
    # only the 64-row tiles fit
    assert name(2048, {"stages": 6}) == "128x128"
    assert name(2048, {"stages": 8}) == "64x128"
    spec = auto_tile(FAM, "int8", {"stages": 3, "producer": "false", "cluster": 2}, 512, 512, 512, 132).spec
    assert (spec.p["consumers"], spec.p["bn"], spec.p["stages"], spec.p["producer"], spec.p["cluster"]) == (
        1, 64, 3, "false", 2)
    # the options' own consumers and bn are replaced: 8 stages (too deep for the default tile) still choose
    assert auto_tile(FAM, "fp16", {"stages": 8, "bn": 256, "consumers": 2}, 512, 512, 512, 132).name == "64x64"
    # M = 192: 3 tile rows of 64, not pairs, so with cluster=2 no tile fits: one sentence with sizes that fit
    with pytest.raises(SpecError) as err:
        auto_tile(FAM, "fp16", {"cluster": 2}, 192, 512, 512, 132)
    assert str(err.value) == (
        "tile=auto: no wgmma block tile fits 192x512x512: M must be a multiple of a tile's BM (2 BM with "
        "cluster=2 or 4), N of its BN (2 BN with cluster=4) and K of BK; the smallest square sizes a tile takes are multiples of 128 "
        "(64x64), e.g. 'problem.sizes=[512]'")
    # a reason every tile shares (the arch) is said once, as without tile=auto
    with pytest.raises(SpecError) as err:
        auto_tile(FAM, "fp16", {}, 512, 512, 512, 132, arch="sm_89")
    assert str(err.value) == str(pytest.raises(SpecError, _spec, arch="sm_89").value)
    with pytest.raises(SpecError, match="^family=wgmma precision=int8 sm_90a: schedule=streamk splits the last"):
        auto_tile(FAM, "int8", {"schedule": "streamk"}, 512, 512, 512, 132)


def test_tile_auto_counts_waves_of_whole_clusters():
    """With cluster=4, tile=auto counts the clusters that fit: at 1024 the 64x128 tile is 32 clusters of
    4, one wave of 33 on 132 SMs but two of 30 (an H200 runs 30 clusters of 4: tile.sms=120), so 128x128
    (16 clusters) wins there."""
    name = lambda sms, *mnk, **o: auto_tile(FAM, "fp16", o, *mnk, sms).name      # noqa: E731
    assert name(132, 1024, 1024, 1024, cluster=4) == "64x128"
    assert name(120, 1024, 1024, 1024, cluster=4) == "128x128"
    assert name(132, 1024, 1024, 1024) == "64x128"
    assert name(3, 2048, 2048, 2048, cluster=4) == name(1, 2048, 2048, 2048, cluster=2) == "128x256"


def test_persistent_grid_splits_k_when_tiles_are_fewer_than_sms():
    """One block per SM and at most one per tile; stream-K with fewer tiles than SMs takes T x floor(SMs / T)
    blocks (split K evenly), pairs of CTAs with cluster=2 counted as one."""
    tiles, streamk = {"cluster": 1}, {"cluster": 1, "schedule": "streamk"}
    assert [persistent_grid(tiles, t, 132) for t in (16, 64, 132, 2048)] == [16, 64, 132, 132]
    assert [persistent_grid(streamk, t, 132) for t in (16, 64, 100, 132, 2048)] == [128, 128, 100, 132, 132]
    assert [persistent_grid({"cluster": 2, "schedule": "streamk"}, t, 132) for t in (16, 64, 2048)] == [
        128, 128, 132]
    assert persistent_grid({"cluster": 2}, 16, 132) == 16
    # clusters of 4: whole clusters, no more than run at once (an H200 runs 32 clusters of 4, not 33)
    assert persistent_grid({"cluster": 4}, 2048, 132, 32) == 128 and persistent_grid({"cluster": 4}, 2048, 132) == 132
    assert persistent_grid({"cluster": 4, "schedule": "streamk"}, 16, 132, 32) == 128   # 4 quads x 8 clusters each
    assert persistent_grid({"cluster": 4, "schedule": "streamk"}, 32, 132, 30) == 96     # 8 quads x 3 clusters



def test_space_count_and_defaults():
    specs = list(FAM.space("sm_90"))
    print(f"wgmma space on sm_90a: {len(specs)} specs")
    # 5 precisions x 4 bn x 2 consumers x 2 producer x 7 stages x 3 swizzle x 2 persistent x 4 orders
    # (grouped by 8, 16 or 32 tile rows, row) = 13440 per epilogue and cluster size, less the stage counts
    # that do not fit 227 KiB: 12480 with registers, 12240 with tma (its C staging takes consumers x 16 KiB);
    # clusters of 2 and 4 need no more shared memory per CTA. schedule=streamk adds the persistent half once
    # more: 3 x 24720 + 3 x 12360
    assert len(specs) == 111240 == len({s.entry for s in specs})
    points = [(s.p.get("epilogue", "(registers)"), s.p.get("cluster", "(1)")) for s in specs
              if "schedule" not in s.p]
    assert [points.count((e, c)) for c in ("(1)", 2, 4) for e in ("(registers)", "tma")] == [12480, 12240] * 3
    streamk = [s for s in specs if s.p.get("schedule") == "streamk"]
    assert len(streamk) == 37080 and all(s.p["persistent"] == "true" for s in streamk)
    assert all(s.arch == "sm_90a" and smem_bytes(s.precision, s.p) <= 232448 for s in specs)
    assert list(FAM.space("sm_89")) == []
    # sm_90a names the same space (walked whole above as sm_90): each of 10000 seeded points of the axes'
    # product is the same spec, or refused alike, for both names
    points = list(itertools.product(*FAM.axes.values()))
    for values in random.Random(0).sample(points, 10000):
        kw = dict(zip(FAM.axes, values, strict=True))
        built = []
        for arch in ("sm_90", "sm_90a"):
            try:
                built.append(FAM.spec(kw["precision"], {k: v for k, v in kw.items() if k != "precision"}, arch))
            except SpecError:
                built.append("refused")
        assert built[0] == built[1], kw
    s = _spec()
    assert s.p == {**DEFAULT, "bk": 64} and s.arch == "sm_90a"
    assert _spec(epilogue="registers", cluster=1, schedule="tiles") == s
    assert s.entry == ("wgmma_fp16_bk64_bn256_consumers2_ordergrouped_persistentfalse_producertrue_"
                       "stages4_swizzle128")
    g = geometry("fp16", s.p)
    assert (g["BM"], g["BN"], g["BK"], g["T"], g["stage_bytes"]) == (128, 256, 64, 384, 49152)
    assert FAM.threads(s) == 384 and FAM.dyn_smem(s) == 1024 + 4 * 49152 + 64
    assert _spec("int8").p["bk"] == 128 and _spec("fp8_e5m2", swizzle=32).p["bk"] == 32
    assert FAM.unit(_spec("int8")) == "TOP/s" and FAM.unit(_spec("fp8_e4m3")) == "TFLOP/s"
    # group: 8 (the default) stays out of the params and the name; with clusters the PTX walks pairs of rows
    assert _spec(group=8) == s
    g16 = _spec(group=16, cluster=2)
    assert g16.p["group"] == 16 and "_group16_ordergrouped_" in g16.entry
    assert "mul.lo.u32      %q0, %tiles_n, 8;" in FAM.build(g16).source        # 8 pair rows
    assert "mul.lo.u32      %q0, %tiles_n, 8;" in FAM.build(s).source          # 8 tile rows
    assert "mul.lo.u32      %q0, %tiles_n, 32;" in FAM.build(_spec(group=32)).source
    # Hydra gives booleans; they validate as the axis' text
    assert _spec(producer=False, persistent=True).p["producer"] == "false"


@pytest.mark.parametrize("call, message", [
    (lambda: _spec(arch="sm_89"), "family=wgmma needs target.arch=sm_90a (wgmma.mma_async and setmaxnreg "
                                  "exist only on sm_90a; auto and sm_90 resolve to it), not target.arch=sm_89"),
    (lambda: _spec(stages=5), "stages=5 needs 246864 bytes of shared memory per block (5 x (128 + 256) rows "
                              "x 128 bytes + 1104), more than the 232448 (227 KiB) of sm_90a; valid with "
                              "bn=256 consumers=2 swizzle=128: stages <= 4"),
    (lambda: _spec(epilogue="tma", stages=5),
     "stages=5 needs 279632 bytes of shared memory per block (5 x (128 + 256) rows x 128 bytes + 32768 of C "
     "staging (2 x 16384) + 1104), more than the 232448 (227 KiB) of sm_90a; valid with bn=256 consumers=2 "
     "swizzle=128 epilogue=tma: stages <= 4"),
    (lambda: _spec("int8", epilogue="tma", bn=128, stages=7),
     "stages=7 needs 263280 bytes of shared memory per block (7 x (128 + 128) rows x 128 bytes + 32768 of C "
     "staging (2 x 16384) + 1136), more than the 232448 (227 KiB) of sm_90a; valid with bn=128 "
     "consumers=2 swizzle=128 epilogue=tma: stages <= 6"),
    (lambda: _spec(epilogue="smem"), "family=wgmma epilogue='smem' is not valid; valid: registers, tma"),
    (lambda: _spec(schedule="streamk"), "family=wgmma precision=fp16 sm_90a: schedule=streamk splits the last "
                                        "wave's K steps among the persistent blocks: it needs persistent=true"),
    (lambda: _spec(schedule="splitk"), "family=wgmma schedule='splitk' is not valid; valid: tiles, streamk"),
    (lambda: _spec(cluster=3), "family=wgmma cluster=3 is not valid; valid: 1, 2, 4"),
    (lambda: _spec(group=16, order="row"), "family=wgmma precision=fp16 sm_90a: group=16 sets the tile rows that "
                                           "order=grouped walks together; order=row has no groups: use "
                                           "order=grouped, or leave group at its default"),
    (lambda: _spec(group=12), "family=wgmma group=12 is not valid; valid: 8, 16, 32"),
    (lambda: _spec(bn=96), "family=wgmma bn=96 is not valid; valid: 256, 192, 128, 64"),
    (lambda: _spec("int4"), "no wgmma GEMM for precision=int4; valid: fp16, bf16, fp8_e4m3, fp8_e5m2, int8"),
    (lambda: _spec(swizzle=16), "swizzle=16 is not valid; valid: 128, 64, 32"),
])
def test_validation_messages(call, message):
    with pytest.raises(SpecError) as err:
        call()
    assert message in str(err.value)


@pytest.mark.parametrize("opts, mnk, message", [
    ({}, (512, 512, 96), "K=96 is not a multiple of BK=64"),
    ({"consumers": 1}, (96, 512, 64), "M=96 is not a multiple of BM=64"),
    ({"bn": 192}, (512, 512, 512), "N=512 is not a multiple of BN=192"),
    ({"cluster": 2}, (384, 512, 512), "M=384 is 3 tile rows of BM=128, not a multiple of 2 (cluster=2: the "
                                      "CTAs of a cluster take adjacent tile rows): M must be a multiple of 256"),
    ({"cluster": 4}, (384, 512, 512), "M=384 is 3 tile rows of BM=128, not a multiple of 2 (cluster=4"),
    ({"cluster": 4}, (512, 768, 512), "N=768 is 3 tile columns of BN=256, not a multiple of 2 (cluster=4: the "
                                      "CTAs of a cluster take adjacent tile columns): N must be a multiple of 512"),
    # both at once, and one tile: each violation named, in the singular where it is one
    ({"cluster": 4}, (384, 256, 512), "M=384 is 3 tile rows of BM=128, not a multiple of 2 (cluster=4: the CTAs "
                                      "of a cluster take adjacent tile rows): M must be a multiple of 256; N=256 is "
                                      "1 tile column of BN=256, not a multiple of 2"),
    ({"cluster": 2}, (320, 512, 512), "M=320 is not a multiple of BM=128"),
])
def test_check_problem(opts, mnk, message):
    with pytest.raises(SpecError, match=re.escape(message)):
        FAM.check_problem(_spec(**opts), *mnk)
    for n in (512, 1024, 2048, 4096, 8192):
        assert FAM.check_problem(_spec(), n, n, n) is None


def test_template_contract():
    """What the PTX must hold, read from the rendered text (the GPU tests check the arithmetic)."""
    src = FAM.build(_spec()).source
    assert ".target sm_90a" in src and ".version 8.0" in src and ".maxntid 384, 1, 1" in src
    assert ".maxnreg 168" in src and "setmaxnreg.dec.sync.aligned.u32 40;" in src
    assert "setmaxnreg.inc.sync.aligned.u32 232;" in src
    assert src.count("wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16") == 4
    assert "mbarrier.arrive.expect_tx.shared::cta.b64 %rd_state, [%q5], 49152;" in src
    assert "0x4000004000010000" in src                 # 128B swizzle, SBO 1024 B, LBO 1
    assert "0x8000002000010000" in FAM.build(_spec(swizzle=64)).source
    assert "0xC000001000010000" in FAM.build(_spec(swizzle=32)).source
    assert "setmaxnreg.inc.sync.aligned.u32 240;" in FAM.build(_spec(consumers=1)).source
    nop = FAM.build(_spec("int8", producer="false")).source
    assert "setmaxnreg" not in nop and ".minnctapersm 1" in nop and ".maxntid 256, 1, 1" in nop
    assert "m64n256k32.s32.s8.s8" in nop and "%ptrue;" in nop and "st.global.v2.s32" in nop
    assert "m64n128k32.f32.e5m2.e5m2" in FAM.build(_spec("fp8_e5m2", bn=128)).source
    for text in ("tmap_c", "st.shared", "fence.proxy.async", "cp.async.bulk.wait_group", "bar.sync        1"):
        assert text not in src and text not in nop


def test_streamk_contract():
    """schedule=streamk: a workspace pointer, the item walk (whole tiles, then K-step segments) in the
    loader and the consumers, a contributor's slot stores before its flag, the owner's acquire spin,
    reset and slot sums; other points render without any of it."""
    s = _spec(persistent="true", schedule="streamk")
    g = geometry("fp16", s.p)
    assert (g["nthr_c"], g["slot_bytes"]) == (256, 131072)
    src = FAM.build(s).source
    assert ".param .u64 ws_ptr," in src and src.count("SK_SPIN:") == 1
    assert src.count("st.global.v4.f32 [%slot+") == 32 and src.count("ld.global.cg.v4.f32") == 32
    assert "st.global.v4.f32 [%slot+126976], { %d124, %d125, %d126, %d127 };" in src   # quad 31 x 256 x 16
    assert "add.s64         %slot, %slot, 4096;" in src                              # after the flags
    store, bar = src.rindex("st.global.v4.f32 [%slot+"), src.index("bar.sync        3, 256;")
    fence, red = src.index("@%pc0 fence.acq_rel.gpu;"), src.index("@%pc0 red.relaxed.gpu.global.add.u32 [%flag]")
    assert store < bar < fence < red
    spin, reset = src.index("ld.acquire.gpu.global.u32 %q2, [%flag];"), src.index("st.relaxed.gpu.global.u32 [%flag], 0;")
    assert red < spin < reset < src.index("ld.global.cg.v4.f32")
    # the loader and the consumers walk the same items: the split is computed in both walks
    # start, the loader (first item, then each next), the consumers, the fixup
    assert src.count("div.u32         %dpn, %sks, %nblocks;") == 5
    assert "setp.lt.u32     %pl, %ck, %cke;" in src and "setp.eq.u32     %pl, %ck, %ckb;" in src
    two = FAM.build(_spec("int8", persistent="true", schedule="streamk", cluster=2, epilogue="tma")).source
    assert two.count("mad.lo.u32      %q1, %q1, 2, %crank;") == 1 and "add.s32         %d127, %d127, %v3;" in two
    for text in ("ws_ptr", "%sks", "SK_", "bar.sync        3"):
        assert text not in FAM.build(_spec(persistent="true")).source


def test_tma_epilogue_contract():
    """epilogue=tma: C's tensor map instead of its pointer, the staging (two buffers of 4 boxes a
    warpgroup) after the ring, one TMA store per 8-column box, chunk by chunk through alternating
    buffers; in each chunk the fence and the wait for the previous chunk's reads come before the
    warpgroup's named barrier, the stores after it."""
    s = _spec(epilogue="tma")
    g = geometry("fp16", s.p)
    assert (g["stg_wg"], g["stg_bytes"], g["box_bytes"], g["nchunks"]) == (16384, 32768, 2048, 8)
    assert FAM.dyn_smem(s) == 1024 + 4 * 49152 + 32768 + 64 == 230464
    src = FAM.build(s).source
    assert ".param .align 64 .b8 tmap_c[128]," in src and "c_ptr" not in src and "st.global" not in src
    assert "add.u32         %full, %base, 229376;" in src        # 4 stages x 49152 + 32768 of staging
    assert "add.u32         %stg, %base, 196608;" in src and "mad.lo.u32      %stg, %wg, 16384, %stg;" in src
    assert src.count("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%tmap_c_gen, { %q5, %q3 }]") == 32
    assert src.count("st.shared.v2.f32") == 64 and src.count("cp.async.bulk.commit_group;") == 8
    # chunk 7 (columns 224 .. 255) in buffer 1: box 31's rows 8 .. 15 at 8192 + 3 x 2048 + 256
    assert "st.shared.v2.f32 [%stt+14592], { %d126, %d127 };" in src and "[%stg+14336];" in src
    assert "st.shared.v2.f32 [%stt+6400], { %d110, %d111 };" in src     # chunk 6, buffer 0, box 3
    chunks = src.split("    // chunk ")[1:]
    assert len(chunks) == 8
    for ch in chunks:
        fence, wait = ch.index("fence.proxy.async.shared::cta;"), ch.index("@%pt0 cp.async.bulk.wait_group.read 0;")
        bar, store = ch.index("@%pwg0 bar.sync 1, 128;"), ch.index("cp.async.bulk.tensor.2d.global")
        assert ch.rindex("st.shared.v2") < fence < wait < bar < store and "@!%pwg0 bar.sync 2, 128;" in ch
    assert src.count("@%pt0 cp.async.bulk.wait_group 0;") == 1
    one = FAM.build(_spec("int8", epilogue="tma", consumers=1, bn=64, persistent="true",
                          producer="false")).source
    assert one.count("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group") == 8
    assert one.count("    bar.sync        1, 128;") == 2 and "%pwg0 bar" not in one
    assert one.count("st.shared.v2.s32") == 16 and one.count("@%pt0 cp.async.bulk.wait_group.read 0;") == 2


def test_cluster_contract():
    """cluster=2: the directive, cluster ids for the tile walk, the B half multicast to both CTAs, releases
    on both CTAs' empty barriers (count doubled), the cluster barriers at start and end."""
    s = _spec(cluster=2)
    assert FAM.multiples(s) == (256, 256, 64) and FAM.dyn_smem(s) == FAM.dyn_smem(_spec())
    src = FAM.build(s).source
    assert ".reqnctapercluster 2, 1, 1" in src and ".reqnctapercluster" not in FAM.build(_spec()).source
    assert "mov.u32         %bid, %clusterid.x;" in src and "mov.u32         %nblocks, %nclusterid.x;" in src
    assert "shr.u32         %tiles_m, %tiles_m, 1;" in src
    assert src.count("mad.lo.u32      %ltm, %ltm, 2, %crm;") == 1             # one tile, producer
    assert src.count("mad.lo.u32      %ctm, %ctm, 2, %crm;") == 1
    assert "and.b32         %crm, %crank, 1;" in src and "%crn" not in src
    assert "mbarrier.init.shared::cta.b64 [%empty+24], 4;" in src            # 2 consumers x 2 CTAs
    assert "mul.lo.u32      %brow, %crm, 128;" in src and "mov.u16         %mask, 3;" in src
    assert "mad.lo.u32      %q6, %crm, 16384, %q6;" in src                  # 128 rows x 128 bytes
    assert src.count("complete_tx::bytes.multicast::cluster [%q6], [%tmap_b_gen, { %q7, %q8 }], [%q5], %mask;") == 1
    assert src.count("complete_tx::bytes [%q6], [%tmap_a_gen") == 1
    assert "mbarrier.arrive.expect_tx.shared::cta.b64 %rd_state, [%q5], 49152;" in src   # the whole stage
    for r in (0, 1):
        assert src.count(f"@%pt0 mapa.shared::cluster.u32 %q5, %q4, {r};") == 2     # k loop, tile end
    assert src.count("@%pt0 mbarrier.arrive.shared::cluster.b64 _, [%q5];") == 4
    assert "mbarrier.arrive.shared::cta" not in src
    assert src.index("barrier.cluster.arrive.release.aligned;") < src.index("PRODUCE:")
    assert src.count("bra  CLUSTER_END;") == 1 and src.count("bra        CLUSTER_END;") == 1
    end = src.index("CLUSTER_END:")
    assert src.index("barrier.cluster.arrive.release;", end) < src.index("barrier.cluster.wait.acquire;", end)
    assert src.index("barrier.cluster.wait.acquire;", end) < src.index("EXIT:", end)
    # the B half of bn=192 starts 96 rows in: a multiple of the 1024-byte swizzle atom
    assert "mad.lo.u32      %q6, %crm, 12288, %q6;" in FAM.build(_spec(cluster=2, bn=192)).source
    nop = FAM.build(_spec(cluster=2, producer="false", persistent="true")).source
    assert nop.count("multicast::cluster") == 3 and "CLUSTER_END:" in nop and "bra  CLUSTER_END" not in nop


def test_cluster_4_contract():
    """cluster=4 (2 x 2): tile row and column from the rank, the A half multicast along the tile row and
    the B half along the tile column (masks from the rank), the whole stage expected, releases on all four
    CTAs' empty barriers, quad tiles (pairs of rows and of columns), groups counted in pair rows."""
    s = _spec(cluster=4, group=16)
    assert FAM.multiples(s) == (256, 512, 64) and FAM.dyn_smem(s) == FAM.dyn_smem(_spec())
    src = FAM.build(s).source
    assert ".reqnctapercluster 4, 1, 1" in src
    assert "shr.u32         %tiles_m, %tiles_m, 1;" in src and "shr.u32         %tiles_n, %tiles_n, 1;" in src
    for t in ("l", "c"):
        assert src.count(f"mad.lo.u32      %{t}tm, %{t}tm, 2, %crm;") == 1
        assert src.count(f"mad.lo.u32      %{t}tn, %{t}tn, 2, %crn;") == 1
    assert "mul.lo.u32      %q0, %tiles_n, 8;" in src                         # group 16 = 8 pair rows
    assert "and.b32         %crm, %crank, 1;" in src and "shr.u32         %crn, %crank, 1;" in src
    assert "mul.lo.u32      %arow, %crn, 64;" in src and "mul.lo.u32      %brow, %crm, 128;" in src
    assert "mad.lo.u32      %q4, %crn, 8192, %q6;" in src                     # 64 rows x 128 bytes
    assert "mad.lo.u32      %q6, %crm, 16384, %q6;" in src                    # 128 rows x 128 bytes
    assert src.count("multicast::cluster [%q4], [%tmap_a_gen, { %q7, %q8 }], [%q5], %amask;") == 1
    assert src.count("multicast::cluster [%q6], [%tmap_b_gen, { %q7, %q8 }], [%q5], %mask;") == 1
    assert "mbarrier.arrive.expect_tx.shared::cta.b64 %rd_state, [%q5], 49152;" in src
    assert "mbarrier.init.shared::cta.b64 [%empty+24], 8;" in src             # 2 consumers x 4 CTAs
    for r in range(4):
        assert src.count(f"@%pt0 mapa.shared::cluster.u32 %q5, %q4, {r};") == 2
    assert "mov.u16         %mask, 3;" not in FAM.build(s).source and "mov.u16         %mask, 3;" in FAM.build(
        _spec(cluster=2)).source


def test_cluster_4_masks():
    """The multicast masks that the PTX computes from the rank r = rm + 2 rn: B to the CTAs of the tile
    column (ranks 2 rn, 2 rn + 1), A to those of the tile row (rm, rm + 2); each CTA receives A from one
    partner and B from another, and every CTA gets each half exactly once."""
    for r in range(4):
        rm, rn = r & 1, r >> 1
        mask_b, mask_a = 3 << (r & 2), 5 << rm
        assert [q for q in range(4) if mask_b >> q & 1] == [2 * rn, 2 * rn + 1]
        assert [q for q in range(4) if mask_a >> q & 1] == [rm, rm + 2]
    for dest in range(4):
        b_from = [(r & 1) for r in range(4) if (3 << (r & 2)) >> dest & 1]      # the B halves dest receives
        a_from = [(r >> 1) for r in range(4) if (5 << (r & 1)) >> dest & 1]     # the A halves
        assert sorted(b_from) == [0, 1] and sorted(a_from) == [0, 1]


def test_run_names_and_identity():
    """The defaults epilogue=registers and cluster=1 add nothing to a point's identity (params, entry, run
    name); tma and cluster=2 do."""
    from experiments.store import record
    assert tuple(FAM.axes)[-3:] == ("epilogue", "cluster", "schedule")
    old = _spec("fp8_e4m3", persistent="true")
    assert record.run_name(FAM, old, (8192,) * 3) == (
        "8192 wgmma fp8_e4m3 bn256 consumers2 producer stages4 swizzle128 persistent grouped")
    new = _spec("fp8_e4m3", persistent="true", epilogue="tma", stages=2)
    assert record.run_name(FAM, new, (8192,) * 3) == (
        "8192 wgmma fp8_e4m3 bn256 consumers2 producer stages2 swizzle128 persistent grouped tma")
    assert new.entry == ("wgmma_fp8_e4m3_bk128_bn256_consumers2_epiloguetma_ordergrouped_persistenttrue_"
                         "producertrue_stages2_swizzle128")
    two = _spec("int8", cluster=2)
    assert record.run_name(FAM, two) == (
        "wgmma int8 bn256 consumers2 producer stages4 swizzle128 no_persistent grouped cluster2")
    assert two.entry == ("wgmma_int8_bk128_bn256_cluster2_consumers2_ordergrouped_persistentfalse_producertrue_"
                         "stages4_swizzle128")


def test_fatal_ptxas_infos_fail_the_build():
    """The C75xx infos ptxas prints for wgmma / setmaxnreg kernels (texts as ptxas 13.0 prints them)."""
    report = "\n".join([
        "ptxas info    : Compiling entry function 'k' for 'sm_90a'",
        "ptxas info    : (C7508) Potential Performance Loss: 'setmaxnreg' ignored; unable to determine "
        "register count at entry.",
        "ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized "
        "due to the presence of Extern calls in the function 'k'.",
        "ptxas info    : (C7517) warpgroup.wait is injected in around line 325 by compiler to allow use of "
        "registers defined by GMMA in function 'k'",
        "ptxas info    : Used 168 registers, used 1 barriers"])
    found = fatal_infos(report)
    assert [re.search(r"\((C\d+)\)", ln).group(1) for ln in found] == ["C7508", "C7515", "C7517"]
    assert fatal_infos("ptxas info    : Used 168 registers, used 1 barriers") == []


def test_fatal_info_from_ptxas(tmp_path, need_ptxas):
    """A real one: an accumulator touched between a wgmma and its wait makes ptxas inject a wait."""
    spec = _spec()
    src = FAM.build(spec).source.replace("    wgmma.commit_group.sync.aligned;\n",
                                         "    wgmma.commit_group.sync.aligned;\n    add.f32 %d5, %d5, 0f3F800000;\n", 1)
    with pytest.raises(PtxasError, match=r"\(C7517\) warpgroup.wait is injected"):
        assemble(src, spec.entry, spec.arch, threads=384, dyn_smem=0, workdir=tmp_path, with_sass=False)


# ------------------------------------------------------------------ assembling a covering subset
def _covering():
    """Per precision: the default, every other value of each axis alone (stages up to the largest
    that fits), every producer x persistent x consumers combination, and stream-K with a producer or
    without, with cluster=2 and the TMA epilogue, and with the smallest tile."""
    out = {}
    for prec in TYPES:
        points = [{}]
        for axis, values in FAM.axes.items():
            if axis != "precision":
                points += [{axis: v} for v in values if v != AXIS_DEFAULT[axis]]
        points += [{"producer": p, "persistent": q, "consumers": c}
                   for p in ("true", "false") for q in ("true", "false") for c in (1, 2)]
        points += [{"bn": 128, "consumers": 1, "stages": n} for n in FAM.axes["stages"]]
        points += [{"bn": 64, "consumers": 1, "stages": 8, "swizzle": 32, "order": "row"}]
        points += [{"epilogue": "tma", "persistent": "true"}]
        points += [{"persistent": "true", "schedule": "streamk", **o} for o in (
            {}, {"producer": "false"}, {"cluster": 2, "epilogue": "tma"}, {"bn": 64, "consumers": 1})]
        for opts in points:
            try:
                s = _spec(prec, **opts)
            except SpecError:
                continue            # stages beyond shared memory
            out[s.entry] = s
    return list(out.values())


def _assemble_checked(specs, tmp_path, with_sass) -> list:
    """Assemble every spec for sm_90a (two at a time; SASS for those ``with_sass(s)`` picks) and check
    what every build must hold: no C75xx info, no spill, registers within the launch cap. Returns
    [(spec, Assembly)]."""
    def one(s):
        return s, assemble(FAM.build(s).source, s.entry, s.arch, threads=FAM.threads(s),
                           dyn_smem=FAM.dyn_smem(s), workdir=tmp_path, with_sass=with_sass(s))
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(one, specs))
    for s, a in results:
        assert not fatal_infos(a.report), (s.entry, a.report)
        assert a.spill_stores == a.spill_loads == a.stack_frame == 0, (s.entry, a.report)
        cap = REGS["launch"] if s.p["producer"] == "true" else 255
        assert 0 < a.registers <= cap, (s.entry, a.registers)
    return results


def _persistent_two_consumers(s) -> bool:
    return s.p["persistent"] == "true" and s.p["consumers"] == 2


def _most_stages(precision, **opts):
    """The spec of ``opts`` with the most stages up to the default 4 that fit in shared memory."""
    for stages in (4, 3, 2):
        try:
            return _spec(precision, stages=stages, **opts)
        except SpecError:
            continue
    raise AssertionError(f"{precision} {opts}: not even 2 stages fit")


def test_covering_subset_assembles(tmp_path, need_ptxas):
    specs = _covering()
    covered = {(a, s.p.get(a, AXIS_DEFAULT[a])) for s in specs for a in FAM.axes if a != "precision"}
    assert covered == {(a, v) for a, vs in FAM.axes.items() if a != "precision" for v in vs}
    assert {s.precision for s in specs} == set(TYPES)

    results = _assemble_checked(specs, tmp_path, lambda s: s.p == {**DEFAULT, "bk": s.p["bk"]})
    print(f"assembled {len(results)} wgmma kernels for sm_90a")
    for s, a in results:
        if a.sass:      # defaults: one wgmma per 32 bytes of K, one TMA load per operand
            op = {"fp16": "HGMMA", "bf16": "HGMMA", "int8": "IGMMA"}.get(s.precision, "QGMMA")
            assert a.sass_counts.get(op) == 4 and a.sass_counts.get("UTMALDG") == 2, (s.entry, a.sass_counts)


def _tma_points(precision):
    """epilogue=tma at every bn x consumers x producer x persistent, with the most stages (up to the
    default 4) that fit beside the C staging."""
    out = []
    for bn in FAM.axes["bn"]:
        for cons in FAM.axes["consumers"]:
            for prod in FAM.axes["producer"]:
                for pers in FAM.axes["persistent"]:
                    out.append(_most_stages(precision, epilogue="tma", bn=bn, consumers=cons, producer=prod,
                                            persistent=pers))
    return out


# the epilogue depends on the precision only through the accumulator (f32 or s32): one of each; every
# precision's TMA epilogue is in the covering subset
@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_tma_epilogue_assembles(precision, tmp_path, need_ptxas):
    specs = _tma_points(precision)
    assert len(specs) == 32
    # the staging (consumers x 16 KiB) leaves room for the default 4 stages even at the largest tile
    assert {s.p["stages"] for s in specs} == {4}
    op = {"fp16": "HGMMA", "bf16": "HGMMA", "int8": "IGMMA"}.get(precision, "QGMMA")
    results = _assemble_checked(specs, tmp_path, _persistent_two_consumers)
    print(f"assembled {len(results)} {precision} wgmma kernels with epilogue=tma for sm_90a")
    for s, a in results:
        assert f"used {1 + s.p['consumers']} barriers" in a.report, (s.entry, a.report)
        if a.sass:      # one TMA store per 8-column box, two shared stores per box and thread
            c = a.sass_counts
            loads = 2 if s.p["producer"] == "true" else 6      # without: prologue, refill, last refill
            assert c.get("UTMASTG") == s.p["bn"] // 8 and c.get("UTMALDG") == loads, (s.entry, c)
            assert c.get("STS") == s.p["bn"] // 4 and c.get(op) == s.p["swizzle"] // 32, (s.entry, c)
            assert not any(k.startswith("STG") for k in c), (s.entry, c)


@pytest.mark.parametrize("precision", ["fp16", "int8"])      # the covering subset has cluster=2 for all
def test_cluster_assembles(precision, tmp_path, need_ptxas):
    """cluster=2 with every producer x persistent x consumers x epilogue (the most stages up to 4 that
    fit) and every bn: assembled, no C75xx info, no spill; SASS of the persistent two-consumer ones: one
    multicast B load per load site, one remote-capable arrival per CTA and release site, the two cluster
    barriers and no GPU-wide fence but theirs."""
    from experiments.build.assemble import sass_opcodes
    specs = [_most_stages(precision, cluster=2, **opts)
             for opts in ([{"producer": p, "persistent": q, "consumers": c, "epilogue": e}
                           for p in ("true", "false") for q in ("true", "false") for c in (1, 2)
                           for e in ("registers", "tma")]
                          + [{"bn": bn} for bn in (192, 128, 64)])]
    assert len(specs) == 19
    results = _assemble_checked(specs, tmp_path, _persistent_two_consumers)
    print(f"assembled {len(results)} {precision} wgmma kernels with cluster=2 for sm_90a")
    for s, a in results:
        if a.sass:
            ops = sass_opcodes(a.sass)
            sites = 1 if s.p["producer"] == "true" else 3       # without: prologue, refill, last refill
            assert ops.get("UTMALDG.2D.MULTICAST") == ops.get("UTMALDG.2D") == sites, (s.entry, ops)
            assert ops.get("SYNCS.ARRIVE.TRANS64.RED.A1T0") == 4, (s.entry, ops)
            assert ops.get("UCGABAR_ARV") == ops.get("UCGABAR_WAIT") == ops.get("MEMBAR.ALL.GPU") == 2, (s.entry, ops)


# ------------------------------------------------------------------ run.py, static
def _children(tmp):
    from experiments.store.track import Tracker
    tr = Tracker(f"sqlite:///{tmp}/mlflow.db", "wgmma-tests", create=False)
    runs = tr.client.search_runs([tr.experiment_id], max_results=100)
    return {r.info.run_name: r for r in runs if "mlflow.parentRunId" in r.data.tags}


def test_static_sweep(tmp_path, need_ptxas):
    rc, out = run_cli(tmp_path, "-m", "family=wgmma", "backend=static", "precision=fp16,int8", "family.stages=4,5",
                      f"tracking.uri={empty_store_at(tmp_path / 'mlflow.db')}", "tracking.experiment=wgmma-tests",
                      f"hydra.sweep.dir={tmp_path}/out")
    assert rc == 0, out
    runs = _children(tmp_path)
    done = {n: r for n, r in runs.items() if r.data.tags.get("outcome") == "static"}
    skipped = [r for r in runs.values() if r.data.tags.get("outcome") == "skipped"]
    assert len(done) == 2 and len(skipped) == 2, sorted(runs)
    assert all("more than the 232448 (227 KiB) of sm_90a" in r.data.tags["skip_reason"] for r in skipped)
    for name, r in sorted(done.items()):
        m = r.data.metrics
        op = "HGMMA" if " fp16 " in f" {name} " else "IGMMA"
        print(f"{name}: {m['registers']:.0f} regs, smem static {m['smem_static_bytes']:.0f} B "
              f"(+ {smem_bytes('fp16', DEFAULT)} B dynamic), {m['sass_' + op]:.0f} x {op}, "
              f"{m['sass_UTMALDG']:.0f} x UTMALDG")
        assert m["threads"] == 384 and m["registers"] == REGS["launch"] and m["spill_stores_bytes"] == 0
        assert m[f"sass_{op}"] == 4 and m["sass_UTMALDG"] == 2
        assert r.data.tags["mma_native"] == "true" and r.data.tags["arch"] == "sm_90a"


def test_static_tma_run(tmp_path, need_ptxas):
    """One epilogue=tma kernel through run.py: typed option, run name, spec params, TMA store counts."""
    rc, out = run_cli(tmp_path, "family=wgmma", "backend=static", "precision=int8", "family.epilogue=tma",
                      f"tracking.uri={empty_store_at(tmp_path / 'mlflow.db')}", "tracking.experiment=wgmma-tests",
                      f"hydra.run.dir={tmp_path}/out")
    assert rc == 0, out
    (name, r), = _children(tmp_path).items()
    assert name == "wgmma int8 bn256 consumers2 producer stages4 swizzle128 no_persistent grouped tma"
    assert r.data.tags["outcome"] == "static" and r.data.params["spec.epilogue"] == "tma"
    m = r.data.metrics
    print(f"{name}: {m['registers']:.0f} regs, {m['smem_dynamic_bytes']:.0f} B dynamic smem, "
          f"{m['sass_UTMASTG']:.0f} x UTMASTG, {m['sass_STS']:.0f} x STS")
    assert m["smem_dynamic_bytes"] == 230464 and m["registers"] == REGS["launch"]
    assert (m["sass_IGMMA"], m["sass_UTMALDG"], m["sass_UTMASTG"], m["sass_STS"]) == (4, 2, 32, 64)


# ------------------------------------------------------------------ GPU
VARIANTS = [{}, {"consumers": 1}, {"producer": "false"}, {"swizzle": 64}, {"swizzle": 32},
            {"persistent": "true"}, {"persistent": "true", "producer": "false", "order": "row"}, {"bn": 128}]


def _verify(precision, opts, n):
    import cupy
    spec = _spec(precision, f"sm_{cupy.cuda.Device().compute_capability}", **opts)
    prep = FAM.prepare(spec, FAM.build(spec), n, n, n, seed=11)
    prep.launch()
    cupy.cuda.Device().synchronize()
    return spec, prep.verify()


@pytest.mark.gpu
@pytest.mark.parametrize("n", [512, 1024, 2048])
@pytest.mark.parametrize("opts", VARIANTS, ids=lambda o: "-".join(f"{k}{v}" for k, v in o.items()) or "default")
@pytest.mark.parametrize("precision", list(TYPES))
def test_gpu_verifies(precision, opts, n):
    spec, res = _verify(precision, opts, n)
    assert res.ok, f"{spec.entry} at {n}: max error {res.max_error:.3g}; {res.message()}"
    if precision == "int8":
        assert res.tolerance == 0 and res.max_error == 0
    else:
        assert res.tolerance == (FP8_RTOL if precision.startswith("fp8") else 1e-3)


# epilogue=tma on the GPU: (options besides epilogue, shapes M x N x K); each shape a multiple of BM, BN
# and BK for every precision (BK 64 for 16-bit types with 128B swizzle, 128 for 8-bit)
TMA_CASES = [
    ({"stages": 2}, [(256, 256, 128), (512, 512, 512), (1024, 1024, 1024)]),
    ({"bn": 128, "consumers": 1}, [(128, 128, 128), (256, 512, 384), (1024, 1024, 1024)]),
    ({"bn": 192, "stages": 3, "producer": "false"}, [(384, 384, 256), (768, 768, 768)]),
    ({"stages": 2, "persistent": "true"}, [(1024, 1024, 1024)]),
    # the default ring with the staging beside it, 256 tiles of 128 x 256 for 132 persistent blocks: every
    # buffer of the staging written again after the stores that read it (8 chunks a tile)
    ({"persistent": "true"}, [(2048, 4096, 512)]),
    # persistent blocks that walk several tiles, so the staging is written again after a wait: 1024 x 2048
    # in 64 x 64 tiles is 512 tiles for the H200's 132 blocks
    ({"bn": 64, "consumers": 1, "persistent": "true"}, [(128, 128, 128), (1024, 2048, 256)]),
    ({"bn": 64, "consumers": 1, "persistent": "true", "producer": "false", "order": "row", "swizzle": 32},
     [(1024, 2048, 256)]),
]


def _prepared(precision, opts, shape):
    import cupy
    spec = _spec(precision, f"sm_{cupy.cuda.Device().compute_capability}", **opts)
    return spec, FAM.prepare(spec, FAM.build(spec), *shape, seed=11)


def _ids(v):
    return "x".join(map(str, v)) if isinstance(v, tuple) else "-".join(f"{k}{x}" for k, x in v.items())


def _finish(entry, limit_s=60.0):
    """Wait for the launches so far; a kernel that never finishes (a barrier that is never completed)
    ends the session with its name instead of hanging it: the hung context cannot run anything else."""
    import time

    import cupy
    done = cupy.cuda.Event()
    done.record()
    deadline = time.monotonic() + limit_s
    while not done.done:
        if time.monotonic() > deadline:
            pytest.exit(f"{entry} did not finish within {limit_s:.0f} s (a deadlock): GPU tests stopped", 3)
        time.sleep(0.01)


def _same_c(precision, opts, change, shape):
    """Verify the kernel of ``opts`` + ``change`` and check that its C is bit for bit that of ``opts``
    alone (the same wgmma sequence: only how operands arrive or results leave differs)."""
    import cupy
    spec, new = _prepared(precision, {**opts, **change}, shape)
    _, ref = _prepared(precision, opts, shape)
    new.launch()
    ref.launch()
    _finish(spec.entry)
    res = new.verify()
    assert res.ok, f"{spec.entry} at {shape}: max error {res.max_error:.3g}; {res.message()}"
    if precision == "int8":
        assert res.tolerance == 0 and res.max_error == 0
    a, b = new.launch.output, ref.launch.output
    assert a.dtype == b.dtype and a.shape == b.shape == shape[:2]
    assert bool(cupy.array_equal(a.view(cupy.int32), b.view(cupy.int32))), spec.entry


@pytest.mark.gpu
@pytest.mark.parametrize("opts, shape", [(o, s) for o, shapes in TMA_CASES for s in shapes], ids=_ids)
@pytest.mark.parametrize("precision", list(TYPES))
def test_gpu_tma_epilogue(precision, opts, shape):
    """epilogue=tma verifies and writes the C of epilogue=registers, bit for bit."""
    _same_c(precision, opts, {"epilogue": "tma"}, shape)


def test_cluster_4_assembles(tmp_path, need_ptxas):
    """cluster=4 with every producer x persistent (two consumers, the TMA epilogue, stream-K where
    persistent) and the smallest tile: assembled, no C75xx info, no spill; SASS: both loads multicast at
    every load site, no plain TMA load, one remote-capable arrival per CTA of the four and release site."""
    from experiments.build.assemble import sass_opcodes
    specs = [_most_stages("int8", cluster=4, producer=p, persistent=q, epilogue="tma",
                          **({"schedule": "streamk"} if q == "true" else {}))
             for p in ("true", "false") for q in ("true", "false")]
    specs.append(_spec("fp8_e4m3", cluster=4, bn=64, consumers=1, swizzle=32))
    results = _assemble_checked(specs, tmp_path, lambda s: True)
    print(f"assembled {len(results)} wgmma kernels with cluster=4 for sm_90a")
    for s, a in results:
        ops = sass_opcodes(a.sass)
        sites = 1 if s.p["producer"] == "true" else 3
        assert ops.get("UTMALDG.2D.MULTICAST") == 2 * sites and "UTMALDG.2D" not in ops, (s.entry, ops)
        assert ops.get("SYNCS.ARRIVE.TRANS64.RED.A1T0") == 8, (s.entry, ops)


# cluster=2 on the GPU: M a multiple of 2 BM; the persistent ones walk about 4 pair tiles per cluster
CLUSTER_CASES = [
    ({}, [(256, 256, 128), (512, 512, 512), (1024, 1024, 1024)]),
    ({"bn": 128, "producer": "false"}, [(512, 256, 256)]),
    ({"bn": 192, "stages": 3, "epilogue": "tma"}, [(768, 768, 768)]),
    ({"bn": 64, "consumers": 1, "persistent": "true"}, [(128, 128, 128), (1024, 2048, 256)]),
    ({"bn": 64, "consumers": 1, "persistent": "true", "producer": "false", "order": "row", "swizzle": 32,
      "epilogue": "tma"}, [(1024, 2048, 256)]),
]


@pytest.mark.gpu
@pytest.mark.parametrize("opts, shape", [(o, s) for o, shapes in CLUSTER_CASES for s in shapes], ids=_ids)
@pytest.mark.parametrize("precision", list(TYPES))
def test_gpu_cluster(precision, opts, shape):
    """cluster=2 (B shared by TMA multicast) verifies and writes the C of cluster=1, bit for bit."""
    _same_c(precision, opts, {"cluster": 2}, shape)


# cluster=4 on the GPU: M a multiple of 2 BM, N of 2 BN; persistent ones walk several quad tiles per cluster
# (stream-K: not bit-identical to whole tiles, it adds split tiles' sums in another order; checked alone)
CLUSTER4_CASES = [
    ({}, [(256, 512, 128), (1024, 1024, 1024)]),
    ({"persistent": "true", "epilogue": "tma", "group": 16}, [(3072, 2048, 256)]),
    ({"bn": 64, "consumers": 1, "persistent": "true", "producer": "false", "swizzle": 32}, [(1024, 2048, 256)]),
    ({"bn": 192, "stages": 3, "order": "row"}, [(768, 1536, 384)]),
]


@pytest.mark.gpu
@pytest.mark.parametrize("opts, shape", [(o, s) for o, shapes in CLUSTER4_CASES for s in shapes], ids=_ids)
@pytest.mark.parametrize("precision", list(TYPES))
def test_gpu_cluster_4(precision, opts, shape):
    """cluster=4 (2 x 2 CTAs sharing A and B by TMA multicast) verifies and writes the C of cluster=1, bit
    for bit."""
    _same_c(precision, opts, {"cluster": 4}, shape)


# group (tile rows walked together by order=grouped): 24 tile rows of 128 (12 pair rows with cluster=2), so
# groups of 16 and 32 end in a partial group; persistent blocks walk several tiles each. (Not with stream-K:
# the order decides which tiles are split, hence the order of a split tile's f32 sums.)
GROUP_CASES = [
    ({}, [(3072, 1024, 256)]),
    ({"cluster": 2, "persistent": "true", "epilogue": "tma"}, [(3072, 1024, 256)]),
    ({"bn": 64, "consumers": 1, "persistent": "true", "producer": "false"}, [(3072, 1024, 256)]),
]


@pytest.mark.gpu
@pytest.mark.parametrize("opts, shape", [(o, s) for o, shapes in GROUP_CASES for s in shapes], ids=_ids)
@pytest.mark.parametrize("group", [16, 32])
@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_gpu_group(precision, group, opts, shape):
    """group=16 and 32 verify and write the C of group=8, bit for bit (the same tiles, in another order)."""
    _same_c(precision, opts, {"group": group}, shape)


# schedule=streamk on the GPU (132 SMs): (options besides persistent and schedule, shapes); tiles beyond
# the full waves are split into K-step segments that cross tile boundaries, each partial tile summed by its
# owner from the slots of the next CTAs. Shapes a multiple of BK = 128 (8-bit) too.
STREAMK_CASES = [
    # 16 x 10 = 160 tiles: 1 whole tile each, 28 tiles' 8 or 16 K steps over 132 CTAs (several per tile)
    ({}, [(2048, 2560, 1024)]),
    # 16 x 9 = 144 tiles, 12 left of 1 or 2 K steps: fewer steps than CTAs, so most take none
    ({}, [(2048, 2304, 256)]),
    # fewer tiles than SMs (persistent_grid): 8 x 8 = 64 tiles of 64 x 64 on 128 CTAs (2 each, split K);
    # 4 x 4 = 16 tiles of 128 x 128 on 128 CTAs: 8 each, 1 K step (16-bit) or none (8-bit: 4 steps)
    ({"bn": 64, "consumers": 1}, [(512, 512, 512)]),
    ({"bn": 128}, [(512, 512, 512)]),
    # 64 x 64 tiles: 256 tiles, 124 left
    ({"bn": 64, "consumers": 1, "producer": "false", "order": "row"}, [(1024, 1024, 512)]),
    # clusters: 8 pair rows x 10 = 80 pair tiles for 66 clusters; TMA epilogue for the owners
    ({"cluster": 2, "epilogue": "tma"}, [(2048, 2560, 1024)]),
    # clusters of 4 (an H200 runs 30 at once, the grid): 8 x 5 = 40 quad tiles, 10 left; 2 x 2 = 4 quad
    # tiles split K among 28 clusters (7 each)
    ({"cluster": 4, "epilogue": "tma", "group": 16}, [(2048, 2560, 1024), (512, 1024, 2048)]),
]


@pytest.mark.gpu
@pytest.mark.parametrize("opts, shape", [(o, s) for o, shapes in STREAMK_CASES for s in shapes], ids=_ids)
@pytest.mark.parametrize("precision", list(TYPES))
def test_gpu_streamk(precision, opts, shape):
    """schedule=streamk verifies (int8 exactly), and again on a second launch into a poisoned C: the
    owners leave every flag zero for the next launch."""
    spec, prep = _prepared(precision, {**opts, "persistent": "true", "schedule": "streamk"}, shape)
    for launch in range(2):
        prep.launch.output.fill(-7 if precision == "int8" else float("nan"))
        prep.launch()
        _finish(spec.entry)
        res = prep.verify()
        assert res.ok, f"{spec.entry} at {shape}, launch {launch}: {res.message()}"
        if precision == "int8":
            assert res.max_error == 0
    ws = prep.launch.operands[1][0]
    assert int(ws[:FLAG_BYTES].view("uint32").max()) == 0      # flags back to zero


@pytest.mark.gpu
def test_gpu_tile_auto_runs_each_chosen_tile(tmp_path):
    """run.py family=wgmma tile=auto at 512 and 1024 on the GPU: two runs, each verified (int8 exactly)
    with the tile chosen for the GPU's SMs (on an H200, 132: 64x64 and 64x128) in its params."""
    import cupy
    import mlflow
    from experiments.families.gpu import sm_count
    db = tmp_path / "m.db"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "family=wgmma", "tile=auto", "precision=int8",
         "problem.sizes=[512,1024]", f"tracking.uri=sqlite:///{db}", f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    want = sorted((str(spec.p["consumers"]), str(spec.p["bn"]), f"[{n}]") for n in (512, 1024)
                  for spec in [auto_tile(FAM, "int8", {}, n, n, n, sm_count()).spec])
    client = mlflow.MlflowClient(f"sqlite:///{db}")
    runs = [r for r in client.search_runs([client.get_experiment_by_name("tensor-core-ablations").experiment_id])
            if "problem.m" in r.data.params]
    got = sorted((r.data.params["family.consumers"], r.data.params["family.bn"], r.data.params["problem.sizes"])
                 for r in runs)
    assert got == want, proc.stdout
    for r in runs:
        assert r.data.tags["verified"] == "true" and r.data.metrics["verify_max_error"] == 0
        assert r.data.tags["tile_auto"] == "true" and r.data.metrics["throughput"] > 0
    if cupy.cuda.Device().attributes["MultiProcessorCount"] == 132:
        assert want == [("1", "128", "[1024]"), ("1", "64", "[512]")]


def test_gpu_cases_are_valid():
    """The GPU cases above validate for every precision and their shapes fit the tiles (CPU check, so a
    typo fails here rather than on the GPU); the persistent ones at 1024 x 2048 walk 512 tiles (256
    pairs) with the H200's 132 blocks (66 clusters)."""
    for cases, change in ((TMA_CASES, {"epilogue": "tma"}), (CLUSTER_CASES, {"cluster": 2}), (GROUP_CASES, {"group": 32}),
                          (CLUSTER4_CASES, {"cluster": 4}),
                          (STREAMK_CASES, {"persistent": "true", "schedule": "streamk"})):
        for precision in TYPES:
            for opts, shapes in cases:
                for o in (opts, {**opts, **change}):
                    spec = _spec(precision, **o)
                    for m, n, k in shapes:
                        FAM.check_problem(spec, m, n, k)
    walk = [(geometry("fp16", {**AXIS_DEFAULT, **o}), s) for o, shapes in TMA_CASES + CLUSTER_CASES
            for s in shapes if o.get("persistent") and s[0] == 1024]
    assert [(s[0] // g["BM"]) * (s[1] // g["BN"]) for g, s in walk] == [32, 512, 512, 512, 512]
