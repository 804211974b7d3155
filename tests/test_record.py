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
    # the warp grid and the block-row grouping too, where they differ from the default kernel's (4x2, 8)
    assert run_name(DEFAULT, NS(**vars(study), warps_m=2, warps_n=4, group_m=1), (2048,) * 3) == (
        "2048 int4 bk64 s2 32x64 ldx4man ca l2xl brow w2x4 g1 m16n8k64")


def test_params_leave_out_the_store_and_repeated_spec_fields():
    flat = {"precision": "int8", "ktile": "64", "mma": "auto", "tracking.uri": "sqlite:////x.db",
            "tracking.experiment": "e", "tracking.rerun": "False"}
    spec = {"precision": "int8", "ktile": 64, "mma": "m16n8k32", "arch": "sm_90", "ptx_version": "7.8"}
    swept = {"variant": "none", "study_kernel": "none", "size": "none"}
    assert params_of(flat, DEFAULT, spec) == {"precision": "int8", "ktile": "64", "mma": "auto",
                                              "spec.mma": "m16n8k32", "spec.arch": "sm_90",
                                              "spec.ptx_version": "7.8", "family": "mma_sync", **swept}
    assert params_of(flat) == {"precision": "int8", "ktile": "64", "mma": "auto", **swept}


def test_every_family_logs_the_swept_axes_and_a_skipped_key_is_the_one_before_them():
    """variant, study_kernel, size and precision on the runs of every family (wmma and dp4a runs had no
    study_kernel param, so a comparison put them on "unknown"); the skipped combination's run key is the
    one it had before those params existed."""
    from experiments.runner.job import skipped_key
    from experiments.store.track import run_key
    flat = {"precision": "int8", "study_kernel": "int8_wmma", "family.block": "64x64", "ktile": "32"}
    for name in ("wmma", "dp4a", "mma_sync", "wgmma", "peak", "cublas"):
        params = params_of(flat, families.get(name), {"family": name}, variant="int8_wmma")
        assert {k: params[k] for k in ("variant", "study_kernel", "size", "precision")} == {
            "variant": "int8_wmma", "study_kernel": "int8_wmma", "size": "none", "precision": "int8"}, name
    old = {"precision": "int8", "study_kernel": "null", "ktile": "32", "family": "mma_sync", "data": "full"}
    new = {**params_of(old, variant="int8_ptx_3stage"), "family": "mma_sync"}
    assert new["study_kernel"] == "none" and new["variant"] == "int8_ptx_3stage"
    assert skipped_key(new) == skipped_key(old) == run_key("skipped", sorted(
        {"precision": "int8", "study_kernel": "null", "ktile": "32", "family": "mma_sync"}.items()))


def test_run_name_leads_with_the_variant_and_the_size_param_is_one_value():
    from experiments.store.record import size_label
    spec = NS(precision="int8", ktile=32, mma_shape="m16n8k32", stages=2, bm=32, bn=64, cache_op="ca")
    assert run_name(DEFAULT, spec, (8192,) * 3, "int8_ptx_mma_k32").startswith("int8_ptx_mma_k32 8192 int8 s2")
    assert run_name(DEFAULT, spec, None, "none") == run_name(DEFAULT, spec)
    assert [size_label((8192,) * 3), size_label((512, 1024, 256)), size_label(None)] == \
        ["8192", "512x1024x256", "none"]


def test_other_families_leave_out_the_default_familys_root_keys_as_they_always_did():
    """Derived from the default family's root keys (smem_layout, added after runs were tracked, stays a
    param of theirs), the list is the one the other families' runs have always had, less study_kernel
    (every family logs it now: test_every_family_logs_the_swept_axes...)."""
    before = {"ktile", "mma", "acc", "b_layout", "family.name", "tracking.", "tile.", "loader.",
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
    table = lines[lines.index("```text") + 1:lines.index("```")]
    assert [c.strip() for c in table[2].split("  ") if c] == [
        "int8", "8192", "gemm_int8_bk64", "1579.1", "696.3 TOP/s", "gemm_int8_bk32", "+7.1%",
        "not tested (timing.repeats=1)"]
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


def test_sweep_note_says_what_was_swept_and_each_winners_margin_against_the_noise():
    """The parent's first screen: the swept axes with their values, per precision and size the winner (its
    variant, EMULATED where its MMA is emulated) with its margin over the runner-up and whether the margin
    is beyond the replicate noise (compare.verdict), in a fixed-width table whose columns are padded."""
    size = {"problem.m": "8192", "problem.n": "8192", "problem.k": "8192", "precision": "int8", "size": "8192"}
    k32, pack = "gemm_int8_bk32_m16n8k32_ldx4x2_ca_bcol_s2_32x64_w2x4_g1", "gemm_int8_ldmanman_w2x4_g1"
    runs = [_run("a", "verified", {**size, "variant": "int8_ptx_mma_k32"}, {"throughput": 142.7, "median_us": 7705.3},
                 {"kernel": k32, "throughput_unit": "TOP/s"}),
            _run("b", "verified", {**size, "variant": "int8_ptx_manual_pack"},
                 {"throughput": 74.5, "median_us": 14760.0}, {"kernel": pack, "throughput_unit": "TOP/s"}),
            _run("c", "verified", {**size, "size": "512", "problem.m": "512", "problem.n": "512", "problem.k": "512",
                                   "variant": "int8_ptx_mma_k32"}, {"throughput": 10.0, "median_us": 26.8},
                 {"kernel": k32, "throughput_unit": "TOP/s"}),
            _run("d", "verified", {**size, "size": "512", "problem.m": "512", "problem.n": "512", "problem.k": "512",
                                   "variant": "int8_ptx_manual_pack"}, {"throughput": 9.9, "median_us": 27.1},
                 {"kernel": pack, "throughput_unit": "TOP/s"}),
            _run("e", "verified", {**size, "precision": "int4", "variant": "int4_ptx_mma_k64"},
                 {"throughput": 39.1, "median_us": 28120.0},
                 {"kernel": "gemm_int4", "throughput_unit": "TOP/s", "mma_native": "false"})]
    reps = {"a": [7700.0, 7705.0, 7710.0], "b": [14700.0, 14760.0, 14800.0], "c": [26.0, 26.8, 27.6],
            "d": [26.2, 27.1, 28.0]}
    note = sweep_note("python run.py -m experiment=l4_run2_int8", runs, None, lambda r: reps.get(r.info.run_name, []))
    lines = note.splitlines()
    assert ("Swept: variant (3): int4_ptx_mma_k64, int8_ptx_manual_pack, int8_ptx_mma_k32; size (2): 512, 8192; "
            "precision (2): int4, int8.") in lines
    table = lines[lines.index("```text") + 1:lines.index("```")]
    cells = [[c for c in row.split("  ") if c] for row in table]
    assert [c.strip() for c in cells[0]] == ["precision", "size", "winner", "median us", "throughput", "runner-up",
                                             "margin", "vs noise"]
    assert [c.strip() for c in cells[2]] == ["int4", "8192", "int4_ptx_mma_k64 EMULATED", "28120.0", "39.1 TOP/s",
                                             "-", "-", "only one kernel"]
    assert [c.strip() for c in cells[3]] == ["int8", "512", "int8_ptx_mma_k32", "26.8", "10.0 TOP/s",
                                             "int8_ptx_manual_pack", "+1.0%", "within noise (R=3, +-9.5%)"]
    assert [c.strip() for c in cells[4]] == ["int8", "8192", "int8_ptx_mma_k32", "7705.3", "142.7 TOP/s",
                                             "int8_ptx_manual_pack", "+91.5%", "beyond noise (R=3, +-1.0%)"]
    # padded: every row of the table is as wide as its columns, the columns line up
    starts = {table[0].index("runner-up")} | {row.index("int8_ptx_manual_pack") for row in table[3:]}
    assert len(starts) == 1


def test_sweep_note_of_runs_in_a_store_tests_the_margin_against_their_replicates(tmp_path, monkeypatch):
    """Through the runner (GPU worker replaced) with three replicates each: the note reads the replicate
    medians from the store (metric history, compare.replicates) and says the winner's margin is beyond
    the noise; the runs carry size as one value."""
    from test_family_runner import EXPERIMENT, _compose, _stub_gpu

    from experiments.reports.compare import replicates
    from experiments.store.track import Tracker
    job, store, worker = _stub_gpu(tmp_path, monkeypatch, 100.0)
    worker.kernel_clock = {"replicate_median_us": [99.5, 100.0, 100.5]}
    assert job.run_job(_compose("precision=int8", "ktile=32", "problem.sizes=[512]", *store))["finished"] == 1
    worker.us, worker.kernel_clock = 150.0, {"replicate_median_us": [149.0, 150.0, 151.0]}
    assert job.run_job(_compose("precision=int8", "ktile=64", "problem.sizes=[512]", *store))["finished"] == 1
    tr = Tracker(f"sqlite:///{tmp_path}/mlflow.db", EXPERIMENT, create=False)
    runs = [r for r in tr.client.search_runs([tr.experiment_id]) if "mlflow.parentRunId" in r.data.tags]
    assert sorted(r.data.params["size"] for r in runs) == ["512", "512"]
    note = sweep_note("cmd", runs, None, lambda r: replicates(tr, r)).splitlines()
    assert "Swept: ktile (2): 32, 64." in note
    row = next(line for line in note if line.startswith("int8"))
    cells = [c.strip() for c in row.split("  ") if c]
    fast = next(r for r in runs if r.data.params["ktile"] == "32")
    slow = next(r for r in runs if r.data.params["ktile"] == "64")
    assert cells == ["int8", "512", fast.data.tags["kernel"], "100.0", "2.7 TOP/s", slow.data.tags["kernel"],
                     "+50.0%", "beyond noise (R=3, +-1.8%)"]


def test_two_different_kernels_never_share_a_name():
    """One entry name per run name and target, so that no two kernels of a sweep share a name whatever it
    varies: the default family's kernels with each field changed alone and in pairs (the warp grid and the
    block-row grouping were once missing from its names), and every point of the other families' spaces
    (wgmma: a sample)."""
    import dataclasses
    import itertools

    from experiments.families.mma_sync.spec import KernelSpec
    from experiments.hardware import ARCHS
    base = KernelSpec(precision="int8", ktile=64, mma_k=32, bm=256, bn=128, warps_m=4, warps_n=2, stages=3,
                      cache_op="cg", arch="sm_90")
    other = {"precision": "int4", "ktile": 32, "mma_k": 64, "bm": 128, "bn": 64, "warps_m": 2, "warps_n": 4,
             "stages": 2, "cache_op": "ca", "group_m": 1, "loader_a": "manual", "loader_b": "x4",
             "b_layout": "row", "acc": "f16", "l2_hint_a": "evict_last", "l2_hint_b": "evict_first",
             "smem_layout": "swizzled", "l2_prefetch": "128B"}
    from experiments.spec import SpecError

    def replaced(changes):
        try:
            return [dataclasses.replace(base, **dict(changes))]
        except SpecError:            # a pair that makes no kernel
            return []
    specs = {"mma_sync": [sp for n in (1, 2) for pair in itertools.combinations(other.items(), n)
                          for sp in replaced(pair)]}
    for name in families.names():
        if name != "mma_sync":
            fam = families.get(name)
            specs[name] = [sp for arch in ARCHS for sp in itertools.islice(fam.space(arch), 0, 3000, 3)]
    for name, points in specs.items():
        by_name: dict = {}
        for sp in points:
            # per target: a peak kernel is sized for its arch (fewer iterations where int4 is emulated)
            by_name.setdefault((sp.arch, run_name(families.get(name), sp, (4096,) * 3)), set()).add(sp.entry)
        assert by_name and all(len(entries) == 1 for entries in by_name.values()), name


def test_swept_values_in_natural_order_and_a_skipped_combination_counts():
    """"ktile (3): 64, 128, 32" listed values as the runs came; a sweep whose one other combination was
    skipped (mma=m16n8k64,m16n8k32 for int8) said nothing was swept."""
    from experiments.store.record import swept_axes
    runs = [_run(str(k), "static", {"ktile": str(k), "size": "none", "precision": "int8"}) for k in (64, 128, 32)]
    assert swept_axes(runs) == {"ktile": ["32", "64", "128"]}
    one = [_run("a", "verified", {"mma": "m16n8k32", "size": "512"}),
           _run("b", "skipped", {"mma": "m16n8k64", "size": "none"})]
    assert swept_axes(one) == {"mma": ["m16n8k32", "m16n8k64"]}           # the skipped one's size is not a value
