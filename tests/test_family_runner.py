"""The kernel families in the runner: ``family`` as a config group with typed options, static runs of
every family through run.py (skipped combinations with their reason, cuBLAS "needs a GPU"), run
names and params, and the speedup / pct_of_peak relations (experiments.reports.compare) on a store built
here: wgmma runs divide by the wgmma peak (``family=peak family.instruction=wgmma``), every other
family by the mma.sync peak. GPU tests (``gpu`` marker): the families verified through run.py, and
pct_of_peak from a peak run of each generation.
"""
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from test_cli import empty_store_at

from experiments.reports import compare
from experiments import families
from experiments.store import record
from experiments.config import register
from experiments.reports.report import families_table
from experiments.families.runner import family_name, family_options, family_spec, family_shapes
from experiments.spec import SpecError
from experiments.families.mma_sync.spec import spec_from_config
from experiments.store.track import Tracker

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENT = "family-tests"


def _compose(*overrides):
    register()
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


# ------------------------------------------------------------------ config group
def test_family_group_selects_typed_options():
    cfg = _compose()
    assert family_name(cfg) == "mma_sync" and family_options(cfg) == {}
    cfg = _compose("family=wmma", "family.block=64x64", "precision=int8")
    assert family_name(cfg) == "wmma"
    assert family_options(cfg) == {"acc": "auto", "block": "64x64", "warps": "2x4"}
    fam, spec = family_spec(cfg, None)
    assert spec.entry == "wmma_int8_accs32_bk64_block64x64_warps2x4" and spec.arch == "sm_90"
    cfg = _compose("family=peak", "precision=int8")
    assert family_options(cfg) == {"mma": "auto", "copy": "auto", "instruction": "mma_sync", "feed": "registers"}
    assert family_spec(cfg, 89)[1].arch == "sm_89"          # target.arch=auto: the GPU's own
    # the wgmma peak: auto on an sm_90 GPU (or without one) is sm_90a, as for family=wgmma
    cfg = _compose("family=peak", "precision=fp8_e5m2", "family.instruction=wgmma")
    assert [family_spec(cfg, cc)[1].arch for cc in (90, None)] == ["sm_90a", "sm_90a"]
    assert family_spec(cfg, 90)[1].p["mma"] == "m64n256k32"
    # precision=copy reaches the peak family from the command line (it used to stop at the enum)
    cfg = _compose("family=peak", "precision=copy", "family.copy=memcpy")
    assert family_spec(cfg, 90)[1].entry == "peak_copy_bytes1073741824_copymemcpy"
    with pytest.raises(SpecError, match=r"precision=copy is not valid; valid values: fp16, bf16, int8, int4, "
                                        r"fp8_e4m3, fp8_e5m2 \(copy is the peak family's copy bandwidth: "
                                        r"family=peak precision=copy\)"):
        spec_from_config(_compose("precision=copy"), 90)


@pytest.mark.parametrize("override, text", [
    ("family.block=99x99", "Invalid value '99x99', expected one of [128x128, 64x64]"),
    ("family.blok=64x64", "Key 'blok' not in 'WmmaConf'"),
])
def test_family_options_are_typed(override, text):
    with pytest.raises(Exception) as err:
        _compose("family=wmma", override)
    assert text in str(err.value) + str(err.value.__cause__)


@pytest.mark.parametrize("overrides, text", [
    (("family=cublas", "precision=int4"), "family=cublas: no cuBLAS GEMM for precision=int4; valid: fp16, bf16, int8"),
    (("family=wmma", "precision=fp8_e4m3"), "family=wmma: no WMMA GEMM for precision=fp8_e4m3; "
                                            "valid: fp16, bf16, int8, int4"),
    (("family=peak", "precision=int8", "family.copy=memcpy"), "family=peak copy=memcpy applies to precision=copy"),
    # no fp8 tensor-core instruction for mma.sync there: a register-only loop folds into FADDs
    (("family=peak", "precision=fp8_e4m3", "target.arch=sm_90"), "sm_90 has no tensor-core instruction for "
                                                                 "mma.sync on fp8"),
    (("family=peak", "precision=fp8_e4m3", "target.arch=sm_100"), "sm_100 has no tensor-core instruction for "
                                                                  "mma.sync on fp8"),
    (("family=peak", "precision=fp16", "family.instruction=wgmma", "target.arch=sm_100"),
     "instruction=wgmma needs target.arch=sm_90a, not sm_100: wgmma.mma_async exists only for the "
     "arch-specific target sm_90a"),
    (("family=peak", "precision=int4", "family.instruction=wgmma"), "instruction=wgmma has no precision=int4"),
])
def test_impossible_family_combinations_name_the_valid_values(overrides, text):
    with pytest.raises(SpecError) as err:
        family_spec(_compose(*overrides), None)
    assert text in str(err.value)


def test_shapes_checked_per_family():
    fam = families.get("wmma")
    spec = fam.spec("int8", {}, "sm_90")
    assert family_shapes(fam, spec, [(512, 512, 512)]) == [(512, 512, 512)]
    with pytest.raises(SpecError) as err:
        family_shapes(fam, spec, [(512, 512, 512), (96, 128, 64)])
    # each size once with its reason, then the sizes that fit (the message used to repeat the kernel's
    # name and the advice for every size)
    assert str(err.value) == (f"1 of 2 problem sizes do not fit {spec.entry}: 96x128x64 (M=96 is not a multiple "
                              "of BM=128). Square sizes must be multiples of 128 (M, N, K: multiples of 128, 128, 64), "
                              "e.g. 'problem.sizes=[128,512]'")
    wg = families.get("wgmma")
    bn192 = wg.spec("fp16", {"bn": 192}, "sm_90a")
    with pytest.raises(SpecError, match=r"5 of 5 problem sizes .* Square sizes must be multiples of 384 \(M, N, K: "
                                        r"multiples of 128, 192, 64\), e.g. \'problem.sizes=\[768,1152,2304,4224,8448\]\'$"):
        family_shapes(wg, bn192, [(s, s, s) for s in (512, 1024, 2048, 4096, 8192)])
    peak = families.get("peak")
    assert family_shapes(peak, peak.spec("int8", {}, "sm_90"), [(512, 512, 512)]) == [None]


def test_run_names_and_params():
    spec = families.get("wmma").spec("int8", {}, "sm_90")
    assert record.run_name(families.get("wmma"), spec, (1024, 1024, 1024)) == "1024 wmma int8 s32 128x128 2x4"
    peak = families.get("peak").spec("int4", {}, "sm_90")
    assert record.run_name(families.get("peak"), peak) == "peak int4 m16n8k64"
    peak = families.get("peak").spec("int8", {"instruction": "wgmma"}, "sm_90")
    assert record.run_name(families.get("peak"), peak) == "peak int8 m64n256k32 wgmma"
    # numbers and switches say their axis (a wgmma name was 'wgmma fp8_e4m3 256 2 true 4 128 true grouped')
    wg = families.get("wgmma").spec("fp8_e4m3", {"persistent": "true"}, "sm_90a")
    assert record.run_name(families.get("wgmma"), wg, (8192,) * 3) == (
        "8192 wgmma fp8_e4m3 bn256 consumers2 producer stages4 swizzle128 persistent grouped")
    wg = families.get("wgmma").spec("fp16", {"producer": "false"}, "sm_90a")
    assert "no_producer" in record.run_name(families.get("wgmma"), wg)
    flat = {"precision": "int8", "ktile": "32", "tile.block": "[256, 128]", "family.name": "wmma",
            "family.block": "128x128", "problem.sizes": "[512]", "timing.batches": "10"}
    params = record.params_of(flat, families.get("wmma"), spec.flat())
    assert params == {"precision": "int8", "family": "wmma", "family.block": "128x128",
                      "problem.sizes": "[512]", "timing.batches": "10", "spec.arch": "sm_90",
                      "spec.entry": spec.entry, "spec.acc": "s32", "spec.bk": "64", "spec.block": "128x128",
                      "spec.warps": "2x4", "variant": "none", "study_kernel": "none", "size": "none"}


# ------------------------------------------------------------------ run.py, static
def test_help_lists_the_families(tmp_path):
    rc, out = _run_cli(tmp_path, "--help")
    assert rc == 0, out
    assert "family: cublas, dp4a, mma_sync, peak, wgmma, wmma" in out.splitlines()
    rc, out = _run_cli(tmp_path, "--cfg", "job", "family=peak", "precision=int8")
    assert rc == 0, out
    assert ("family:\n  name: peak\n  mma: auto\n  copy: auto\n  instruction: mma_sync\n  feed: registers\n"
            "precision: int8\n") in out
    assert list(tmp_path.iterdir()) == []


def _run_cli(cwd, *args, hide_gpu=True, timeout=300):
    if hide_gpu:
        from test_cli import run_cli
        return run_cli(cwd, *args, timeout=timeout)
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "HYDRA_FULL_ERROR")}
    proc = subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=cwd, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    return proc.returncode, proc.stdout


def _store(tmp):
    return [f"tracking.uri={empty_store_at(f'{tmp}/mlflow.db')}", f"tracking.experiment={EXPERIMENT}",
            f"hydra.sweep.dir={tmp}/out"]


def _children(tmp) -> dict:
    tr = Tracker(f"sqlite:///{tmp}/mlflow.db", EXPERIMENT, create=False)
    runs = tr.client.search_runs([tr.experiment_id], max_results=100)
    return {r.info.run_name: r for r in runs if "mlflow.parentRunId" in r.data.tags}


def test_static_sweep_of_families(tmp_path, need_ptxas):
    rc, out = _run_cli(tmp_path, "-m", "family=wmma,cublas,peak", "precision=int8,int4", *_store(tmp_path))
    assert rc == 0, out
    runs = _children(tmp_path)
    # int4 on sm_90 is ptxas' emulation (IMMA.S8 and integer code): where the SASS says so (tag
    # mma_native=false), the name and the description say EMULATED; the names are otherwise as before
    for name, r in runs.items():
        emulated = r.data.tags.get("mma_native") == "false"
        assert (" int4 " in name + " ") >= emulated, name
        assert name.startswith("EMULATED ") == emulated, name
        assert r.data.tags["mlflow.note.content"].startswith("EMULATED MMA (") == emulated, name
    assert sorted(n.removeprefix("EMULATED ") for n in runs) == [
        "cublas int8", "peak int4 m16n8k64", "peak int8 m16n8k32", "skipped family=cublas precision=int4",
        "wmma int4 s32 128x128 2x4", "wmma int8 s32 128x128 2x4"]
    runs = {n.removeprefix("EMULATED "): r for n, r in runs.items()}
    assert all(r.info.status == "FINISHED" and r.data.params["family"] in ("wmma", "cublas", "peak")
               for r in runs.values())
    skipped = runs["skipped family=cublas precision=int4"]
    assert skipped.data.tags["outcome"] == "skipped"
    assert "no cuBLAS GEMM for precision=int4; valid: fp16, bf16, int8" in skipped.data.tags["skip_reason"]
    cub = runs["cublas int8"]
    assert cub.data.tags["outcome"] == "static" and cub.data.tags["ptxas"] == "not applicable"
    assert cub.data.tags["mlflow.note.content"].startswith("Not run: needs a GPU: cuBLAS GEMM cublas_int8")
    peak = runs["peak int8 m16n8k32"]
    assert peak.data.tags["kernel"] == "peak_int8_chains8_iters16_mmam16n8k32_units1048576"
    assert peak.data.metrics["threads"] == 256 and peak.data.metrics["spill_stores_bytes"] == 0
    assert peak.data.params["spec.mma"] == "m16n8k32" and "ktile" not in peak.data.params
    wmma = runs["wmma int8 s32 128x128 2x4"]
    if shutil.which("nvcc"):       # CUDA C++ -> nvcc -ptx -> ptxas: resources
        assert wmma.data.metrics["threads"] == 256 and wmma.data.metrics["smem_static_bytes"] == 32768
        assert 0 < wmma.data.metrics["registers"] <= 255
    else:
        assert "registers" not in wmma.data.metrics and wmma.data.tags["ptxas"] == "missing"


# ------------------------------------------------------------------ speedups and peaks
def _add(tr, parent, family, precision, thr, size=(512, 512, 512), gpu="NVIDIA H200", driver="580.1",
         mma=None, instruction=None):
    params = {"family": family, "precision": precision}
    if size:
        params.update({"problem.m": size[0], "problem.n": size[1], "problem.k": size[2]})
    if mma:
        params["spec.mma"] = mma
    if instruction:                 # a peak's spec.instruction: only wgmma peaks carry it
        params["spec.instruction"] = instruction
    rid = tr.start(f"{family} {precision} {thr}", params, {"gpu": gpu, "driver": driver, "outcome": "verified"},
                   parent)
    tr.log(rid, {"throughput": thr})
    tr.end(rid)
    time.sleep(0.002)           # start times apart: "latest" is well defined
    return rid


def test_speedups_and_pct_of_peak(tmp_path):
    tr = Tracker(empty_store_at(tmp_path / "mlflow.db"), EXPERIMENT)
    old = tr.start("sweep old", {}, {"kind": "sweep"})
    new = tr.start("sweep new", {}, {"kind": "sweep"})
    p_old = _add(tr, old, "peak", "int8", 1000.0, size=None, mma="m16n8k32")
    p_k16 = _add(tr, old, "peak", "int8", 600.0, size=None, mma="m16n8k16")
    _add(tr, old, "peak", "int8", 5000.0, size=None, mma="m16n8k32", driver="999.9")     # another driver
    gemm = _add(tr, new, "mma_sync", "int8", 500.0, mma="m16n8k32")
    assert compare.relate(tr, gemm) == {gemm: {"pct_of_peak": 50.0, "peak_run": p_old}}   # latest, no baseline
    w1 = _add(tr, new, "wmma", "int8", 200.0)
    w2 = _add(tr, new, "wmma", "int8", 250.0)                  # the best wmma run is the reference
    _add(tr, new, "cublas", "int8", 400.0, size=(1024, 1024, 1024))     # another size: no relation
    _add(tr, new, "cublas", "int8", 400.0, gpu="NVIDIA L4")    # another GPU: no relation
    got = compare.relate(tr, w1)
    # each speedup names the run it divides by (tag speedup_vs_<family>.run: id and name)
    assert got == {gemm: {"speedup_vs_wmma": 2.0, "speedup_vs_wmma.run": f"{w2} wmma int8 250.0"},
                   w1: {"pct_of_peak": 20.0, "peak_run": p_old}}
    cub = _add(tr, new, "cublas", "int8", 625.0)
    assert compare.relate(tr, cub)[gemm] == {"speedup_vs_cublas": 0.8,
                                             "speedup_vs_cublas.run": f"{cub} cublas int8 625.0"}
    assert tr.client.get_run(gemm).data.tags["speedup_vs_wmma.run"] == f"{w2} wmma int8 250.0"
    m = tr.client.get_run(gemm).data.metrics
    assert (m["speedup_vs_wmma"], m["speedup_vs_cublas"], m["pct_of_peak"]) == (2.0, 0.8, 50.0)
    assert "speedup_vs_wmma" not in tr.client.get_run(w1).data.metrics          # baselines: no speedups
    # a GEMM run on the k16 shape divides by the k16 peak; one with another precision has no peak
    g16 = _add(tr, new, "mma_sync", "int8", 300.0, mma="m16n8k16")
    assert compare.relate(tr, g16)[g16] == {"pct_of_peak": 50.0, "peak_run": p_k16, "speedup_vs_wmma": 1.2,
                                            "speedup_vs_cublas": 0.48,
                                            "speedup_vs_wmma.run": f"{w2} wmma int8 250.0",
                                            "speedup_vs_cublas.run": f"{cub} cublas int8 625.0"}
    g4 = _add(tr, new, "mma_sync", "int4", 10.0, mma="m16n8k64")
    assert compare.relate(tr, g4) == {}
    # a peak measured in the same sweep wins over the latest, and updates the sweep's GEMM runs
    p_new = _add(tr, new, "peak", "int8", 800.0, size=None, mma="m16n8k32")
    _add(tr, old, "peak", "int8", 2000.0, size=None, mma="m16n8k32")            # later, other sweep
    got = compare.relate(tr, p_new)
    assert got[gemm] == {"pct_of_peak": 62.5, "peak_run": p_new}
    assert got[w1] == {"pct_of_peak": 25.0, "peak_run": p_new}
    assert got[g16] == {"pct_of_peak": 37.5, "peak_run": p_new}     # no k16 peak in this sweep: the highest
    assert g4 not in got
    run = tr.client.get_run(gemm)
    assert run.data.metrics["pct_of_peak"] == 62.5 and run.data.tags["peak_run"] == p_new
    # the report by family: the tags backend and kernel, as the runner sets them
    for r in tr.client.search_runs([tr.experiment_id], max_results=100):
        tr.client.set_tag(r.info.run_id, "backend", "gpu")
        tr.client.set_tag(r.info.run_id, "kernel", r.info.run_name.replace(" ", "_"))
        tr.client.set_tag(r.info.run_id, "throughput_unit", "TOP/s")
    lines = families_table(tr.uri, EXPERIMENT).splitlines()
    h200 = lines[lines.index("## NVIDIA H200"):lines.index("## NVIDIA L4")]
    assert h200[2:6] == ["| peak | shape | throughput |", "| --- | --- | ---: |",
                         "| int8 | m16n8k16 | 600.0 TOP/s |", "| int8 | m16n8k32 | 2000.0 TOP/s |"]
    print("\n".join(h200))
    assert h200[-6:-1] == [   # the best run per family; pct_of_peak from the peak of the new sweep (800)
        "| int4 | 512x512x512 | mma_sync | mma_sync_int4_10.0 | 10.0 TOP/s | - | - | - | - |",
        "| int8 | 512x512x512 | mma_sync | mma_sync_int8_500.0 | 500.0 TOP/s | 62.5 | 2.00 | - | 0.80 |",
        "| int8 | 512x512x512 | wmma | wmma_int8_250.0 | 250.0 TOP/s | 31.2 | - | - | - |",
        "| int8 | 512x512x512 | cublas | cublas_int8_625.0 | 625.0 TOP/s | 78.1 | - | - | - |",
        "| int8 | 1024x1024x1024 | cublas | cublas_int8_400.0 | 400.0 TOP/s | 50.0 | - | - | - |"]


def test_pct_of_peak_divides_by_the_peak_of_the_same_instruction(tmp_path):
    """wgmma runs relate to the wgmma peak (param spec.instruction=wgmma), every other family (cuBLAS
    too, as before) to the mma.sync peak, whose runs carry no spec.instruction (as those tracked before
    the option existed); a wgmma run without a wgmma peak gets no pct_of_peak rather than the mma.sync
    one; a peak arriving in a sweep updates only the runs of its own instruction."""
    tr = Tracker(empty_store_at(tmp_path / "mlflow.db"), EXPERIMENT)
    old = tr.start("sweep old", {}, {"kind": "sweep"})
    new = tr.start("sweep new", {}, {"kind": "sweep"})
    p_mma = _add(tr, old, "peak", "fp16", 640.0, size=None, mma="m16n8k16")
    p_wg = _add(tr, old, "peak", "fp16", 990.0, size=None, mma="m64n256k16", instruction="wgmma")
    _add(tr, old, "peak", "bf16", 640.0, size=None, mma="m16n8k16")
    assert [compare.instruction_of_peak(tr.client.get_run(r)) for r in (p_mma, p_wg)] == ["mma_sync", "wgmma"]
    wg = _add(tr, new, "wgmma", "fp16", 693.0)
    assert compare.relate(tr, wg) == {wg: {"pct_of_peak": 70.0, "peak_run": p_wg}}
    mine = _add(tr, new, "mma_sync", "fp16", 320.0, mma="m16n8k16")
    assert compare.relate(tr, mine) == {mine: {"pct_of_peak": 50.0, "peak_run": p_mma}}
    cub = _add(tr, new, "cublas", "fp16", 576.0)
    assert compare.relate(tr, cub) == {cub: {"pct_of_peak": 90.0, "peak_run": p_mma},
                                       mine: {"speedup_vs_cublas": 0.5556,
                                              "speedup_vs_cublas.run": f"{cub} cublas fp16 576.0"},
                                       wg: {"speedup_vs_cublas": 1.2031,
                                            "speedup_vs_cublas.run": f"{cub} cublas fp16 576.0"}}
    wg_bf16 = _add(tr, new, "wgmma", "bf16", 600.0)         # bf16 has only an mma.sync peak
    assert compare.relate(tr, wg_bf16) == {}
    assert compare.peak_of(tr, tr.client.get_run(wg_bf16), "mma_sync").data.params["precision"] == "bf16"
    # peaks of the new sweep: each updates the runs of its own instruction only
    p_wg2 = _add(tr, new, "peak", "fp16", 1000.0, size=None, mma="m64n256k16", instruction="wgmma")
    assert compare.relate(tr, p_wg2) == {wg: {"pct_of_peak": 69.3, "peak_run": p_wg2}}
    p_mma2 = _add(tr, new, "peak", "fp16", 800.0, size=None, mma="m16n8k16")
    assert compare.relate(tr, p_mma2) == {mine: {"pct_of_peak": 40.0, "peak_run": p_mma2},
                                          cub: {"pct_of_peak": 72.0, "peak_run": p_mma2}}
    got = {r: tr.client.get_run(r).data for r in (wg, mine, cub)}
    assert [(d.metrics["pct_of_peak"], d.tags["peak_run"]) for d in got.values()] == [
        (69.3, p_wg2), (40.0, p_mma2), (72.0, p_mma2)]
    assert "pct_of_peak" not in tr.client.get_run(wg_bf16).data.metrics


# ------------------------------------------------------------------ the GPU path, worker replaced
class _Worker:
    """Stands in for the GPU worker: records each call and answers like measure_family would for a
    kernel that verifies and whose launches take ``us`` microseconds."""

    def __init__(self, us):
        self.us, self.calls = us, []
        self.kernel_clock = {}          # what a kernel that records its cycles adds to the timing dict
        self.device = None              # what the worker reported of the GPU (job._device), once asked

    def start(self):
        """The real worker starts its process here; the calls below answer without one."""

    def call(self, name, timeout, **kw):
        self.calls.append((name, kw))
        state = {"sm_clock_mhz": 1980, "temperature_c": 40, "clock_event_reasons": 0}
        return {"verified": True, "verify_max_error": 0.0, "verify_mismatches": 0, "verify_message": "",
                "verify_rtol": 0.0, "jit_s": 0.5, "note": "a note",
                "state_before": dict(state), "state_after": dict(state),
                "timing": {"median_us": self.us, "min_us": self.us, "max_us": self.us * 1.1, "spread": 0.1,
                           "launches_per_batch": 10, "batches": 3, "method": "cuda_graph", "l2_flush": False,
                           "batch_us": [self.us] * 3, **self.kernel_clock}}


def _stub_gpu(tmp_path, monkeypatch, us):
    """run_job on a stated H200 (sm_90) with the worker replaced by :class:`_Worker`: (job module,
    store overrides, worker)."""
    import contextlib

    from experiments.runner import job
    from experiments.store import track
    gpu = {"gpu": "NVIDIA H200", "compute_capability": 90, "driver": "580.1", "cuda_driver": "13.0",
           "pci_bus_id": "0000:01:00.0", "uuid": "GPU-1"}
    monkeypatch.chdir(tmp_path)
    for key, val in (("key", "k1"), ("name", "sweep t"), ("jobs", "1"), ("overrides", "")):
        monkeypatch.setenv(track.SWEEP_ENV[key], val)
    monkeypatch.setattr(job, "claim_gpu", lambda *a: gpu)
    worker = _Worker(us)

    def device(g):
        worker.device = {"gpu": g["gpu"], "compute_capability": 90, "cuda_runtime": "13.0", "cupy": "14.0"}
        return worker.device
    monkeypatch.setattr(job, "_device", device)
    monkeypatch.setattr(job, "gpu_lock", lambda *a: contextlib.nullcontext())
    store = [f"tracking.uri={empty_store_at(tmp_path / 'mlflow.db')}", f"tracking.experiment={EXPERIMENT}"]
    monkeypatch.setattr(job, "_WORKER", worker)
    return job, store, worker


def test_gpu_path_with_the_worker_replaced(tmp_path, monkeypatch):
    """run_job on a (stated) GPU for family=dp4a and family=peak: the worker gets measure_family with
    the spec and the build; runs are named, rated in the family's unit and related (pct_of_peak)."""
    job, store, worker = _stub_gpu(tmp_path, monkeypatch, 1000.0)
    # the peak kernel's own cycle record (peak.kernel_clock); the stub's timing has no NVML samples
    worker.kernel_clock = {"mma_per_sm_cycle": 0.5963123, "mma_per_sm_cycle_min": 0.59, "mma_per_sm_cycle_max": 0.6,
                           "kernel_cycles": 1_984_000, "kernel_sms": 132, "sm_clock_mhz_kernel": 1979.64}
    assert job.run_job(_compose("family=peak", "precision=int8", *store)) == {
        "finished": 1, "failed": 0, "done_before": 0}
    name, kw = worker.calls[0]
    assert name == "measure_family" and (kw["m"], kw["n"], kw["k"]) == (0, 0, 0)
    assert kw["family"] == "peak" and kw["build"]["kind"] == "ptx" and ["mma", "m16n8k32"] in kw["params"]
    worker.us, worker.kernel_clock = 100.0, {}
    assert job.run_job(_compose("family=dp4a", "precision=int8", "problem.sizes=[512]", *store))["finished"] == 1
    name, kw = worker.calls[1]
    assert (kw["m"], kw["n"], kw["k"], kw["arch"]) == (512, 512, 512, "sm_90") and kw["build"]["kind"] == "cuda"
    runs = _children(tmp_path)
    peak, dp4a = runs["peak int8 m16n8k32"], runs["512 dp4a int8 128x128"]
    flops = 2 ** 20 * 16 * 8 * 2 * 16 * 8 * 32          # units x iters x chains x 2 x 16 x 8 x K
    assert peak.data.metrics["throughput"] == float(f"{flops / 1000.0 / 1e6:.5g}") == 1099.5   # 5 digits
    assert "problem.m" not in peak.data.params and peak.data.tags["family_note"] == "a note"
    assert dp4a.data.metrics["throughput"] == 2.6844           # 2 * 512^3 / 100 us, 5 significant digits
    assert dp4a.data.tags["throughput_unit"] == "TOP/s" and dp4a.data.params["family"] == "dp4a"
    assert dp4a.data.tags["peak_run"] == peak.info.run_id
    assert dp4a.data.metrics["pct_of_peak"] == round(100 * 2.6844 / peak.data.metrics["throughput"], 2)
    assert dp4a.data.tags["mlflow.note.content"].startswith("512x512x512: 100.0 us, 2.7 TOP/s")
    assert peak.data.tags["mlflow.note.content"].startswith(
        "peak_int8_chains8_iters16_mmam16n8k32_units1048576: 1000.0 us")
    assert "verified; 0.5963 MMA per SM and cycle at 1980 MHz (the kernel's own count); clock-event" in \
        peak.data.tags["mlflow.note.content"]
    got = {f: peak.data.metrics.get(f) for f in ("mma_per_sm_cycle", "sm_clock_mhz_kernel", "kernel_cycles",
                                                 "kernel_sms", "sm_clock_mhz_mean", "throughput_per_ghz")}
    assert got == {"mma_per_sm_cycle": 0.59631, "sm_clock_mhz_kernel": 1979.6, "kernel_cycles": 1_984_000,
                   "kernel_sms": None, "sm_clock_mhz_mean": None, "throughput_per_ghz": None}
    assert not {"mma_per_sm_cycle", "sm_clock_mhz_kernel", "kernel_cycles"} & set(dp4a.data.metrics)
    assert record.throughput_figure([peak], tmp_path / "f.png") is False      # no size: not plotted


def test_a_kernel_ptxas_rejects_is_one_failed_run_wherever_it_comes(tmp_path, monkeypatch, need_ptxas):
    """On a (stated) GPU, ptxas rejecting a kernel fails one run named for the kernel (stage assemble),
    the first kernel of the process (built while the worker starts) and a later one (built once its
    first size is to be measured) alike: the same tags (none of the GPU's: nothing ran on it), counts
    of the same form. ptxas is a wrapper that rejects every source while a flag file exists."""
    import mlflow
    job, store, worker = _stub_gpu(tmp_path, monkeypatch, 100.0)
    flag, wrapper = tmp_path / "reject", tmp_path / "rejecting_ptxas"
    wrapper.write_text(f'#!/bin/sh\ncase "$*" in *--version*) exec {need_ptxas} "$@";; esac\n'
                       f'if [ -e {flag} ]; then echo "ptxas fatal: rejected" >&2; exit 1; fi\nexec {need_ptxas} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PTXAS", str(wrapper))
    flag.write_text("")
    first = job.run_job(_compose("precision=int8", "problem.sizes=[512]", *store))
    flag.unlink()
    assert job.run_job(_compose("precision=int8", "problem.sizes=[1024]", *store))["finished"] == 1
    assert worker.device is not None                          # later kernels: built after the GPU's report
    flag.write_text("")
    later = job.run_job(_compose("precision=fp16", "problem.sizes=[512]", *store))
    assert first == later == {"failed": 1}
    client = mlflow.MlflowClient(store[0].split("=", 1)[1])
    runs = client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id],
                              "tags.failed_stage = 'assemble'")
    assert sorted(r.data.tags["kernel"].split("_")[1] for r in runs) == ["fp16", "int8"]
    for r in runs:
        assert r.info.status == "FAILED" and "ptxas fatal: rejected" in r.data.tags["error"]
        assert not {"gpu", "cupy", "driver", "run_key"} & set(r.data.tags), r.data.tags


def test_wgmma_peak_through_the_runner(tmp_path, monkeypatch):
    """family=peak family.instruction=wgmma on a (stated) sm_90 GPU: built for sm_90a and assembled
    (HGMMA in the SASS where cuobjdump exists), rated from its fixed work (2^40 flops); a wgmma GEMM run
    relates to it, an mma_sync GEMM run to the mma.sync peak of the same sweep."""
    job, store, worker = _stub_gpu(tmp_path, monkeypatch, 1100.0)
    assert job.run_job(_compose("family=peak", "precision=fp16", "family.instruction=wgmma", *store))["finished"] == 1
    name, kw = worker.calls[-1]
    assert name == "measure_family" and kw["arch"] == "sm_90a" and kw["build"]["kind"] == "ptx"
    assert ["instruction", "wgmma"] in kw["params"] and ["mma", "m64n256k16"] in kw["params"]
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16" in kw["build"]["source"]
    worker.us = 2000.0
    assert job.run_job(_compose("family=peak", "precision=fp16", *store))["finished"] == 1
    assert kw["arch"] != worker.calls[-1][1]["arch"] == "sm_90"
    worker.us = 500.0
    for fam in ("wgmma", "mma_sync"):
        assert job.run_job(_compose(f"family={fam}", "precision=fp16", "problem.sizes=[1024]", *store))["finished"] == 1
    runs = _children(tmp_path)
    wpeak, mpeak = runs["peak fp16 m64n256k16 wgmma"], runs["peak fp16 m16n8k16"]
    assert wpeak.data.metrics["throughput"] == round(2 ** 40 / 1100.0 / 1e6, 2) == 999.56
    assert wpeak.data.tags["arch"] == "sm_90a" and wpeak.data.params["spec.instruction"] == "wgmma"
    assert wpeak.data.params["family.instruction"] == "wgmma" and "spec.instruction" not in mpeak.data.params
    assert wpeak.data.metrics["threads"] == 256 and wpeak.data.metrics["smem_dynamic_bytes"] == 50176
    assert wpeak.data.metrics["spill_stores_bytes"] == 0 and wpeak.data.metrics["registers"] <= 255
    if "sass_HGMMA" in wpeak.data.metrics:
        assert wpeak.data.metrics["sass_HGMMA"] == 32 and wpeak.data.tags["mma_native"] == "true"
    gemm = {r.data.params["family"]: r for r in runs.values() if r.data.params.get("problem.m") == "1024"}
    thr = round(2 * 1024 ** 3 / 500.0 / 1e6, 2)
    assert gemm["wgmma"].data.tags["peak_run"] == wpeak.info.run_id
    assert gemm["wgmma"].data.metrics["pct_of_peak"] == round(100 * thr / 999.56, 2)
    assert gemm["mma_sync"].data.tags["peak_run"] == mpeak.info.run_id
    assert gemm["mma_sync"].data.metrics["pct_of_peak"] == round(100 * thr / mpeak.data.metrics["throughput"], 2)


# ------------------------------------------------------------------ GPU
def _gpu_sweep(tmp, *args):
    rc, out = _run_cli(tmp, "-m", *args, "timing.batches=3", "timing.min_batch_ms=2", *_store(tmp),
                       hide_gpu=False, timeout=900)
    assert rc == 0, out
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("family, precision", [("dp4a", "int8"), ("wmma", "fp16"), ("cublas", "int8"),
                                               ("peak", "int8")])
def test_measure_family_in_process(family, precision):
    """The worker function itself: verified (exactly for integers, within rtol for floats), then timed."""
    from experiments.families.gpu import device_sm
    from experiments.gpu.worker import measure_family
    fam = families.get(family)
    spec = fam.spec(precision, {}, f"sm_{device_sm()}")
    b = fam.build(spec)
    res = measure_family(family, precision, spec.arch, [list(p) for p in spec.params],
                         {"kind": b.kind, "source": b.source, "entry": b.entry, "options": list(b.options)},
                         512, 512, 512, {"warmup": 1, "batches": 3, "min_batch_ms": 2.0}, 1e-3, 5)
    assert res["verified"], res["verify_message"]
    assert res["verify_mismatches"] == 0 and res["verify_rtol"] == (1e-3 if precision == "fp16" else 0.0)
    t = res["timing"]
    assert t["batches"] == 3 and 0 < t["min_us"] <= t["median_us"] <= t["max_us"]
    if family == "peak":        # its own cycle record: an SM's 4 schedulers issue one instruction a cycle each
        assert 0 < t["mma_per_sm_cycle"] < 4 and t["kernel_cycles"] > 0 and t["sm_clock_mhz_kernel"] > 0, t
    else:
        assert "mma_per_sm_cycle" not in t
    print(f"{spec.entry}: {t['median_us']:.1f} us, {fam.rate(spec, 512, 512, 512, t['median_us']):.1f} "
          f"{fam.unit(spec)}; {res['note']}")


@pytest.mark.gpu
def test_families_verify_through_run_py_and_relate(tmp_path):
    """family=wmma,dp4a,cublas,mma_sync at 512 and 1024 (int8): every run verified; mma_sync runs get
    speedup_vs_<baseline> = their throughput / the baseline's; then a peak sweep gives pct_of_peak."""
    out = _gpu_sweep(tmp_path, "family=wmma,dp4a,cublas,mma_sync", "precision=int8", "problem.sizes=[512,1024]")
    print(out)
    runs = _children(tmp_path)
    assert len(runs) == 8, sorted(runs)
    assert all(r.data.tags["outcome"] == "verified" and r.data.tags["throughput_unit"] == "TOP/s"
               and r.data.metrics["verify_mismatches"] == 0 for r in runs.values()), sorted(runs)
    by = {(r.data.params["family"], int(r.data.params["problem.m"])): r for r in runs.values()}
    for n in (512, 1024):
        mine = by[("mma_sync", n)].data.metrics
        for base in ("wmma", "dp4a", "cublas"):
            want = mine["throughput"] / by[(base, n)].data.metrics["throughput"]
            assert mine[f"speedup_vs_{base}"] == pytest.approx(want, rel=1e-3), (n, base)
            assert "speedup_vs_wmma" not in by[(base, n)].data.metrics
    out = _gpu_sweep(tmp_path, "family=peak", "precision=int8")
    print(out)
    peak = _children(tmp_path)["peak int8 m16n8k32"]
    assert peak.data.tags["outcome"] == "verified" and peak.data.metrics["throughput"] > 100
    # the GEMM sweep had no peak: a later run of it relates to the latest peak run in the store
    _gpu_sweep(tmp_path, "family=mma_sync", "precision=int8", "problem.sizes=[2048]")
    [run] = [r for r in _children(tmp_path).values() if r.data.params.get("problem.m") == "2048"]
    want = 100 * run.data.metrics["throughput"] / peak.data.metrics["throughput"]
    assert run.data.tags["peak_run"] == peak.info.run_id
    assert run.data.metrics["pct_of_peak"] == pytest.approx(want, rel=1e-3) and 0 < want < 100


@pytest.mark.gpu
def test_each_generation_relates_to_its_own_peak_through_run_py(tmp_path):
    """Both fp16 peaks (mma.sync and wgmma), then a wgmma and an mma_sync GEMM at 4096: each GEMM's
    peak_run is the peak of its own instruction and its pct_of_peak is within (0, 100]; the wgmma peak
    is above the mma.sync peak (sm_90 GPUs: wgmma is sm_90a only)."""
    from experiments.families.gpu import device_sm
    if device_sm() != 90:
        pytest.skip(f"wgmma needs an sm_90 GPU (sm_90a); this one is sm_{device_sm()}")
    print(_gpu_sweep(tmp_path, "family=peak", "family.instruction=mma_sync,wgmma", "precision=fp16"))
    print(_gpu_sweep(tmp_path, "family=wgmma,mma_sync", "precision=fp16", "problem.sizes=[4096]"))
    runs = _children(tmp_path)
    peaks = {r.data.params.get("spec.instruction", "mma_sync"): r for r in runs.values()
             if r.data.params["family"] == "peak"}
    assert set(peaks) == {"mma_sync", "wgmma"} and all(r.data.tags["outcome"] == "verified" for r in peaks.values())
    assert peaks["wgmma"].data.metrics["throughput"] > peaks["mma_sync"].data.metrics["throughput"]
    for r in runs.values():
        fam = r.data.params["family"]
        if fam == "peak":
            continue
        want = peaks["wgmma" if fam == "wgmma" else "mma_sync"]
        assert r.data.tags["peak_run"] == want.info.run_id, fam
        pct = r.data.metrics["pct_of_peak"]
        print(f"{fam}: {r.data.metrics['throughput']:.1f} TFLOP/s = {pct:.1f} % of the {want.info.run_name} run")
        assert 0 < pct <= 100, fam


def test_config_schema_lists_every_family():
    cfg = _compose("family=dp4a")
    assert OmegaConf.to_container(cfg.family, enum_to_str=True) == {"name": "dp4a", "block": "128x128"}
    import pickle                       # parallel launchers pickle the job's config
    assert pickle.loads(pickle.dumps(cfg)).family.block.value == "128x128"
    assert sorted(p.stem for p in (ROOT / "conf" / "family").glob("*.yaml")) == sorted(families.names())


def test_mma_sync_keys_given_to_another_family_are_named():
    """`family=wgmma ktile=16 tile=64x64 pipeline.stages=7` built the default wgmma kernel silently."""
    from experiments.runner.job import ignored_keys
    over = "family=wgmma ktile=16 tile=64x64 pipeline.stages=7 +cache.op=ca precision=fp16 family.bn=128"
    assert ignored_keys(over, "wgmma") == ["ktile", "tile", "pipeline.stages", "cache.op"]
    assert ignored_keys(over, "mma_sync") == []
    assert ignored_keys("family=peak precision=int8 problem.sizes=[512]", "peak") == []
    # smem_layout is a root key of mma_sync too (wgmma has its own family.swizzle)
    assert ignored_keys("family=wgmma smem_layout=swizzled family.swizzle=64", "wgmma") == ["smem_layout"]
    # tile=auto chooses the wgmma block tile too (tile.sms plans it); a fixed tile preset stays ignored
    assert ignored_keys("family=wgmma tile=auto tile.sms=58 +tile.auto=true", "wgmma") == []
    assert ignored_keys("family=wgmma tile=128x128 tile.block=[64,64]", "wgmma") == ["tile", "tile.block"]
    assert ignored_keys("family=peak tile=auto", "peak") == ["tile"]
