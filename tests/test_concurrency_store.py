"""The store stays true under interruption and concurrency: Ctrl-C in a sweep, two sweeps at once on
one store (the slower half of test_store.py's scenarios, in a file of their own so that parallel test
workers share the work; a parallel launcher's jobs: test_parallel.py).

Each test runs ``run.py`` as a user would (without a GPU: the static path) and asserts on the store.
"""
import signal

import pytest
from test_cli import EXPERIMENT, run_cli, store_args
from test_store import assert_store_is_true, popen

pytestmark = pytest.mark.usefixtures("need_ptxas")


def test_ctrl_c_keeps_what_finished_and_a_rerun_resumes_under_the_same_parent(tmp_path):
    args = ["-m", "precision=fp16,bf16,int8", "ktile=32,64", "pipeline.stages=1,2", *store_args(tmp_path)]
    proc = popen(tmp_path, *args)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("[3/12]"):
            proc.send_signal(signal.SIGINT)
            break
    out = "".join(seen) + proc.stdout.read()
    assert proc.wait(120) == 130, out
    assert out.count("Interrupted:") == 1 and "Traceback" not in out, out
    assert "Run the same command again to resume" in out
    parents, children = assert_store_is_true(tmp_path)
    assert [p.info.status for p in parents] == ["KILLED"]
    done = {c.data.tags["run_key"] for c in children if c.info.status == "FINISHED"}
    assert 3 <= len(done) < 12
    assert all(c.data.tags["skip_reason"] == "interrupted by Ctrl-C" and c.data.tags["outcome"] == "interrupted"
               for c in children if c.info.status == "KILLED")
    # the count is of measurement runs; the sweep's parent is said apart (it was counted as a run in progress)
    killed = len([c for c in children if c.info.status == "KILLED"])
    assert f"{killed} run(s) in progress marked KILLED (outcome=interrupted); the sweep is marked KILLED" in out

    rc, out = run_cli(tmp_path, *args)
    assert rc == 0, out
    assert out.count("already tracked") == len(done)
    assert f"continuing parent run {parents[0].info.run_id}" in out
    parents2, children2 = assert_store_is_true(tmp_path)
    assert [p.info.run_id for p in parents2] == [parents[0].info.run_id]
    assert parents2[0].info.status == "FINISHED" and "skip_reason" not in parents2[0].data.tags
    assert len([c for c in children2 if c.info.status == "FINISHED"]) == 12


def test_two_sweeps_at_once_on_a_new_then_an_existing_store(tmp_path):
    """Each command gets its own output folder; the store holds the union, nothing twice."""
    uri = [f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"tracking.experiment={EXPERIMENT}"]
    for sweep in (["precision=int4,int8", "ktile=64"], ["precision=fp16,int8", "ktile=64"]):
        procs = [popen(tmp_path, "-m", *sweep, *uri) for _ in range(2)]
        outs = [p.communicate(timeout=240)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs
        assert all("Traceback" not in o and "alembic" not in o for o in outs), outs
    parents, children = assert_store_is_true(tmp_path)
    finished = [c for c in children if c.info.status == "FINISHED"]
    kernels = {c.data.tags["kernel"] for c in finished}
    assert len(finished) == len(kernels) == 3          # int4, int8 (in both sweeps), fp16
    assert len(parents) == 2                           # one per distinct sweep
    sweep_dirs = list((tmp_path / "outputs" / "multirun").glob("*/*"))
    assert len(sweep_dirs) == 4, sweep_dirs            # one folder per command
    for d in sweep_dirs:
        for job in d.iterdir():
            assert "tracking" not in job.name and "\\" not in job.name
