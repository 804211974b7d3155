"""The wgmma family (experiments.families.wgmma, kernels_ptx/wgmma_gemm.ptx.j2).

CPU: the space and its messages; a covering subset of the space (every value of every axis for every
precision, plus every producer x persistent x consumers combination) rendered and assembled with
``ptxas -arch=sm_90a -v`` through experiments.assemble (which fails a build on the C75xx infos: wgmma
serialized, a wait or fence injected, setmaxnreg ignored), none spilling, registers within the cap;
one static sweep through run.py (registers, HGMMA / UTMALDG counts, a skipped point with its reason).
GPU (``gpu`` marker): every precision verified at 512, 1024 and 2048 for the default point and for
axis variations; int8 exactly, floats within rtol (fp8 within wgmma.FP8_RTOL).
"""
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from experiments import families
from experiments.assemble import PtxasError, assemble, fatal_infos
from experiments.families.wgmma import FP8_RTOL, REGS, TYPES, geometry, smem_bytes
from experiments.spec import SpecError

ROOT = Path(__file__).resolve().parent.parent
FAM = families.get("wgmma")
DEFAULT = {"bn": 256, "consumers": 2, "producer": "true", "stages": 4, "swizzle": 128,
           "persistent": "false", "order": "grouped"}


def _spec(precision="fp16", arch="sm_90", **opts):
    return FAM.spec(precision, opts, arch)


# ------------------------------------------------------------------ space and validation
def test_space_count_and_defaults():
    specs = list(FAM.space("sm_90"))
    print(f"wgmma space on sm_90a: {len(specs)} specs")
    # 5 precisions x 4 bn x 2 consumers x 2 producer x 7 stages x 3 swizzle x 2 persistent x 2 orders
    # = 6720, less the stage counts that do not fit 227 KiB
    assert len(specs) == 6240 == len({s.entry for s in specs})
    assert all(s.arch == "sm_90a" and smem_bytes(s.precision, s.p) <= 232448 for s in specs)
    assert list(FAM.space("sm_89")) == [] and len(list(FAM.space("sm_90a"))) == 6240
    s = _spec()
    assert s.p == {**DEFAULT, "bk": 64} and s.arch == "sm_90a"
    assert s.entry == ("wgmma_fp16_bk64_bn256_consumers2_ordergrouped_persistentfalse_producertrue_"
                       "stages4_swizzle128")
    g = geometry("fp16", s.p)
    assert (g["BM"], g["BN"], g["BK"], g["T"], g["stage_bytes"]) == (128, 256, 64, 384, 49152)
    assert FAM.threads(s) == 384 and FAM.dyn_smem(s) == 1024 + 4 * 49152 + 64
    assert _spec("int8").p["bk"] == 128 and _spec("fp8_e5m2", swizzle=32).p["bk"] == 32
    assert FAM.unit(_spec("int8")) == "TOP/s" and FAM.unit(_spec("fp8_e4m3")) == "TFLOP/s"
    # Hydra gives booleans; they validate as the axis' text
    assert _spec(producer=False, persistent=True).p["producer"] == "false"


@pytest.mark.parametrize("call, message", [
    (lambda: _spec(arch="sm_89"), "family=wgmma needs target.arch=sm_90a (wgmma.mma_async and setmaxnreg "
                                  "exist only on sm_90a; auto and sm_90 resolve to it), not target.arch=sm_89"),
    (lambda: _spec(stages=5), "stages=5 needs 246864 bytes of shared memory per block (5 x (128 + 256) rows "
                              "x 128 bytes + 1104), more than the 232448 (227 KiB) of sm_90a; valid with "
                              "bn=256 consumers=2 swizzle=128: stages <= 4"),
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
    that fits), and every producer x persistent x consumers combination."""
    out = {}
    for prec in TYPES:
        points = [{}]
        for axis, values in FAM.axes.items():
            if axis != "precision":
                points += [{axis: v} for v in values if v != DEFAULT[axis]]
        points += [{"producer": p, "persistent": q, "consumers": c}
                   for p in ("true", "false") for q in ("true", "false") for c in (1, 2)]
        points += [{"bn": 128, "consumers": 1, "stages": n} for n in FAM.axes["stages"]]
        points += [{"bn": 64, "consumers": 1, "stages": 8, "swizzle": 32, "order": "row"}]
        for opts in points:
            try:
                s = _spec(prec, **opts)
            except SpecError:
                continue            # stages beyond shared memory
            out[s.entry] = s
    return list(out.values())


def test_covering_subset_assembles(tmp_path, need_ptxas):
    specs = _covering()
    covered = {(a, s.p[a]) for s in specs for a in FAM.axes if a != "precision"}
    assert covered == {(a, v) for a, vs in FAM.axes.items() if a != "precision" for v in vs}
    assert {s.precision for s in specs} == set(TYPES)

    def one(s):
        sass = s.p == {**DEFAULT, "bk": s.p["bk"]}
        return s, assemble(FAM.build(s).source, s.entry, s.arch, threads=FAM.threads(s),
                           dyn_smem=FAM.dyn_smem(s), workdir=tmp_path, with_sass=sass)
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(one, specs))
    print(f"assembled {len(results)} wgmma kernels for sm_90a")
    for s, a in results:
        assert a.spill_stores == a.spill_loads == a.stack_frame == 0, (s.entry, a.report)
        cap = REGS["launch"] if s.p["producer"] == "true" else 255
        assert 0 < a.registers <= cap, (s.entry, a.registers)
        assert not fatal_infos(a.report)
        if a.sass:      # defaults: one wgmma per 32 bytes of K, one TMA load per operand
            op = {"fp16": "HGMMA", "bf16": "HGMMA", "int8": "IGMMA"}.get(s.precision, "QGMMA")
            assert a.sass_counts.get(op) == 4 and a.sass_counts.get("UTMALDG") == 2, (s.entry, a.sass_counts)


# ------------------------------------------------------------------ run.py, static
def _children(tmp):
    from experiments.track import Tracker
    tr = Tracker(f"sqlite:///{tmp}/mlflow.db", "wgmma-tests", create=False)
    runs = tr.client.search_runs([tr.experiment_id], max_results=100)
    return {r.info.run_name: r for r in runs if "mlflow.parentRunId" in r.data.tags}


def test_static_sweep(tmp_path, need_ptxas):
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "HYDRA_FULL_ERROR")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "-m", "family=wgmma", "backend=static", "precision=fp16,int8",
         "family.stages=4,5", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", "tracking.experiment=wgmma-tests",
         f"hydra.sweep.dir={tmp_path}/out"], cwd=tmp_path, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    assert proc.returncode == 0, proc.stdout
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
