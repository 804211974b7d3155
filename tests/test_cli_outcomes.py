"""The exit status and the store say what happened, and a mistake gets one line, not a traceback.

A run that FAILED (rejected by ptxas, a wrong result, a GPU fault) fails the command (exit 1) and its
sweep's parent run (FAILED, with the count as its reason), after the sweep ran to its end; a skipped
combination fails nothing. A sweep Hydra expands otherwise than it is written is recorded with the
values that ran. Values longer than MLflow keeps are kept whole as artifacts. Job folders fit the
file system. Each test runs ``run.py`` (or ``experiments.ncu.profile``) as a user would, on the static path.
"""
import os
from pathlib import Path

import pytest
from test_cli import ROOT, all_runs, run_cli, store_args

pytestmark = pytest.mark.usefixtures("need_ptxas")


def _client(tmp):
    import mlflow
    return mlflow.MlflowClient(f"sqlite:///{tmp}/mlflow.db")


def test_a_kernel_ptxas_rejects_fails_the_command_and_its_parent(tmp_path):
    """target.ptx_version=9.9 (or an older ptxas): the run FAILED, but the command exited 0 and the
    parent ended FINISHED, so a CI job checking kernels on the static path passed."""
    rc, out = run_cli(tmp_path, "precision=int8", "target.ptx_version=9.9", *store_args(tmp_path, False))
    assert rc == 1 and "Traceback" not in out, out
    assert out.strip().splitlines()[-1].startswith(
        "1 of 1 run(s) failed: 1 rejected by the assembler (ptxas "), out
    assert "Unsupported .version 9.9" in out.strip().splitlines()[-1]
    parents, children = all_runs(tmp_path)
    assert [(c.info.status, c.data.tags["failed_stage"]) for c in children] == [("FAILED", "assemble")]
    assert [p.info.status for p in parents] == ["FAILED"]
    assert parents[0].data.tags["error"] == ("1 of 1 run(s) failed: 1 rejected by the assembler; see their "
                                             "runs' error tag")


def test_a_sweep_with_a_failed_run_goes_on_and_fails_at_its_end(tmp_path):
    """Four jobs: one assembles, one is rejected by ptxas, two are impossible combinations (skipped,
    no failure). Every job runs; then the parent ends FAILED and the command exits 1."""
    rc, out = run_cli(tmp_path, "-m", "precision=int8", "ktile=32", "target.ptx_version=9.9,auto",
                      "mma=m16n8k32,m16n8k64", *store_args(tmp_path))
    assert rc == 1 and "Traceback" not in out, out
    assert "[4/4] " in out and ": 1 failed, 2 skipped, 1 static." in out
    assert out.strip().splitlines()[-1].startswith("1 of 4 run(s) failed: 1 rejected by the assembler ("), out
    parents, children = all_runs(tmp_path)
    assert sorted((c.info.status, c.data.tags["outcome"]) for c in children) == [
        ("FAILED", "failed"), ("FINISHED", "skipped"), ("FINISHED", "skipped"), ("FINISHED", "static")]
    assert [p.info.status for p in parents] == ["FAILED"]
    assert parents[0].data.tags["error"].startswith("1 of 4 run(s) failed: 1 rejected by the assembler")
    assert parents[0].data.tags["runs"] == "1 failed, 2 skipped, 1 static"


def test_a_sort_of_a_range_is_recorded_with_the_values_that_ran(tmp_path):
    """Hydra 1.3.8 expands sort(range(1,6,2),reverse=true) to 4,2,0; the parent was named after 5,3,1."""
    rc, out = run_cli(tmp_path, "-m", "precision=int8", "pipeline.stages=sort(range(1,6,2),reverse=true)",
                      *store_args(tmp_path))
    assert rc == 0 and "Traceback" not in out, out     # stages=0 is an impossible combination: skipped
    assert ("Note: Hydra expands a sweep otherwise than it is written: pipeline.stages=sort(range(1,6,2),"
            "reverse=true) runs as 4,2,0 (written: 5,3,1).") in out
    parents, children = all_runs(tmp_path)
    assert sorted(c.data.params["pipeline.stages"] for c in children) == ["0", "2", "4"]
    assert [p.info.run_name for p in parents] == ["sweep precision=int8 pipeline.stages=4,2,0"]
    assert parents[0].data.tags["sweep_values"] == ("pipeline.stages=sort(range(1,6,2),reverse=true) runs as "
                                                    "4,2,0 (written: 5,3,1)")


@pytest.mark.parametrize("text, expected", [
    ("s=sort(range(1,6,2),reverse=true)", ("s", ["4", "2", "0"], ["5", "3", "1"])),
    ("s=sort(range(5,0,-2))", ("s", ["2", "4", "6"], ["1", "3", "5"])),
    ("s=sort(range(1,7,2),reverse=true)", None),       # a whole number of steps: Hydra is right
    ("s=range(1,6,2)", None), ("s=sort(3,1,2,reverse=true)", None), ("s=shuffle(range(1,6,2))", None),
    ("s=3", None), ("s=glob(*)", None),
])
def test_values_as_run(text, expected):
    from experiments.runner.sweep import values_as_run
    assert values_as_run([text]) == ({text: expected} if expected else {})


def test_a_param_longer_than_mlflow_keeps_is_kept_whole(tmp_path):
    """problem.shapes of 400 shapes was cut at 6,000 characters mid-list, without a word."""
    shapes = [[256 * i, 128, 64] for i in range(1, 401)]
    arg = "problem.shapes=" + str(shapes).replace(" ", "")
    rc, out = run_cli(tmp_path, "precision=int8", arg, *store_args(tmp_path, False))
    assert rc == 0 and "Traceback" not in out, out
    assert out.count("Note: param problem.shapes is 7,168 characters, longer than MLflow keeps: the param "
                     "holds its start, the whole value is the run's artifact long_values/problem.shapes.txt") == 1
    parents, children = all_runs(tmp_path)
    (child,) = children
    kept = child.data.params["problem.shapes"]
    assert len(kept) == 6000 and kept.startswith("[[256, 128, 64], [512, 128, 64], ")
    assert kept.endswith(" ... [7168 characters; whole: artifact long_values/problem.shapes.txt]")
    assert child.data.tags["long_values"] == "problem.shapes"
    whole = Path(_client(tmp_path).download_artifacts(child.info.run_id, "long_values/problem.shapes.txt",
                                                      str(tmp_path)))
    assert whole.read_text() == str(shapes)
    assert len(parents[0].info.run_name) == 250 and parents[0].info.run_name.endswith("...")
    assert f"precision=int8 {arg} tracking.uri=" in parents[0].data.tags["overrides"]   # whole


@pytest.mark.parametrize("sweep", [True, False])
def test_a_bad_interpolation_in_the_output_folder_is_one_line(tmp_path, sweep):
    """hydra.sweep.dir=${nope.x}/out gave an 84-line InterpolationKeyError (a job key: one line)."""
    key = "hydra.sweep.dir" if sweep else "hydra.run.dir"
    args = ["-m", "precision=int8,int4"] if sweep else ["precision=int8"]
    rc, out = run_cli(tmp_path, *args, f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", key + "=${nope.x}/out")
    assert rc == 2 and "Traceback" not in out, out
    assert out.strip() == (f"Invalid configuration: {key}: Interpolation key 'nope.x' not found (Hydra's output "
                           "folder; python run.py --cfg hydra shows the keys it can use)")
    assert not (tmp_path / "mlflow.db").exists()


def test_a_group_of_a_config_dir_is_added_with_plus(tmp_path, run_checks):
    """+mygroup=option of a --config-dir's group was refused as an "Unknown key"."""
    group = tmp_path / "cd" / "mygroup"
    group.mkdir(parents=True)
    (group / "fast.yaml").write_text("# @package _global_\nprecision: int8\nktile: 64\n")
    (group / "nested.yaml").write_text("# keys under mygroup\nprecision: int8\n")
    cd = f"--config-dir={tmp_path / 'cd'}"
    rc, out = run_cli(tmp_path, cd, "+mygroup=fast", *store_args(tmp_path, False))
    assert rc == 0 and "Traceback" not in out, out
    (child,) = all_runs(tmp_path)[1]
    assert (child.data.params["precision"], child.data.params["ktile"]) == ("int8", "64")
    rc, out = run_checks(tmp_path, cd, "mygroup=fast", *store_args(tmp_path, False))
    assert rc == 2 and out.strip() == (f"mygroup is a config group of --config-dir {tmp_path / 'cd'}, not one of "
                                       "the config's defaults: add it with +mygroup=fast")
    rc, out = run_checks(tmp_path, cd, "+mygroup=nested", *store_args(tmp_path, False))
    assert rc == 2 and out.strip() == (f"mygroup=nested ({group / 'nested.yaml'}) puts its keys under 'mygroup', "
                                       "which the config has no key for: begin the file with '# @package "
                                       "_global_' to set the config's keys (precision, tile.block, ...)")
    rc, out = run_checks(tmp_path, cd, "+mygroup=slow", *store_args(tmp_path, False))
    assert rc == 2 and out.strip() == f"mygroup=slow is not a preset ('+mygroup=slow'); valid: fast, nested ({group})"
    assert len(all_runs(tmp_path)[1]) == 1
    # a group conf/ has too: the valid values come from both folders, and the message names both
    (tmp_path / "cd" / "tile").mkdir()
    (tmp_path / "cd" / "tile" / "mine.yaml").write_text("block: [64, 64]\nwarps: [2, 2]\n")
    rc, out = run_checks(tmp_path, cd, "tile=nope", *store_args(tmp_path, False))
    assert rc == 2 and out.strip().startswith("tile=nope is not a preset ('tile=nope'); valid: 128x128, "), out
    assert out.strip().endswith(f", mine (conf/tile/, {tmp_path / 'cd' / 'tile'})"), out


def _slurm_env(tmp_path, *tools):
    """The environment with a bin folder first on PATH holding ``tools``: fakes of Slurm's commands,
    sbatch refusing the partition as Slurm does."""
    fake = tmp_path / "bin"
    fake.mkdir()
    scripts = {"sbatch": 'echo "sbatch: error: invalid partition specified: nope" >&2\nexit 1\n', "srun": "exit 0\n",
               "sinfo": "exit 0\n"}
    for tool in tools:
        (fake / tool).write_text("#!/bin/sh\n" + scripts[tool])
        (fake / tool).chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = str(fake) + (os.pathsep + env["PATH"] if tools else "")
    return env


def test_a_slurm_partition_that_does_not_exist_is_one_line(tmp_path):
    """hydra.launcher.partition=nope ended in submitit's 41-line traceback."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    rc, out = run_cli(tmp_path, "-m", "hydra/launcher=slurm", "hydra.launcher.partition=nope", "precision=int8",
                      *store_args(tmp_path), env=_slurm_env(tmp_path, "sbatch", "srun", "sinfo"))
    assert rc == 1 and "Traceback" not in out, out
    assert out.strip().splitlines()[-1] == (
        "Slurm did not run the sweep: sbatch: error: invalid partition specified: nope (hydra.launcher.partition="
        f"nope; `sinfo -s` lists the partitions; submitit's files: {tmp_path}/out/.submitit)")
    assert all_runs(tmp_path) == ([], [])          # the parent, which no run joined, is removed


def test_slurm_launcher_without_slurm_is_one_line(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    rc, out = run_cli(tmp_path, "-m", "hydra/launcher=slurm", "precision=int8", *store_args(tmp_path, new_store=True),
                      env=_slurm_env(tmp_path))
    assert rc == 2 and "Traceback" not in out, out
    assert out.strip().splitlines()[-1] == (
        "hydra/launcher=slurm submits the jobs with Slurm's sbatch and srun, not on PATH here: run the command on "
        "a node of the Slurm cluster, or leave hydra/launcher out to run the jobs on this machine. Nothing was "
        "tracked.")
    assert not (tmp_path / "mlflow.db").exists()


def test_import_into_a_file_store_is_one_line(tmp_path, module_cli):
    report = ROOT / "tests" / "data" / "ncu" / "text_report_synthetic.txt"
    rc, out, err = module_cli("experiments.profile", "--import-text", str(report), "--uri", f"file:{tmp_path}/mlruns",
                              cwd=ROOT)
    assert rc == 2 and out == "", out + err
    assert err.splitlines() == [
        f"error: the tracking URI file:{tmp_path}/mlruns is a file store; MLflow 3 keeps runs in a database store. "
        f"Use a SQLite file instead, e.g. sqlite:///{tmp_path}/mlruns.db, or a tracking server (http://host:port)."]
    assert list(tmp_path.iterdir()) == []


def test_job_folders_fit_the_file_system(tmp_path):
    """problem.shapes of 16 shapes stopped the sweep with OSError: [Errno 36] File name too long."""
    shapes = "[" + ",".join(f"[{4096 + 256 * i},4096,1024]" for i in range(16)) + "]"
    rc, out = run_cli(tmp_path, "-m", "precision=int8,fp16", f"problem.shapes={shapes}", *store_args(tmp_path))
    assert rc == 0 and "Traceback" not in out, out
    folders = sorted(p.name for p in (tmp_path / "out").iterdir() if p.is_dir())
    assert len(folders) == 2 and all(len(f.encode()) == 255 for f in folders), folders
    assert folders[0].startswith("0_precision=int8,problem.shapes=[[4096,4096,1024],[4352,4096,1024],")
    assert folders[1].startswith("1_precision=fp16,")
    assert len(all_runs(tmp_path)[1]) == 2


def test_job_dir_name():
    from experiments.runner.sweep import NAME_MAX, job_dir_name
    assert job_dir_name(3, "precision=int8,ktile=64") == "3_precision=int8,ktile=64"
    long = "x=" + "é" * 300                     # two bytes each: cut on a character's boundary
    a, b = job_dir_name(0, long), job_dir_name(0, long + "y")
    assert len(a.encode()) <= NAME_MAX and len(b.encode()) <= NAME_MAX and a != b
    start, digest = a.rsplit("..._", 1)
    assert start.startswith("0_x=éé") and len(digest) == 16 and int(digest, 16) >= 0


def test_failure_summary_counts_each_stage():
    """Wrong results and GPU faults (GPU runs) fail the sweep as a rejection does."""
    from types import SimpleNamespace

    from experiments.store.record import failure_summary
    runs = [SimpleNamespace(data=SimpleNamespace(tags={"failed_stage": s})) for s in ("verify", "gpu", "verify", "job")]
    assert failure_summary(runs, 9) == ("4 of 9 run(s) failed: 1 GPU fault(s), 1 job(s) could not run, "
                                        "2 wrong result(s)")
