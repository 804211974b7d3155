"""Claims and liveness across processes and hosts (experiments.store.track: Tracker.claim, claim_marker,
stale): at most one run per measurement however many claimants race, on SQLite and on a tracking
server backed by PostgreSQL; a run whose heartbeat stopped is closed KILLED by any host and measured
again. The heavy race is ``python tools/claim_race.py --processes 8 --trials 20 --postgres``."""
import importlib.util
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments.store import track
from experiments.store.track import Tracker, claim_marker

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tools import claim_race, tracking_server  # noqa: E402


def _other_host(tr, rid, beat_age_s):
    """Make run ``rid`` look like a run of a process on another host whose last heartbeat was
    ``beat_age_s`` seconds ago."""
    tr.open.discard(rid)                  # no heartbeat from this process any more; one under way
    for _ in range(2):                    # may land after the first write: written twice
        tr.log(rid, tags={"owner_host": "node-elsewhere", "owner_pid": "4242",
                          track.HEARTBEAT: f"{time.time() - beat_age_s:.0f}"})
        time.sleep(0.2)


def test_a_run_of_another_host_without_heartbeat_is_closed_and_measured_again(tmp_path):
    """A job killed on another host left its run RUNNING for ever: a re-run said "being tracked by
    another process" and tracked nothing."""
    tr = Tracker(f"sqlite:///{tmp_path}/m.db", "live", stale_after=60)
    fresh = tr.start("fresh", {}, {"run_key": "k-fresh"})
    _other_host(tr, fresh, 5)
    assert tr.claim("k-fresh", "again", {}, {}, lambda: None) == ("busy", fresh)   # alive elsewhere
    dead = tr.start("dead", {}, {"run_key": "k-dead"})
    _other_host(tr, dead, 120)
    state, new = tr.claim("k-dead", "again", {}, {}, lambda: None)
    assert state == "new" and new != dead
    old = tr.client.get_run(dead)
    assert old.info.status == "KILLED" and old.data.tags["outcome"] == "interrupted"
    assert old.data.tags["skip_reason"].startswith("no heartbeat from its process (pid 4242 on node-elsewhere) "
                                                   "for 12")
    assert "more than tracking.stale_after_s=60: the process or its node ended" in old.data.tags["skip_reason"]
    assert tr.client.get_run(fresh).info.status == "RUNNING"
    assert tr.close_stale() == 0                       # the fresh one stays; the new one is this process's


def test_open_runs_get_a_heartbeat(tmp_path):
    """A Tracker that joins after one with the default interval (30 s) is beaten at its own, shorter
    interval: the heartbeat thread once slept out the 30 s chosen before it joined."""
    slow = Tracker(f"sqlite:///{tmp_path}/slow.db", "slow")
    slow.end(slow.start("slow", {}, {}))
    time.sleep(0.2)                                      # the thread is now inside a long wait
    tr = Tracker(f"sqlite:///{tmp_path}/m.db", "beat", stale_after=2)
    rid = tr.start("beating", {}, {})
    first = float(tr.client.get_run(rid).data.tags[track.HEARTBEAT])
    deadline = time.time() + 10
    while time.time() < deadline and float(tr.client.get_run(rid).data.tags[track.HEARTBEAT]) <= first:
        time.sleep(0.3)
    assert float(tr.client.get_run(rid).data.tags[track.HEARTBEAT]) > first
    tr.end(rid)


def test_a_claim_whose_claimant_died_before_its_run_is_taken_over(tmp_path):
    """The marker of a claim without a run: busy while young, then the next claim wins."""
    tr = Tracker(f"sqlite:///{tmp_path}/m.db", "markers", stale_after=600)   # young whatever the load
    tr.client.create_experiment(claim_marker(tr.experiment_id, "k1", 0),
                                tags={"owner_host": "node-elsewhere", "owner_pid": "7"})
    assert tr.claim("k1", "x", {}, {}, lambda: None) == ("busy", "node-elsewhere:7")
    tr.stale_after = 0.5
    time.sleep(0.6)
    state, rid = tr.claim("k1", "x", {}, {}, lambda: None)
    assert state == "new" and tr.client.get_run(rid).data.tags["claim"] == "1"
    assert tr.client.get_experiment_by_name(claim_marker(tr.experiment_id, "k1", 1)).lifecycle_stage == "deleted"
    tr.end(rid, "FAILED", "x")                          # a failed run is measured again: claim 2
    state, again = tr.claim("k1", "x", {}, {}, lambda: None)
    assert state == "new" and tr.client.get_run(again).data.tags["claim"] == "2"
    tr.end(again)
    assert tr.claim("k1", "x", {}, {}, lambda: None) == ("done", again)


def test_a_claim_whose_claimant_on_this_host_ended_before_its_run_is_taken_over_at_once(tmp_path):
    """A job process killed between its claim marker and its run (Ctrl-C of a parallel sweep) held the
    key for tracking.stale_after_s: the sweep run again at once skipped that kernel as measured
    elsewhere, and ended with one run fewer. A claimant of this host whose process has ended has spent
    its claim; one still alive, or of another host, holds it while the marker is young."""
    tr = Tracker(f"sqlite:///{tmp_path}/m.db", "markers", stale_after=600)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    for key, pid in (("dead", gone), ("alive", str(os.getpid()))):
        tr.client.create_experiment(claim_marker(tr.experiment_id, key, 0),
                                    tags={"owner_host": socket.gethostname(), "owner_pid": pid})
    state, rid = tr.claim("dead", "x", {}, {}, lambda: None)
    assert state == "new" and tr.client.get_run(rid).data.tags["claim"] == "1"
    assert tr.claim("alive", "x", {}, {}, lambda: None) == ("busy", f"{socket.gethostname()}:{os.getpid()}")
    tr.end(rid)


def _ends_when_looked_up(monkeypatch, pid: str, last_act):
    """track.process_ended as it answers when the process ``pid`` of this host does ``last_act`` (ends
    its run, say) and exits between a claimant's read of the store and its look at that process."""
    real = track.process_ended

    def ended(host, p):
        if p == pid:
            last_act()
            return True
        return real(host, p)
    monkeypatch.setattr(track, "process_ended", ended)


def test_a_run_finished_by_its_process_just_before_it_exited_is_not_measured_again(tmp_path, monkeypatch):
    """The claimant read the run RUNNING, then its process FINISHED it and exited: the run is done,
    not an orphan to close as KILLED (over its FINISHED status) and measure again. Seen through a
    tracking server under load: two runs of one measurement."""
    tr = Tracker(f"sqlite:///{tmp_path}/m.db", "settled", stale_after=600)
    rid = tr.start("other", {}, {"run_key": "k", "claim": "0"})
    tr.open.discard(rid)
    tr.client.set_tag(rid, "owner_pid", "999999991")          # another process of this host
    _ends_when_looked_up(monkeypatch, "999999991", lambda: tr.client.set_terminated(rid, "FINISHED"))
    assert tr.claim("k", "x", {}, {}, lambda: None) == ("done", rid)
    assert tr.client.get_run(rid).info.status == "FINISHED"
    assert len(tr.client.search_runs([tr.experiment_id], "tags.run_key = 'k'")) == 1


def test_a_run_made_by_a_claimant_just_before_it_exited_is_seen(tmp_path, monkeypatch):
    """The claimant found marker 0 without a run, then its maker started and FINISHED the run and
    exited: claim 0 is not spent (its run is done), so no claim 1 and no second run."""
    tr = Tracker(f"sqlite:///{tmp_path}/m.db", "settled", stale_after=600)
    mid = tr.client.create_experiment(claim_marker(tr.experiment_id, "k", 0),
                                      tags={"owner_host": socket.gethostname(), "owner_pid": "999999992"})
    tr.client.delete_experiment(mid)
    made = []

    def run_and_exit():
        made.append(tr.start("other", {}, {"run_key": "k", "claim": "0"}))
        tr.end(made[-1])
    _ends_when_looked_up(monkeypatch, "999999992", run_and_exit)
    assert tr.claim("k", "x", {}, {}, lambda: None) == ("done", made[0])
    assert tr.client.get_experiment_by_name(claim_marker(tr.experiment_id, "k", 1)) is None
    assert len(tr.client.search_runs([tr.experiment_id], "tags.run_key = 'k'")) == 1


def test_simultaneous_claims_on_sqlite_without_its_file_lock_start_one_run(tmp_path):
    """Processes on several hosts sharing a SQLite file (a network file system) do not share its
    file lock: the claim marker alone decides."""
    rows = claim_race.race(f"sqlite:///{tmp_path}/race.db", processes=3, trials=1, no_lock=True)
    assert [(won, runs) for _, won, runs in rows] == [(1, 1)]


def test_a_racer_ends_when_its_race_is_gone():
    """When the race's process was killed (a test run stopped), its racers kept waiting at the barrier,
    their store's heartbeat at about 28% CPU each, until killed by hand: a racer now ends (status 1)
    within a second of its race (here a process that has exited)."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    pid = os.fork()
    if pid == 0:                          # as a racer: watch, then wait far longer than the test does
        try:
            claim_race.ends_with(gone.pid, every_s=0.05)
            time.sleep(30)
        finally:
            os._exit(0)
    t0 = time.monotonic()
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() - t0 < 10:
        time.sleep(0.02)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    assert done[0] == pid and os.waitstatus_to_exitcode(done[1]) == 1 and time.monotonic() - t0 < 5


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """An MLflow tracking server backed by PostgreSQL, both on loopback, as ``python
    tools/tracking_server.py FOLDER`` starts them; at the end it is stopped with SIGTERM (``kill``),
    which must stop both: it once left them running."""
    import signal
    from urllib.parse import urlsplit
    if not (tracking_server.postgres_bin("initdb") and tracking_server.postgres_bin("postgres")):
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    if importlib.util.find_spec("psycopg2") is None:
        pytest.skip("the psycopg2 driver is not installed (pip install psycopg2-binary)")
    folder = tmp_path_factory.mktemp("pg")
    proc = subprocess.Popen([sys.executable, str(ROOT / "tools" / "tracking_server.py"), str(folder), "--workers",
                             "2"], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("tracking server "):
        proc.kill()
        pytest.fail(f"tools/tracking_server.py did not start: {line!r} (its log: {folder}/mlflow-server.log)")
    uri, db = line.split()[2], line.split("(store ")[1].rstrip(")\n")
    yield uri
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    for address in (urlsplit(uri), urlsplit(db)):      # both stopped: nothing answers on their ports
        with pytest.raises(OSError), socket.create_connection((address.hostname, address.port), timeout=2):
            pass


def test_simultaneous_claims_through_a_tracking_server_start_one_run(server):
    """Four processes claiming one measurement through `mlflow server` each created a run (8 of 8
    trials): the file lock beside a SQLite store means nothing to a server."""
    rows = claim_race.race(server, processes=4, trials=2)
    assert [(won, runs) for _, won, runs in rows] == [(1, 1), (1, 1)]
    tr = Tracker(server, "stale-on-server", stale_after=30)
    dead = tr.start("dead", {}, {"run_key": "k-dead"})
    _other_host(tr, dead, 90)
    state, again = tr.claim("k-dead", "again", {}, {}, lambda: None)
    assert state == "new"
    assert tr.client.get_run(dead).info.status == "KILLED"
    tr.end(again)          # no run left open: this process would beat it against the stopped server
