"""Execute the analysis notebooks headless and keep the executed copies with their outputs.

    python -m analysis.notebooks --table results/h200/l4_claims/runs.csv --out outputs/notebooks/h200
    python -m analysis.notebooks --uri sqlite:///outputs/mlflow.db --sweep latest --out outputs/nb/latest

Each notebook (analysis/notebooks/<name>.py, a jupytext percent file) runs in a fresh Python kernel
(nbclient + ipykernel: ``pip install -e '.[notebooks]'``) with its working folder and every output
under --out: <name>.ipynb (executed, with its outputs) and one sub-folder per GPU with the figures and
tables. Nothing is written beside the notebooks. Exit 2 for a table, store, experiment, sweep or claims
file that cannot be read and an --out that cannot be written (a table, store, experiment or sweep
before any notebook runs), 1 for a cell that fails otherwise: one line, the error's; its traceback is
in the executed copy. Ctrl-C (SIGTERM) ends the running notebook's kernel and
the command, exit 130 (143), with one line naming that notebook.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from experiments.cli import out_problem, positive_int, refuse_store_options_with_table

from . import DEFAULT_SWEEP, FOLDER, NAMES, source


# what a notebook raises for the store, sweep, table or claims file as given (exit 2, as analysis.report)
INPUT_ERRORS = ("RunsError", "StoreError", "UriError", "StoreUnavailable", "FileNotFoundError", "ClaimsError")


def execute(name: str, out: Path, env: dict, timeout: int = 600) -> Path:
    """Run notebook ``name`` in a new kernel with ``env``, cwd ``out``; write out/<name>.ipynb and
    return its path. Raises SystemExit naming the missing packages when nbclient/ipykernel are absent,
    nbclient's CellExecutionError when a cell fails."""
    try:
        import jupytext
        import nbformat
        from jupyter_client import KernelManager
        from nbclient import NotebookClient
    except ImportError as exc:
        raise SystemExit(f"executing the notebooks needs nbclient and ipykernel ({exc}): "
                         "pip install -e '.[notebooks]'") from None
    nb = jupytext.read(FOLDER / f"{name}.py")
    # the kernel talks over local sockets in a private folder (over TCP, ipykernel warns that nothing is
    # encrypted)
    with tempfile.TemporaryDirectory(prefix="kernel_") as sockets:
        km = KernelManager(kernel_name="python3", transport="ipc", ip=str(Path(sockets) / "kernel"))
        client = NotebookClient(nb, km=km, timeout=timeout, resources={"metadata": {"path": str(out)}})
        failed: list = []

        def run() -> None:
            try:
                client.execute(env=env)
            except BaseException as exc:  # noqa: BLE001 - raised below, in the caller's thread
                failed.append(exc)
        # nbclient runs in a thread of its own, where it leaves SIGINT alone: Ctrl-C reaches this thread as
        # KeyboardInterrupt (in the main thread nbclient's own handler shut the kernel down under the
        # running cell, which ended in an AssertionError or went on as if nothing had happened)
        worker = threading.Thread(target=run, name=f"notebook {name}", daemon=True)
        worker.start()
        try:
            while worker.is_alive():
                worker.join(0.1)
        except KeyboardInterrupt:
            # the kernel is killed by its process id, not through km, which the worker thread is using (also
            # while it starts the kernel); the worker then ends on its dead kernel, and the copy so far is
            # written once it has
            deadline = time.monotonic() + 30
            while worker.is_alive() and time.monotonic() < deadline:
                _kill_kernel(km)
                worker.join(0.1)
            _kill_kernel(km, reap=True)      # also one the worker started as it ended
            if not worker.is_alive():
                with contextlib.suppress(Exception):
                    nbformat.write(nb, out / f"{name}.ipynb")
            raise
        if km.has_kernel:
            km.shutdown_kernel()
        nbformat.write(nb, out / f"{name}.ipynb")      # also a failed run: its traceback is in the cell
    if failed:
        raise failed[0]
    return out / f"{name}.ipynb"


def _kill_kernel(km, reap: bool = False) -> None:
    """SIGKILL the kernel of ``km`` (its process group: the kernel leads a session of its own) if it has
    been started, without calling ``km`` (jupyter_client's manager is not shared between threads); with
    ``reap``, also wait for it (no zombie is left behind this process)."""
    prov = getattr(km, "provisioner", None)
    pgid, pid = getattr(prov, "pgid", None), getattr(prov, "pid", None)
    with contextlib.suppress(OSError):
        if pgid:
            os.killpg(pgid, signal.SIGKILL)
        elif pid:
            os.kill(pid, signal.SIGKILL)
    if reap and (process := getattr(prov, "process", None)) is not None:
        with contextlib.suppress(Exception):
            process.wait(10)


class Terminated(KeyboardInterrupt):
    """SIGTERM, ended as Ctrl-C is (exit 143)."""


def _terminate(signum, frame):
    raise Terminated


def main(argv=None) -> int:
    head, rest = __doc__.split("\n\n", 1)     # what it does; the examples and the rest after the options
    ap = argparse.ArgumentParser(prog="python -m analysis.notebooks", description=head,
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=rest)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--table", nargs="+", help="tidy table(s) (runs.csv of a report), e.g. the committed "
                     "results/h200/l4_claims/runs.csv")
    src.add_argument("--uri", default=None, help="tracking URI (default: as run.py resolves it)")
    ap.add_argument("--experiment", default=None,
                    help="experiment of the store (default tensor-core-ablations)")
    ap.add_argument("--sweep", default=None, help="parent run id, 'latest', or '' for every run")
    ap.add_argument("--out", required=True, help="output folder (one sub-folder per GPU inside)")
    ap.add_argument("--only", nargs="+", choices=NAMES, default=list(NAMES), help="which notebooks")
    ap.add_argument("--claims", default=None,
                    help="claims YAML for the claims notebook (default: the L4 study's)")
    ap.add_argument("--n-boot", type=positive_int, default=None,
                    help="bootstrap resamples (predictors notebook)")
    args = ap.parse_args(argv)
    names = list(dict.fromkeys(args.only))
    if args.table:
        refuse_store_options_with_table(ap, [f"--{k}" for k in ("sweep", "experiment")
                                             if getattr(args, k) is not None])
    repo = str(FOLDER.parents[1])                 # this checkout's analysis package, also in the kernel
    env = {**os.environ, "MPLBACKEND": "Agg",
           "PYTHONPATH": os.pathsep.join([repo] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    settings = {"ANALYSIS_TABLE": args.table and os.pathsep.join(str(Path(t).resolve()) for t in args.table),
                "ANALYSIS_URI": args.uri, "ANALYSIS_EXPERIMENT": args.experiment,
                "ANALYSIS_SWEEP": args.sweep,
                "ANALYSIS_CLAIMS": args.claims and str(Path(args.claims).resolve()),
                "ANALYSIS_N_BOOT": None if args.n_boot is None else str(args.n_boot)}
    env.update({k: v for k, v in settings.items() if v is not None})
    if args.uri is not None:                      # a --uri reads the store, not a table the environment names
        env.pop("ANALYSIS_TABLE", None)
    # what each notebook's load() will read (analysis.notebooks.source of the kernels' settings: the
    # options, else the ANALYSIS_* environment), checked before any kernel starts
    from experiments.store.track import StoreError

    from ..runs import RunsError, open_source, read_table
    try:
        for tables, uri, experiment, sweep in dict.fromkeys(source(env, DEFAULT_SWEEP[n]) for n in names):
            if tables:                            # as analysis.report reads them; named as given
                read_table(args.table or tables)
            else:
                open_source(uri, experiment, sweep or None)
    except (RunsError, StoreError, FileNotFoundError) as exc:
        print(f"Cannot read the runs: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    if problem := out_problem(out):
        print(f"Could not write --out {args.out}: {problem}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    try:
        from nbclient.exceptions import CellExecutionError
    except ImportError as exc:
        raise SystemExit(f"executing the notebooks needs nbclient and ipykernel ({exc}): "
                         "pip install -e '.[notebooks]'") from None
    signal.signal(signal.SIGTERM, _terminate)
    for i, name in enumerate(names):
        try:
            path = execute(name, out, {**env, "ANALYSIS_OUT": str(out)})
        except KeyboardInterrupt as exc:
            copy = out / (name + ".ipynb")
            how = "Terminated" if isinstance(exc, Terminated) else "Interrupted"
            print(f"{how}: notebook {name} did not finish ("
                  f"{f'its executed copy so far: {copy}' if copy.exists() else 'no executed copy'}); "
                  + (f"executed before it: {', '.join(names[:i])}" if i else "none was executed"),
                  file=sys.stderr)
            return 143 if isinstance(exc, Terminated) else 130
        except CellExecutionError as exc:
            # the error's own line; the cell's traceback is in the executed copy
            print(f"notebook {name} failed: {exc.ename}: {exc.evalue} (the executed copy, with the "
                  f"traceback: {out / (name + '.ipynb')})", file=sys.stderr)
            return 2 if exc.ename in INPUT_ERRORS else 1
        print(f"executed {name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
