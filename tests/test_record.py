"""experiments/store/record.py: how runs present themselves (names, decoded tags, descriptions, the UI view)."""
from types import SimpleNamespace as NS

import pytest

from experiments import families
from experiments.store.record import clock_reasons, params_of, run_name, sweep_note

DEFAULT = families.get(families.DEFAULT)


@pytest.mark.parametrize("mask, text", [(0, "none"), (4, "sw_power_cap"), (1 | 4, "gpu_idle+sw_power_cap"),
                                        (0x40 | 0x20, "sw_thermal+hw_thermal"), (0x1000, "0x1000"),
                                        (None, "unknown")])
def test_clock_reasons(mask, text):
    assert clock_reasons(mask) == text


def test_run_name_leads_with_the_size_then_what_differs_from_the_default_kernel():
    spec = NS(precision="int8", ktile=64, mma_shape="m16n8k32", stages=3, bm=256, bn=128)
    assert run_name(DEFAULT, spec, (8192, 8192, 8192)) == "8192 int8 bk64 m16n8k32 s3 256x128"
    assert run_name(DEFAULT, spec, (512, 1024, 256)) == "512x1024x256 int8 bk64 m16n8k32 s3 256x128"
    assert run_name(DEFAULT, spec) == "int8 bk64 m16n8k32 s3 256x128"
    stages = NS(precision="fp16", ktile=32, mma_shape="m16n8k16", stages=2, bm=256, bn=128)
    assert run_name(DEFAULT, stages, (1024,) * 3) == "1024 fp16 s2 bk32 m16n8k16 256x128"
    study = NS(precision="int4", ktile=64, mma_shape="m16n8k64", stages=2, bm=32, bn=64, loader_a="x4",
               loader_b="manual", cache_op="ca", b_layout="row", acc="auto", l2_hint_a="none",
               l2_hint_b="evict_last")
    assert run_name(DEFAULT, study, (2048,) * 3) == "2048 int4 bk64 s2 32x64 ldx4man ca l2xl brow m16n8k64"


def test_params_leave_out_the_store_and_repeated_spec_fields():
    flat = {"precision": "int8", "ktile": "64", "mma": "auto", "tracking.uri": "sqlite:////x.db",
            "tracking.experiment": "e", "tracking.rerun": "False"}
    spec = {"precision": "int8", "ktile": 64, "mma": "m16n8k32", "arch": "sm_90", "ptx_version": "7.8"}
    assert params_of(flat, DEFAULT, spec) == {"precision": "int8", "ktile": "64", "mma": "auto",
                                              "spec.mma": "m16n8k32", "spec.arch": "sm_90",
                                              "spec.ptx_version": "7.8", "family": "mma_sync"}
    assert params_of(flat) == {"precision": "int8", "ktile": "64", "mma": "auto"}


def test_other_families_leave_out_the_default_familys_root_keys_as_they_always_did():
    """Derived from the default family's root keys (smem_layout, added after runs were tracked, stays a
    param of theirs), the list is the one the other families' runs have always had."""
    before = {"ktile", "mma", "acc", "b_layout", "study_kernel", "family.name", "tracking.", "tile.", "loader.",
              "pipeline.", "cache."}
    for name in ("wmma", "dp4a", "cublas", "peak", "wgmma"):
        assert set(families.get(name).dropped_params()) == before
    flat = {"precision": "int8", "ktile": "64", "smem_layout": "padded", "cache.op": "cg", "tile.group_m": "8",
            "family.name": "wmma", "family.block": "64x64", "timing.batches": "10"}
    assert families.get("wmma").run_params(flat, {"family": "wmma", "precision": "int8", "block": "64x64"}) == {
        "precision": "int8", "smem_layout": "padded", "family.block": "64x64", "timing.batches": "10",
        "family": "wmma", "spec.block": "64x64"}


def _run(name, outcome, params=None, metrics=None, tags=None):
    return NS(info=NS(run_name=name, status="FAILED" if outcome == "failed" else "FINISHED"),
              data=NS(params=params or {}, metrics=metrics or {}, tags={"outcome": outcome, **(tags or {})}))


def test_sweep_note_has_the_best_kernel_per_size_and_the_skipped_reasons():
    size = {"problem.m": "8192", "problem.n": "8192", "problem.k": "8192", "precision": "int8"}
    runs = [_run("8192 int8 bk32", "verified", size, {"throughput": 650.0, "median_us": 1690.0},
                 {"kernel": "gemm_int8_bk32", "throughput_unit": "TOP/s"}),
            _run("8192 int8 bk64", "verified", size, {"throughput": 696.3, "median_us": 1579.1},
                 {"kernel": "gemm_int8_bk64", "throughput_unit": "TOP/s"}),
            _run("skipped precision=int8 mma=m16n8k64", "skipped", tags={"skip_reason": "mma=m16n8k64 is not valid"}),
            _run("512 int8 bk64", "failed", tags={"error": "verification failed: 3 elements\nmore"})]
    note = sweep_note("python run.py -m precision=int8 ktile=32,64", runs)
    lines = note.splitlines()
    assert lines[0] == "`python run.py -m precision=int8 ktile=32,64`"
    assert lines[2] == "1 failed, 1 skipped, 2 verified."
    assert "| int8 | 8192x8192x8192 | gemm_int8_bk64 | 1579.1 | 696.3 TOP/s |" in lines
    assert "- precision=int8 mma=m16n8k64: mma=m16n8k64 is not valid" in lines
    assert "- 512 int8 bk64: verification failed: 3 elements" in lines
    assert lines[-1] == ("Units: `throughput` TFLOP/s, TOP/s or GB/s (tag throughput_unit); `median_us` us.")


def test_git_commit_is_the_projects_own(tmp_path, monkeypatch):
    """A project folder inside another repository records no commit (not the other one's)."""
    import subprocess

    from experiments.runner import job
    from experiments.store import track
    outer = tmp_path / "outer"
    (outer / "project").mkdir(parents=True)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", str(outer)], check=True)
    (outer / "f").write_text("x")
    subprocess.run([*git, "-C", str(outer), "add", "f"], check=True)
    subprocess.run([*git, "-C", str(outer), "commit", "-q", "-m", "outer"], check=True)
    monkeypatch.setattr(track, "PROJECT_ROOT", outer / "project")
    job.git_commit.cache_clear()
    assert job.git_commit() is None
    monkeypatch.setattr(track, "PROJECT_ROOT", outer)
    job.git_commit.cache_clear()
    head = subprocess.run(["git", "-C", str(outer), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert job.git_commit() == head.strip()
    job.git_commit.cache_clear()
