import shutil
import sys

import pytest

from experiments.gpu.worker import nvml_gpu


def _gpu_reason():
    if nvml_gpu() is None:
        return "no NVIDIA GPU found (NVML)"
    try:
        import cupy  # noqa: F401
    except ImportError:
        return "CuPy is not installed (pip install -e '.[cuda13]' or '.[cuda12]')"
    return None


_REASON = _gpu_reason()


# ptxas -arch=A -v SRC -o OUT and cuobjdump -sass CUBIN as experiments.build.assemble runs them, answered from
# a folder shared by the test run's processes (xdist workers, run.py's forks and interpreters) when the
# same input was done before: key sha256 of the arch and PTX text, or of the cubin. A failure, an output
# that names the input file, and any other command line run the tool itself.
_TOOL_CACHE = r"""#!/bin/sh
real='{real}'; cache='{cache}'
if [ "{pattern}" = ptxas ] && [ $# -eq 5 ] && [ "$2" = -v ] && [ "$4" = -o ] && [ -f "$3" ]; then
    case "$1" in -arch=*) ;; *) exec "$real" "$@" ;; esac
    src=$3; out=$5; key=ptxas-$({{ echo "$1"; cat "$3"; }} | sha256sum | cut -c1-64)
elif [ "{pattern}" = cuobjdump ] && [ $# -eq 2 ] && [ "$1" = -sass ] && [ -f "$2" ]; then
    src=$2; out=; key=sass-$(sha256sum < "$2" | cut -c1-64)
else
    exec "$real" "$@"
fi
if [ -d "$cache/$key" ]; then
    cat "$cache/$key/stdout"; cat "$cache/$key/stderr" >&2
    [ -z "$out" ] || cp "$cache/$key/cubin" "$out"
    exit 0
fi
new=$(mktemp -d "$cache/new.XXXXXX")
"$real" "$@" > "$new/stdout" 2> "$new/stderr"; rc=$?
cat "$new/stdout"; cat "$new/stderr" >&2
if [ $rc -eq 0 ] && ! grep -qF "$src" "$new/stdout" "$new/stderr" && \
   {{ [ -z "$out" ] || cp "$out" "$new/cubin"; }}; then
    mv -T "$new" "$cache/$key" 2>/dev/null || rm -rf "$new"
else
    rm -rf "$new"
fi
exit $rc
"""


def handle_sigint() -> None:
    """Tests send Ctrl-C (SIGINT) to commands and to their own process: SIGINT is handled, as in a
    terminal, also where a shell started the tests in the background with SIGINT ignored (which every
    process started from here would inherit; a handled signal is reset to its default in a new program)."""
    import signal
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config):
    """SIGINT handled in each process of the test run (:func:`handle_sigint`). Put the caching ptxas and
    cuobjdump (_TOOL_CACHE) first on PATH, once per test run: the controller makes them, xdist workers and
    every command they start inherit PATH."""
    import os
    import tempfile
    from pathlib import Path

    from experiments.build.assemble import find_ptxas, find_tool
    handle_sigint()
    if os.environ.get("TC_TOOL_CACHE") or os.environ.get("PTXAS"):
        return
    tools = {"ptxas": find_ptxas(), "cuobjdump": find_tool("cuobjdump", "cuda_cuobjdump")}
    cache = Path(tempfile.mkdtemp(prefix="tool_cache_"))
    (cache / "bin").mkdir()
    for name, real in tools.items():
        if real:
            wrapper = cache / "bin" / name
            wrapper.write_text(_TOOL_CACHE.format(real=real, cache=cache, pattern=name))
            wrapper.chmod(0o755)
    os.environ["TC_TOOL_CACHE"] = str(cache)
    os.environ["PATH"] = f"{cache / 'bin'}{os.pathsep}{os.environ['PATH']}"
    config._tool_cache = cache


def pytest_unconfigure(config):
    cache = getattr(config, "_tool_cache", None)
    if cache is not None:
        shutil.rmtree(cache, ignore_errors=True)


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: without a GPU, one worker more than the CPU cores the tests may use: some files
    mostly wait (for Slurm's scheduler, a tracking server, Chromium), and the extra worker fills those
    waits (on 2 cores: 443-506 s of pytest with 3 workers, 496-520 s with 2). With a GPU none (tests one
    after another), so that two tests never time kernels on the same GPU at once."""
    import os
    if nvml_gpu() is not None:
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores + 1


# the files that take longest without a GPU (CPU time of ptxas and run.py commands, waits for a tracking
# server or Slurm), collected first, so that with -n and `--dist loadfile --no-loadscope-reorder` they
# start first and the short files even out the workers' ends. The Slurm tests, which mostly wait for the
# scheduler, come first: the ptxas of the covering subsets (two processes at a time) fills those waits
LONGEST_FIRST = ("test_slurm.py", "test_assemble.py", "test_wgmma.py", "test_first_steps.py", "test_parallel.py",
                 "test_concurrency_store.py", "test_claims_store.py", "test_cli.py", "test_analysis_report.py",
                 "test_where_runs_land.py", "test_store.py", "test_store_pressure.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))     # stable: each file keeps its order
    if _REASON is None:
        return
    skip = pytest.mark.skip(reason=f"gpu test: {_REASON}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def need_ptxas():
    from experiments.build.assemble import find_ptxas
    if find_ptxas() is None:
        pytest.skip("ptxas not found (CUDA toolkit or pip install nvidia-cuda-nvcc)")
    return shutil.which("ptxas")


def _cli_env(mp, cwd):
    """The environment and folder of a command as tests/test_cli.run_cli gives them, in this process."""
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    mp.delenv("HYDRA_FULL_ERROR", raising=False)
    mp.setenv("CUDA_VISIBLE_DEVICES", "")
    if cwd is not None:
        mp.chdir(cwd)


@pytest.fixture(autouse=True)
def _fresh_hydra():
    """Hydra's global state after each test as a new process has it: a test that composes a config or runs
    run.py in this process (run_checks) leaves GlobalHydra and HydraConfig set, and a later test's job
    would read that run's Hydra config as its own. Likewise the heartbeats: a Tracker a test left with
    runs open went on beating them, against a server the test had stopped, into later tests' output."""
    yield
    track = sys.modules.get("experiments.store.track")
    if track is not None:
        track._BEATING.clear()
    hydra = sys.modules.get("hydra.core.hydra_config")
    if hydra is not None:
        from hydra.core.global_hydra import GlobalHydra
        GlobalHydra.instance().clear()
        hydra.HydraConfig.instance().cfg = None


@pytest.fixture
def run_checks(capsys):
    """``run_checks(cwd, *args)``: ``python run.py ARGS`` for a command refused before any work, run in
    this process (no interpreter start-up): run.py's checks, Hydra's composition and the sweep's start
    up to its config check (experiments.runner.validate.check); (exit status, stdout + stderr) as ``run_cli``
    returns them. A command that gets past the config check fails the test."""
    import gc
    import runpy
    import signal
    import sys
    from pathlib import Path

    import hydra._internal.utils as hydra_utils
    from hydra._internal.hydra import Hydra
    from hydra.core.global_hydra import GlobalHydra

    import experiments.runner.sweep

    class Past(SystemExit):
        pass

    def checked(config, multirun):
        check(config, multirun)
        raise Past("run.py went past its checks: run it with run_cli")
    check = experiments.runner.sweep.check

    def run(cwd, *args):
        script = Path(__file__).resolve().parent.parent / "run.py"
        handler = signal.getsignal(signal.SIGTERM)
        capsys.readouterr()
        with pytest.MonkeyPatch.context() as mp:
            _cli_env(mp, cwd)
            mp.setattr(sys, "argv", [str(script), *args])
            mp.setattr(gc, "freeze", lambda: None)      # run.py's: this process's objects stay collectable
            mp.setattr(experiments.runner.sweep, "check", checked)
            mp.setattr(hydra_utils, "run_and_report", hydra_utils.run_and_report)
            for name in ("app_help", "show_cfg", "hydra_help"):    # run.py's, for --help and --cfg
                mp.setattr(Hydra, name, getattr(Hydra, name))
            try:
                runpy.run_path(str(script), run_name="__main__")
                rc = 0
            except Past:
                raise AssertionError("run.py went past its checks into the work: run it with run_cli") from None
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else 1
                if isinstance(exc.code, str):
                    print(exc.code, file=sys.stderr)
            finally:
                signal.signal(signal.SIGTERM, handler)
                GlobalHydra.instance().clear()
        out, err = capsys.readouterr()
        return rc, out + err
    return run


@pytest.fixture
def module_cli(capsys):
    """``module_cli(module, *args, cwd=None)``: ``python -m MODULE ARGS`` as its ``main(argv)`` in this
    process, without a GPU: (exit status, stdout, stderr). A SystemExit's message goes to stderr with
    status 1, as the interpreter does."""
    import importlib
    import sys

    def run(module, *args, cwd=None):
        capsys.readouterr()
        with pytest.MonkeyPatch.context() as mp:
            _cli_env(mp, cwd)
            try:
                result = importlib.import_module(module).main(list(args))
                rc = result if isinstance(result, int) else 0
            except SystemExit as exc:
                rc = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
                if isinstance(exc.code, str):
                    print(exc.code, file=sys.stderr)
        out, err = capsys.readouterr()
        return rc, out, err
    return run
