"""experiments.reports.compare.verdict: same / faster / slower / ambiguous from two runs' replicate medians, on
synthetic replicate sets built from the noise measured on an H200 (the same kernel re-measured moves
0.8-1.3 %: a relative standard deviation of about 1 % per replicate; wgmma with 2 stages is 14-18 %
slower than with 4); and `python -m experiments.report --against` with a verdict per pair."""
import math
import random
import shutil
import statistics

import pytest
from test_cli import _empty_store

from experiments.reports.compare import (NO_REPLICATES, NOISE_FLOOR, NOISE_TIMES, REPLICATES, noise_of, replicates,
                                 verdict)

SD = 0.01          # relative standard deviation of one replicate median (H200 re-measurements)


def _runs(rng, n, sd, scale=1.0, base=1000.0):
    """``n`` replicate medians (us) around ``base`` x ``scale``, log-normal with ``sd``."""
    return [base * scale * rng.lognormvariate(0.0, sd) for _ in range(n)]


def _table(seed, pairs, shift, reps=5, sd=SD):
    """The verdicts of ``pairs`` pairs of runs whose second is ``shift`` slower, judged as a report does:
    with the median replicate noise of every run of the table."""
    rng = random.Random(seed)
    sides = [(_runs(rng, reps, sd), _runs(rng, reps, sd, 1 + shift)) for _ in range(pairs)]
    noise = statistics.median(noise_of(x) for side in sides for x in side)
    return [verdict(a, b, noise=noise) for a, b in sides]


def test_identical_runs_are_the_same_in_at_least_95_percent_of_pairs():
    calls = [v.call for seed in range(20) for v in _table(seed, 40, 0.0)]
    assert calls.count("same") / len(calls) >= 0.95, {c: calls.count(c) for c in set(calls)}
    assert "faster" not in calls and "slower" not in calls


@pytest.mark.parametrize("reps", [3, 5, 10])
def test_a_15_percent_slower_variant_is_always_slower(reps):
    calls = [v.call for seed in range(20) for v in _table(seed, 40, 0.15, reps)]
    assert set(calls) == {"slower"}
    faster = [verdict(b, a, noise=SD).call for a, b in
              ((_runs(random.Random(s), reps, SD), _runs(random.Random(s + 99), reps, SD, 1.15)) for s in range(50))]
    assert set(faster) == {"faster"}


@pytest.mark.parametrize("reps", [3, 5, 10])
def test_half_a_percent_within_one_percent_noise_is_never_called_faster_or_slower(reps):
    calls = [v.call for seed in range(20) for v in _table(seed, 40, 0.005, reps)]
    assert set(calls) <= {"same", "ambiguous"} and "same" in calls


def test_one_replicate_is_ambiguous_never_a_call_from_the_batches():
    v = verdict([1000.0], [1500.0])
    assert v.call == "ambiguous" and v.reason.startswith(NO_REPLICATES)
    assert "both runs have R = 1; +50.0% is not told from noise" in v.reason
    assert v.low is None and v.replicates == (1, 1) and v.ratio == 1.5
    v = verdict([1000.0, 1001.0, 999.0], [1500.0])
    assert v.call == "ambiguous" and "the second run has R = 1" in v.reason


def test_the_interval_is_welchs_as_scipy_computes_it():
    """The interval of the log ratio (noise 0: Welch's own) equals scipy.stats.ttest_ind's (equal_var=False)
    confidence interval of the mean logs' difference, at the verdict's level."""
    from scipy.stats import ttest_ind
    rng = random.Random(3)
    for reps_a, reps_b in ((3, 3), (5, 4), (10, 6)):
        a, b = _runs(rng, reps_a, 0.02), _runs(rng, reps_b, 0.01, 1.04)
        v = verdict(a, b, noise=0.0)
        ci = ttest_ind([math.log(x) for x in b], [math.log(x) for x in a], equal_var=False).confidence_interval(0.90)
        assert math.log(v.low) == pytest.approx(ci.low, rel=1e-9, abs=1e-12)
        assert math.log(v.high) == pytest.approx(ci.high, rel=1e-9, abs=1e-12)
        assert math.log(v.ratio) == pytest.approx((ci.low + ci.high) / 2)


def test_the_interval_is_never_narrower_than_the_noise_implies():
    """Three replicates that agree to 0.01 % in a table whose runs move 1 %: the interval is that of
    normal noise of 1 % (z_0.95 x 1 % x sqrt(1/3 + 1/3)), not the pair's own 0.01 %."""
    from scipy.stats import norm
    v = verdict([1000.0, 1000.1, 999.9], [1020.0, 1020.1, 1019.9], noise=0.01)
    half = norm.ppf(0.95) * 0.01 * math.sqrt(2 / 3)
    assert math.log(v.high / v.ratio) == pytest.approx(half)
    assert v.call == "ambiguous" and v.margin == pytest.approx(NOISE_TIMES * 0.01)
    # the margin has a floor: quiet runs are not told apart below it
    v = verdict([1000.0, 1000.1, 999.9], [1005.0, 1005.1, 1004.9], noise=0.0001)
    assert v.margin == NOISE_FLOOR and v.call == "same"


def test_clocks_further_apart_than_one_percent_are_compared_as_cycles():
    """The second run at a 10 % lower SM clock took 10 % longer: the same cycles, so the same kernel."""
    rng = random.Random(5)
    a = _runs(rng, 5, SD)
    b = [x * 1980 / 1782 for x in _runs(rng, 5, SD)]
    raw = verdict(a, b, noise=SD)
    assert raw.call == "slower" and not raw.normalised
    v = verdict(a, b, clocks=(1980.0, 1782.0), noise=SD)
    assert v.call == "same" and v.normalised and abs(v.ratio - 1) < 0.02
    assert "normalised by the SM clock (1980 MHz first, 1782 MHz second, -10.0%: cycles compared)" in v.reason
    # within 1 % the times are compared as they are
    v = verdict(a, a, clocks=(1980.0, 1970.0), noise=SD)
    assert not v.normalised and "normalised" not in v.reason
    assert verdict(a, b, clocks=(1980.0, 1782.0), noise=SD, clock_tolerance=None).call == "slower"


def test_the_reason_carries_the_numbers():
    v = verdict([1000.0, 1010.0, 990.0, 1005.0, 995.0], [1160.0, 1150.0, 1140.0, 1155.0, 1145.0])
    assert v.call == "slower" and v.cell() == f"slower {v.ratio - 1:+.1%}"
    assert v.reason.startswith(f"{v.ratio - 1:+.2%} (90% interval {v.low - 1:+.2%} .. {v.high - 1:+.2%}) above "
                               f"+{v.margin:.1%} (margin 3 x replicate noise {v.noise:.2%}, at least 1%); R = 5, 5")
    for bad in ([], [0.0, 1.0], [float("nan"), 1.0]):
        with pytest.raises(ValueError, match="are not finite times > 0"):
            verdict(bad, [1.0, 2.0])


# ----------------------------------------------------------------------------- the report
def _tracker(tmp_path):
    """A Tracker of experiment "e" in a copy of an empty store (no migration to wait for)."""
    from experiments.store.track import Tracker
    shutil.copy(_empty_store(), tmp_path / "m.db")
    return Tracker(f"sqlite:///{tmp_path}/m.db", "e")


def _sweep(tr, label, runs, gpu="NVIDIA H200"):
    """A sweep parent and its verified runs on ``gpu``: [(kernel, N, params, replicate medians, clock MHz)]."""
    from mlflow.entities import Metric
    parent = tr.start(f"sweep {label}", {}, {"kind": "sweep", "sweep_key": label})
    tr.end(parent)
    for kern, n, params, reps, clock in runs:
        rid = tr.start(f"{n} {kern}", {"problem.m": n, "problem.n": n, "problem.k": n, **params},
                       {"backend": "gpu", "outcome": "verified", "kernel": kern, "gpu": gpu,
                        "gpu_uuid": "GPU-a"}, parent)
        tr.log(rid, {"median_us": statistics.median(reps), "spread": 0.001,
                     **({"sm_clock_mhz_mean": clock} if clock else {})})
        tr.client.log_batch(rid, [Metric(REPLICATES, us, 0, step) for step, us in enumerate(reps) if len(reps) > 1])
        tr.end(rid)
    return parent


def test_against_a_sweep_gives_a_verdict_per_pair_and_the_tally(tmp_path, capsys):
    """Stages 2 against 4 (16 % slower) in one store: paired on everything but family.stages, each
    "slower" with its reason; the same sweep run again: "same"; runs without replicates: ambiguous."""
    from experiments.reports.report import main, verdict_table
    tr = _tracker(tmp_path)
    rng = random.Random(11)
    sizes = (4096, 8192)
    four = _sweep(tr, "s4", [(f"wgmma_s4_{n}", n, {"family.stages": 4, "verify.seed_used": rng.randrange(99)},
                              _runs(rng, 5, SD, base=n / 4), 1980.0) for n in sizes])
    slow = {n: _runs(rng, 5, SD, 1.16, base=n / 4) for n in sizes}
    two = _sweep(tr, "s2", [(f"wgmma_s2_{n}", n, {"family.stages": 2, "verify.seed_used": rng.randrange(99)},
                             slow[n], 1980.0) for n in sizes])
    lines = verdict_table(tr.uri, "e", two, four).splitlines()
    assert lines[0] == f"sweep {two} against sweep {four}; store: {tr.uri}"
    assert lines[1] == "Compared on: family.stages (2 against 4)."
    rows = [line.split(" | ") for line in lines[6:8]]
    assert [(r[0], r[1], r[2], r[5]) for r in rows] == [(f"| wgmma_s2_{n}", f"wgmma_s4_{n}", f"{n}x{n}x{n}", "5, 5")
                                                        for n in sizes]
    assert all(r[7].startswith("slower +1") and " above +" in r[8] for r in rows), rows
    assert lines[-1].startswith("Verdicts: 0 same, 0 faster, 2 slower, 0 ambiguous; replicate noise ")
    assert lines[-2] == f"2 pair(s); 0 run(s) of sweep {two} without a reference, 0 reference run(s) unmatched."
    # the same sweep again (the latest), against the one before it: previous
    again = _sweep(tr, "s2 again", [(f"wgmma_s2_{n}", n, {"family.stages": 2, "verify.seed_used": 1},
                                     [us * 1.003 for us in slow[n]], 1980.0) for n in sizes])
    assert main(["--uri", tr.uri, "--experiment", "e", "--against", "previous"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"sweep {again} against sweep {two}; store: {tr.uri}"
    assert out[1] == "Compared on: no param differs (the same kernels measured again)."
    assert out[-2].startswith("Verdicts: 2 same, 0 faster, 0 slower, 0 ambiguous") and out[-1] == ""
    # one run against one run (ids), and runs without replicates
    bare = _sweep(tr, "bare", [("wgmma_s2_4096", 4096, {"family.stages": 2}, [1200.0], None)])
    run4 = tr.client.search_runs([tr.experiment_id], f"tags.mlflow.parentRunId = '{four}' and "
                                 "tags.kernel = 'wgmma_s4_4096'")[0].info.run_id
    lines = verdict_table(tr.uri, "e", bare, run4).splitlines()
    assert lines[0].startswith(f"sweep {bare} against run {run4} (wgmma_s4_4096)")
    row = lines[6].split(" | ")
    assert row[5] == "1, 5" and row[7].startswith("ambiguous ")
    assert row[8].startswith(f"{NO_REPLICATES}: the second run has R = 1")
    assert lines[-1].startswith("Verdicts: 0 same, 0 faster, 0 slower, 1 ambiguous (1 without replicates: "
                                "sweep with timing.repeats=5")


def test_against_refuses_runs_it_cannot_compare(tmp_path, capsys):
    from experiments.reports.report import main
    tr = _tracker(tmp_path)
    only = _sweep(tr, "one", [("k", 512, {}, [10.0, 10.1], None)])
    for argv, text in ((["--against", "previous"], f"no sweep before {only} in {tr.uri}: --against previous "
                                                  "needs an earlier sweep"),
                       (["--against", only], f"sweep {only} and sweep {only} hold the same runs"),
                       (["--against", "0" * 32], f"'{'0' * 32}' is not a run id in {tr.uri}")):
        assert main(["--uri", tr.uri, "--experiment", "e", *argv]) == 2
        assert capsys.readouterr().err.startswith(f"Store error: {text}")
    with pytest.raises(SystemExit) as exc:
        main(["--uri", tr.uri, "--experiment", "e", "--against", only, "--repeat", tr.uri])
    assert exc.value.code == 2 and "drop --repeat" in capsys.readouterr().err
    other = _sweep(tr, "two", [("k", 512, {}, [20.0, 20.1], None)], gpu="NVIDIA L4")     # another GPU model
    assert main(["--uri", tr.uri, "--experiment", "e", "--against", only]) == 2
    assert (f"No run in sweep {other} has a match in sweep {only} of {tr.uri} (a run of the same GPU model that "
            "agrees in every param but the compared ones: none)") in capsys.readouterr().err


def test_replicates_are_read_by_step_and_a_run_without_them_is_one(tmp_path):
    tr = _tracker(tmp_path)
    rid = tr.start("r", {}, {})
    tr.log(rid, {"median_us": 7.0})
    assert replicates(tr, tr.client.get_run(rid)) == [7.0]
    for step, us in ((2, 12.0), (0, 10.0), (1, 11.0)):
        tr.client.log_metric(rid, REPLICATES, us, step=step)
    assert replicates(tr, tr.client.get_run(rid)) == [10.0, 11.0, 12.0]


def test_speedup_columns_show_the_verdict_where_both_runs_have_replicates(tmp_path):
    """--by-family: an mma_sync run 25 % faster than cuBLAS, both with replicates: "1.25 faster"; without
    replicates the speedup alone; a run of other operand data is a row of its own (data=zeros)."""
    from experiments.reports.report import families_table
    tr = _tracker(tmp_path)
    rng = random.Random(2)
    runs = [("cublas", 4096, {"family": "cublas"}, _runs(rng, 5, SD, 1.25), None),
            ("gemm_fp16", 4096, {"family": "mma_sync", "data": "full"}, _runs(rng, 5, SD), None),
            ("gemm_fp16", 4096, {"family": "mma_sync", "data": "zeros"}, _runs(rng, 5, SD, 0.9), None),
            ("cublas", 2048, {"family": "cublas"}, [130.0], None),
            ("gemm_fp16", 2048, {"family": "mma_sync"}, [100.0], None)]
    _sweep(tr, "s", [(k, n, {"precision": "fp16", **p}, reps, c) for k, n, p, reps, c in runs])
    for r in tr.client.search_runs([tr.experiment_id], "tags.kernel = 'gemm_fp16'"):
        n, full = int(r.data.params["problem.m"]), r.data.params.get("data", "full") == "full"
        tr.log(r.info.run_id, {"throughput": 1e6 / r.data.metrics["median_us"],
                               **({"speedup_vs_cublas": {4096: 1.25, 2048: 1.3}[n]} if full else {})})
    for r in tr.client.search_runs([tr.experiment_id], "tags.kernel = 'cublas'"):
        tr.log(r.info.run_id, {"throughput": 1e6 / r.data.metrics["median_us"]})
    rows = [line for line in families_table(tr.uri, "e").splitlines() if line.startswith("| fp16 |")]
    cells = {tuple(c.strip() for c in line.split("|")[2:4]): line.split("|")[9].strip() for line in rows}  # vs cublas
    assert cells == {("2048x2048x2048", "mma_sync"): "1.30", ("2048x2048x2048", "cublas"): "-",
                     ("4096x4096x4096", "mma_sync"): "1.25 faster", ("4096x4096x4096", "cublas"): "-",
                     ("4096x4096x4096", "mma_sync data=zeros"): "-"}, rows


def test_the_clock_of_a_run_is_the_window_clock_where_measured():
    from types import SimpleNamespace as NS

    from experiments.reports.compare import clock_of
    run = lambda **m: NS(data=NS(metrics=m))  # noqa: E731
    assert clock_of(run(sm_clock_mhz_window=1755.0, sm_clock_mhz_mean=1800.0)) == 1755.0
    assert clock_of(run(sm_clock_mhz_mean=1800.0)) == 1800.0 and clock_of(run()) is None


def test_a_mistyped_run_id_for_against_is_not_read_as_a_store(tmp_path, module_cli):
    """--against nosuchrun said "the tracking URI nosuchrun is a file store" and suggested a .db path."""
    from test_cli import store_args
    store_args(tmp_path)                                  # an empty store at tmp_path/mlflow.db
    rc, _, err = module_cli("experiments.report", "--against", "nosuchrun", "--uri", f"sqlite:///{tmp_path}/mlflow.db")
    assert rc == 2 and err.strip().splitlines()[-1].endswith(
        "--against 'nosuchrun' is neither runs of this store (previous, or a run id: 32 hex digits) nor another "
        "store (a tracking URI such as sqlite:///PATH/mlflow.db, or a path to one)"), err


def test_against_between_sweeps_of_static_runs_says_what_they_hold(tmp_path, capsys):
    """Two GPU-less sweeps: "--against previous" said "they hold 0 and 0 verified GPU run(s)" with no reason
    and no way on; it names the static runs and the command that tables them."""
    from experiments.reports.report import main
    tr = _tracker(tmp_path)
    sweeps = []
    for label in ("a", "b"):
        parent = tr.start(f"sweep {label}", {}, {"kind": "sweep", "sweep_key": label})
        for i in range(2):
            tr.end(tr.start(f"static {label}{i}", {"precision": "int8"},
                            {"backend": "static", "outcome": "static"}, parent))
        tr.end(parent)
        sweeps.append(parent)
    assert main(["--uri", tr.uri, "--experiment", "e", "--against", "previous"]) == 2
    assert capsys.readouterr().err == (
        f"No run in sweep {sweeps[1]} of {tr.uri} was measured on a GPU yet: 2 static run(s) (rendered and "
        "assembled only): a verdict needs verified GPU runs on both sides; their kernels compare as python -m "
        f"experiments.report --static --uri {tr.uri} --experiment e --sweep {sweeps[1]}\n")
