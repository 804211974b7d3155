"""Operand data as an axis (root key ``data``, experiments.gpu.verify.Data): what each kind draws, exactly
today's operands for ``full``, the tolerance each is verified with, the param and the run key of a run,
and the values refused before any work. The GPU check of each kind is ``test_data_kinds_verify_on_the_gpu``."""
import hashlib

import numpy as np
import pytest
from test_family_runner import EXPERIMENT, _children, _compose, _stub_gpu

from experiments.dtypes import DType
from experiments.gpu.verify import (Data, check, data_kind, data_tolerance, fp8_finite_codes, fp8_values,
                                make_operands)

PRECISIONS = [d.name for d in DType]

# sha256 (first 16 hex digits) of A, B, A_ref, B_ref of make_operands(precision, 24, 40, 64, seed=7) as
# they were drawn before data existed: data=full must draw them unchanged
FULL = {("fp16", "col"): "4706f41e7fe16e2e", ("fp16", "row"): "faf42ac72b40b476",
        ("bf16", "col"): "1d729d1c90b6f89c", ("bf16", "row"): "97cf173060af7622",
        ("int8", "col"): "9e7c4a41731d9f47", ("int8", "row"): "fe2d17f62a8d28bd",
        ("int4", "col"): "82bcc81f8323f2e1", ("int4", "row"): "fb918cbfb1ecc010",
        ("fp8_e4m3", "col"): "f6b4d725daea7ea3", ("fp8_e4m3", "row"): "5111c0c13dcb975c",
        ("fp8_e5m2", "col"): "6cd2d487cc851616", ("fp8_e5m2", "row"): "02a1b06de50178ce"}


def _digest(ops) -> str:
    h = hashlib.sha256()
    for arr in (ops.a, ops.b, ops.a_ref, ops.b_ref):
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("precision, layout", sorted(FULL))
def test_full_draws_todays_operands(precision, layout):
    assert _digest(make_operands(precision, 24, 40, 64, 7, xp=np, b_layout=layout)) == FULL[(precision, layout)]
    assert _digest(make_operands(precision, 24, 40, 64, 7, xp=np, b_layout=layout, data="full")) == \
        FULL[(precision, layout)]


def _values(precision, data, seed=3):
    ops = make_operands(precision, 64, 48, 128, seed, xp=np, data=data)
    return np.concatenate([ops.a_ref.ravel(), ops.b_ref.ravel()]), ops


@pytest.mark.parametrize("precision", PRECISIONS)
def test_each_kind_draws_what_it_says(precision):
    d = DType[precision]
    uniform, _ = _values(precision, "uniform")
    normal, _ = _values(precision, "normal")
    if d.is_float:
        assert -1 <= uniform.min() < -0.9 and 0.9 < uniform.max() <= 1      # rounded to the type: 1 may occur
        assert 0.9 < normal.std() < 1.1 and abs(normal.mean()) < 0.05 and np.abs(normal).max() > 3
    else:
        lo, hi = {8: (-8, 7), 4: (-2, 1)}[d.bits]
        assert (uniform.min(), uniform.max()) == (lo, hi) and np.all(uniform == np.round(uniform))
        sd = {8: 32, 4: 2}[d.bits]
        assert 0.85 * sd < normal.std() < 1.15 * sd and normal.min() >= -(1 << (d.bits - 1))
    for kind, value in (("zeros", 0.0), ("constant", 1.0)):
        vals, ops = _values(precision, kind)
        assert np.all(vals == value), kind
        assert np.all(ops.a_ref @ ops.b_ref.T == value * 128)
    sparse, _ = _values(precision, "sparse")
    full, _ = _values(precision, "full")
    assert 0.45 < np.mean(sparse == 0) < 0.55 and np.mean(full == 0) < 0.1
    assert np.all((sparse == 0) | (sparse == full))            # the full values, half of them zeroed


def test_fp8_values_are_codes_of_the_format():
    """uniform and normal fp8 operands are the nearest codes of the drawn values, decoded exactly."""
    for precision in ("fp8_e4m3", "fp8_e5m2"):
        ops = make_operands(precision, 32, 32, 64, 1, xp=np, data="normal")
        assert ops.a.dtype == np.uint8 and np.array_equal(fp8_values(ops.a, precision), ops.a_ref)
        rs = np.random.RandomState(1)
        drawn = rs.standard_normal((32, 64)).astype(np.float32)
        every = fp8_values(fp8_finite_codes(precision), precision).astype(np.float64)
        nearest = np.abs(every[None, None, :] - drawn[..., None]).min(axis=-1)
        assert np.array_equal(np.abs(ops.a_ref - drawn), nearest)


@pytest.mark.parametrize("data", list(Data.__members__))
def test_the_same_seed_draws_the_same_operands(data):
    one, two, other = (make_operands("fp16", 16, 24, 32, s, xp=np, data=data) for s in (5, 5, 6))
    assert _digest(one) == _digest(two)
    assert (_digest(one) != _digest(other)) == (data not in ("zeros", "constant"))


def test_zeros_are_verified_exactly():
    ops = make_operands("fp16", 8, 8, 32, 1, xp=np, data="zeros")
    assert data_tolerance("zeros", 1e-3) == 0.0 and data_tolerance("normal", 1e-3) == 1e-3
    assert check(np.zeros((8, 8), np.float32), ops, True, 0.0).ok
    c = np.zeros((8, 8), np.float32)
    c[2, 3] = 1e-30                                  # within any relative bound of a zero (|A| |B|)
    res = check(c, ops, True, data_tolerance("zeros", 1e-3))
    assert not res.ok and res.mismatches == 1 and res.where == (2, 3) and res.tolerance == 0
    assert "1 elements of C differ from the reference (exactly); worst at C[2, 3]" in res.message()
    c[2, 3] = np.nan                                 # the poison of an unwritten element
    assert not check(c, ops, True, 0.0).ok


def test_an_unknown_kind_names_the_valid_ones():
    for call in (lambda: data_kind("ones"), lambda: make_operands("fp16", 8, 8, 16, 1, xp=np, data="ones"),
                 lambda: data_tolerance("ones", 1e-3)):
        with pytest.raises(ValueError, match="data='ones' is not valid; valid values: full, uniform, normal, "
                                             "zeros, sparse, constant"):
            call()


# ------------------------------------------------------------------ the run: param, key, name
def test_data_is_a_param_of_every_run_and_in_the_key_only_when_not_full(tmp_path, monkeypatch):
    """On a (stated) GPU with the worker replaced: data=full runs as before (no data for the worker, the
    run key of before, the name of before) with param data=full; data=zeros is a run of its own (key and
    name) whose worker draws zeros; running data=full again finds its run measured."""
    from omegaconf import OmegaConf

    from experiments.runner import kernel
    from experiments.store import track
    from experiments.gpu.timing import key_items
    job, store, worker = _stub_gpu(tmp_path, monkeypatch, 100.0)
    sizes = "problem.sizes=[512]"
    assert job.run_job(_compose("family=dp4a", "precision=int8", sizes, *store))["finished"] == 1
    assert job.run_job(_compose("family=dp4a", "precision=int8", sizes, "data=zeros", *store))["finished"] == 1
    assert "data" not in worker.calls[0][1] and worker.calls[1][1]["data"] == "zeros"
    runs = _children(tmp_path)
    full, zeros = runs["512 dp4a int8 128x128"], runs["512 dp4a int8 128x128 data=zeros"]
    assert (full.data.params["data"], zeros.data.params["data"]) == ("full", "zeros")
    # the key data=full gets is the one of every run before the data axis existed
    cfg = _compose("family=dp4a", "precision=int8", sizes, *store)
    kern = kernel.make_kernel(cfg, tmp_path, 90, True, {}, print)
    timing = {k: v for k, v in OmegaConf.to_container(cfg.timing, enum_to_str=True).items() if k != "timeout_s"}
    before = track.run_key("gpu", *kern.identity, 512, 512, 512, "NVIDIA H200", 90, "580.1", key_items(timing),
                           cfg.verify.rtol)
    assert full.data.tags["run_key"] == before
    assert zeros.data.tags["run_key"] == track.run_key("gpu", *kern.identity, 512, 512, 512, "NVIDIA H200", 90,
                                                       "580.1", key_items(timing), cfg.verify.rtol, ("data", "zeros"))
    assert job.run_job(_compose("family=dp4a", "precision=int8", sizes, *store)) == {
        "finished": 0, "failed": 0, "done_before": 1}
    assert len(worker.calls) == 2
    # the tables keep the two apart: the results table, the sweep's best kernel per precision and data
    from experiments.store.record import sweep_note
    from experiments.reports.report import results_table
    kern = full.data.tags["kernel"]
    rows = [line.split(" | ")[1] for line in results_table(store[0].split("=", 1)[1], EXPERIMENT).splitlines()
            if line.startswith("| NVIDIA H200")]
    assert sorted(rows) == [kern, f"{kern} data=zeros"]
    note = sweep_note("cmd", [full, zeros]).splitlines()
    assert [line.split("  ")[0].strip() for line in note if line.startswith("int8")] == ["int8", "int8 data=zeros"]


def test_a_family_with_fixed_operands_takes_full_only(tmp_path, monkeypatch, run_checks):
    """The peak family's kernels hold fixed words: data=zeros is an error without -m, a skipped run in a
    sweep of several families, and exit 2 before any work when no family of the command takes it."""
    from experiments.spec import SpecError
    job, store, _ = _stub_gpu(tmp_path, monkeypatch, 100.0)
    with pytest.raises(SpecError, match="data=zeros is not valid for family=peak: its kernels hold fixed operand "
                                        "words .*; valid: full"):
        job.run_job(_compose("family=peak", "precision=int8", "data=zeros", *store))
    rc, out = run_checks(tmp_path, "family=peak", "data=zeros", f"tracking.uri=sqlite:///{tmp_path}/x.db")
    assert rc == 2 and "data=zeros is not valid for family=peak: its kernels hold fixed operand words" in out
    assert not (tmp_path / "x.db").exists()


def test_a_sweep_over_families_skips_the_one_with_fixed_operands(tmp_path, need_ptxas):
    """family=wmma,peak data=zeros without a GPU: wmma's static run with param data=zeros, peak's a skipped
    run with the reason; the sweep is not a failure."""
    from test_cli import all_runs, run_cli, store_args
    rc, out = run_cli(tmp_path, "-m", "family=wmma,peak", "precision=int8", "data=zeros", *store_args(tmp_path))
    assert rc == 0, out
    _, children = all_runs(tmp_path)
    by_family = {r.data.params["family"]: r for r in children}
    assert by_family["wmma"].data.tags["outcome"] == "static" and by_family["wmma"].data.params["data"] == "zeros"
    peak = by_family["peak"]
    assert peak.data.tags["outcome"] == "skipped" and peak.data.params["data"] == "zeros"
    assert peak.data.tags["skip_reason"].startswith("data=zeros is not valid for family=peak: its kernels hold "
                                                    "fixed operand words")


def test_a_skipped_combination_keeps_its_key_with_data_full():
    from experiments.runner import job
    from experiments.store import track
    from experiments.gpu.timing import key_params
    params = {"precision": "int8", "mma": "m16n8k64", "ktile": 64, "timing.batches": 10, "timing.repeats": 1}
    before = track.run_key("skipped", sorted(key_params(params).items()))
    assert job.skipped_key({**params, "data": "full"}) == before
    assert job.skipped_key({**params, "data": "zeros"}) != before


@pytest.mark.parametrize("args", [("data=ones",), ("-m", "data=zeros,ones")])
def test_an_invalid_value_stops_before_any_work(tmp_path, run_checks, args):
    rc, out = run_checks(tmp_path, *args, f"tracking.uri=sqlite:///{tmp_path}/x.db")
    assert rc == 2 and "Traceback" not in out
    assert "data=ones is not valid ('data=ones'); valid: full, uniform, normal, zeros, sparse, constant" in out, out
    assert not (tmp_path / "x.db").exists()


# ------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("data", list(Data.__members__))
@pytest.mark.parametrize("family, precision, opts", [
    ("mma_sync", "fp16", {"mma_k": 16}), ("mma_sync", "int8", {"mma_k": 32}), ("wgmma", "fp8_e4m3", {}),
    ("cublas", "bf16", {})])
def test_data_kinds_verify_on_the_gpu(family, precision, opts, data):
    """Each kind verified by two GEMM families on the GPU (wgmma on sm_90 only): zeros exactly, the others
    within the precision's bound (integers exactly)."""
    from experiments import families
    from experiments.families.gpu import device_sm
    fam = families.get(family)
    arch = f"sm_{device_sm()}"
    if family == "wgmma" and arch != "sm_90":
        pytest.skip("wgmma runs on sm_90 only")
    if family == "mma_sync":
        opts = dict(ktile=32, bm=64, bn=64, warps_m=2, warps_n=2, stages=2, cache_op="cg", **opts)
    spec = fam.spec(precision, opts, arch)
    n = 1024
    prep = fam.prepare(spec, fam.build(spec), n, n, n, 11, data=data)
    import cupy
    prep.launch()
    cupy.cuda.Device().synchronize()
    res = prep.verify()
    assert res.ok, f"{spec.entry} data={data}: {res.message()}"
    assert (res.tolerance == 0) == (data == "zeros" or precision == "int8")
