"""The store stays true under misuse: failing and crashing jobs, deleted experiments, file stores,
moved stores, changed toolchains, sizes that do not fit (Ctrl-C, concurrent sweeps and parallel
launchers: test_concurrency_store.py).

Each test runs ``run.py`` as a user would (without a GPU: the static path) and asserts on the store:
every run ends FINISHED, FAILED or KILLED with a reason; no measurement is tracked twice; a re-run
continues under the same parent; no parent is empty.
"""
import os
import re
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from test_cli import EXPERIMENT, ROOT, all_runs, popen_cli, run_cli, store_args

pytestmark = pytest.mark.usefixtures("need_ptxas")


def cli_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "HYDRA_FULL_ERROR")}
    env.update(CUDA_VISIBLE_DEVICES="", **extra)
    return env


def popen(cwd, *args, env=None):
    """``python run.py ARGS`` started in ``cwd`` (test_cli.popen_cli), stdout and stderr in one text stream."""
    return popen_cli(cwd, *args, env=env or cli_env())


def assert_store_is_true(tmp):
    """No run is RUNNING, every FAILED run has an error and every KILLED (interrupted) or skipped one
    a reason, every child an outcome, no run key is FINISHED twice, every parent has children.
    Returns (parents, children)."""
    parents, children = all_runs(tmp)
    for r in parents + children:
        assert r.info.status in ("FINISHED", "FAILED", "KILLED"), (r.info.run_name, r.info.status)
    for r in children:
        if r.info.status == "FAILED":
            assert r.data.tags.get("error"), r.info.run_name
        if r.info.status == "KILLED" or r.data.tags.get("outcome") == "skipped":
            assert r.data.tags.get("skip_reason"), r.info.run_name
        assert r.data.tags.get("outcome") in ("verified", "static", "skipped", "failed", "interrupted")
    keys = Counter(r.data.tags["run_key"] for r in children if r.info.status == "FINISHED")
    assert [k for k, n in keys.items() if n > 1] == []
    for p in parents:
        assert any(c.data.tags["mlflow.parentRunId"] == p.info.run_id for c in children), p.info.run_name
    return parents, children


def test_failing_job_fails_its_own_run_and_the_sweep_goes_on(tmp_path):
    rc, out = run_cli(tmp_path, "-m", "backend=gpu,static", "precision=int4", "ktile=64", *store_args(tmp_path))
    assert rc == 1, out
    assert "backend=gpu but no NVIDIA GPU was found" in out and "1 job(s) could not run" in out
    parents, children = assert_store_is_true(tmp_path)
    assert [p.info.status for p in parents] == ["FAILED"]
    by = {c.data.params["backend"]: c for c in children}
    assert by["gpu"].info.status == "FAILED" and by["gpu"].data.tags["failed_stage"] == "job"
    assert by["gpu"].data.tags["error"].startswith("backend=gpu but no NVIDIA GPU was found")
    assert by["static"].info.status == "FINISHED"


def test_crash_inside_a_job_fails_that_run_only(tmp_path):
    """An unexpected exception in one job (here: rendering int4) fails that job's run with the
    exception and its traceback; the other jobs finish; the command exits 1 with a summary."""
    prelude = textwrap.dedent("""
        from experiments import families
        fam = type(families.get(families.DEFAULT))
        real = fam.build
        def build(self, spec):
            if spec.precision == "int4":
                raise ZeroDivisionError("boom in render")
            return real(self, spec)
        fam.build = build
    """)
    rc, out = run_cli(tmp_path, "-m", "precision=int4,int8", "ktile=64", *store_args(tmp_path), prelude=prelude)
    assert rc == 1, out
    assert "[1/2] job failed precision=int4 ktile=64: ZeroDivisionError: boom in render" in out
    parents, children = assert_store_is_true(tmp_path)
    assert [p.info.status for p in parents] == ["FAILED"]
    assert sorted(c.info.status for c in children) == ["FAILED", "FINISHED"]
    crashed = next(c for c in children if c.info.status == "FAILED")
    assert crashed.data.tags["error"] == "ZeroDivisionError: boom in render"
    import mlflow
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    tb = Path(client.download_artifacts(crashed.info.run_id, "traceback.txt", str(tmp_path)))
    assert "in render" in tb.read_text() and "ZeroDivisionError" in tb.read_text()


def test_sweep_over_a_glob_is_counted_and_named(tmp_path):
    presets = sorted(p.stem for p in (ROOT / "conf" / "tile").glob("128*.yaml"))
    rc, out = run_cli(tmp_path, "-m", "tile=glob(128*)", "precision=int8", "ktile=64", *store_args(tmp_path))
    assert rc == 0, out
    n = len(presets)
    assert "Callback" not in out
    for i in range(1, n + 1):
        assert f"[{i}/{n}] " in out, out
    parents, children = assert_store_is_true(tmp_path)
    assert len(parents) == 1 and len(children) == n
    p = parents[0]
    assert p.info.run_name == "sweep tile=glob(128*) precision=int8 ktile=64"
    assert p.data.tags["jobs"] == str(n) and p.info.status == "FINISHED"


def test_sweep_defined_in_a_preset_is_counted(tmp_path):
    """``hydra.sweeper.params`` of an experiment preset (another way of defining a sweep)."""
    extra = tmp_path / "extra" / "experiment"
    extra.mkdir(parents=True)
    # ktile folded over two lines (">-"), as a preset may fold a long list of values: the
    # name showed "32, 64"
    (extra / "tiny.yaml").write_text("# @package _global_\nhydra:\n  sweeper:\n    params:\n"
                                     "      precision: int4,int8\n      ktile: >-\n        32,\n        64\n")
    rc, out = run_cli(tmp_path, "-m", f"--config-dir={tmp_path / 'extra'}", "experiment=tiny",
                      *store_args(tmp_path))
    assert rc == 0, out
    assert "[4/4] " in out and "Tracking 4 job(s)" in out
    parents, children = assert_store_is_true(tmp_path)
    assert len(children) == 4 and parents[0].data.tags["jobs"] == "4"
    assert parents[0].info.run_name == "sweep precision=int4,int8 ktile=32,64 experiment=tiny"
    # the command line narrows the preset's sweep: the name shows what runs (it listed both before)
    other = tmp_path / "narrow"
    other.mkdir()
    rc, out = run_cli(other, "-m", f"--config-dir={tmp_path / 'extra'}", "experiment=tiny", "precision=int8",
                      *store_args(other))
    assert rc == 0 and "Tracking 2 job(s)" in out, out
    parents, _ = assert_store_is_true(other)
    assert [p.info.run_name for p in parents] == ["sweep ktile=32,64 experiment=tiny precision=int8"]


def test_deleted_experiment_is_explained(tmp_path):
    rc, out = run_cli(tmp_path, "precision=int8", "ktile=64", *store_args(tmp_path, False))
    assert rc == 0, out
    import mlflow
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name(EXPERIMENT)
    client.delete_experiment(exp.experiment_id)
    rc, out = run_cli(tmp_path, "precision=int8", "ktile=64", *store_args(tmp_path, False))
    assert rc == 1 and "Traceback" not in out, out
    assert f"Store error: experiment '{EXPERIMENT}' (id {exp.experiment_id})" in out
    assert f"mlflow experiments restore --experiment-id {exp.experiment_id}" in out


@pytest.mark.parametrize("uri, said", [
    ("file:./mlruns", "MLflow 3 keeps runs in a database store"),
    ("bogus://x", "the tracking URI bogus://x has a scheme MLflow cannot track to: give sqlite:///PATH"),
])
def test_a_tracking_uri_that_names_no_store_gets_one_line_and_exit_2(tmp_path, uri, said):
    """A URI whose form names no store this tool can use is a bad value: one line and exit 2, as for any
    other (it was 1, as for a store that fails while it runs), and nothing made."""
    rc, out = run_cli(tmp_path, "-m", "precision=int8", f"tracking.uri={uri}")
    assert rc == 2 and "Traceback" not in out and len(out.strip().splitlines()) == 1, out
    assert out.startswith(f"Store error: {'the tracking URI ' + uri if 'file' in uri else said}"), out
    assert said in out and list(tmp_path.iterdir()) == []
    if uri.startswith("file:"):
        assert f"sqlite:///{tmp_path}/mlruns.db" in out


def test_a_tracking_uri_from_the_environment_is_named_as_such(tmp_path):
    """MLFLOW_TRACKING_URI=bogus://y was refused as if tracking.uri had been given."""
    rc, out = run_cli(tmp_path, "-m", "precision=int8",
                      prelude="import os; os.environ['MLFLOW_TRACKING_URI'] = 'bogus://y'")
    assert (rc, out.strip()) == (2, "Store error (from $MLFLOW_TRACKING_URI): the tracking URI bogus://y has a "
                                    "scheme MLflow cannot track to: give sqlite:///PATH (a file), http://HOST:PORT "
                                    "(a tracking server) or a database server's URI (postgresql://, mysql://)"), out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("module", ["experiments.report", "experiments.performance", "experiments.profile",
                                    "analysis.report"])
def test_readers_refuse_a_missing_store_alike(tmp_path, module_cli, module):
    """Every reader exits 2 on a store that is not there (the report exited 1, the others 2), names the path,
    and creates nothing."""
    rc, _, err = module_cli(module, "--uri", f"sqlite:///{tmp_path}/typo.db", cwd=ROOT)
    assert rc == 2 and "no store at" in err and f"{tmp_path}/typo.db" in err and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []


def test_another_ptxas_is_another_run(tmp_path):
    """The ptxas version is a tag and part of the run key: results of another toolchain are kept apart."""
    from experiments.build.assemble import find_ptxas
    from experiments.build.toolchain import tool_version
    fake = tmp_path / "ptxas"
    fake.write_text(f'#!/bin/sh\nif [ "$1" = "--version" ]; then\n'
                    f'  echo "Cuda compilation tools, release 11.7, V11.7.99"; exit 0\nfi\n'
                    f'exec {find_ptxas()} "$@"\n')
    fake.chmod(0o755)
    args = ["precision=int8", "ktile=64", *store_args(tmp_path, False)]
    rc, out = run_cli(tmp_path, *args, env=cli_env(PTXAS=str(fake)))
    assert rc == 0, out
    rc, out = run_cli(tmp_path, *args)
    assert rc == 0 and "already tracked" not in out, out
    _, children = assert_store_is_true(tmp_path)
    assert sorted(c.data.tags["ptxas_version"] for c in children) == sorted(
        ["11.7.99", tool_version(find_ptxas())])


@pytest.mark.parametrize("multirun", [False, True])
def test_problem_sizes_are_checked_before_any_work(tmp_path, multirun):
    args = ["problem.sizes=[1000,2048]", *store_args(tmp_path, multirun)]
    rc, out = run_cli(tmp_path, *(["-m"] if multirun else []), *args)
    reason = ("1 of 2 problem sizes do not fit gemm_fp16_bk32_m16n8k16_ldx4x2_cg_bcol_s3_256x128_w4x2_g8: "
              "1000x1000x1000 (M=1000 is not a multiple of BM=256; N=1000 is not a multiple of BN=128; "
              "K=1000 is not a multiple of BK=32). Square sizes must be multiples of 256 (M, N, K: multiples of 256, 128, "
              "32), e.g. 'problem.sizes=[1024,2048]'")
    assert reason in out, out
    parents, children = all_runs(tmp_path)
    if multirun:
        assert rc == 2 and [c.data.tags["outcome"] for c in children] == ["skipped"]     # every job skipped
        assert reason in children[0].data.tags["skip_reason"]
    else:
        assert rc == 2 and parents == [] and children == []     # refused at the start, as any invalid value


def _start_gpu_worker() -> str:
    from experiments.gpu.worker import GpuWorker, WorkerError
    worker = GpuWorker()
    try:
        return "ok: " + str(worker.call("device_info", timeout=120)["gpu"])
    except WorkerError as exc:
        return str(exc).splitlines()[0]
    finally:
        worker.stop()


def test_gpu_worker_starts_inside_a_joblib_worker():
    """joblib's loky workers set their own start method; the GPU worker they spawn must still start
    (it then answers, or reports the missing CuPy from inside, but never dies on start-up)."""
    joblib = pytest.importorskip("joblib")
    for res in joblib.Parallel(n_jobs=2, backend="loky")(joblib.delayed(_start_gpu_worker)() for _ in range(2)):
        assert res.startswith("ok: ") or "No module named 'cupy'" in res, res


def test_gpu_worker_answers_a_submitted_call_when_asked():
    """submit() returns at once (a job process imports MLflow meanwhile); wait() gets that call's
    answer, or its error: warm_up reports the missing CuPy from inside without a GPU."""
    from experiments.gpu.worker import GpuWorker, WorkerError
    w = GpuWorker()
    try:
        w.submit("ready")
        assert w.wait("ready", 120) is True
        w.submit("warm_up")
        try:
            assert w.wait("warm_up", 120)["sm_count"] > 0
        except WorkerError as exc:
            assert "No module named 'cupy'" in str(exc) or "CUDA" in str(exc), exc
    finally:
        w.stop()


def test_warp_grid_that_does_not_divide_the_block_tile(tmp_path):
    rc, out = run_cli(tmp_path, "tile.warps=[3,2]", *store_args(tmp_path, False))
    assert rc == 2, out
    assert ("tile.block=[256, 128] cannot be split over tile.warps=[3, 2]: BM=256 is not divisible by WM=3; "
            "each warp computes BM/WM x BN/WN of C") in out
    assert "85.3" not in out


def test_study_preset_static_view_with_sass_and_the_emulation_note(tmp_path):
    """The study's int4 k64 ablation without a GPU: six variants, resources, SASS mix, and one note
    that sm_90 emulates mma.sync on .s4."""
    from experiments.build.assemble import find_tool
    if not (find_tool("cuobjdump", "cuda_cuobjdump") or find_tool("nvdisasm", "cuda_nvdisasm")):
        pytest.skip("no cuobjdump/nvdisasm (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    rc, out = run_cli(tmp_path, "-m", "experiment=l4_run4_int4_k64_ablation", *store_args(tmp_path))
    assert rc == 0, out
    assert out.count("Note: 6 kernel(s) of this sweep run an emulated MMA") == 1
    _, children = assert_store_is_true(tmp_path)
    assert len(children) == 6
    assert {c.data.tags["study_kernel"] for c in children} == {
        "int4_ptx_mma_k64_x4_x2nontrans_ca", "int4_ptx_mma_k64_x1_x2nontrans_ca",
        "int4_ptx_mma_k64_x2_x2nontrans_ca", "int4_ptx_mma_k64_x4_x1nontrans_ca",
        "int4_ptx_mma_k64_x4_x2nontrans_cg", "int4_ptx_mma_k64_x4_x2trans_ca"}
    for c in children:
        assert c.data.tags["mma_native"] == "false" and "IMMA.16832.S8.S8" in c.data.tags["mma_native_reason"]
        assert c.data.metrics["sass_IMMA"] > 0 and c.data.metrics["sass_CALL"] > 0
        assert c.data.metrics["registers"] > 0


@pytest.mark.parametrize("args, text, code", [
    (["+foo=bar", "precision=int8"], "Unknown key 'foo' (added with '+'); valid top-level keys: family, precision,", 2),
    (["backend=gpu"], "Cannot run: backend=gpu but no NVIDIA GPU was found (NVML); use backend=auto or backend=static",
     2),
    (["-m", "backend=gpu", "precision=int8"], "Cannot run: backend=gpu but no NVIDIA GPU was found (NVML); use "
     "backend=auto or backend=static", 2),
    (["pipeline.stages=20"], "sm_90 allows 232448: valid pipeline.stages here: 1..7 (or reduce ktile or tile.block)", 2),
])
def test_bad_input_stops_before_any_run(tmp_path, args, text, code):
    rc, out = run_cli(tmp_path, *args, *store_args(tmp_path, False))
    assert rc == code and text in out and "Traceback" not in out, out
    assert all_runs(tmp_path) == ([], [])


def test_unreachable_tracking_server_fails_at_once(tmp_path):
    import socket
    import time
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.time()
    rc, out = run_cli(tmp_path, "precision=int8", f"tracking.uri=http://127.0.0.1:{port}",
                      f"hydra.run.dir={tmp_path}/out")
    assert rc == 1 and f"Store error: no MLflow tracking server answers at http://127.0.0.1:{port}" in out, out
    assert time.time() - t0 < 60


def test_shapes_and_settings_are_checked():
    from omegaconf import OmegaConf

    from experiments.config import Config
    from experiments.runner.kernel import SETTING_KEYS, setting_problem, shapes_of
    from experiments.spec import SpecError
    base = OmegaConf.structured(Config)
    for dotlist, text in ((["problem.shapes=[[256,128]]"], "problem.shapes=[[256,128]] is not valid: entry [256,128] "
                           "is not [M, N, K] of positive integers"),
                          (["problem.sizes=[512,-512]"], "problem.sizes=[512,-512] is not valid: square sizes M=N=K "
                           "must be positive integers, e.g. 'problem.sizes=[512,1024]'"),
                          (["problem.sizes=[0]"], "problem.sizes=[0] is not valid")):
        with pytest.raises(SpecError, match=re.escape(text)):
            shapes_of(OmegaConf.merge(base, OmegaConf.from_dotlist(dotlist)))
    assert shapes_of(OmegaConf.merge(base, OmegaConf.from_dotlist(["problem.shapes=[[512,1024,256]]"]))) == \
        [(512, 1024, 256)]
    for dotlist, text in ((["timing.batches=0"], "timing.batches=0 is not valid; it must be a whole number >= 1"),
                          (["verify.rtol=-1"], "verify.rtol=-1.0 is not valid; it must be a finite number > 0"),
                          (["timing.min_batch_ms=0"], "timing.min_batch_ms=0.0 is not valid; it must be a finite"),
                          # NaN and inf: a NaN tolerance passed any result as verified
                          (["verify.rtol=nan"], "verify.rtol=nan is not valid; it must be a finite number > 0"),
                          (["verify.rtol=inf"], "verify.rtol=inf is not valid"),
                          (["timing.min_batch_ms=nan"], "timing.min_batch_ms=nan is not valid"),
                          (["timing.timeout_s=inf"], "timing.timeout_s=inf is not valid"),
                          (["verify.seed=-1"], "verify.seed=-1 is not valid; it must be null (a fresh seed per "
                                               "run) or an integer from 0 to 2**32 - 1"),
                          (["verify.seed=4294967296"], "verify.seed=4294967296 is not valid")):
        cfg = OmegaConf.merge(base, OmegaConf.from_dotlist(dotlist))
        assert [p for k in SETTING_KEYS if (p := setting_problem(k, OmegaConf.select(cfg, k)))][0].startswith(text)
    assert not [k for k in SETTING_KEYS if setting_problem(k, OmegaConf.select(base, k))]


def test_study_int8_preset_runs_its_baselines(tmp_path):
    """The study's run 2 with its baselines (int8_wmma, int8_dp4a) as variants of their families."""
    rc, out = run_cli(tmp_path, "-m", "experiment=l4_run2_int8", *store_args(tmp_path))
    assert rc == 0, out
    _, children = assert_store_is_true(tmp_path)
    by_study = {c.data.tags["study_kernel"]: c for c in children}
    assert sorted(by_study) == ["int8_dp4a", "int8_ptx_3stage", "int8_ptx_manual_pack", "int8_ptx_mma_k16",
                                "int8_ptx_mma_k32", "int8_wmma"]
    assert by_study["int8_wmma"].data.params["family"] == "wmma"
    assert by_study["int8_dp4a"].data.params["family"] == "dp4a"
    assert by_study["int8_ptx_mma_k32"].data.params["family"] == "mma_sync"
    assert all(c.data.metrics.get("registers", 0) > 0 for c in children)
    # every child carries the swept axis (variant) and the study's name as params, whatever its family,
    # and the names of two kernels differ within what the UI shows of them (they lead with the variant)
    for study, c in by_study.items():
        assert {k: c.data.params[k] for k in ("variant", "study_kernel", "precision", "size")} == {
            "variant": study, "study_kernel": study, "precision": "int8", "size": "none"}
        assert c.info.run_name.startswith(study + " ")
    assert by_study["int8_wmma"].info.run_name == "int8_wmma wmma int8 s32 128x128 2x4"
    assert len({c.info.run_name[:24] for c in children}) == len(children) == 6
