"""A PostgreSQL database and an MLflow tracking server on this host's loopback, for tests and for
trying a store many hosts share (README, "A Slurm cluster"):

    python tools/tracking_server.py /tmp/store          # prints the server's URI; Ctrl-C or kill stops both

The server's artifacts and log go to the given folder; PostgreSQL runs from a new data folder under /tmp
(removed when it stops; as the user ``postgres`` when started by root: PostgreSQL refuses root), the
server with ``--workers 4`` (``--workers N``), ``--backend-store-uri postgresql://...`` and
``--allowed-hosts`` for this host's names. Needs PostgreSQL's ``initdb`` and ``postgres`` (Debian:
apt-get install postgresql) and the ``psycopg2`` driver (pip install psycopg2-binary).
"""
from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def postgres_bin(name: str) -> str | None:
    """The path of PostgreSQL's program ``name`` (PATH, else Debian's /usr/lib/postgresql/*/bin), or None."""
    found = shutil.which(name) or sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found if isinstance(found, str) else (found[-1] if found else None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_postgres(cmd: list) -> list:
    """``cmd`` run as the user postgres when this process is root (PostgreSQL refuses root)."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def start_postgres(folder: Path) -> tuple[str, subprocess.Popen]:
    """Start a new PostgreSQL cluster (its data in a new folder under /tmp) on a free loopback port with a
    database ``mlflow``; returns (its SQLAlchemy URI, the server process). Raises RuntimeError naming what
    failed (a program missing, initdb's or the server's message)."""
    initdb, server = postgres_bin("initdb"), postgres_bin("postgres")
    if not (initdb and server):
        raise RuntimeError("PostgreSQL's initdb and postgres are not installed (apt-get install postgresql)")
    # the data folder directly under /tmp: PostgreSQL's user must reach it (a test's tmp folder is
    # private to root); removed by stop()
    data = Path(tempfile.mkdtemp(prefix="pg-", dir="/tmp"))
    if os.geteuid() == 0:
        shutil.chown(data, "postgres", "postgres")
    subprocess.run(_as_postgres([initdb, "-D", str(data), "-U", "mlflow", "--auth=trust", "-E", "UTF8"]),
                   check=True, capture_output=True, text=True)
    port = _free_port()
    proc = subprocess.Popen(_as_postgres([server, "-D", str(data), "-p", str(port), "-k", str(data),
                                          "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200",
                                          "-c", "fsync=off"]),
                            stdout=subprocess.DEVNULL, stderr=open(data / "postgres.log", "w"))  # noqa: SIM115
    # (a pipe nobody reads would fill with its log, a line per refused claim, and stop every backend)
    deadline = time.time() + 30
    while time.time() < deadline:
        isready = postgres_bin("pg_isready") or "pg_isready"
        ready = subprocess.run([isready, "-h", "127.0.0.1", "-p", str(port)], capture_output=True)
        if ready.returncode == 0:
            break
        if proc.poll() is not None:
            raise RuntimeError(f"PostgreSQL did not start: {(data / 'postgres.log').read_text().strip()}")
        time.sleep(0.2)
    proc.data_dir = data
    subprocess.run([postgres_bin("psql") or "psql", "-h", "127.0.0.1", "-p", str(port), "-U", "mlflow",
                    "-d", "postgres", "-c", "CREATE DATABASE mlflow"], check=True, capture_output=True)
    return f"postgresql+psycopg2://mlflow@127.0.0.1:{port}/mlflow", proc


def start_server(backend: str, folder: Path, workers: int = 2,
                 env: dict | None = None) -> tuple[str, subprocess.Popen]:
    """Start ``mlflow server`` on a free loopback port with the store ``backend`` and artifacts in
    ``folder``/artifacts, with the environment variables ``env`` added; returns (its URI, the process)
    once it answers /health. MLflow's job runner (its own processes, for GenAI evaluation jobs) is off
    unless ``env`` turns it on: a tracking store needs none, and it costs several interpreters' start-up.
    Raises RuntimeError with the server's last lines when it does not start within two minutes."""
    port = _free_port()
    log = open(Path(folder) / "mlflow-server.log", "w")   # noqa: SIM115 - the server's, for as long as it runs
    names = ",".join(sorted({"localhost", "127.0.0.1", socket.gethostname(), socket.getfqdn()}))
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port",
                             str(port), "--backend-store-uri", backend, "--default-artifact-root",
                             str(Path(folder) / "artifacts"), "--workers", str(workers),
                             "--allowed-hosts", ",".join(f"{n},{n}:{port}" for n in names.split(","))],
                            stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **(env or {})})
    uri = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        with contextlib.suppress(OSError):
            urllib.request.urlopen(uri + "/health", timeout=2).close()
            return uri, proc
        if proc.poll() is not None:
            break
        time.sleep(0.3)
    proc.kill()
    tail = (Path(folder) / "mlflow-server.log").read_text().splitlines()[-5:]
    raise RuntimeError("mlflow server did not start: " + " | ".join(tail))


def stop(*procs: subprocess.Popen) -> None:
    """End the processes started here (the server first, then PostgreSQL)."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        if getattr(proc, "data_dir", None):
            shutil.rmtree(proc.data_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    """``python tools/tracking_server.py [FOLDER] [--workers N]``: start both, print the server's URI, and
    stop both (their data folder removed) on Ctrl-C or SIGTERM, also when started in the background
    (where a shell leaves SIGINT ignored)."""
    import argparse
    import signal
    ap = argparse.ArgumentParser(description="PostgreSQL and an MLflow tracking server on loopback")
    ap.add_argument("folder", nargs="?", default="/tmp/mlflow-pg", help="the server's artifacts and log")
    ap.add_argument("--workers", type=int, default=4, help="the server's worker processes")
    args = ap.parse_args(argv)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.default_int_handler)
    where = Path(args.folder)
    where.mkdir(parents=True, exist_ok=True)
    pg = server = None
    try:
        db, pg = start_postgres(where)
        uri, server = start_server(db, where, workers=args.workers)
        print(f"tracking server {uri} (store {db})", flush=True)
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        stop(*(p for p in (server, pg) if p is not None))


if __name__ == "__main__":
    main()
