"""python -m experiments.profile on a store laid out as run.py writes it, with a stand-in `ncu`
(tests/data/ncu/fake_ncu.py) on CPU machines, and with the real ncu on a GPU (`gpu` tests)."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments import metrics, ncu
from experiments.ncu import profile
from experiments.ncu.launch import _artifact
from experiments.families.mma_sync.render import render
from experiments.families.mma_sync.spec import KernelSpec

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "ncu"
TCP = ROOT.parent / "shared" / "reference" / "tensorcoreptx"
EXP = "tensor-core-ablations"
GPU = {"gpu": "NVIDIA H200", "compute_capability": 90, "driver": "580.159.04", "cuda_driver": "13.0",
       "pci_bus_id": "00000000:19:00.0"}
INT8 = KernelSpec("int8", 64, 32, 128, 128, 2, 4, 2, "cg", "sm_90")
FP16 = KernelSpec("fp16", 32, 16, 64, 64, 2, 2, 3, "ca", "sm_90")
INT4 = KernelSpec("int4", 64, 64, 128, 128, 2, 4, 2, "cg", "sm_90")
PTX_ARTIFACT = _artifact("ptx", "kernel.ptx.txt")


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """One MLflow SQLite store for the module (a new store costs seconds); each test has its own
    experiment in it."""
    import mlflow
    path = tmp_path_factory.mktemp("store") / "mlflow.db"
    uri = f"sqlite:///{path}"
    mlflow.MlflowClient(uri).search_experiments()
    return uri


def _item_spec(item: dict):
    """The spec of a plan item, as the launcher rebuilds it."""
    from experiments import families
    return families.get(item["family"]).respec(item["precision"], item["arch"], item["params"])


def _item(run_id: str, spec, source: str, n: int) -> dict:
    """A plan item as experiments.ncu.launch.plan_item makes it: ``spec`` at N x N x N, seed 1."""
    return {"run_id": run_id, "entry": spec.entry, "family": spec.family, "precision": spec.precision,
            "arch": spec.arch, "params": [list(p) for p in spec.params],
            "build": {"kind": "ptx", "source": source, "entry": spec.entry, "options": []},
            "m": n, "n": n, "k": n, "seed": 1}


def add_run(client, exp, parent, spec, size, tmp, status="FINISHED", verified="true", backend="gpu",
            median=None, ptx_name=None):
    """A child run as experiments/runner/job.py tracks a GPU measurement (tags, params, PTX artifact under
    the run record's name; runs tracked before it have ``<entry>.ptx``)."""
    from mlflow.entities import Metric, Param
    ptx = tmp / "ptx" / (ptx_name or PTX_ARTIFACT)
    ptx.parent.mkdir(exist_ok=True)
    ptx.write_text(render(spec))
    m, n, k = size
    tags = {"kernel": spec.entry, "ptx_sha256": hashlib.sha256(ptx.read_bytes()).hexdigest(),
            "backend": backend, "arch": spec.arch, "mlflow.parentRunId": parent, "run_key": f"{spec.entry}{m}"}
    if backend == "gpu":
        tags.update(gpu="NVIDIA H200", compute_capability="90", verified=verified)
    rid = client.create_run(exp, run_name=f"{spec.entry} {m}x{n}x{k}", tags=tags).info.run_id
    params = {f"spec.{key}": v for key, v in spec.flat().items()}
    params.update({"precision": spec.precision, "problem.m": m, "problem.n": n, "problem.k": k,
                   "verify.seed_used": 1234})
    client.log_batch(rid, params=[Param(key, str(v)) for key, v in params.items()],
                     metrics=[Metric("median_us", median, 0, 0)] if median else [])
    client.log_artifact(rid, str(ptx))
    if status == "FAILED":
        client.set_tag(rid, "error", "verification failed: 3 elements of C differ from the reference")
    client.set_terminated(rid, status)
    return rid


@pytest.fixture
def store(tmp_path, db):
    """In an experiment of its own: an older sweep (one run) and the latest sweep: int8 at 256 and
    512, fp16 at 256 (verified), int4 at 256 (verification failed), and a static run."""
    import mlflow
    client = mlflow.MlflowClient(db)
    exp = client.create_experiment(tmp_path.name, artifact_location=(tmp_path / "artifacts").as_uri())
    old = client.create_run(exp, run_name="sweep old", tags={"kind": "sweep"},
                            start_time=int(time.time() * 1000) - 3600_000).info.run_id
    runs = {"old": add_run(client, exp, old, INT8, (256, 256, 256), tmp_path, median=9.0,
                           ptx_name=f"{INT8.entry}.ptx")}
    parent = client.create_run(exp, run_name="sweep new", tags={"kind": "sweep"}).info.run_id
    runs["int8_256"] = add_run(client, exp, parent, INT8, (256, 256, 256), tmp_path, median=10.0)
    runs["int8_512"] = add_run(client, exp, parent, INT8, (512, 512, 512), tmp_path, median=40.0)
    runs["fp16_256"] = add_run(client, exp, parent, FP16, (256, 256, 256), tmp_path, median=20.0)
    runs["int4_256"] = add_run(client, exp, parent, INT4, (256, 256, 256), tmp_path, "FAILED", "false")
    runs["static"] = add_run(client, exp, parent, FP16, (256, 256, 256), tmp_path, backend="static")
    for rid in (old, parent):
        client.set_terminated(rid)
    return {"uri": db, "client": client, "parent": parent, "runs": runs, "tmp": tmp_path,
            "experiment": tmp_path.name}


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    """`ncu` on PATH is the stand-in; returns the file that logs its command lines."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "ncu"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} {DATA / 'fake_ncu.py'} \"$@\"\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    log = tmp_path / "ncu_calls.jsonl"
    monkeypatch.setenv("FAKE_NCU_LOG", str(log))
    for var in ("FAKE_NCU_MODE", "FAKE_NCU_FAULT", "FAKE_NCU_LOADFAIL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr("experiments.gpu.worker.nvml_gpu", lambda: GPU)
    return log


def run(store, *args):
    return profile.main(["--uri", store["uri"], "--experiment", store["experiment"],
                         "--workdir", str(store["tmp"] / "work"), *args])


def calls(log):
    lines = log.read_text().splitlines() if log.exists() else []
    return [c for c in map(json.loads, lines) if "--version" not in c and "--import" not in c]


def tags_of(store, key):
    return store["client"].get_run(store["runs"][key]).data


def test_profiles_latest_sweep_into_the_same_runs(store, fake_ncu, capsys):
    assert run(store) == 0
    out = capsys.readouterr().out
    assert "Selected 5 run(s)" in out and "3 to profile, 2 not" in out
    assert "not verified (status FAILED, verified=false: verification failed: 3 elements of C differ from the reference): only FINISHED, verified runs are profiled" in out
    assert "backend=static: never measured on a GPU" in out
    # one ncu process for the three (kernel, size) launches, each kernel named exactly
    (cmd,) = calls(fake_ncu)
    k = cmd[cmd.index("-k") + 1]
    assert k == f"regex:^({FP16.entry}|{INT8.entry})$"
    assert cmd[cmd.index("--launch-skip") + 1] == "3" and cmd[cmd.index("--launch-count") + 1] == "3"
    assert cmd[cmd.index("--clock-control") + 1] == "none" and cmd[cmd.index("--cache-control") + 1] == "all"
    assert "--set" not in cmd
    names = cmd[cmd.index("--metrics") + 1].split(",")
    assert "sm__pipe_tensor_op_hmma_type_hmma_hgmma_qgmma_cycles_active.avg.pct_of_peak_sustained_active" in names
    assert "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active" not in names
    assert cmd[-4:-1] == [sys.executable, "-m", "experiments.ncu.launch"]
    plan = json.loads(Path(cmd[-1]).read_text())
    item = next(it for it in plan["items"] if it["run_id"] == store["runs"]["int8_512"])
    assert _item_spec(item) == INT8 and item["family"] == "mma_sync"
    assert (item["m"], item["n"], item["k"], item["seed"]) == (512, 512, 512, 1234)
    for key, size, median in (("int8_256", 256, 10.0), ("int8_512", 512, 40.0), ("fp16_256", 256, 20.0)):
        d = tags_of(store, key)
        assert d.tags["ncu"] == "done" and "ncu_error" not in d.tags
        assert d.tags["ncu.version"] == "2025.3.1.0" and d.tags["ncu.clock_control"] == "none"
        assert d.tags["ncu.cache_control"] == "all" and d.tags["ncu.replay_mode"] == "kernel"
        assert d.tags["ncu.set"] == "default" and d.tags["ncu.arch"] == "sm_90" and d.tags["ncu.kernel_filter"] == k
        assert d.metrics["median_us"] == median                       # the timing is untouched
        assert metrics.undeclared(d.metrics) == []                     # experiments/metrics.py declares each
        assert d.metrics["ncu.duration_us"] == size * 10 / 1000       # the stand-in's 10 * M ns
        assert d.metrics["ncu_over_event_time"] == pytest.approx(size / 100 / median, rel=1e-12)
        assert d.metrics["ncu.achieved_occupancy_pct"] == 91.77 and d.metrics["ncu.dram_cycles_active"] == 5466.67
        assert d.metrics["ncu.tensor_pipe_active_pct"] == 87.25 and d.metrics["ncu.stall_long_scoreboard"] == 13.92
        assert d.metrics["ncu.global_store_sectors_per_request"] == 4.0
        assert "ncu.global_load_sectors_per_request" not in d.metrics      # n/a: missing, never 0
        assert d.tags["ncu.missing"] == ("ncu.global_load_sectors_per_request "
                                         "(l1tex__average_t_sectors_per_request_pipe_lsu_mem_global_op_ld.ratio: n/a)")
        rid = store["runs"][key]
        dst = store["tmp"] / "dl" / key
        dst.mkdir(parents=True)
        row = ncu.parse_csv(Path(store["client"].download_artifacts(rid, "ncu/ncu_raw.csv", str(dst))).read_text())
        assert [la.function for la in row.launches] == [d.tags["kernel"]]
        assert row.launches[0].number("gpu__time_duration.sum") == size * 10
        assert d.tags["ncu.report"].startswith(f"runs:/{store['parent']}/ncu/")
    reports = [a.path for a in store["client"].list_artifacts(store["parent"], "ncu")]
    assert len(reports) == 1
    (rep,) = store["client"].list_artifacts(store["parent"], reports[0])
    assert rep.path.endswith("profile_0.ncu-rep") and tags_of(store, "fp16_256").tags["ncu.report"].endswith(rep.path)
    for key in ("int4_256", "static", "old"):
        assert "ncu" not in tags_of(store, key).tags and "ncu.duration_us" not in tags_of(store, key).metrics


def test_second_call_skips_profiled_runs_unless_rerun(store, fake_ncu, capsys):
    assert run(store) == 0
    assert run(store) == 0
    assert "already profiled (ncu=done); --rerun profiles it again" in capsys.readouterr().out
    assert len(calls(fake_ncu)) == 1
    assert run(store, "--rerun", "--parent", store["parent"], "--clock-control", "base") == 0
    assert len(calls(fake_ncu)) == 2 and tags_of(store, "int8_256").tags["ncu.clock_control"] == "base"
    # --filter selects across sweeps: the older sweep's run too
    assert run(store, "--filter", f"tags.kernel = '{INT8.entry}'") == 0
    assert tags_of(store, "old").tags["ncu"] == "done" and tags_of(store, "old").metrics["median_us"] == 9.0


def test_no_ncu_on_path(store, fake_ncu, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert run(store) == 2
    err = capsys.readouterr().err
    assert "ncu (Nsight Compute CLI) was not found on PATH" in err and "--ncu /path/to/ncu" in err
    assert all("ncu" not in tags_of(store, key).tags for key in store["runs"])


def test_selections_that_match_nothing(store, fake_ncu, capsys):
    assert run(store, "--filter", "params.precision = 'fp64'") == 2
    assert "the selection matched no run: runs matching \"params.precision = 'fp64'\"" in capsys.readouterr().err
    assert run(store, "--filter", "params.precision === 'int8'") == 2
    assert "is not a valid MLflow filter" in capsys.readouterr().err
    assert run(store, "--parent", "0123456789abcdef") == 2
    assert "--parent 0123456789abcdef is not a run id in sqlite:///" in capsys.readouterr().err
    assert run(store, "--filter", "tags.verified = 'false'") == 2
    assert "no run of the selection can be profiled" in capsys.readouterr().err
    assert run(store, "--experiment", "nope") == 2
    assert "experiment 'nope' is not in" in capsys.readouterr().err and calls(fake_ncu) == []


def test_misspelled_metric_name_is_reported_missing(store, fake_ncu, tmp_path, capsys):
    bad = tmp_path / "typo.yaml"
    bad.write_text("metrics:\n  - duration_us\n  - dram_cycles_active: {unit: cycle, ncu: dram__cycles_activ.avg}\n")
    assert run(store, "--set", str(bad)) == 1
    out = capsys.readouterr().out
    assert "MISSING ncu.dram_cycles_active: dram__cycles_activ.avg: not returned in 3 run(s)" in out
    assert "ncu --query-metrics --chips gh100" in out
    d = tags_of(store, "int8_512")
    assert d.tags["ncu"] == "done" and d.metrics["ncu.duration_us"] == 5.12
    assert "ncu.dram_cycles_active" not in d.metrics
    assert d.tags["ncu.missing"] == "ncu.dram_cycles_active (dram__cycles_activ.avg: not returned)"
    assert run(store, "--set", "fastest") == 2
    assert "metric set 'fastest' not found" in capsys.readouterr().err


def test_no_permission_marks_runs_and_keeps_timings(store, fake_ncu, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_NCU_MODE", "perm")
    assert run(store) == 1
    out = capsys.readouterr().out
    assert "3 failed" in out and "NVreg_RestrictProfilingToAdminUsers=0" in out
    for key, median in (("int8_256", 10.0), ("fp16_256", 20.0)):
        d = tags_of(store, key)
        assert d.tags["ncu"] == "failed" and "ERR_NVGPUCTRPERM" in d.tags["ncu_error"]
        assert d.metrics["median_us"] == median and "ncu.duration_us" not in d.metrics
        assert store["client"].get_run(store["runs"][key]).info.status == "FINISHED"
    monkeypatch.setenv("FAKE_NCU_MODE", "ok")       # permission granted: failed runs are profiled again
    assert run(store) == 0
    assert tags_of(store, "int8_256").tags["ncu"] == "done" and "ncu_error" not in tags_of(store, "int8_256").tags


def test_faulting_kernel_fails_alone(store, fake_ncu, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_NCU_FAULT", f"{INT8.entry}:512")
    assert run(store) == 1
    cmds = calls(fake_ncu)
    first_plan = [it["run_id"] for it in json.loads(Path(cmds[0][-1]).read_text())["items"]]
    culprit = first_plan.index(store["runs"]["int8_512"])
    assert len(cmds) == (1 if culprit == len(first_plan) - 1 else 2)     # the launches after it go again
    d = tags_of(store, "int8_512")
    assert d.tags["ncu"] == "failed" and "the kernel failed under ncu (profile launch)" in d.tags["ncu_error"]
    assert "An error was reported by the driver" in d.tags["ncu_error"] and d.metrics["median_us"] == 40.0
    assert tags_of(store, "int8_256").tags["ncu"] == "done" and tags_of(store, "fp16_256").tags["ncu"] == "done"
    assert "FAILED" in capsys.readouterr().out


def test_kernel_that_cannot_be_loaded(store, fake_ncu, monkeypatch):
    monkeypatch.setenv("FAKE_NCU_LOADFAIL", FP16.entry)
    assert run(store) == 1
    cmds = calls(fake_ncu)
    assert len(cmds) == 2 and cmds[1][cmds[1].index("-k") + 1] == f"regex:^({INT8.entry})$"
    assert "could not be loaded: PtxJitError" in tags_of(store, "fp16_256").tags["ncu_error"]
    assert tags_of(store, "int8_512").tags["ncu"] == "done"


def test_run_that_cannot_be_rebuilt(store, fake_ncu, capsys):
    from mlflow.entities import Param
    client = store["client"]
    exp = client.get_experiment_by_name(store["experiment"]).experiment_id
    rid = client.create_run(exp, run_name="broken", tags={
        "kernel": INT8.entry, "backend": "gpu", "gpu": "NVIDIA H200", "verified": "true",
        "mlflow.parentRunId": store["parent"]}).info.run_id
    client.log_batch(rid, params=[Param(f"spec.{k}", str(v)) for k, v in INT8.flat().items() if k != "ktile"]
                     + [Param("problem.m", "256"), Param("problem.n", "256"), Param("problem.k", "256")])
    client.set_terminated(rid)
    no_ptx = client.create_run(exp, run_name="no ptx", tags={
        "kernel": INT8.entry, "backend": "gpu", "gpu": "NVIDIA H200", "verified": "true",
        "mlflow.parentRunId": store["parent"]}).info.run_id
    client.log_batch(no_ptx, params=[Param(f"spec.{k}", str(v)) for k, v in INT8.flat().items()]
                     + [Param("problem.m", "256"), Param("problem.n", "256"), Param("problem.k", "256")])
    client.set_terminated(no_ptx)
    assert run(store) == 1
    assert client.get_run(rid).data.tags["ncu_error"].startswith(
        "not profiled: the kernel cannot be rebuilt: params spec.ktile are missing and artifact config.yaml "
        "gave: MlflowException")
    assert client.get_run(no_ptx).data.tags["ncu_error"] == (
        f"not profiled: the kernel's PTX (artifact {PTX_ARTIFACT} or {INT8.entry}.ptx) could not be read: "
        "not in the run")
    assert all(tags_of(store, key).tags["ncu"] == "done" for key in ("int8_256", "int8_512", "fp16_256"))
    assert "FAILED broken" in capsys.readouterr().out


def test_run_that_keeps_only_its_config(store, fake_ncu):
    """Runs whose params hold the config (not every spec field) are rebuilt from config.yaml."""
    from mlflow.entities import Param
    from omegaconf import OmegaConf

    from experiments.config import Config
    from experiments.families.mma_sync.spec import spec_from_config
    cfg = OmegaConf.structured(Config)
    spec = spec_from_config(cfg, 90)
    client, tmp = store["client"], store["tmp"]
    exp = client.get_experiment_by_name(store["experiment"]).experiment_id
    (tmp / "cfg").mkdir()
    (tmp / "cfg" / PTX_ARTIFACT).write_text(render(spec))
    (tmp / "cfg" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    rid = client.create_run(exp, run_name="config only", tags={
        "kernel": spec.entry, "backend": "gpu", "gpu": "NVIDIA H200", "verified": "true", "arch": "sm_90",
        "mlflow.parentRunId": store["parent"]}).info.run_id
    client.log_batch(rid, params=[Param("precision", spec.precision), Param("spec.arch", "sm_90"),
                                  Param("problem.m", "512"), Param("problem.n", "512"), Param("problem.k", "512")])
    for name in (PTX_ARTIFACT, "config.yaml"):
        client.log_artifact(rid, str(tmp / "cfg" / name))
    client.set_terminated(rid)
    assert run(store, "--filter", f"tags.kernel = '{spec.entry}'") == 0
    plan = json.loads(Path(calls(fake_ncu)[0][-1]).read_text())
    (item,) = plan["items"]
    assert _item_spec(item) == spec
    assert client.get_run(rid).data.tags["ncu"] == "done"
    assert client.get_run(rid).data.metrics["ncu.duration_us"] == 5.12


def test_no_kernels_profiled_names_the_filter(store, fake_ncu, monkeypatch):
    monkeypatch.setenv("FAKE_NCU_MODE", "nokernels")
    assert run(store) == 1
    err = tags_of(store, "int8_256").tags["ncu_error"]
    assert f"ncu profiled no kernel matching -k regex:^({FP16.entry}|{INT8.entry})$" in err


def test_dry_run_and_missing_gpu(store, fake_ncu, monkeypatch, capsys):
    assert run(store, "--dry-run") == 0
    out = capsys.readouterr().out
    assert "--launch-skip 3 --launch-count 3" in out and "experiments.ncu.launch" in out
    assert "--set" not in out and "--clock-control none --cache-control all --replay-mode kernel" in out
    assert run(store, "--dry-run", "--set", "full", "--replay-mode", "application") == 0
    out = capsys.readouterr().out
    assert "--set full --metrics gpu__time_duration.sum," in out and "--replay-mode application" in out
    assert calls(fake_ncu) == [] and all("ncu" not in tags_of(store, key).tags for key in store["runs"])
    assert "not runnable here" not in out
    # without ncu the plan is still printed, and says that it cannot run here
    assert run(store, "--dry-run", "--ncu", str(store["tmp"] / "no-ncu")) == 0
    assert "(not runnable here: --ncu " in capsys.readouterr().out
    monkeypatch.setattr("experiments.gpu.worker.nvml_gpu", lambda: None)
    assert run(store) == 2
    assert "no NVIDIA GPU found (NVML)" in capsys.readouterr().err
    monkeypatch.setattr("experiments.gpu.worker.nvml_gpu", lambda: {**GPU, "gpu": "NVIDIA A100-SXM4-80GB"})
    assert run(store) == 2
    assert "measured on NVIDIA H200, this machine has NVIDIA A100-SXM4-80GB" in capsys.readouterr().out


def test_no_store(tmp_path, capsys):
    assert profile.main(["--uri", f"sqlite:///{tmp_path}/none.db"]) == 2
    assert "no store at" in capsys.readouterr().err and not (tmp_path / "none.db").exists()


@pytest.mark.skipif(not TCP.is_dir(), reason="shared/reference/tensorcoreptx (third-party reports) not present")
def test_import_published_text_reports(db, capsys):
    import mlflow
    uri = db
    files = [str(TCP / "run4__int4_ptx_mma_k64_x2_x2nontrans_ca_ncu_8192.txt"),
             str(TCP / "run2__int8_wmma_ncu_8192.txt")]
    args = ["--import-text", *files, "--uri", uri, "--experiment", "l4", "--gpu", "NVIDIA L4"]
    assert profile.main(args) == 0
    out = capsys.readouterr().out
    assert "run2__int8_wmma_ncu_8192.txt: 1 result block(s) of 3 profiled launch(es)" in out
    assert "the program's own check FAILED, runs tagged verified=false" in out
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("l4").experiment_id
    runs = client.search_runs([exp], "tags.source = 'ncu_text'")
    blocks = {(r.data.params["source.file"], r.data.params["source.block"]): r for r in runs
              if "source.block" in r.data.params}
    assert len(blocks) == 4 and len(runs) == 6          # 4 blocks + one parent per file
    assert all(metrics.undeclared(r.data.metrics) == [] for r in runs)
    x2 = blocks[("run4__int4_ptx_mma_k64_x2_x2nontrans_ca_ncu_8192.txt", "2")]
    assert x2.data.metrics["ncu.duration_us"] == 179920.0
    assert x2.data.metrics["ncu.achieved_occupancy_pct"] == 66.51
    assert x2.data.metrics["ncu.dram_cycles_active"] == 38973354.67
    assert x2.data.tags["verified"] == "false" and x2.data.tags["launch_role"] == "profiled"
    assert x2.data.tags["backend"] == "reference" and "backend" not in blocks[(x2.data.params["source.file"], "0")].data.tags
    assert x2.data.params["problem.m"] == "8192" and x2.data.tags["gpu"] == "NVIDIA L4"
    assert x2.data.tags["compute_capability"] == "89" and x2.data.tags["ncu.set"] == "full"
    small = blocks[("run4__int4_ptx_mma_k64_x2_x2nontrans_ca_ncu_8192.txt", "0")]
    assert small.data.tags["launch_role"] == "other" and "problem.m" not in small.data.params
    assert small.data.metrics["ncu.duration_us"] == 27.65
    wmma = blocks[("run2__int8_wmma_ncu_8192.txt", "0")]
    assert wmma.data.tags["verified"] == "true" and wmma.data.metrics["ncu.duration_us"] == 858300.0
    assert profile.main(args) == 0                         # importing again adds nothing
    assert "already imported" in capsys.readouterr().out
    assert len(client.search_runs([exp], "tags.source = 'ncu_text'")) == 6


def test_launcher_stops_before_any_launch_when_a_kernel_cannot_load(tmp_path):
    """A broken PTX (and, without a GPU, a missing CuPy) is reported per run; nothing is launched."""
    items = [_item(rid, INT8, source, 256) for rid, source in (("r_good", render(INT8)),
                                                                ("r_bad", "this is not PTX\n"))]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"items": items, "status": str(tmp_path / "status.json")}))
    proc = subprocess.run([sys.executable, "-m", "experiments.ncu.launch", str(plan)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3 and "ncu_launch: start" not in proc.stdout
    failed = json.loads((tmp_path / "status.json").read_text())["failed"]
    assert "r_bad" in failed and "nothing launched" in proc.stderr


# -- on a GPU --------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_launcher_runs_a_plan(tmp_path):
    """The program ncu runs: loads, then launches each item twice (warm-up, profile), exit 0."""
    items = [_item(f"r{m}", INT8, render(INT8), m) for m in (256, 512)]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"items": items, "status": str(tmp_path / "status.json")}))
    proc = subprocess.run([sys.executable, "-m", "experiments.ncu.launch", str(plan)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert [line for line in proc.stdout.splitlines() if "done" in line] == [
        "ncu_launch: done warmup 0", "ncu_launch: done warmup 1", "ncu_launch: done profile 0",
        "ncu_launch: done profile 1"]


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("ncu") is None, reason="ncu (Nsight Compute) not on PATH")
def test_sweep_then_profile_with_ncu(tmp_path):
    """run.py measures two sizes of one int8 kernel; the profile command adds ncu counters to both."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    sweep = subprocess.run([sys.executable, str(ROOT / "run.py"), "-m", "precision=int8", "ktile=64",
                            "problem.sizes=[1024,2048]", f"tracking.uri={uri}", f"hydra.sweep.dir={tmp_path}/out"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    assert profile.main(["--uri", uri, "--workdir", str(tmp_path / "ncu")]) == 0
    import mlflow
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name(EXP).experiment_id], "tags.ncu = 'done'")
    assert len(runs) == 2
    for r in runs:
        m = r.data.metrics
        assert "not returned" not in r.data.tags["ncu.missing"], r.data.tags["ncu.missing"]
        assert 0 < m["ncu.achieved_occupancy_pct"] <= 100 and m["ncu.tensor_pipe_active_pct"] > 0
        assert 0.5 < m["ncu_over_event_time"] < 3 and m["ncu.dram_cycles_active"] > 0


def test_runs_of_registered_families(store, fake_ncu):
    """wmma (CUDA C++) and peak (PTX) runs are rebuilt from their family.* params and profiled;
    a cuBLAS run is refused with the reason; a run whose source changed since is refused."""
    from mlflow.entities import Param

    from experiments import families
    from experiments.families.base import ptx_sha256
    client = store["client"]
    exp = client.get_experiment_by_name(store["experiment"]).experiment_id

    def add(family, precision, options, size, sha=None):
        spec = families.get(family).spec(precision, options, "sm_90")
        build = families.get(family).build(spec)
        tags = {"kernel": spec.entry, "backend": "gpu", "gpu": "NVIDIA H200", "verified": "true",
                "arch": "sm_90", "ptx_sha256": sha or ptx_sha256(build.source),
                "mlflow.parentRunId": store["parent"]}
        rid = client.create_run(exp, run_name=spec.entry, tags=tags).info.run_id
        params = {"family": family, "precision": precision, "verify.seed_used": "7",
                  **{f"family.{k}": str(v) for k, v in options.items()},
                  **{f"spec.{k}": str(v) for k, v in spec.flat().items() if k not in ("family", "precision")}}
        if size:
            params.update({"problem.m": size, "problem.n": size, "problem.k": size})
        client.log_batch(rid, params=[Param(k, str(v)) for k, v in params.items()])
        client.set_terminated(rid)
        return rid, spec

    wmma, wspec = add("wmma", "int8", {"block": "128x128", "warps": "2x4"}, 512)
    peak, pspec = add("peak", "fp16", {"mma": "auto"}, None)
    blas, _ = add("cublas", "fp16", {}, 512)
    stale, _ = add("dp4a", "int8", {}, 512, sha="0" * 64)
    assert run(store, "--filter", "params.family != 'mma_sync'") == 1
    plan = json.loads(Path(calls(fake_ncu)[0][-1]).read_text())
    items = {it["entry"]: it for it in plan["items"]}
    assert set(items) == {wspec.entry, pspec.entry}
    assert items[wspec.entry]["build"]["kind"] == "cuda" and items[pspec.entry]["build"]["kind"] == "ptx"
    assert (items[wspec.entry]["m"], items[wspec.entry]["seed"]) == (512, 7)
    assert [client.get_run(r).data.tags["ncu"] for r in (wmma, peak, blas, stale)] == ["done", "done",
                                                                                      "failed", "failed"]
    assert "is a library call" in client.get_run(blas).data.tags["ncu_error"]
    assert "differs from the run's (tag ptx_sha256)" in client.get_run(stale).data.tags["ncu_error"]


def test_triage_says_a_skipped_run_could_not_exist():
    """--dry-run labelled skipped combinations 'backend=static: never measured on a GPU'."""
    from types import SimpleNamespace as NS
    skipped = NS(info=NS(status="FINISHED"), data=NS(params={}, tags={
        "backend": "static", "outcome": "skipped", "skip_reason": "mma=m16n8k64 is not valid with precision=int8"}))
    static = NS(info=NS(status="FINISHED"), data=NS(params={}, tags={"backend": "static", "outcome": "static"}))
    todo, why = profile.triage([skipped, static], None, False)
    assert todo == [] and [w for _, w in why] == [
        "skipped (cannot exist: mma=m16n8k64 is not valid with precision=int8): never measured",
        "backend=static: never measured on a GPU"]
