"""Race claims: N processes claim the same measurement at once, T times; each time exactly one run
must exist in the store afterwards (experiments.store.track.Tracker.claim, claim_marker).

    python tools/claim_race.py --processes 8 --trials 20 --uri http://HOST:5000
    python tools/claim_race.py --processes 8 --trials 20 --postgres      # starts PostgreSQL + mlflow server
    python tools/claim_race.py --processes 4 --trials 5 --uri sqlite:////tmp/race.db --no-file-lock

``--no-file-lock`` leaves out the file lock beside a SQLite store, as processes on several hosts
sharing the file over a network file system would be (the lock does not reach them). Prints one line
per trial and a summary; exits 1 when any trial ended with other than one run.
"""
from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def ends_with(pid: int, every_s: float = 0.5) -> threading.Thread:
    """Watch process ``pid`` from a daemon thread and end this process (status 1) once it is gone: a
    racer whose race was killed (Ctrl-C, a test run stopped) ends instead of waiting at the barrier
    with its store's heartbeat running."""
    def watch() -> None:
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:     # alive, another user's
                pass
            time.sleep(every_s)
    thread = threading.Thread(target=watch, daemon=True, name="race-watch")
    thread.start()
    return thread


def _racer(uri: str, experiment: str, keys: list, barrier, results, no_lock: bool, racing: int) -> None:
    ends_with(racing)
    from experiments.store import track
    if no_lock:
        track.store_lock = lambda uri: contextlib.nullcontext()
    tr = track.Tracker(uri, experiment)
    for key in keys:
        barrier.wait()
        state, rid = tr.claim(key, "race", {}, {}, lambda: None)
        if state == "new":
            tr.end(rid)
        results.put((key, state))
    results.close()
    results.join_thread()
    os._exit(0)            # at once: a thread MLflow's client left must not keep the race waiting


def race(uri: str, processes: int, trials: int, no_lock: bool = False) -> list[tuple[str, int, int]]:
    """Run the race; returns per trial (run key, claimants that started a run, runs in the store)."""
    from experiments.store.track import Tracker
    experiment = f"claim-race-{uuid.uuid4().hex[:8]}"
    tr = Tracker(uri, experiment)                          # made once, before the racers open it
    keys = [f"race-{uuid.uuid4().hex[:12]}" for _ in range(trials)]
    # each racer forked from one process that has imported the store's modules, not a new interpreter
    # that imports them again (seconds of CPU per racer); spawn where there is no forkserver
    ctx = mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
    ctx.set_forkserver_preload(["experiments.store.track", "mlflow.store.tracking.sqlalchemy_store"])
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(uri, experiment, keys, barrier, results, no_lock, os.getpid()))
             for _ in range(processes)]
    for p in procs:
        p.start()
    got = [results.get(timeout=600) for _ in range(processes * trials)]
    for p in procs:
        p.join()
    return [(k, sum(1 for key, s in got if key == k and s == "new"),
             len(tr.client.search_runs([tr.experiment_id], f"tags.run_key = '{k}'"))) for k in keys]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--uri", help="the store: sqlite:///PATH, http://HOST:PORT, postgresql://...")
    ap.add_argument("--postgres", action="store_true", help="start PostgreSQL and mlflow server here")
    ap.add_argument("--no-file-lock", action="store_true")
    args = ap.parse_args()
    procs = []
    uri = args.uri
    if args.postgres:
        from tools.tracking_server import start_postgres, start_server, stop
        folder = Path(tempfile.mkdtemp(prefix="claim-race-"))
        db, pg = start_postgres(folder)
        procs = [pg]
        try:
            uri, server = start_server(db, folder, workers=4)
        except BaseException:
            stop(pg)
            raise
        procs = [server, pg]
        print(f"store: mlflow server {uri} on {db}", flush=True)
    if not uri:
        ap.error("give --uri or --postgres")
    try:
        t0 = time.time()
        rows = race(uri, args.processes, args.trials, args.no_file_lock)
    finally:
        from tools.tracking_server import stop
        stop(*procs)
    for i, (key, won, runs) in enumerate(rows):
        print(f"trial {i + 1}: {won} claimant(s) started a run, {runs} run(s) in the store ({key})")
    bad = [r for r in rows if r[1] != 1 or r[2] != 1]
    print(f"{len(rows) - len(bad)} of {len(rows)} trials with exactly one run; {args.processes} processes "
          f"each, {time.time() - t0:.1f} s, store {uri}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
