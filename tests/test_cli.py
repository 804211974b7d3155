"""run.py end to end without a GPU: Hydra sweeps, static runs in MLflow, errors before any work."""
import atexit
import functools
import locale
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from experiments.runner.variants import listed

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENT = "cli-tests"

pytestmark = pytest.mark.usefixtures("need_ptxas")


def _cli_env(env=None) -> dict:
    """The environment of ``run_cli``: ``env`` (default: this process's) with every GPU hidden."""
    env = dict(os.environ if env is None else env)
    for key in ("MLFLOW_TRACKING_URI", "HYDRA_FULL_ERROR"):
        env.pop(key, None)
    env["CUDA_VISIBLE_DEVICES"] = ""     # the same static path on machines with and without a GPU
    return env


# read when a module is imported or the interpreter starts: a command with other values than the
# zygote's needs a fresh interpreter
_START_ENV = ("PYTHON", "MPL", "HOME", "XDG_", "LC_", "LANG", "CUDA_", "NVIDIA_", "LD_")
_ZYGOTE = []
_ZYGOTE_LOCK = threading.Lock()


def _start_settings(env: dict, module) -> dict:
    """The variables of ``env`` that a new interpreter reads at start-up. A PYTHONPATH of only this
    checkout changes nothing for run.py, whose folder it is (first on sys.path already); the command's
    own child processes (Slurm tasks) still get it from ``env``."""
    got = {k: v for k, v in env.items() if k.startswith(_START_ENV)}
    if module is None and not [p for p in got.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(ROOT)]:
        got.pop("PYTHONPATH", None)
    return got


def _zygote(env, module=None):
    """This process's zygote (tests/zygote.py), started with run_cli's environment, or None when ``env``
    differs from that in a start-up setting (the command needs a fresh interpreter)."""
    from zygote import Zygote
    if not _ZYGOTE:
        _ZYGOTE.append(Zygote(_cli_env()))
        atexit.register(_ZYGOTE[0].close)
    if _start_settings(env, module) != _start_settings(_ZYGOTE[0].env, module):
        return None
    return _ZYGOTE[0]


def _zygote_run(cwd, args, env, timeout, prelude=None):
    """(status, output) from this process's zygote, or None when it cannot take the command: another
    thread is using it, or ``env`` differs from its own in a start-up setting."""
    if not _ZYGOTE_LOCK.acquire(blocking=False):
        return None
    try:
        if (zygote := _zygote(env)) is None:
            return None
        rc, data = zygote.run(cwd, args, env, timeout, prelude)
    finally:
        _ZYGOTE_LOCK.release()
    # as subprocess.run(text=True) decodes it
    text = data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")
    return rc, text


def popen_cli(cwd, *args, env=None, module=None, start_new_session=False):
    """``python run.py ARGS`` (``python -m MODULE ARGS``) started in ``cwd`` and not waited for, with the
    environment ``env`` (default: run_cli's); what ``subprocess.Popen(..., text=True, stdout=PIPE,
    stderr=STDOUT)`` returns. Forked from this process's zygote when it can take the command (as
    run_cli), else a new interpreter."""
    env = _cli_env() if env is None else env
    zygote = _zygote(env, module)
    if zygote is not None:
        return zygote.popen(cwd, args, env, module, start_new_session)
    command = [str(ROOT / "run.py")] if module is None else ["-m", module]
    return subprocess.Popen([sys.executable, *command, *map(str, args)], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=start_new_session)


def run_cli(cwd, *args, env=None, timeout=300, fresh=False, prelude=None):
    """``python run.py ARGS`` in ``cwd`` with every GPU hidden; stdout and stderr together.

    Forked from a process that has run.py's imports done (tests/zygote.py: the same output and
    status, seconds less CPU each); ``fresh``: a new interpreter, for what needs one (signals,
    interpreter options, the start-up itself). ``prelude``: Python code run first in that process
    (it patches a module to inject a fault), as ``python -c 'PRELUDE; run run.py' ARGS``."""
    env = _cli_env(env)
    if not fresh and (done := _zygote_run(cwd, args, env, timeout, prelude)) is not None:
        return done
    command = [str(ROOT / "run.py")] if prelude is None else ["-c", _prelude_script(prelude)]
    proc = subprocess.run([sys.executable, *command, *args], cwd=cwd, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    return proc.returncode, proc.stdout


def _prelude_script(prelude: str) -> str:
    """A ``python -c`` script: ``prelude``, then run.py as ``__main__`` with the script's arguments."""
    return (f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n{prelude}\nimport runpy\n"
            f"sys.argv = [{str(ROOT / 'run.py')!r}, *sys.argv[1:]]\n"
            f"runpy.run_path({str(ROOT / 'run.py')!r}, run_name='__main__')\n")


@functools.lru_cache(maxsize=1)
def _empty_store() -> Path:
    """A SQLite store with MLflow's schema, made once per test run: copying it spares each test the
    migration. It lies in the test run's shared folder (conftest: TC_TOOL_CACHE), made by the first
    xdist worker that needs it while the others wait; in a folder of this process without one."""
    import mlflow
    from filelock import FileLock
    shared = os.environ.get("TC_TOOL_CACHE")
    folder = Path(shared) / "empty_store" if shared else Path(tempfile.mkdtemp(prefix="empty_store_"))
    folder.mkdir(exist_ok=True)
    db = folder / "mlflow.db"
    with FileLock(str(folder / "make.lock")):
        if not db.exists():
            made = folder / "new.db"
            made.unlink(missing_ok=True)
            mlflow.MlflowClient(f"sqlite:///{made}").search_experiments()
            made.rename(db)
    return db


def empty_store_at(db) -> str:
    """The URI of a copy of the empty store at ``db`` (a store with MLflow's schema: no migration to
    run), made unless ``db`` exists; for tests about what is logged, not how a store is made."""
    db = Path(db)
    if not db.exists():
        db.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(_empty_store(), db)
    return f"sqlite:///{db}"


def logging_ptxas(folder) -> tuple[Path, Path]:
    """A ptxas (for ``$PTXAS``) in ``folder`` that appends each command line it gets to folder/ptxas.log,
    then runs the test run's ptxas: (the wrapper, the log)."""
    from experiments.build.assemble import find_ptxas
    wrapper, log = Path(folder) / "logging_ptxas", Path(folder) / "ptxas.log"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {find_ptxas()} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper, log


def store_args(tmp, multirun=True, new_store=False):
    """Overrides that put the store (a copy of an empty one unless ``new_store``) and the Hydra
    output folder into ``tmp``."""
    uri = f"sqlite:///{tmp}/mlflow.db"
    if not new_store and not (Path(tmp) / "mlflow.db").exists():
        shutil.copy(_empty_store(), Path(tmp) / "mlflow.db")
    out = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    return [f"tracking.uri={uri}", f"tracking.experiment={EXPERIMENT}", f"{out}={tmp}/out"]


def all_runs(tmp):
    """(parent runs, child runs) of the store in ``tmp``."""
    import mlflow
    client = mlflow.MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    exp = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([exp.experiment_id], max_results=1000) if exp else []
    parents = [r for r in runs if r.data.tags.get("kind") == "sweep"]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) + len(children) == len(runs)
    return parents, children


MMA_K64_INT8 = "mma=m16n8k64 is not valid with precision=int8"

# mma=auto: the largest native K that divides ktile
AUTO_MMA = {("int4", "32"): "m16n8k32", ("int4", "64"): "m16n8k64",
            ("int8", "32"): "m16n8k32", ("int8", "64"): "m16n8k32"}


@pytest.fixture(scope="module")
def headline(tmp_path_factory):
    """The README's sweep, run twice into the same store; the store is read after each run. ptxas is a
    wrapper that writes each command line it gets to ``ptxas.log``; the second run's lines follow a
    line ``--- again``."""
    tmp = tmp_path_factory.mktemp("headline")
    args = ["-m", "precision=int4,int8", "ktile=32,64", *store_args(tmp)]
    wrapper, log = logging_ptxas(tmp)
    env = {**os.environ, "PTXAS": str(wrapper)}
    first = run_cli(tmp, *args, env=env)
    after_first = all_runs(tmp)
    with open(log, "a") as f:
        f.write("--- again\n")
    second = run_cli(tmp, *args, env=env)
    after_second = all_runs(tmp)
    return tmp, first, after_first, second, after_second


def test_headline_sweep(headline):
    tmp, (rc, out), (parents, children), _, _ = headline
    assert rc == 0, out
    assert "No NVIDIA GPU found" in out
    assert f"Tracking 4 job(s) in sqlite:///{tmp}/mlflow.db" in out
    for i in range(1, 5):
        assert f"[{i}/4] gemm_" in out
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.status == "FINISHED" and parent.data.tags["jobs"] == "4"
    assert len(children) == 4
    seen = set()
    for r in children:
        p, t, m = r.data.params, r.data.tags, r.data.metrics
        assert r.info.status == "FINISHED"
        assert t["mlflow.parentRunId"] == parent.info.run_id
        assert t["backend"] == "static" and t["ptxas"] == "ok"
        assert m["registers"] > 0
        assert m["spill_stores_bytes"] >= 0 and 0 < m["theoretical_occupancy_pct"] <= 100
        key = (p["precision"], p["ktile"])
        seen.add(key)
        assert p["spec.mma"] == AUTO_MMA[key]
        assert t["kernel"].startswith(f"gemm_{key[0]}_bk{key[1]}_{AUTO_MMA[key]}_ldx4x2_")
        mark = "EMULATED " if t.get("mma_native") == "false" else ""     # int4 on sm_90: ptxas' emulation
        assert r.info.run_name == f"{mark}{key[0]} bk{key[1]} {AUTO_MMA[key]} s3 256x128"   # no size: static
        note = t["mlflow.note.content"]
        assert t["outcome"] == "static" and note.startswith("EMULATED MMA (" if mark else "Assembled for sm_90")
        assert "Assembled for sm_90 (no GPU: not run)" in note
        assert not any(k.startswith("tracking.") for k in p)
        assert len(t["ptx_sha256"]) == 64
    assert seen == set(AUTO_MMA)


def test_headline_again_tracks_nothing_new(headline):
    tmp, _, (_, first_children), (rc, out), (parents, children) = headline
    assert rc == 0, out
    assert out.count("already tracked") == 4
    # the kernels it measured are not built again: ptxas is asked its version only (the run key's part)
    first, again = (tmp / "ptxas.log").read_text().split("--- again\n")
    assert sum("-arch=sm_90" in line for line in first.splitlines()) == 4, first
    assert set(again.splitlines()) <= {"--version"}, again
    assert sorted(r.info.run_id for r in children) == sorted(r.info.run_id for r in first_children)
    assert len(parents) == 1          # no second, empty parent
    # where the results are, as the first run said it: the re-run of a finished sweep printed only the line
    # that nothing was tracked
    parent, uri = parents[0].info.run_id, f"sqlite:///{tmp}/mlflow.db"
    tail = out[out.index("Nothing new was tracked"):].splitlines()
    assert tail[:4] == ["Nothing new was tracked: every run of this sweep is already in the store.",
                        f"Parent run {parent}: 4 static.",
                        f"Browse the results:  mlflow ui --backend-store-uri {uri}",
                        f"  this sweep: http://127.0.0.1:5000/#/experiments/{parents[0].info.experiment_id}/runs"
                        f"?viewStateShareKey={parent}&workflowType=machine_learning"], out
    assert tail[5] == (f"  as a table: python -m experiments.report --static --uri {uri} --experiment {EXPERIMENT} "
                       f"--sweep {parent}"), out
    # and that its int4 kernels run ptxas' emulation, as the first run said (the re-run left it out)
    assert tail[6].startswith("Note: 2 kernel(s) of this sweep run an emulated MMA on their target"), out


@pytest.mark.parametrize("override, texts", [
    # Hydra's own messages for these suggested appending the key with '+', which hid the typo
    ("ktile=32.5", ["ktile=32.5 is not an integer ('ktile=32.5'); valid: 16, 32, 64, 128"]),
    ("ktile=abc", ["ktile=abc is not an integer ('ktile=abc'); valid: 16, 32, 64, 128"]),
    ("tile.sms=1.5", ["tile.sms=1.5 is not an integer ('tile.sms=1.5')"]),
    ("precision=int5", ["precision=int5 is not valid ('precision=int5'); valid: fp16, bf16, int8, int4, "
                        "fp8_e4m3, fp8_e5m2, copy (family=peak)"]),
    ("precsion=int8", ["Unknown key 'precsion' ('precsion=int8'); valid top-level keys: family, precision, "
                       "ktile, mma, acc, b_layout, smem_layout, backend, data, study_kernel, tile, loader, pipeline, "
                       "cache, problem, target, timing, launch, verify, tracking (python run.py --help)"]),
    ("+foo=1", ["Unknown key 'foo' (added with '+'); valid top-level keys: family, precision, ktile,"]),
    ("pipeline.stage=3", ["Unknown key 'pipeline.stage' ('pipeline.stage=3'); valid keys of pipeline: "
                          "pipeline.stages (python run.py --help)"]),
    ("+tile.blok=[128,128]", ["Unknown key 'tile.blok' (added with '+'); valid keys of tile: tile.block, "
                              "tile.warps, tile.group_m, tile.auto, tile.sms (python run.py --help)"]),
    ("family.bn=128", ["Unknown key 'family.bn' ('family.bn=128'); family=mma_sync has no options (the root keys "
                       "set it); bn is an option of family=wgmma"]),
])
def test_bad_override_stops_before_any_run(tmp_path, override, texts):
    rc, out = run_cli(tmp_path, "-m", override, "pipeline.stages=1,2", *store_args(tmp_path, new_store=True))
    assert rc == 2 and "Traceback" not in out, out
    for text in texts:
        assert text in out, out
    assert not (tmp_path / "mlflow.db").exists()
    assert "Launching" not in out


def test_unknown_option_of_the_chosen_family_names_its_options(tmp_path, run_checks):
    rc, out = run_checks(tmp_path, "family=wgmma", "family.foo=1", *store_args(tmp_path, new_store=True))
    assert rc == 2 and "Traceback" not in out
    assert ("Unknown key 'family.foo' ('family.foo=1'); family=wgmma has the options: bn, consumers, producer, "
            "stages, swizzle, persistent, order, group, epilogue, cluster, schedule") in out
    assert not (tmp_path / "mlflow.db").exists()
    # a family option in a sweep over families: Hydra failed the whole sweep naming MmaSyncConf
    rc, out = run_cli(tmp_path, "-m", "family=wmma,wgmma", "family.bn=128", *store_args(tmp_path, new_store=True))
    assert rc == 2 and ("'family.bn=128' sets an option of wgmma in a sweep over several families "
                        "(family=wmma,wgmma): each job's family takes only its own options") in out
    # a value outside the option's own values names them (OmegaConf's message did not)
    rc, out = run_cli(tmp_path, "-m", "family=wgmma", "family.bn=128,256.0", *store_args(tmp_path, new_store=True))
    assert rc == 2 and "family.bn=256.0 is not an integer ('family.bn=256.0'); valid: 256, 192, 128, 64" in out
    assert not (tmp_path / "mlflow.db").exists()


def test_impossible_single_run_fails_with_the_reason(tmp_path):
    rc, out = run_cli(tmp_path, "precision=int8", "mma=m16n8k64", *store_args(tmp_path, False))
    assert rc != 0
    assert MMA_K64_INT8 in out and "valid values: auto, m16n8k16, m16n8k32" in out, out
    parents, children = all_runs(tmp_path)
    assert children == [] and parents == []        # nothing in the store
    assert not list((tmp_path / "out").glob("*.ptx"))


def test_impossible_combination_in_a_sweep_is_skipped(tmp_path):
    rc, out = run_cli(tmp_path, "-m", "precision=int8", "ktile=32", "mma=m16n8k32,m16n8k64",
                      *store_args(tmp_path))
    assert rc == 0, out
    assert "[2/2] skipped" in out
    parents, children = all_runs(tmp_path)
    assert len(parents) == 1 and len(children) == 2
    by_status = {r.info.status: r for r in children}
    by_outcome = {r.data.tags["outcome"]: r for r in children}
    assert sorted(by_status) == ["FINISHED"] and sorted(by_outcome) == ["skipped", "static"]
    done, skipped = by_outcome["static"], by_outcome["skipped"]
    assert done.data.params["spec.mma"] == "m16n8k32"
    assert done.data.tags["kernel"].startswith("gemm_int8_bk32_m16n8k32_")
    assert skipped.data.params["mma"] == "m16n8k64"
    reason = skipped.data.tags["skip_reason"]
    assert MMA_K64_INT8 in reason and reason.endswith("valid values: auto, m16n8k16, m16n8k32")
    assert skipped.data.tags["backend"] == "static"
    assert skipped.data.metrics == {}
    assert skipped.info.run_name == "skipped precision=int8 ktile=32 mma=m16n8k64"
    assert skipped.data.tags["mlflow.note.content"].startswith("Skipped, not a failure: ")


def test_without_ptxas_and_ktile_with_leading_zero(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PTXAS"}
    env["PATH"] = str(empty)
    rc, out = run_cli(tmp_path, "precision=fp16", "ktile=032", *store_args(tmp_path, False), env=env)
    assert rc == 0, out
    assert "ptxas was not found" in out and "nvidia-cuda-nvcc" in out
    parents, children = all_runs(tmp_path)
    assert len(parents) == 1 and len(children) == 1
    r = children[0]
    assert r.info.status == "FINISHED"
    assert r.data.tags["ptxas"] == "missing" and r.data.tags["backend"] == "static"
    # ktile=032 is the integer 32
    assert r.data.params["ktile"] == "32" and r.data.params["spec.mma"] == "m16n8k16"
    assert r.data.tags["kernel"].startswith("gemm_fp16_bk32_m16n8k16_")
    assert "registers" not in r.data.metrics and r.data.metrics["threads"] > 0


def test_help(tmp_path):
    rc, out = run_cli(tmp_path, "--help")
    assert rc == 0, out
    assert "\nprecision: " in out and "\nktile: " in out
    tile_line = next(x for x in out.splitlines() if x.startswith("tile: "))
    presets = sorted(p.stem for p in (ROOT / "conf" / "tile").glob("*.yaml"))
    assert len(presets) >= 5
    for name in presets:
        assert name in tile_line.split(": ", 1)[1].split(", "), tile_line
    assert "python run.py -m precision=int4,int8 ktile=32,64" in out
    assert "Another family's options (family.*) and their values: python run.py family=peak --help" in out
    # only groups a command line can select (not the ncu metric sets, not the family schemas)
    groups = out.split("== Config groups (presets) ==", 1)[1].split("== Options of family", 1)[0]
    assert [line.split(":")[0] for line in groups.strip().splitlines()] == [
        "family", "tile", "problem", "experiment", "variant", "hydra/launcher", "hydra/sweeper"]
    # the default family's options are the root keys: listed with their values
    root = out.split("== Options of family=mma_sync", 1)[1].split("== Settings of every family", 1)[0]
    assert "(none: family=mma_sync is set by the root keys; their values, defaults in the config below:)" in root
    for line in ("  smem_layout: padded | swizzled", "  loader.b: x1 | x2 | x4 | manual",
                 "  pipeline.stages: 1 ... 65 (what shared memory allows)", "  mma: auto | m16n8k8 | m16n8k16 | "
                 "m16n8k32 | m16n8k64", "  cache.l2_hint_a: none | evict_first | evict_last | evict_normal"):
        assert line in root.splitlines(), (line, root)
    # the settings every family takes: their values were only in the errors a wrong one gave
    shared = out.split("== Settings of every family (valid values, the default first) ==", 1)[1]
    shared = [line.strip() for line in shared.split("== Config ", 1)[0].strip().splitlines()]
    assert shared[:2] == ["data: full | uniform | normal | zeros | sparse | constant",
                          "timing.regime: sustained | burst"], shared
    assert [line.split(":")[0] for line in shared] == ["data", "timing.regime", "timing.repeats",
                                                      "launch.blocks_per_sm"]
    assert list(tmp_path.iterdir()) == []


def test_help_lists_a_family_options_and_values(tmp_path):
    """--help printed the chosen family's defaults only: family.schedule=streamk appeared nowhere."""
    from experiments import families
    rc, out = run_cli(tmp_path, "family=wgmma", "--help")
    assert rc == 0, out
    options = out.split("== Options of family=wgmma (family.<option>=<value>; valid values, the default "
                        "first) ==", 1)[1].split("== Settings of every family", 1)[0].strip().splitlines()
    assert options[0] == "bn: 256 (default), 192, 128, 64"
    assert "schedule: tiles (default), streamk" in options and "epilogue: registers (default), tma" in options
    assert len(options) == len(families.get("wgmma").axes) - 1


@pytest.mark.parametrize("args, precision", [(("--cfg", "job", "precision=int4", "ktile=032"), "int4"),
                                             (("ktile=32", "--cfg", "job"), "fp16")])
def test_cfg_job(tmp_path, args, precision):
    rc, out = run_cli(tmp_path, *args)
    assert rc == 0, out
    lines = out.splitlines()
    assert f"precision: {precision}" in lines and "ktile: 32" in lines
    assert list(tmp_path.iterdir()) == []


@functools.lru_cache(maxsize=1)
def _run_module():
    """run.py imported as a module (its checks run before Hydra, so they are called directly)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("run_main", ROOT / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _refusal(argv):
    """The line ``python run.py ARGV`` is refused with before any work (None: it is not): Hydra composes
    the config in this process as run.py's Hydra does (a sweep: each job's values, at the sweep's
    start), through run.py's error report and experiments.runner.validate.check."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    from experiments.runner.validate import Invalid, check
    multirun = "-m" in argv
    overrides = [a for a in argv if not a.startswith("-")]

    def compose():
        with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
            cfg = GlobalHydra.instance().config_loader().load_configuration(
                "config", overrides, RunMode.MULTIRUN if multirun else RunMode.RUN)
            check(cfg, multirun)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(sys, "argv", ["run.py", *argv])
            _run_module()._reported(compose)
    except Invalid as exc:
        return str(exc)
    return None


def _compose(*overrides):
    from hydra import compose, initialize_config_dir

    from experiments.config import register
    from experiments.runner.variants import register as register_variants
    register()
    register_variants()                 # the variants conf/experiment/ lists (variant=gen_wgmma, ...)
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


INT9 = ("precision=int9 is not valid ('precision=int9'); valid: fp16, bf16, int8, int4, fp8_e4m3, fp8_e5m2, "
        "copy (family=peak)")


@pytest.mark.parametrize("args, message", [
    # Hydra's traceback, exit 1, for a value it cannot compose
    (("--help", "precision=int9"), INT9),
    (("precision=int9", "--help"), INT9),
    (("-m", "precision=int4,int9", "--help"), INT9),
    (("family=foo", "--help"),
     "family=foo is not a preset ('family=foo'); valid: cublas, dp4a, mma_sync, peak, wgmma, wmma (conf/family/)"),
    # the help, exit 0, for a value the run refuses
    (("ktile=48", "--help"), "ktile=48 is not valid ('ktile=48'); valid: 16, 32, 64, 128"),
    (("family=wgmma", "family.bn=100", "--help"),
     "family.bn=100 is not valid for family=wgmma ('family.bn=100'); valid: 256, 192, 128, 64"),
    # the config, exit 0
    (("--cfg", "job", "ktile=48"), "ktile=48 is not valid ('ktile=48'); valid: 16, 32, 64, 128"),
    (("--cfg", "all", "family=wgmma", "family.bn=100"),
     "family.bn=100 is not valid for family=wgmma ('family.bn=100'); valid: 256, 192, 128, 64"),
    (("--cfg", "job", "precision=copy"),
     "precision=copy is not valid for family=mma_sync; valid: fp16, bf16, int8, int4, fp8_e4m3, fp8_e5m2 "
     "(copy is a precision of family=peak)"),
    (("tile=null", "--help"),
     "'tile=null': tile takes one preset's name; valid: 128x128, 128x128_w2x2, 128x256, 128x256_w4x4, "
     "256x128, 256x128_w4x4, 64x64, auto, l4_32x64"),
    (("--hydra-help", "ktile=48"), "ktile=48 is not valid ('ktile=48'); valid: 16, 32, 64, 128"),
    (("--cfg", "job", "tile.block=[100,128]"),
     "Invalid configuration: tile.block=[100, 128] with tile.warps=[4, 2] gives a warp tile of 25x64; it must "
     "be a multiple of 16x8 (m16n8 MMA tiles). Valid examples: block [128,128] warps [2,4]; [64,64] [2,2]."),
])
def test_help_and_cfg_refuse_what_the_run_refuses(tmp_path, run_checks, args, message):
    """--help and --cfg show the config the command would run: a config the run refuses is refused the
    same way, one line and exit 2, before anything is shown."""
    rc, out = run_checks(tmp_path, *args)
    assert (rc, out.splitlines()) == (2, [message])
    rc, out = run_checks(tmp_path, *(a for a in args if a not in ("--help", "--hydra-help", "--cfg", "job",
                                                                  "all")))
    assert (rc, out.splitlines()) == (2, [message])          # the run's own refusal
    assert list(tmp_path.iterdir()) == []


def test_cfg_of_a_preset_sweep_says_nothing_before_it_refuses(tmp_path, run_checks):
    """The comment line on the preset's sweep came on stdout before the refusal."""
    rc, out = run_checks(tmp_path, "experiment=l4_run1_fp16", "ktile=48", "--cfg", "job")
    assert (rc, out.splitlines()) == (2, ["ktile=48 is not valid ('ktile=48'); valid: 16, 32, 64, 128"])
    rc, out = run_checks(tmp_path, "experiment=l4_run1_fp16", "--cfg", "job")
    assert rc == 0 and out.startswith("# experiment=l4_run1_fp16 sweeps variant (6 values); ")
    assert "\nktile: 32\n" in out


GROUP_VALUE = "{arg!r}: {group} takes one preset's name; valid: {valid}"
TILES = "128x128, 128x128_w2x2, 128x256, 128x256_w4x4, 256x128, 256x128_w4x4, 64x64, auto, l4_32x64"
FAMILIES = "cublas, dp4a, mma_sync, peak, wgmma, wmma"


@pytest.mark.parametrize("args, arg, group, valid", [
    # Hydra: "ValueError: Config group override must be a string or a list", a traceback
    (["tile=null"], "tile=null", "tile", TILES),
    (["-m", "family=5"], "family=5", "family", FAMILIES),
    (["experiment=1.5"], "experiment=1.5", "experiment", None),
    # a list is several presets at once to Hydra: a TypeError's traceback, or a run of no family (exit 0)
    (["problem=[1,2]"], "problem=[1,2]", "problem", "default, small"),
    (["family=[]"], "family=[]", "family", FAMILIES),
    (["-m", "tile=64x64,[1]"], "tile=64x64,[1]", "tile", TILES),
    # a path into another group: a run of the tile's keys under family (exit 0)
    (["family=../tile/64x64"], "family=../tile/64x64", "family", FAMILIES),
    (["family=''"], "family=''", "family", FAMILIES),
])
def test_a_config_group_takes_one_preset_name(tmp_path, run_checks, args, arg, group, valid):
    from experiments.runner.variants import listed  # noqa: F401 - run.py's presets, as --help lists them
    valid = valid or ", ".join(_run_module().presets(group))
    message = GROUP_VALUE.format(arg=arg, group=group, valid=valid)
    for flags in ((), ("--help",), ("--cfg", "job")):
        if flags and "-m" in args and flags[0] == "--cfg":
            continue
        rc, out = run_checks(tmp_path, *args, *flags)
        assert (rc, out.splitlines()) == (2, [message]), flags
    assert list(tmp_path.iterdir()) == []


def test_an_override_without_a_key_says_so(tmp_path, run_checks):
    for arg in ("=5", "+=5"):
        rc, out = run_checks(tmp_path, arg)
        assert (rc, out.splitlines()) == (2, [f"{arg!r} has no key; give key=value (python run.py --help lists "
                                              "the keys)"])


@pytest.mark.parametrize("group, name, data, problem", [
    # each was a traceback: yaml.parser.ParserError, OSError 'Invalid loaded object type: int',
    # UnicodeDecodeError; a key given twice blamed another file of the folder
    ("variant", "broken", b"ktile: [48\n",
     "is not valid YAML: expected ',' or ']', but got '<stream end>' at line 2, column 1; fix the file"),
    ("tile", "scalar", b"5\n", "holds one value (int), not a mapping of keys to values; fix the file"),
    ("tile", "binary", b"\xff\xfe\n", "is not UTF-8 text (byte 0); a preset is a YAML file"),
    ("tile", "dup", b"block: [64,64]\nblock: [64,64]\n",
     "is not valid YAML: found duplicate key block at line 2, column 1; fix the file"),
])
def test_a_preset_file_that_does_not_load_is_named_with_why(tmp_path, run_checks, group, name, data, problem):
    """The same line from a run, --help and --cfg, with a file that does not load beside it."""
    (tmp_path / "cd" / group).mkdir(parents=True)
    (path := tmp_path / "cd" / group / f"{name}.yaml").write_bytes(data)
    (tmp_path / "cd" / group / "aaa.yaml").write_text("ktile: [48\n")        # not the one chosen
    for flags in ((), ("--help",), ("--cfg", "job")):
        rc, out = run_checks(tmp_path, f"{group}={name}", "--config-dir", str(tmp_path / "cd"), *flags)
        assert (rc, out.splitlines()) == (2, [f"{path} {problem}"]), flags


@pytest.mark.parametrize("group, data, problem", [
    # the run crashed in check_preset_sweep (AttributeError: 'list' object has no attribute 'get')
    ("experiment", "- 1\n- 2\n", "holds one value (list), not a mapping of keys to values; fix the file"),
    # a family's scalar ran the default family, exit 0, and --help crashed on ${family.name}
    ("family", "hello\n", "holds one value (str), not a mapping of keys to values; fix the file"),
    # 'Merge error: list is not a subclass of TileConf', without the file
    ("tile", "- 1\n- 2\n", "holds one value (list), not a mapping of keys to values; fix the file"),
])
def test_a_chosen_preset_that_is_no_mapping_is_named(tmp_path, run_checks, group, data, problem):
    (tmp_path / "cd" / group).mkdir(parents=True)
    (path := tmp_path / "cd" / group / "x.yaml").write_text(data)
    for flags in ((), ("--help",), ("--cfg", "job")):
        rc, out = run_checks(tmp_path, f"{group}=x", "--config-dir", str(tmp_path / "cd"), *flags)
        assert (rc, out.splitlines()) == (2, [f"{path} {problem}"]), flags


def test_a_family_preset_without_a_family_name_is_refused(tmp_path, run_checks):
    """An empty family preset ran the default family (exit 0) and --help crashed on ${family.name}."""
    (tmp_path / "cd" / "family").mkdir(parents=True)
    (tmp_path / "cd" / "family" / "x.yaml").write_text("")
    for flags in ((), ("--help",), ("--cfg", "job")):
        rc, out = run_checks(tmp_path, "family=x", "--config-dir", str(tmp_path / "cd"), *flags)
        assert (rc, out.splitlines()) == (2, [
            "family=x names no family (no family.name): a family preset starts from a family's schema, as those "
            "of conf/family/ do (defaults: [/schema/family/NAME@_here_, _self_]); families: mma_sync, wmma, "
            "dp4a, cublas, peak, wgmma"]), flags


def test_an_experiment_file_that_does_not_load_stops_every_command(tmp_path, run_checks):
    """Every command reads the experiment presets' variant lists: a broken one was a traceback in each,
    also when another preset was chosen."""
    (tmp_path / "cd" / "experiment").mkdir(parents=True)
    (path := tmp_path / "cd" / "experiment" / "broken.yaml").write_text("# @package _global_\nktile: [48\n")
    for args in ((), ("--help",), ("experiment=l4_run1_fp16", "--cfg", "job")):
        rc, out = run_checks(tmp_path, *args, "--config-dir", str(tmp_path / "cd"))
        assert (rc, out.splitlines()) == (2, [f"Invalid preset: {path} is not valid YAML: expected ',' or ']', "
                                              "but got '<stream end>' at line 3, column 1; fix the file"])


@pytest.mark.parametrize("text, key, valid", [
    ("timing:\n  foo: 1\n", "timing.foo", "valid keys of timing: timing.warmup, timing.batches, "),
    ("foo: 1\n", "foo", "valid top-level keys: family, precision, ktile, ")])
def test_a_preset_key_the_config_lacks_is_named_where_it_is(tmp_path, run_checks, text, key, valid):
    """A preset's unknown key outside family.* was said to be 'family.foo, an option family=TimingConf
    does not have'."""
    (tmp_path / "cd" / "variant").mkdir(parents=True)
    (path := tmp_path / "cd" / "variant" / "mine.yaml").write_text("# @package _global_\n" + text)
    rc, out = run_checks(tmp_path, "--config-dir", str(tmp_path / "cd"), "variant=mine")
    assert rc == 2 and out.startswith(f"variant=mine ({path}) sets {key}, which the config does not have; "
                                      f"{valid}"), out
    assert len(out.splitlines()) == 1 and "family" not in out.split(";")[0]


@pytest.mark.parametrize("argv, given", [(["--run", "--cfg", "job"], "--run and --cfg"),
                                         (["-c", "job", "-r", "ktile=32"], "--run and --cfg"),
                                         (["--info", "-m", "ktile=32"], "--multirun and --info"),
                                         (["-sc", "query", "--cfg=all"], "--cfg and --shell-completion")])
def test_two_modes_are_one_line(argv, given):
    """Hydra's answer was a traceback: 'Only one of --run, --multirun, --cfg, --info and --shell_completion
    can be specified'."""
    assert _run_module().check_modes(argv) == (
        "Hydra takes one of --run (-r), --multirun (-m), --cfg (-c), --info (-i), --shell-completion (-sc); "
        f"this command gives {given}: keep one")


@pytest.mark.parametrize("args, shown", [
    (("-m", "precision=int4,int8", "--help"), "== Options of family=mma_sync"),   # Hydra: 'Ambiguous value'
    (("-m", "experiment=search_mma_sync", "--help"), "== Options of family=mma_sync"),  # no GPU needed
    (("--hydra-help", "precision=int8"), "Hydra (1.3"),      # Hydra's own help: the app's keys left out
    (("--cfg", "job", "family=wgmma", "family.bn=128"), "  bn: 128"),
])
def test_help_and_cfg_of_a_valid_command(tmp_path, run_checks, args, shown):
    rc, out = run_checks(tmp_path, *args)
    assert rc == 0 and shown in out.splitlines()[0] + "\n" + out, out
    assert "Traceback" not in out and list(tmp_path.iterdir()) == []


def test_cfg_job_shows_integer_family_options_as_integers(tmp_path):
    rc, out = run_cli(tmp_path, "family=wgmma", "--cfg", "job")
    assert rc == 0, out
    family = out.split("family:\n", 1)[1].split("\nprecision:", 1)[0].splitlines()
    for line in ("  name: wgmma", "  bn: 256", "  consumers: 2", "  producer: true", "  stages: 4",
                 "  swizzle: 128", "  persistent: false", "  order: grouped"):
        assert line in family, out
    assert not [line for line in family if "'" in line], out
    assert list(tmp_path.iterdir()) == []


def test_integer_family_options_keep_params_and_kernel_names():
    """Typed ints in the schema: the tracked params are the same strings ('128') and the spec, entry
    and run key's kernel part the same as when the options were Enum members."""
    from experiments import families
    from experiments.families.runner import family_options, family_spec
    from experiments.store.track import flatten
    cfg = _compose("family=wgmma", "family.bn=0128", "family.stages=3", "family.persistent=true")
    options = family_options(cfg)
    assert {k: options[k] for k in ("bn", "consumers", "producer", "stages", "swizzle", "persistent", "order")} == {
        "bn": 128, "consumers": 2, "producer": True, "stages": 3, "swizzle": 128, "persistent": True,
        "order": "grouped"}
    assert [type(options[k]) for k in ("bn", "consumers", "stages", "swizzle")] == [int] * 4
    flat = flatten(cfg)
    assert {k: flat[f"family.{k}"] for k in ("bn", "consumers", "producer", "stages", "swizzle", "persistent")} == {
        "bn": "128", "consumers": "2", "producer": "True", "stages": "3", "swizzle": "128", "persistent": "True"}
    _, spec = family_spec(cfg, None)
    declared = families.get("wgmma").spec("fp16", {"bn": 128, "stages": 3, "persistent": "true"}, "sm_90a")
    assert spec == declared and "_bn128_" in spec.entry and "_stages3_" in spec.entry
    assert spec.p["bn"] == 128 and spec.p["swizzle"] == 128 and spec.p["bk"] == 64 and spec.arch == "sm_90a"
    # a variant that sets an integer option (conf/experiment/generations.yaml lists gen_wgmma_bn_128: bn 128)
    assert family_options(_compose("variant=gen_wgmma_bn_128"))["bn"] == 128


@pytest.mark.parametrize("argv, message", [
    (['family=wgmma', 'family.persistent=2'],
     "family.persistent=2 is not valid ('family.persistent=2'); valid: true, false"),
    (['-m', 'family=wgmma', 'family.producer=true,yes'],
     "family.producer=yes is not valid ('family.producer=yes'); valid: true, false"),
    (['family=wgmma', 'family.bn=100'],
     "family.bn=100 is not valid for family=wgmma ('family.bn=100'); valid: 256, 192, 128, 64"),
    (['family=wgmma', 'family.stages=abc'],
     "family.stages=abc is not an integer ('family.stages=abc'); valid: 2, 3, 4, 5, 6, 7, 8"),
    # the value as given (OmegaConf's message says True)
    (['family=wgmma', 'family.stages=true'],
     "family.stages=true is not an integer ('family.stages=true'); valid: 2, 3, 4, 5, 6, 7, 8"),
    # family.name set alone: "family.bn=None is not valid for family=wgmma"
    (['family.name=wgmma'],
     "'family.name=wgmma' does not choose a family (family.name names the one family= chose); choose it "
     "with family=wgmma, which brings its options (python run.py family=wgmma --help)"),
    # a value removed: "precision=None is not valid", and for ktile a multi-line error, exit 1
    (['~precision'],
     "'~precision' leaves precision without a value, which a run needs; give it one instead, e.g. "
     "precision=fp16 (python run.py --help lists the values)"),
    (['-m', '~ktile', 'precision=int8,fp16'],
     "'~ktile' leaves ktile without a value, which a run needs; give it one instead, e.g. ktile=32 "
     "(python run.py --help lists the values)"),
    (['~tile'],                     # a config group removed from the defaults: the schema's values
     None),
    (['~family'],                   # the default family's config, as without a family=
     None),
    (['~timing'],                   # gave the default as a Python dict
     "'~timing' leaves timing without a value, which a run needs; leave it out for the default (python "
     "run.py --cfg job shows it)"),
    (['~tracking'],
     "'~tracking' leaves tracking without a value, which a run needs; leave it out for the default (python "
     "run.py --cfg job shows it)"),
    (['~tile.block'],               # "TileConf (DictConfig) does not support deletion"
     "'~tile.block' leaves tile.block without a value, which a run needs; give it one instead, e.g. "
     "tile.block=[256,128] (python run.py --help lists the values)"),
    (['family=wgmma', 'family.name=wgmma'],     # the family given: nothing to refuse
     None),
    (['family.name=nope'],
     "'family.name=nope' does not choose a family (family.name names the one family= chose); choose one "
     "with family=NAME; valid: mma_sync, wmma, dp4a, cublas, peak, wgmma"),
    (['~variant'],                  # a group without a default: nothing removed
     None),
    # tracking.wait=inf or 1e308: an OverflowError at the sweep's start, exit 1; stale_after_s=-1 was taken
    (['tracking.wait=inf'],
     "tracking.wait=inf is out of range; valid: 0 ... 2147483 seconds (0: no waiting for the store's lock; "
     "at most SQLite's busy timeout, a 32-bit count of milliseconds)"),
    (['tracking.wait=1e308'],
     "tracking.wait=1e+308 is out of range; valid: 0 ... 2147483 seconds (0: no waiting for the store's "
     "lock; at most SQLite's busy timeout, a 32-bit count of milliseconds)"),
    (['tracking.wait=2147483'],
     None),
    (['tracking.wait=2147483.5'],   # was shown as 2.14748e+06, like the limit
     "tracking.wait=2147483.5 is out of range; valid: 0 ... 2147483 seconds (0: no waiting for the store's "
     "lock; at most SQLite's busy timeout, a 32-bit count of milliseconds)"),
    (['family.name=null'],          # "e.g. the default family.name=None"
     "family.name takes no null ('family.name=null'); give a value, as python run.py --help lists them"),
    (['tracking.stale_after_s=-1'],
     "tracking.stale_after_s=-1 is out of range; valid: more than 0 seconds, finite (a RUNNING run without "
     "a heartbeat this long is closed KILLED and redone)"),
    (['timing.l2_flush=1'],
     "timing.l2_flush=1 is not valid ('timing.l2_flush=1'); valid: true, false"),
    (['tracking.rerun=on'],
     "tracking.rerun=on is not valid ('tracking.rerun=on'); valid: true, false"),
    (['family=wgmma', 'family.persistent=true', 'family.producer=False', 'family.bn=0128', 'timing.l2_flush=TRUE'],
     None),
    (['-m', 'family=wgmma', 'family.persistent=false,true', 'family.stages=2,8', 'tile.auto=true'],
     None),
    (['-m', 'family=wgmma', 'family.bn=choice(128,256)'],
     None),
    (['-m', 'family=wgmma', 'family.bn=choice(128,100)'],
     "family.bn=100 is not valid for family=wgmma ('family.bn=100'); valid: 256, 192, 128, 64"),
    (['-m', 'timing.cuda_graph=choice(true,maybe)'],
     "timing.cuda_graph=maybe is not valid ('timing.cuda_graph=maybe'); valid: true, false"),
    (['-m', 'timing.cuda_graph=choice(true,1)'],
     "timing.cuda_graph=1 is not valid ('timing.cuda_graph=1'); valid: true, false"),
    (['-m', 'precision=choice(int8,foo)'],
     "precision=foo is not valid ('precision=foo'); valid: fp16, bf16, int8, int4, fp8_e4m3, "
     'fp8_e5m2, copy (family=peak)'),
    (['-m', 'timing.batches=choice(3,x)'],
     "timing.batches=x is not an integer ('timing.batches=x')"),
    (['precision='],
     "precision= is not valid ('precision='); valid: fp16, bf16, int8, int4, fp8_e4m3, fp8_e5m2, "
     'copy (family=peak)'),
    (['-m', 'precision=glob(int*)', "verify.rtol='1e-3'"],
     None),
    (['tile.block=128'],
     "tile.block takes a list ('tile.block=128'); give one in brackets, e.g. "
     "'tile.block=[256,128]'"),
    (['-m', 'tile.block=[64,64],128'],
     "tile.block takes a list ('tile.block=128'); give one in brackets, e.g. "
     "'tile.block=[256,128]'"),
    (['problem.shapes=1'],
     "problem.shapes takes a list ('problem.shapes=1'); give one in brackets, e.g. "
     "'problem.shapes=[[4096,4096,1024]]'"),
    (['-m', 'tile.block=[64,64],[128,128]', 'problem.sizes=[512]', 'problem.shapes=[[512,512,1024]]'],
     None),
    (['--help', 'precision=int5'],
     "precision=int5 is not valid ('precision=int5'); valid: fp16, bf16, int8, int4, fp8_e4m3, "
     'fp8_e5m2, copy (family=peak)'),
    (['-m', 'cache.op=ca,cx'],
     "cache.op=cx is not valid ('cache.op=cx'); valid: ca, cg"),
    (['precision=INT8'],
     "precision=INT8 is not valid ('precision=INT8'); valid: fp16, bf16, int8, int4, fp8_e4m3, "
     'fp8_e5m2, copy (family=peak); did you mean precision=int8?'),
    (['family=peak', 'precision=COPY'],
     "precision=COPY is not valid ('precision=COPY'); valid: fp16, bf16, int8, int4, fp8_e4m3, "
     'fp8_e5m2, copy (family=peak); did you mean precision=copy?'),
    (['precision=COPY'],
     "precision=COPY is not valid ('precision=COPY'); valid: fp16, bf16, int8, int4, fp8_e4m3, "
     'fp8_e5m2, copy (family=peak); did you mean family=peak precision=copy?'),
    (['family=wgmma', 'precision=INT4'],
     "precision=INT4 is not valid ('precision=INT4'); valid: fp16, bf16, int8, int4, fp8_e4m3, "
     'fp8_e5m2, copy (family=peak); precision=int4 is for family=mma_sync,wmma,peak, not family=wgmma'),
    (['-m', 'b_layout=col,ROW'],
     "b_layout=ROW is not valid ('b_layout=ROW'); valid: col, row; did you mean b_layout=row?"),
    (['family=MMA_SYNC'],
     "family=MMA_SYNC is not a preset ('family=MMA_SYNC'); valid: cublas, dp4a, mma_sync, peak, wgmma, wmma "
     "(conf/family/); did you mean family=mma_sync?"),
    (['-m', 'tile=256x128,256X128'],
     "tile=256X128 is not a preset ('tile=256X128'); valid: 128x128, 128x128_w2x2, 128x256, 128x256_w4x4, "
     "256x128, 256x128_w4x4, 64x64, auto, l4_32x64 (conf/tile/); did you mean tile=256x128?"),
    (['+ncu=FULL'],
     "ncu=FULL is not a preset ('+ncu=FULL'); valid: default, full, metrics (conf/ncu/); did you mean "
     "+ncu=full?"),
    (['problem=Small'],
     "problem=Small is not a preset ('problem=Small'); valid: default, small (conf/problem/); did you mean "
     "problem=small?"),
    (['target.arch=SM_90'],
     "target.arch=SM_90 is not valid for family=mma_sync; valid: auto, sm_80, sm_86, sm_89, sm_90, sm_90a, "
     "sm_100, sm_120; did you mean target.arch=sm_90?"),
    (['-m', 'precision=fp16,fp8_e5m2', 'cache.l2_hint_b=evict_last', 'b_layout=row'],
     None),
    (['-m', 'precision=int8,fp16', 'timing.warmup=-1'],
     'timing.warmup=-1 is not valid; it must be a whole number >= 0'),
    (['verify.rtol=1e-3,nan'],
     "Ambiguous value for argument 'verify.rtol=1e-3,nan'; 1. To use it as a list, use "
     "key=[value1,value2]; 2. To use it as string, quote the value: key=\\'value1,value2\\'; 3. To "
     'sweep over it, add --multirun to your command line'),
    (['verify.seed=-1'],
     'verify.seed=-1 is not valid; it must be null (a fresh seed per run) or an integer from 0 to '
     '2**32 - 1'),
    (['verify.seed=null', 'timing.batches=3', 'timing.min_batch_ms=0.5', 'verify.rtol=range(1,3)'],
     "Sweep parameters 'verify.rtol=range(1,3)' requires --multirun"),
    (['timing.batches=null'],
     "timing.batches takes no null ('timing.batches=null'); give a value, e.g. the default "
     'timing.batches=10'),
    (['-m', 'verify.rtol=1e-3,null'],
     "verify.rtol takes no null ('verify.rtol=null'); give a value, e.g. the default "
     'verify.rtol=0.001'),
    (['-m', 'precision=int8,int4', 'timing.batches=int(0)'],
     'timing.batches=0 is not valid; it must be a whole number >= 1'),
    (['-m', 'timing.batches=range(0,2)'],
     'timing.batches=0 is not valid; it must be a whole number >= 1'),
    (['-m', 'timing.batches=choice(3,0)'],
     'timing.batches=0 is not valid; it must be a whole number >= 1'),
    (['timing.min_batch_ms=" -1"'],
     'timing.min_batch_ms=-1.0 is not valid; it must be a finite number > 0'),
    (['timing.batches=${timing.warmup}'],
     None),
    (['-m', 'timing.batches=range(1,4,0)'],
     "'timing.batches=range(1,4,0)' cannot be expanded: range() arg 3 must not be zero"),
    (['-m', 'timing.batches=interval(0,5)'],
     "'timing.batches=interval(0,5)': interval(...) is for sweepers that sample (e.g. Optuna's); "
     "Hydra's basic sweeper takes lists (a,b), range(...) and choice(...)"),
    (['-m', 'ktile=range(32,65,32)', 'tile=glob(*)'],
     None),
    (["timing.batches='5'", 'ktile="64"', 'timing.warmup=+2', 'timing.max_launches=1_000'],
     None),
    (["ktile='64.5'"],
     'ktile=64.5 is not an integer ("ktile=\'64.5\'"); valid: 16, 32, 64, 128'),
    (['-m', 'variant=h200_perf_best,nosuch'],
     "variant=nosuch is not a preset ('variant=nosuch'); valid: "
     + ", ".join(sorted([*(p.stem for p in (ROOT / "conf" / "variant").glob("*.yaml")), *listed()]))
     + " (conf/variant/ and the variants conf/experiment/ presets list)"),
    (['ktile=33'],
     "ktile=33 is not valid ('ktile=33'); valid: 16, 32, 64, 128"),
    (['-m', 'ktile=32,33', 'precision=int8,fp16'],
     "ktile=33 is not valid ('ktile=33'); valid: 16, 32, 64, 128"),
    (['tile=foo'],
     "tile=foo is not a preset ('tile=foo'); valid: 128x128, 128x128_w2x2, 128x256, 128x256_w4x4, "
     '256x128, 256x128_w4x4, 64x64, auto, l4_32x64 (conf/tile/)'),
    (['-m', 'tile=glob(128*)', 'family=mma_sync', 'experiment=l4_run1_fp16'],
     None),
    (['variant=h200_perf_peak', 'family.feed=ldmatrix'],
     None),
    (['variant=gen_wgmma', 'family.bn=128'],
     None),
    (['experiment=h200_performance', 'variant=h200_perf_peak', 'family.mma=m16n8k8'],
     None),
    (['variant=h200_perf_peak', 'family.feed=lds'],
     "family.feed=lds is not valid ('family.feed=lds'); valid: registers, ldmatrix"),
    (['-m', 'variant=h200_perf_best,h200_perf_peak', 'family.feed=ldmatrix'],
     "Unknown key 'family.feed' ('family.feed=ldmatrix'); family=mma_sync has no options (the "
     'root keys set it); feed is an option of family=peak'),
    (['variant=h200_perf_best', 'family.feed=ldmatrix'],
     "Unknown key 'family.feed' ('family.feed=ldmatrix'); family=mma_sync has no options (the "
     'root keys set it); feed is an option of family=peak'),
    (['-m', 'experiment=generations', 'family.schedule=streamk'],
     "Unknown key 'family.schedule' ('family.schedule=streamk'); family=mma_sync has no options "
     '(the root keys set it); schedule is an option of family=wgmma'),
    (['-m', 'experiment=generations', 'variant=gen_wgmma,gen_wgmma_best', 'family.schedule=streamk'],
     "Unknown key 'family.schedule' ('family.schedule=streamk'); family=mma_sync has no options "
     '(the root keys set it); schedule is an option of family=wgmma'),
    (['variant=gen_wgmma_group_16', 'family=mma_sync'],
     'variant=gen_wgmma_group_16 sets family.group, an option family=mma_sync does not have: a '
     "family= on the command line replaces the preset's family; drop it, or choose a variant of "
     'family=mma_sync (conf/variant/)'),
    (['-m', 'variant=gen_wgmma,gen_wgmma_best', 'family=mma_sync'],
     'variant=gen_wgmma_best sets family.cluster, an option family=mma_sync does not have: a '
     "family= on the command line replaces the preset's family; drop it, or choose a variant of "
     'family=mma_sync (conf/variant/)'),
    (['variant=gen_wgmma_group_16', 'family=wgmma'],
     None),
    (['family=cublas', 'family.schedule=streamk'],
     "Unknown key 'family.schedule' ('family.schedule=streamk'); family=cublas has no options; "
     'schedule is an option of family=wgmma'),
])
def test_option_values_are_checked_before_any_work(argv, message):
    """Hydra composes each job's config against the structured config (an unknown key, a wrong type, a
    value outside an Enum, a preset that does not exist, a scalar for a list), then the sweep's start
    checks them (true/false given otherwise, which OmegaConf reads as a bool; a family option outside
    its declared values; a setting out of range): one line naming the key, the value and the valid
    values, and the valid one when only the case differs (precision=INT8). These used to end in Hydra's
    traceback or after the sweep was tracked."""
    assert _refusal(argv) == message


@pytest.mark.parametrize("multirun", [False, True])
def test_removed_tracking_is_refused_where_the_run_starts(tmp_path, multirun):
    """``~tracking`` reached the sweep's start, which reads the store first: "Invalid configuration:
    tracking: Missing key tracking", and with -m "Could not start the sweep: ConfigAttributeError"."""
    rc, out = run_cli(tmp_path, *(["-m"] if multirun else []), "~tracking", "precision=int8")
    assert (rc, out.strip().splitlines()[-1]) == (2, _refusal(["~tracking"])), out


def test_a_sweep_of_no_jobs_says_so_and_tracks_nothing(tmp_path):
    """An empty range(...) made 0 jobs and the line "every run of this sweep is already in the store"."""
    rc, out = run_cli(tmp_path, "-m", "precision=int8", "timing.batches=range(1,1)",
                      *store_args(tmp_path, new_store=True))
    assert rc == 2 and "Traceback" not in out, out
    assert "The sweep has no jobs: its overrides (precision=int8 timing.batches=range(1,1) " in out
    assert ") expand to no combination (a glob(...) that matches no value, or an empty range(...)?)" in out
    assert "already in the store" not in out and not (tmp_path / "mlflow.db").exists()


@pytest.mark.parametrize("sweep", [False, True])
def test_an_interpolation_that_does_not_fit_its_key_stops_with_the_key(tmp_path, sweep):
    """verify.seed=${verify.rtol} (a float into an integer key) ended in OmegaConf's traceback."""
    args = ["-m", "precision=int8,int4"] if sweep else ["precision=int8"]
    rc, out = run_cli(tmp_path, *args, "verify.seed=${verify.rtol}", *store_args(tmp_path, sweep, new_store=True))
    assert rc == 2 and "Traceback" not in out, out
    assert out.strip().endswith("Invalid configuration: verify.seed: While dereferencing interpolation "
                                "'${verify.rtol}': Value '0.001' of type 'float' could not be converted to "
                                "Integer"), out
    assert not (tmp_path / "mlflow.db").exists()


def test_option_below_a_family_option_is_not_an_option():
    """family.bn.x=1 passed the check on its first part, then ended in a KeyError traceback."""
    message = _refusal(["family=wgmma", "family.bn.x=1"])
    assert message == ("family.bn is an integer, with no keys below it ('family.bn.x=1'); valid: 256, 192, 128, "
                       "64"), message


def test_boolean_option_outside_true_false_stops_with_exit_2(tmp_path, run_checks):
    """family.persistent=2 was read as true (OmegaConf takes any non-zero integer for a bool)."""
    rc, out = run_checks(tmp_path, "family=wgmma", "family.persistent=2", *store_args(tmp_path, False, new_store=True))
    assert rc == 2 and "Traceback" not in out
    assert out.strip() == "family.persistent=2 is not valid ('family.persistent=2'); valid: true, false"
    assert not (tmp_path / "mlflow.db").exists()


CFG_WITH_M = ("--cfg shows one job's config and Hydra does not take it with -m: drop -m to see one job's config "
              "(python run.py {one}), or see a preset's sweep params in hydra.sweeper.params with "
              "python run.py --cfg hydra {preset}")


@pytest.mark.parametrize("argv, one, preset", [
    (["-m", "precision=int8,fp16", "--cfg", "job"], "--cfg job precision=int8", "experiment=NAME"),
    # flags first: Hydra's parser takes no overrides on both sides of --cfg
    (["--multirun", "ktile=32,64", "--cfg=all", "tile.block=[128,128]", "problem.sizes='512,1024'"],
     "--cfg=all ktile=32 tile.block=[128,128] problem.sizes='512,1024'", "experiment=NAME"),
    (["-c", "hydra", "-m", "experiment=generations"], "-c hydra experiment=generations", "experiment=generations"),
    # choice(...) and range(...) cut to their first value (the hint gave them whole, which Hydra refuses
    # without -m); glob(...), interval(...) and an empty range have none and are left out
    (["-m", "--cfg", "job", "ktile=choice(32,64)", "timing.batches=range(3,5)", "precision=glob(*)",
      "verify.rtol=interval(0,1)", "timing.warmup=range(1,1)"], "--cfg job ktile=32 timing.batches=3",
     "experiment=NAME"),
])
def test_cfg_with_multirun_says_what_to_do(argv, one, preset):
    assert _run_module().check_modes(argv) == CFG_WITH_M.format(one=one, preset=preset)


def test_cfg_without_multirun_and_multirun_without_cfg_pass():
    check = _run_module().check_modes
    assert check(["--cfg", "job", "precision=int8"]) is None
    assert check(["-m", "precision=int8,fp16"]) is None
    assert check(["--help"]) is None


def test_cfg_with_multirun_is_one_line_and_exit_2(tmp_path, run_checks):
    """Hydra's own answer was a traceback: 'Only one of --run, --multirun, --cfg, ... can be specified'."""
    rc, out = run_checks(tmp_path, "-m", "precision=int8,fp16", "--cfg", "job")
    assert rc == 2
    assert out.splitlines() == [CFG_WITH_M.format(one="--cfg job precision=int8", preset="experiment=NAME")]
    assert list(tmp_path.iterdir()) == []
    # the command the message gives works
    rc, out = run_cli(tmp_path, "--cfg", "job", "precision=int8")
    assert rc == 0 and "precision: int8" in out.splitlines()


def test_single_job_multirun_with_impossible_combination_is_skipped(tmp_path):
    """A multirun of one job is still a multirun: the combination is recorded as skipped (and, as
    every job of the sweep was skipped, the command exits 2)."""
    rc, out = run_cli(tmp_path, "-m", "precision=int8", "mma=m16n8k64", *store_args(tmp_path))
    assert rc == 2, out
    assert "[1/1] skipped" in out
    parents, children = all_runs(tmp_path)
    assert [p.info.status for p in parents] == ["FINISHED"]
    assert [(c.info.status, c.data.tags["outcome"]) for c in children] == [("FINISHED", "skipped")]
    assert MMA_K64_INT8 in children[0].data.tags["skip_reason"]
    # the same command again: test_first_steps.test_sweep_whose_every_job_is_skipped_exits_2


@pytest.mark.parametrize("args", [("-m", "precision=int5", "ktile=32,64"), ("--cfg", "job", "precision=int8"),
                                  ("precision=int8", "tracking.uri=sqlite:////proc/x/mlflow.db")])
def test_forked_command_says_what_a_fresh_interpreter_says(tmp_path, args):
    """run_cli's zygote (a fork with run.py's imports done) gives the exit status and output of
    ``python run.py ARGS`` in a new interpreter: a refusal (2), a config shown (0), a store that cannot be
    written (1)."""
    store = [] if args[-1].startswith("tracking.uri") else store_args(tmp_path, multirun=False)
    forked = run_cli(tmp_path, *args, *store)
    assert forked == run_cli(tmp_path, *args, *store, fresh=True)
    assert forked[0] == {"-m": 2, "--cfg": 0}.get(args[0], 1), forked[1]


@pytest.mark.parametrize("module, args", [(None, ("--cfg", "job", "precision=int8")),
                                          (None, ("precision=int5",)),
                                          ("experiments.report", ("--help",))])
def test_started_command_says_what_a_fresh_interpreter_says(tmp_path, module, args):
    """popen_cli's zygote path (a fork started without waiting for it, read through a FIFO) gives the
    output and exit status of the same command in a new interpreter, for run.py and for python -m."""
    from zygote import Started
    proc = popen_cli(tmp_path, *args, module=module)
    assert isinstance(proc, Started)
    out, _ = proc.communicate(timeout=120)
    command = [str(ROOT / "run.py")] if module is None else ["-m", module]
    fresh = subprocess.run([sys.executable, *command, *args], cwd=tmp_path, env=_cli_env(), text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    assert (proc.returncode, out) == (fresh.returncode, fresh.stdout)
    assert proc.returncode == (2 if args == ("precision=int5",) else 0), out


def test_sigint_is_handled_where_the_shell_left_it_ignored():
    """A non-interactive shell starts a background job with SIGINT ignored, and every process of the test
    run inherited that: the Ctrl-C tests signalled processes that ignored it (conftest.handle_sigint)."""
    import signal

    from conftest import handle_sigint
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        handle_sigint()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        proc = subprocess.run([sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT))"],
                              capture_output=True, text=True, timeout=60)
        assert proc.stdout.strip() == "<built-in function default_int_handler>"    # a new program's: default
    finally:
        signal.signal(signal.SIGINT, old)


def test_hydra_reads_each_config_file_once_and_an_edited_file_again(tmp_path, monkeypatch):
    """experiments.runner.sweep.compose_once: compositions with other overrides parse a YAML file of their
    defaults list once per process; a file edited since is parsed again, and each composition gets its
    own copy of what was read."""
    import os

    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from experiments.runner.sweep import compose_once
    conf = tmp_path / "conf"
    (conf / "x").mkdir(parents=True)
    (conf / "config.yaml").write_text("defaults:\n  - x: a\n  - _self_\nk: 1\n")
    option = conf / "x" / "a.yaml"
    option.write_text("v: 1\n")
    compose_once()
    load, read = OmegaConf.load, []
    monkeypatch.setattr(OmegaConf, "load", lambda f: read.append(getattr(f, "name", f)) or load(f))
    with initialize_config_dir(str(conf), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        for k in range(3):
            cfg = loader.load_configuration("config", [f"k={k}"], RunMode.RUN)
            assert (cfg.k, cfg.x.v) == (k, 1)
            cfg.x.v = 5                                     # each caller gets its own copy
        assert read.count(os.path.realpath(option)) == 1
        option.write_text("v: 22\n")
        assert loader.load_configuration("config", ["k=7"], RunMode.RUN).x.v == 22
        assert read.count(os.path.realpath(option)) == 2


def test_hydra_composes_each_config_once_per_command(monkeypatch):
    """experiments.runner.sweep.compose_once: a repeated composition (Hydra's mode check, its sweeper's check
    of each job, its launcher) is a copy of the first; what it reads (overrides, mode, folder,
    environment) composes anew, and Hydra's override checks still run on each call."""
    from hydra import initialize_config_dir
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import ConfigCompositionException
    from hydra.types import RunMode

    from experiments.config import register
    from experiments.runner.sweep import compose_once
    register()
    monkeypatch.setattr(ConfigLoaderImpl, "load_configuration", ConfigLoaderImpl.load_configuration)  # undone after
    impl, calls = ConfigLoaderImpl._load_configuration_impl, []
    monkeypatch.setattr(ConfigLoaderImpl, "_load_configuration_impl",
                        lambda self, *a, **k: calls.append(k["overrides"]) or impl(self, *a, **k))
    compose_once()
    compose_once()
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        first = loader.load_configuration("config", ["precision=int8"], RunMode.RUN)
        first.ktile = 16                                   # each caller gets its own copy
        again = loader.load_configuration("config", ["precision=int8"], RunMode.RUN)
        assert calls == [["precision=int8"]] and again.precision.value == "int8" and again.ktile == 32
        loader.load_configuration("config", ["precision=int4"], RunMode.RUN)
        monkeypatch.setenv("COMPOSE_ONCE_TEST", "1")
        loader.load_configuration("config", ["precision=int8"], RunMode.RUN)
        assert len(calls) == 3
        loader.load_configuration("config", ["ktile=32,64"], RunMode.RUN, validate_sweep_overrides=False)
        with pytest.raises(ConfigCompositionException, match="Ambiguous value for argument 'ktile=32,64'"):
            loader.load_configuration("config", ["ktile=32,64"], RunMode.RUN)
        assert len(calls) == 4
