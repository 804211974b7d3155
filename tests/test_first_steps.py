"""What a new user meets on a fresh clone without a GPU: presets without -m, values no kernel can take
(an error before any work) beside combinations a sweep cannot run (skipped runs), sizes too large for
the kernels' 32-bit offsets, the printed `mlflow ui` line, read-only folders, non-ASCII values.

Each test runs ``run.py`` as a user would (the static path) and asserts on the exit status, the
message and the store.
"""
import shlex

import pytest

from experiments.runner.variants import listed
from test_cli import ROOT, _empty_store, _refusal, _run_module, all_runs, empty_store_at, run_cli, store_args

pytestmark = pytest.mark.usefixtures("need_ptxas")


def test_a_sweep_over_presets_with_sweeps_of_their_own_stops_before_any_work(tmp_path, run_checks):
    """-m experiment=l4_run2_int8,l4_run3_int4 ran two jobs of the default fp16 kernel, exit 0: Hydra's
    sweeper takes the command line's sweep only, so neither preset's variants ran."""
    args = ["-m", "experiment=l4_run2_int8,l4_run3_int4", *store_args(tmp_path, new_store=True)]
    rc, out = run_checks(tmp_path, *args)
    assert rc == 2 and "Traceback" not in out, out
    rest = " ".join(args[2:])
    assert out.strip() == (
        "experiment=l4_run2_int8,l4_run3_int4 sweeps presets that define sweeps of their own (l4_run2_int8: "
        "variant (6 values); l4_run3_int4: variant (5 values)): Hydra would run one job per preset with those "
        "keys at the config's default, none of the presets' kernels; nothing was run. Run each preset's sweep: "
        f"python run.py -m {rest} experiment=l4_run2_int8; python run.py -m {rest} experiment=l4_run3_int4")
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("preset, swept, keys, first", [
    ("l4_run4_int4_k64_ablation", "variant (6 values)", "variant", "variant=int4_ptx_mma_k64_x4_x2nontrans_ca"),
    ("generations", "precision (4 values), variant (22 values)", "precision and variant",
     "precision=fp16 variant=gen_mma_sync"),
])
def test_preset_sweep_without_multirun_stops_and_gives_the_command(tmp_path, run_checks, preset, swept, keys,
                                                                   first):
    """Without -m Hydra ignored the preset's sweep and tracked one default fp16 kernel, exit 0."""
    args = [f"experiment={preset}", *store_args(tmp_path, False, new_store=True)]
    rc, out = run_checks(tmp_path, *args)
    assert rc == 2 and "Traceback" not in out, out
    given = " ".join(args)
    assert out.strip() == (
        f"experiment={preset} defines a sweep over {swept}; without -m Hydra would ignore it and run a single "
        f"job with {keys} at the config's default: nothing was run. Run the sweep: python run.py -m {given}   "
        f"or one of its jobs: python run.py {given} {first}")
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "out").exists()


def test_one_job_of_a_preset_sweep_runs_without_multirun(tmp_path):
    """Every swept key given: one job of the sweep, as the message suggests."""
    rc, out = run_cli(tmp_path, "experiment=l4_run4_int4_k64_ablation", "variant=int4_ptx_mma_k64_x4_x2nontrans_ca",
                      "problem.sizes=[512]", *store_args(tmp_path, False))
    assert rc == 0 and "Traceback" not in out, out
    parents, children = all_runs(tmp_path)
    assert len(parents) == 1 and len(children) == 1
    assert children[0].data.tags["study_kernel"] == "int4_ptx_mma_k64_x4_x2nontrans_ca"
    assert children[0].data.tags["outcome"] == "static"


def test_cfg_job_of_a_preset_says_where_its_sweep_is(tmp_path):
    rc, out = run_cli(tmp_path, "--cfg", "job", "experiment=generations")
    assert rc == 0, out
    lines = out.splitlines()
    assert lines[0] == ("# experiment=generations sweeps precision (4 values), variant (22 values); this is one "
                        "job's config with them at their defaults. The sweep: python run.py --cfg hydra "
                        "experiment=generations (hydra.sweeper.params; its variants: "
                        "hydra.callbacks.tracking.variants); run it: python run.py -m "
                        "experiment=generations")
    assert "precision: fp16" in lines and "ktile: 64" in lines
    import yaml
    assert yaml.safe_load(out)["ktile"] == 64          # the comment keeps the output YAML
    rc, out = run_cli(tmp_path, "--cfg", "job", "experiment=generations", "precision=int8", "variant=gen_peak")
    assert rc == 0 and not out.startswith("#") and "precision: int8" in out.splitlines(), out
    assert list(tmp_path.iterdir()) == []


VALID_MMA_SYNC = "valid: fp16, bf16, int8, int4, fp8_e4m3, fp8_e5m2 (copy is a precision of family=peak)"


@pytest.mark.parametrize("multirun", [False, True])
@pytest.mark.parametrize("args, message", [
    (["target.arch=sm_75"], "target.arch=sm_75 is not valid for family=mma_sync; valid: auto, sm_80, sm_86, "
                            "sm_89, sm_90, sm_90a, sm_100, sm_120"),
    (["precision=copy"], f"precision=copy is not valid for family=mma_sync; {VALID_MMA_SYNC}"),
    (["problem.sizes=[0]"], "problem.sizes=[0] is not valid: square sizes M=N=K must be positive integers, e.g. "
                            "'problem.sizes=[512,1024]'"),
    (["problem.shapes=[[512,512]]"], "problem.shapes=[[512,512]] is not valid: entry [512,512] is not [M, N, K] "
                                     "of positive integers; e.g. 'problem.shapes=[[4096,4096,1024],[512,2048,512]]'"),
    (["family=wgmma", "target.arch=sm_80"], "target.arch=sm_80 is not valid for family=wgmma; valid: auto, sm_90, "
                                            "sm_90a"),
    (["target.ptx_version=abc"], "target.ptx_version='abc' must be 'auto' or MAJOR.MINOR, e.g. 7.8"),
    (["target.ptx_version=8"], "target.ptx_version='8' must be 'auto' or MAJOR.MINOR, e.g. 7.8"),
    (["target.arch=sm_9x"], "target.arch=sm_9x is not valid for family=mma_sync; valid: auto, sm_80, sm_86, "
                            "sm_89, sm_90, sm_90a, sm_100, sm_120"),
    (["verify.rtol=-1"], "verify.rtol=-1.0 is not valid; it must be a finite number > 0"),
    (["timing.warmup=-1"], "timing.warmup=-1 is not valid; it must be a whole number >= 0"),
    (["timing.repeats=0"], "timing.repeats=0 is not valid; it must be a whole number >= 1"),     # a count
    (["problem.sizes=[abc]"], "problem.sizes[0]=abc is not an integer ('problem.sizes=[abc]')"),
])
def test_value_no_kernel_takes_is_an_error_before_any_work(tmp_path, run_checks, args, message, multirun):
    """These became green skipped runs in a sweep (exit 0) and errors after the store was opened in a
    single run (exit 1), while precision=int5 stopped at once with exit 2: now all stop at once."""
    rc, out = run_checks(tmp_path, *(["-m", "pipeline.stages=2,3"] if multirun else []), *args,
                      *store_args(tmp_path, multirun, new_store=True))
    assert rc == 2 and "Traceback" not in out, out
    assert out.strip() == message
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, message", [
    (['-m', 'precision=fp16,copy'],
     'precision=copy is not valid for family=mma_sync; valid: fp16, bf16, int8, int4, fp8_e4m3, '
     'fp8_e5m2 (copy is a precision of family=peak)'),
    (['-m', 'problem.sizes=[512],[-512]'],
     'problem.sizes=[-512] is not valid: square sizes M=N=K must be positive integers, e.g. '
"'problem.sizes=[512,1024]'"),
    (['-m', 'problem.shapes=[[512,512,512,1]]'],
     'problem.shapes=[[512,512,512,1]] is not valid: entry [512,512,512,1] is not [M, N, K] of '
     "positive integers; e.g. 'problem.shapes=[[4096,4096,1024],[512,2048,512]]'"),
    (['family=wgmma', 'precision=int4'],
     'precision=int4 is not valid for family=wgmma; valid: fp16, bf16, fp8_e4m3, fp8_e5m2, int8 '
     '(int4 is a precision of family=mma_sync or wmma or peak)'),
    (['-m', 'family=mma_sync,peak', 'precision=copy'],
     None),
    (['-m', 'family=wmma,cublas', 'precision=int4'],
     None),
    (['-m', 'target.arch=sm_80,sm_90', 'precision=fp8_e4m3'],
     None),
    (['variant=h200_perf_peak', 'precision=copy'],
     None),
    (['problem.sizes=[46336]', 'problem.shapes=[[256,128,32]]', 'target.arch=auto'],
     None),
])
def test_values_of_every_family_are_checked_before_any_work(argv, message):
    assert _refusal(argv) == message


def test_sweep_whose_every_job_is_skipped_exits_2(tmp_path):
    """A sweep of combinations that cannot exist tracked its skipped runs and exited 0."""
    args = ["-m", "precision=int8", "mma=m16n8k64", "ktile=32,64", *store_args(tmp_path)]
    rc, out = run_cli(tmp_path, *args)
    assert rc == 2 and "Traceback" not in out, out
    assert out.strip().endswith("Every job of this sweep was skipped (2 combination(s) that cannot exist; see their "
                                "runs' skip_reason): nothing was built or measured. Exit status 2.")
    parents, children = all_runs(tmp_path)
    assert [p.info.status for p in parents] == ["FINISHED"]
    assert sorted((c.info.status, c.data.tags["outcome"]) for c in children) == [("FINISHED", "skipped")] * 2
    # the same command again resumes: nothing new (each combination's line names its run), the same answer
    rc, out = run_cli(tmp_path, *args)
    assert rc == 2 and out.count("already recorded") == 2 and "Every job of this sweep was skipped" in out, out
    for c in children:
        ktile = c.data.params["ktile"]
        assert f"] skipped precision=int8 mma=m16n8k64 ktile={ktile}: already recorded (run {c.info.run_id})" in out
    assert sorted(c.info.run_id for c in all_runs(tmp_path)[1]) == sorted(c.info.run_id for c in children)


@pytest.mark.parametrize("size, reason", [
    (50000, "M=50000 is not a multiple of BM=256"),
    (1048576, "too large for 32-bit offsets in gemm_fp16_bk32_m16n8k16_ldx4x2_cg_bcol_s3_256x128_w4x2_g8: A and B "
              "must each stay below 2^32 bytes, C below 2^40 bytes"),
])
def test_too_large_size_suggests_one_that_fits(tmp_path, size, reason):
    """The hint rounded up past the 32-bit offset limit: [50000] suggested [50176], [1048576] itself."""
    rc, out = run_cli(tmp_path, f"problem.sizes=[{size}]", *store_args(tmp_path, False))
    assert rc == 2 and "Traceback" not in out and "Tracking" not in out, out
    assert reason in out
    assert out.strip().endswith("Square sizes must be multiples of 256 (M, N, K: multiples of 256, 128, 32) and at "
                                "most 46336 (the largest this kernel takes), e.g. 'problem.sizes=[46336]'"), out
    assert all_runs(tmp_path) == ([], [])


def test_suggested_sizes_are_taken():
    """The suggestion is the largest multiple the kernel takes, for every precision's element size."""
    from omegaconf import OmegaConf

    from experiments.config import Config
    from experiments.families.runner import family_shapes, family_spec
    from experiments.spec import SpecError
    for precision, largest in (("fp16", 46336), ("int8", 65280), ("int4", 92672)):
        cfg = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.from_dotlist([f"precision={precision}"]))
        fam, spec = family_spec(cfg, None)
        family_shapes(fam, spec, [(largest,) * 3])
        with pytest.raises(SpecError, match=rf"at most {largest} .*e\.g\. 'problem\.sizes=\[512,{largest}\]'$"):
            family_shapes(fam, spec, [(512,) * 3, (largest + 256,) * 3])


@pytest.fixture(scope="module")
def static_sweep(tmp_path_factory):
    """A sweep of two static runs into a store in a folder with a space in its name, run once for the
    tests that read it: (the store's folder, exit status, output)."""
    folder = tmp_path_factory.mktemp("static_sweep") / "my runs"
    folder.mkdir()
    rc, out = run_cli(folder.parent, "-m", "precision=int8,int4", "problem.sizes=[512]", *store_args(folder))
    return folder, rc, out


def test_printed_mlflow_ui_line_works_with_a_space_in_the_store_path(static_sweep):
    folder, rc, out = static_sweep
    assert rc == 0 and " " in folder.name, out
    line = next(x for x in out.splitlines() if "mlflow ui" in x)
    assert shlex.split(line.split(":", 1)[1]) == ["mlflow", "ui", "--backend-store-uri", f"sqlite:///{folder}/mlflow.db"]


def _as_user(*command):
    """``command`` as a user that read-only modes hold: root ignores them, so root runs it in a user
    namespace of its own (``unshare --user``), where the files it owns obey their modes."""
    import os
    import shutil
    import subprocess
    if os.geteuid() != 0:
        return list(command)
    if not shutil.which("unshare") or subprocess.run(["unshare", "--user", "true"]).returncode:
        pytest.skip("running as root without user namespaces: read-only folders cannot be made")
    return ["unshare", "--user", *command]


def _run_as_user(cwd, script, *args):
    """``python script ARGS`` in ``cwd`` as :func:`_as_user`, every GPU hidden; stdout and stderr."""
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "HYDRA_FULL_ERROR")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run(_as_user(sys.executable, str(script), *args), cwd=cwd, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    return proc.returncode, proc.stdout


def test_read_only_store_folder_names_the_folder(tmp_path):
    """A store in a read-only folder: "attempt to write a readonly database" (or a lock-file
    PermissionError) with no word of which file, after the sweep had started."""
    import shutil
    ro = tmp_path / "ro"
    ro.mkdir()
    shutil.copy(_empty_store(), ro / "mlflow.db")
    ro.chmod(0o555)
    try:
        for db in (ro / "mlflow.db", ro / "new" / "mlflow.db"):
            rc, out = _run_as_user(tmp_path, ROOT / "run.py", "precision=int8", f"tracking.uri=sqlite:///{db}",
                                   f"hydra.run.dir={tmp_path}/out")
            assert rc == 1 and "Traceback" not in out, out
            assert out.strip() == (f"Store error: the store {db} cannot be written: {ro} is read-only for this user "
                                   "(SQLite writes the database and its journal beside it, the artifacts go there "
                                   "too); give a writable place: tracking.uri=sqlite:////PATH/mlflow.db, or "
                                   "MLFLOW_TRACKING_URI"), out
    finally:
        ro.chmod(0o755)
    assert sorted(p.name for p in ro.iterdir()) == ["mlflow.db"] and not (tmp_path / "out").exists()
    assert all_runs(ro) == ([], [])


@pytest.mark.parametrize("multirun", [False, True])
def test_read_only_project_folder_names_both_folders(tmp_path, multirun):
    """run.py from a read-only copy of the project: Hydra's 15-line traceback for the output folder,
    and the default store (outputs/mlflow.db of the project) could not be written either."""
    import shutil
    project = tmp_path / "project"
    project.mkdir()
    for name in ("run.py", "conf", "experiments", "kernels_ptx"):
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, project / name)
    modes = {p: p.stat().st_mode for p in (project, *project.rglob("*")) if p.is_dir()}
    for p in modes:
        p.chmod(0o555)
    try:
        rc, out = _run_as_user(project, project / "run.py", *(["-m"] if multirun else []), "precision=int8")
    finally:
        for p, mode in modes.items():
            p.chmod(mode)
    key = "hydra.sweep.dir=outputs/multirun/" if multirun else "hydra.run.dir=outputs/runs/"
    lines = out.strip().splitlines()
    assert rc == 2 and "Traceback" not in out and len(lines) == 2, out
    assert lines[0].startswith(key) and lines[0].endswith(
        f" cannot be made or written: {project} is read-only for this user. Give a writable folder for Hydra's "
        f"job configs and logs: {key.split('=')[0]}=PATH"), out
    assert lines[1].startswith(f"Store error: the store {project}/outputs/mlflow.db cannot be written: {project} is "
                               "read-only for this user"), out
    assert not (project / "outputs").exists() and not (project / "multirun").exists()


@pytest.mark.parametrize("arg, quoted", [
    ("tracking.experiment=tëst", "tracking.experiment='tëst'"),
    ("study_kernel=café", "study_kernel='café'"),
    ("tracking.experiment=ü,a", "tracking.experiment='ü',a"),
    ("hydra.sweep.dir=/tmp/é", "hydra.sweep.dir='/tmp/é'"),
])
def test_unquoted_non_ascii_value_says_how_to_quote_it(tmp_path, run_checks, arg, quoted):
    """Hydra's answer was LexerNoViableAltException with no hint to quote the value."""
    rc, out = run_checks(tmp_path, "-m", arg, *store_args(tmp_path, new_store=True))
    assert rc == 2 and "Traceback" not in out and "LexerNoViableAltException" not in out, out
    assert out.strip() == (f"{arg!r}: Hydra reads a value with non-ASCII characters only in quotes; give {quoted} "
                           f"(in the shell: \"{quoted}\")")
    assert not (tmp_path / "mlflow.db").exists()


def test_quoted_non_ascii_values_are_tracked(tmp_path):
    """The quoted form the message gives works: the experiment, the store folder and study_kernel."""
    import mlflow
    db = tmp_path / "résultats" / "mlflow.db"
    rc, out = run_cli(tmp_path, "precision=int8", "problem.sizes=[512]", "tracking.experiment='tëst'",
                      "study_kernel='café'", f"tracking.uri='sqlite:///{db}'", f"hydra.run.dir={tmp_path}/out")
    assert rc == 0, out
    client = mlflow.MlflowClient(f"sqlite:///{db}")
    runs = client.search_runs([client.get_experiment_by_name("tëst").experiment_id])
    child = next(r for r in runs if "mlflow.parentRunId" in r.data.tags)
    assert child.data.params["study_kernel"] == "café" and child.data.tags["outcome"] == "static"


def test_without_a_gpu_every_next_step_points_to_the_static_table(static_sweep, module_cli):
    """experiments.reports.report, experiments.reports.performance and analysis.report exited 2 on a sweep of static
    runs and the notebooks printed "0 runs": each now names what the sweep holds and the command that
    tables its static runs, which the sweep prints too."""
    from analysis.runs import load_runs, unmeasured_note
    folder, rc, out = static_sweep
    assert rc == 0, out
    parents, children = all_runs(folder)
    uri, parent = f"sqlite:///{folder}/mlflow.db", parents[0].info.run_id
    command = (f"python -m experiments.report --static --uri {shlex.quote(uri)} --experiment cli-tests "
               f"--sweep {parent}")
    assert f"  as a table: {command}" in out.splitlines()
    rc, table, err = module_cli(*shlex.split(command)[2:], cwd=ROOT)   # python -m MODULE ARGS, in this process
    assert rc == 0, err
    rows = [line for line in table.splitlines() if line.startswith("| gemm_")]
    assert len(rows) == 2
    for r in children:
        row = next(line for line in rows if line.startswith(f"| {r.data.tags['kernel']} | sm_90 |"))
        assert f"| {r.data.metrics['registers']:.0f} |" in row and row.endswith(f"| {r.data.tags['mma_native']} |")
    for module in ("experiments.report", "experiments.performance", "analysis.report"):
        args = ["--uri", uri, "--experiment", "cli-tests"] + (["--no-log"] if module == "analysis.report" else [])
        rc, _, err = module_cli(module, *args, cwd=ROOT)
        assert rc == 2 and "2 static" in err and "Traceback" not in err, err
        assert "python -m experiments.report --static --uri " + shlex.quote(uri) in err, (module, err)
    note = unmeasured_note(load_runs(uri, "cli-tests", "latest"))
    assert note == (f"sweep {parent} of experiment 'cli-tests' in {uri} holds no run measured on a GPU (2 static): "
                    f"static runs are rendered and assembled only; their table: {command}")


@pytest.mark.parametrize("argv, message", [
    (["--cfg=all", "-cd", "conf", "experiment=l4_run1_fp16"],
     "# experiment=l4_run1_fp16 sweeps variant (6 values); this is one job's config with them at their defaults. "
     "The sweep: python run.py --cfg hydra -cd conf experiment=l4_run1_fp16 (hydra.sweeper.params); run it: "
     "python run.py -m -cd conf experiment=l4_run1_fp16"),
    (["-c", "hydra", "experiment=generations"], None),          # shows the sweep itself
    (["--help", "experiment=generations"], None),
    (["-m", "experiment=generations"], None),
    # a sweep over presets takes only the command line's sweep: each preset's own would be lost
    (["-m", "experiment=l4_run2_int8,methodology", "precision=int8"],
     "experiment=l4_run2_int8,methodology sweeps presets that define sweeps of their own (l4_run2_int8: variant "
     "(6 values); methodology: timing.regime (2 values), variant (3 values)): Hydra would run one job per preset "
     "with those keys at the config's default, none of the presets' kernels; nothing was run. Run each preset's "
     "sweep: python run.py -m precision=int8 experiment=l4_run2_int8; python run.py -m precision=int8 "
     "experiment=methodology"),
    (["-m", "experiment=l4_run2_int8,l4_run3_int4", "variant=int8_ptx_3stage"], None),   # the swept key given
    (["experiment=generations", "variant=gen_wgmma", "precision=fp16"], None),
    (["experiment=h200_performance", "variant=h200_perf_peak"],
     "experiment=h200_performance defines a sweep over precision (3 values); without -m Hydra would ignore it and "
     "run a single job with precision at the config's default: nothing was run. Run the sweep: python run.py -m "
     "experiment=h200_performance variant=h200_perf_peak   or one of its jobs: python run.py "
     "experiment=h200_performance variant=h200_perf_peak precision=fp16"),
])
def test_preset_sweep_check(argv, message):
    assert _run_module().check_preset_sweep(argv) == message


def test_the_static_table_of_a_failed_sweep_lists_its_kernels_and_why(tmp_path, module_cli):
    """The "as a table:" command a sweep prints exited 2 ("No static run in sweep ...") when every run
    failed (ptxas rejected the PTX) or was skipped: it now lists each kernel with its reason."""
    rc, out = run_cli(tmp_path, "-m", "target.ptx_version=9.9", *store_args(tmp_path))
    assert rc != 0 and "1 failed" in out, out
    [command] = [line.split("as a table: ", 1)[1] for line in out.splitlines() if "as a table: " in line]
    rc, table, err = module_cli(*shlex.split(command)[2:], cwd=ROOT)
    assert rc == 0 and "0 kernel(s), 1 failed" in table, (table, err)
    [_, children] = all_runs(tmp_path)
    [run] = children
    assert run.info.status == "FAILED" and run.data.tags["outcome"] == "failed"
    line = f"- {run.data.tags['kernel']} (sm_90): failed: ptxas "
    assert any(row.startswith(line) and row.endswith("Unsupported .version 9.9; current version is '9.0'")
               for row in table.splitlines()), table
    # a sweep whose runs were all skipped: each with its reason
    from experiments.store.track import Tracker
    tr = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "cli-tests", create=False)
    parent = tr.start("sweep skipped", {}, {"kind": "sweep", "sweep_key": "skipped-only"})
    tr.end(tr.start("skipped family=cublas precision=fp8_e4m3", {}, {"backend": "static"}, parent), "KILLED",
           "cuBLAS has no fp8 GEMM on sm_80")
    tr.log(tr.sweep_runs(parent)[0].info.run_id, tags={"outcome": "skipped"})
    tr.end(parent)
    rc, table, err = module_cli("experiments.report", "--static", "--uri", tr.uri, "--experiment", "cli-tests",
                                "--sweep", parent, cwd=ROOT)
    assert rc == 0 and "0 kernel(s), 1 skipped" in table, (table, err)
    assert "- skipped family=cublas precision=fp8_e4m3 (-): skipped: cuBLAS has no fp8 GEMM on sm_80" in table


def test_the_reports_of_a_sweep_of_static_runs_count_that_sweep_and_mark_what_it_reused(tmp_path, module_cli):
    """`report --static --sweep latest` after an overlapping sweep listed its kernels with no reused
    marker; `report --sweep latest` counted the whole store's static runs and dropped --sweep from the
    command it gave."""
    from experiments.store.track import MEMBER, Tracker
    tr = Tracker(empty_store_at(tmp_path / "m.db"), "e")
    sweeps = [tr.start(f"sweep {i}", {}, {"kind": "sweep", "sweep_key": f"k{i}"}) for i in range(2)]
    made = {}
    for kernel, sweep in (("gemm_int8_bk32", 0), ("gemm_int8_bk64", 0), ("gemm_int8_bk128", 1)):
        made[kernel] = tr.start(kernel, {}, {"backend": "static", "outcome": "static", "kernel": kernel,
                                             "arch": "sm_90", "mma_native": "true"}, sweeps[sweep])
        tr.log(made[kernel], {"registers": 128})
        tr.end(made[kernel])
    tr.client.set_tag(made["gemm_int8_bk64"], MEMBER.format(sweeps[1]), "reused")   # as Tracker.join does
    for rid in sweeps:
        tr.end(rid)
    rc, table, err = module_cli("experiments.report", "--static", "--uri", tr.uri, "--experiment", "e",
                                "--sweep", "latest", cwd=ROOT)
    assert rc == 0, err
    assert table.splitlines()[0].endswith(": 2 kernel(s) (1 reused from earlier sweeps)"), table
    assert "| gemm_int8_bk64 (reused) | sm_90 | 128 |" in table and "| gemm_int8_bk128 | sm_90 | 128 |" in table
    assert "bk32" not in table
    rc, out, err = module_cli("experiments.report", "--uri", tr.uri, "--experiment", "e", "--sweep", "latest",
                              cwd=ROOT)
    assert rc == 2 and f"No run in sweep {sweeps[1]} of {tr.uri} was measured on a GPU yet: 2 static run(s)" in err
    assert f"python -m experiments.report --static --uri {tr.uri} --experiment e --sweep {sweeps[1]} tables" in err
    rc, out, err = module_cli("experiments.report", "--uri", tr.uri, "--experiment", "e", "--sweep", "latest",
                              "--by-family", cwd=ROOT)
    assert rc == 2 and err == (f"No run in sweep {sweeps[1]} of {tr.uri} was measured on a GPU yet: 2 static run(s) "
                               "(rendered and assembled only): nothing to compare.\n"), err


@pytest.mark.parametrize("args, said", [
    (["-m", "precision=int8,"], "'precision=int8,': a value of the sweep is empty (a comma too many); give "
                                "precision=int8"),
    (["-m", "precision=int8", "ktile=,32,,64"], "'ktile=,32,,64': a value of the sweep is empty (a comma too "
                                                "many); give ktile=32,64"),
    (["-m", "precision=,"], "'precision=,': a value of the sweep is empty (a comma too many); give "
                            "precision=VALUE"),
    (["precision"], "'precision' has no value: write precision=VALUE (python run.py --help lists the keys and "
                    "their values)"),
    (["+ncu"], "'+ncu' has no value: write +ncu=VALUE (python run.py --help lists the keys and their values)"),
    (["precision:int8"], "'precision:int8' has no '=': write precision=int8"),
    # what is left once the comma is gone needs quotes: no fix that Hydra would refuse in turn
    (["-m", "tracking.experiment=tëst,"], "'tracking.experiment=tëst,': a value of the sweep is empty (a comma "
                                         "too many): remove it"),
    # an option's value is no override: the error is the override's ('precision'), not the folder's commas
    (["--config-dir={tmp}/a,,b", "precision"], "'precision' has no value: write precision=VALUE (python run.py "
                                              "--help lists the keys and their values)"),
])
def test_an_override_the_grammar_cannot_read_says_what_is_wrong_in_its_words(tmp_path, run_checks, args, said):
    """A trailing comma gave ANTLR's "mismatched input '<EOF>' expecting {':', BRACKET_OPEN, ...}", a key
    without '=' the advice to quote its value."""
    args = [a.format(tmp=tmp_path) for a in args]
    for a in args:
        if a.startswith("--config-dir="):
            (tmp_path / "a,,b").mkdir()
    rc, out = run_checks(tmp_path, *args, "backend=static", f"hydra.run.dir={tmp_path}/out")
    assert (rc, out.strip()) == (2, said)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("arg, quoted", [
    ("tracking.uri=sqlite:///~/x.db", 'tracking.uri="sqlite:///~/x.db"'),
    ("tracking.uri=sqlite:////tmp/a#b/m.db", 'tracking.uri="sqlite:////tmp/a#b/m.db"'),
])
def test_value_the_override_lexer_rejects_says_how_to_quote_it(tmp_path, run_checks, arg, quoted):
    """'~' (which the README advertises) and '#' unquoted ended in LexerNoViableAltException."""
    rc, out = run_checks(tmp_path, arg, "backend=static", f"hydra.run.dir={tmp_path}/out")
    assert rc == 2 and "LexerNoViableAltException" not in out, out
    assert out.strip() == (f"{arg!r}: Hydra reads this value only in quotes; give {quoted} "
                           f"(in the shell: '{quoted}')")
    assert _run_module()._parsed(quoted).value() == arg.split("=", 1)[1]
    assert not (tmp_path / "out").exists()


def test_restore_command_of_a_deleted_experiment_works_when_pasted(tmp_path):
    """The command was `mlflow experiments restore ...` with the store's URI beside it: pasted alone it
    made ./mlflow.db and failed. Now the printed line (the URI shell-quoted) restores it."""
    import subprocess

    import mlflow
    from experiments.store.track import StoreError, Tracker
    uri = f"sqlite:///{tmp_path}/a store/m.db"
    (tmp_path / "a store").mkdir()
    tr = Tracker(uri, "gone")
    tr.client.delete_experiment(tr.experiment_id)
    with pytest.raises(StoreError) as err:
        Tracker(uri, "gone")
    command = str(err.value).split("Restore it with: ", 1)[1].split(" ; ", 1)[0]
    assert command == (f"MLFLOW_TRACKING_URI={shlex.quote(uri)} mlflow experiments restore "
                       f"--experiment-id {tr.experiment_id}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(command, shell=True, cwd=elsewhere, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert mlflow.MlflowClient(uri).get_experiment(tr.experiment_id).lifecycle_stage == "active"
    assert list(elsewhere.iterdir()) == []


def test_unknown_sweep_names_the_store_in_the_mlflow_ui_command(tmp_path):
    from analysis.runs import RunsError, load_runs
    from experiments.store.track import Tracker
    uri = f"sqlite:///{tmp_path}/a store/m.db"
    (tmp_path / "a store").mkdir()
    Tracker(uri, "tensor-core-ablations")
    with pytest.raises(RunsError) as err:
        load_runs(uri, sweep="0123456789abcdef")
    assert f"mlflow ui --backend-store-uri {shlex.quote(uri)} or sweep='latest'" in str(err.value)


@pytest.mark.parametrize("buffered", [False, True])
def test_report_on_a_closed_stdout_exits_quietly(static_sweep, buffered):
    """`python -m experiments.report ... | head -1` ended in a BrokenPipeError traceback."""
    import os
    import subprocess
    import sys
    folder, rc, out = static_sweep
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED" or not buffered}
    proc = subprocess.Popen([sys.executable, "-m", "experiments.report", "--static", "--uri",
                             f"sqlite:///{folder}/mlflow.db", "--experiment", "cli-tests"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()                       # as `| head -1` does once it has its line
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 1 and err == "", err


@pytest.mark.parametrize("module", ["experiments.report", "experiments.performance", "analysis.report",
                                    "experiments.profile"])
@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")    # runpy, on a module imported before
def test_report_commands_share_the_closed_stdout_guard(module, monkeypatch):
    """Each report command's entry point runs its main() through experiments.cli.run_main."""
    import runpy

    import experiments.cli
    ran = []
    monkeypatch.setattr(experiments.cli, "run_main", lambda main: ran.append(main.__module__) or 7)
    with pytest.raises(SystemExit) as done:
        runpy.run_module(module, run_name="__main__")
    # a command module of experiments/ runs the main() of the stage package that holds it
    held = {"experiments.report": "experiments.reports.report", "experiments.performance":
            "experiments.reports.performance", "experiments.profile": "experiments.ncu.profile"}
    assert done.value.code == 7 and ran == [held.get(module, "__main__")]


def _parent_summary(tmp_path):
    parents, children = all_runs(tmp_path)
    assert len(parents) == 1
    return parents[0].data.tags["runs"], children


def test_parent_counts_each_measurement_once(tmp_path):
    """A kernel that failed twice read "2 failed"; a 2-job sweep with tracking.rerun=true run twice read
    "4 static": the parent counts the latest run of each measurement."""
    (tmp_path / "failed").mkdir()
    (tmp_path / "rerun").mkdir()
    for _ in range(2):
        rc, out = run_cli(tmp_path / "failed", "target.ptx_version=9.9", "backend=static", "ktile=32",
                          *store_args(tmp_path / "failed", False))
        assert rc == 1 and "Parent run" in out, out
    summary, children = _parent_summary(tmp_path / "failed")
    assert summary == "1 failed" and [c.info.status for c in children] == ["FAILED", "FAILED"]
    for _ in range(2):
        rc, out = run_cli(tmp_path / "rerun", "-m", "pipeline.stages=2,3", "backend=static", "ktile=32",
                          "tracking.rerun=true", *store_args(tmp_path / "rerun"))
        assert rc == 0, out
    summary, children = _parent_summary(tmp_path / "rerun")
    assert summary == "2 static" and len(children) == 4


@pytest.mark.parametrize("multirun", [False, True])
@pytest.mark.parametrize("args, message", [
    # a key the config does not have, at the top and in a node
    (["ktil=32"], "Unknown key 'ktil' ('ktil=32'); valid top-level keys: family, precision, ktile, mma, acc, "
                  "b_layout, smem_layout, backend, data, study_kernel, tile, loader, pipeline, cache, problem, "
                  "target, timing, launch, verify, tracking (python run.py --help)"),
    (["pipeline.stage=3"], "Unknown key 'pipeline.stage' ('pipeline.stage=3'); valid keys of pipeline: "
                           "pipeline.stages (python run.py --help)"),
    # a value of the wrong type, outside an Enum, a scalar for a list
    (["ktile=32.5"], "ktile=32.5 is not an integer ('ktile=32.5'); valid: 16, 32, 64, 128"),
    (["precision=int5"], "precision=int5 is not valid ('precision=int5'); valid: fp16, bf16, int8, int4, fp8_e4m3, "
                         "fp8_e5m2, copy (family=peak)"),
    (["tile.block=128"], "tile.block takes a list ('tile.block=128'); give one in brackets, e.g. "
                         "'tile.block=[256,128]'"),
    # a boolean given as 1: OmegaConf reads it as true, the typed field takes true or false only
    (["timing.l2_flush=1"], "timing.l2_flush=1 is not valid ('timing.l2_flush=1'); valid: true, false"),
    # a preset that does not exist; a family option the family does not have or a value it does not take
    (["tile=foo"], "tile=foo is not a preset ('tile=foo'); valid: 128x128, 128x128_w2x2, 128x256, 128x256_w4x4, "
                   "256x128, 256x128_w4x4, 64x64, auto, l4_32x64 (conf/tile/)"),
    (["family=cublas", "family.schedule=streamk"], "Unknown key 'family.schedule' ('family.schedule=streamk'); "
                                                   "family=cublas has no options; schedule is an option of "
                                                   "family=wgmma"),
    (["family=wgmma", "family.bn=100"], "family.bn=100 is not valid for family=wgmma ('family.bn=100'); valid: 256, 192, 128, 64"),
])
def test_bad_override_is_refused_before_anything_is_tracked(tmp_path, run_checks, args, message, multirun):
    """Each kind of bad override, alone and beside a sweep: exit 2, one line naming the key, the value
    and the valid values, and the store (already there) holds no run; no job folder was made. The check
    is Hydra's composition against the structured config plus the sweep's start check, not a parser of
    the command line."""
    sweep = ["-m", "precision=int8,fp16"] if multirun else []
    rc, out = run_checks(tmp_path, *sweep, *args, "backend=static", *store_args(tmp_path, multirun))
    assert (rc, out.strip()) == (2, message), out
    assert all_runs(tmp_path) == ([], []) and not (tmp_path / "out").exists()


@pytest.mark.parametrize("sweep, message", [
    ("ktile=32,32.5", "ktile=32.5 is not an integer ('ktile=32.5'); valid: 16, 32, 64, 128"),
    ("timing.l2_flush=false,1", "timing.l2_flush=1 is not valid ('timing.l2_flush=1'); valid: true, false"),
    ("variant=int8_wmma,nosuch", "variant=nosuch is not a preset ('variant=nosuch'); valid: "
     + ", ".join(sorted([*(p.stem for p in (ROOT / "conf" / "variant").glob("*.yaml")), *listed()]))
     + " (conf/variant/ and the variants conf/experiment/ presets list)"),
])
def test_bad_value_of_a_sweep_is_refused_before_its_parent_run_exists(tmp_path, run_checks, sweep, message):
    """A bad value among a sweep's values: Hydra composed that job only when it came to it, after the
    parent run was tracked (a parent without children, exit 1). Now the sweep's start composes every
    value, and refuses before the parent exists."""
    rc, out = run_checks(tmp_path, "-m", sweep, "backend=static", *store_args(tmp_path))
    assert (rc, out.strip()) == (2, message), out
    assert all_runs(tmp_path) == ([], []) and not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, message", [
    (["pipeline.stages=100"], "Invalid configuration: pipeline.stages=100 is not valid; valid values: 1 ... 65 "
                              "that fit shared memory (the main loop of S stages waits with cp.async.wait_group "
                              "S - 2, and its counter holds at most 63 pending groups)"),
    (["mma=M16N8K16"], "Invalid configuration: mma=M16N8K16 is not valid with precision=fp16; valid values: auto, "
                       "m16n8k8, m16n8k16; did you mean mma=m16n8k16?"),
    # both lists were named, the one that was right too
    (["tile.block=[128]"], "Invalid configuration: tile.block=[128] must be two integers (BM, BN), e.g. "
                           "tile.block=[128,128]\n"),
    (["tile.warps=[4]", "tile.block=[1,2,3]"], "Invalid configuration: tile.block=[1, 2, 3] must be two integers "
                                               "(BM, BN), e.g. tile.block=[128,128]; tile.warps=[4] must be two "
                                               "integers (warps along M and N), e.g. tile.warps=[2,4]\n"),
    (["tile.block=[100,128]"], "Invalid configuration: tile.block=[100, 128] with tile.warps=[4, 2] gives a warp "
                               "tile of 25x64; it must be a multiple of 16x8"),
    (["precision=int8", "mma=m16n8k64"], "Invalid configuration: mma=m16n8k64 is not valid with precision=int8; "
                                         "valid values: auto, m16n8k16, m16n8k32"),
    (["problem.sizes=[]"], "problem.sizes and problem.shapes are both empty; give at least one size, e.g. "
                           "'problem.sizes=[4096]'"),
    (["tile=auto", "problem.sizes=[]"], "problem.sizes and problem.shapes are both empty"),
    (["problem.sizes=[1000]"], "Invalid configuration: 1 of 1 problem sizes do not fit gemm_fp16_bk32_m16n8k16_"
                               "ldx4x2_cg_bcol_s3_256x128_w4x2_g8: 1000x1000x1000 (M=1000 is not a multiple of "
                               "BM=256;"),
])
def test_a_single_run_no_kernel_can_take_is_refused_before_anything_is_tracked(tmp_path, run_checks, args,
                                                                                 message):
    """Without -m, a combination the family's spec refuses (or no size at all) stopped after the sweep's
    start had opened the store and printed "Tracking 1 job(s)", with exit 1. Now it is refused with the
    sweep's other checks: exit 2, one line, no run in the store."""
    rc, out = run_checks(tmp_path, *args, "backend=static", *store_args(tmp_path, False))
    assert rc == 2 and out.lstrip().startswith(message) and "Tracking" not in out, out
    assert all_runs(tmp_path) == ([], [])


def test_a_sweep_without_sizes_is_refused_but_peak_needs_none(tmp_path, run_checks):
    """'problem.sizes=[]' in a sweep left every job a skipped run; the peak family ignores sizes."""
    rc, out = run_checks(tmp_path, "-m", "precision=int8,fp16", "problem.sizes=[]", "backend=static",
                         *store_args(tmp_path))
    assert (rc, out.strip()) == (2, "problem.sizes and problem.shapes are both empty; give at least one size, "
                                    "e.g. 'problem.sizes=[4096]'"), out
    assert all_runs(tmp_path) == ([], [])
    rc, out = run_cli(tmp_path, "-m", "family=peak", "family.instruction=mma_sync", "precision=int8",
                      "problem.sizes=[]", "backend=static", *store_args(tmp_path))
    assert rc == 0 and len(all_runs(tmp_path)[1]) == 1, out
