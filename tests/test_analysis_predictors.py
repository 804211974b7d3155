"""analysis/predictors.py on constructed tidy tables whose effects are built in: a DRAM share that is
bytes / time (circular), a precision confounder (Simpson's paradox), and interventional runs of one
kernel at several settings of a lever, with replicates."""
import math

import numpy as np
import pandas as pd
import pytest

from analysis import predictors
from analysis.predictors import interventional, kernel_identity, predictor_study, share_identity

PEAK = 4.8e12                  # B/s
SIZES = (1024, 2048, 4096)


def _run(kernel, n, precision, us, occ, nbytes, share=None, **params):
    flop = 2.0 * n ** 3
    return {"run_id": f"{kernel}-{n}-{params.get('launch.blocks_per_sm', 0)}", "kernel": kernel, "gpu": "G",
            "status": "FINISHED", "verified": True, "m": n, "n": n, "k": n, "size": str(n), "flop": flop,
            "precision": precision, "median_us": us, "min_us": us * 0.99, "max_us": us * 1.01,
            "throughput": flop / us / 1e6, "ncu_duration_us": us, "achieved_occupancy_pct": occ,
            "dram_bytes": nbytes, "dram_cycles_active": nbytes / 64.0,
            "dram_active_pct": 100 * nbytes / (us * 1e-6 * PEAK) if share is None else share,
            "pipeline.stages": 2, "verify.seed_used": hash(kernel) % 97, **params}


def _observed(seed=0, kernels=8):
    """Kernels of two precisions at three sizes; time from occupancy and traffic with noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for j in range(kernels):
        prec = "int8" if j % 2 else "fp16"
        occ, bpf = rng.uniform(10, 50), rng.uniform(0.001, 0.02)     # 2..42 % of DRAM bandwidth
        for n in SIZES:
            us = 2 * n ** 3 / 1e8 * math.exp(-0.01 * occ + rng.normal(0, 0.1))
            rows.append(_run(f"k{j}", n, prec, us, occ, bpf * 2 * n ** 3))
    return pd.DataFrame(rows)


def test_a_share_built_as_bytes_over_time_is_flagged_circular_and_never_a_predictor():
    res = predictor_study(_observed(), n_boot=50)
    assert res.identity["explained"] == pytest.approx(1.0, abs=1e-12)      # the identity, exactly
    assert res.identity["peak_tbps"] == pytest.approx(PEAK / 1e12, rel=1e-12)
    assert res.circularity.startswith(predictors.CIRCULARITY) and "explain 100.0 % of the variance" in res.circularity
    assert "better predictor" not in res.verdict and "its correlation with throughput is circular" in res.verdict
    # the check does not hold for arbitrary data: a share unrelated to throughput explains nothing
    rng = np.random.default_rng(1)
    noise = _observed().assign(dram_active_pct=lambda d: rng.uniform(1, 50, len(d)))
    assert share_identity(noise)["explained"] < 0
    assert "holds only loosely here" in predictor_study(noise, n_boot=50).circularity


def test_the_study_count_is_reported_as_traffic():
    ident = share_identity(_observed())
    assert ident["count_r2"] == pytest.approx(1.0, abs=1e-12) and ident["count_slope"] == pytest.approx(1.0, abs=1e-12)
    res = predictor_study(_observed(), n_boot=50)
    assert "count of DRAM active cycles measures DRAM traffic (R^2 = 1.0000" in res.verdict
    assert ("Whether DRAM bandwidth limits throughput cannot be answered on this GPU: 0 of 24 runs (0 kernel(s)) "
            f"use >= 60 % of DRAM bandwidth (highest {ident['share_max']:.1f} %)") in res.verdict
    bound = predictor_study(_observed().assign(dram_active_pct=70.0), n_boot=50)
    assert "24 of 24 runs (8 kernels) use >= 60 % of DRAM bandwidth (highest 70.0 %)" in bound.verdict


def _simpson(seed=2):
    """Within each precision throughput FALLS 2 % per occupancy point; int8 kernels have both higher
    occupancy and 3x the throughput, so pooling over precision makes occupancy look helpful."""
    rng = np.random.default_rng(seed)
    rows = []
    for j in range(12):
        prec, shift, fast = ("int8", 40.0, 3.0) if j % 2 else ("fp16", 0.0, 1.0)
        occ = shift + rng.uniform(0, 20)
        for n in SIZES:
            thr_factor = fast * math.exp(-0.02 * occ + rng.normal(0, 0.02))
            rows.append(_run(f"k{j}", n, prec, 2 * n ** 3 / 1e8 / thr_factor, occ, 0.05 * 2 * n ** 3))
    return pd.DataFrame(rows)


def test_stratifying_by_precision_recovers_the_built_in_sign_that_pooling_flips():
    res = predictor_study(_simpson(), n_boot=100)
    t = res.tests[(res.tests["predictor"] == "achieved_occupancy_pct")
                  & (res.tests["test"] == "slope (cluster-robust OLS)")].set_index("scope")
    within, pooled = t.loc["size x precision"], t.loc["size only (the study's control)"]
    assert pooled["estimate"] > 0 and pooled["ci_low"] > 0                    # pooled: the wrong sign
    assert within["ci_low"] <= -0.02 <= within["ci_high"] and within["ci_high"] < 0
    assert within["n_kernels"] == 12 and within["df"] == 11 and within["n"] == 36
    assert f"{within['effect']:+.3g} % per +10 points of achieved occupancy" in res.verdict
    assert "flips the sign for achieved occupancy" in res.verdict and "precision confounds" in res.verdict
    # bytes/FLOP (and so the count) is constant within size x precision here: no slope, no p
    assert res.family_size == res.tests["p"].notna().sum() == 4
    assert (res.tests["p_adj"].dropna() >= res.tests["p"].dropna() - 1e-15).all()


def _levers(replicates=True, seed=3, effect=-0.01):
    """Four kernels, each at blocks_per_sm 1..4 (occupancy 12.5 points a step) at two sizes; throughput
    changes by ``effect`` (ln units) per occupancy point, plus a kernel's own level; five replicates."""
    rng = np.random.default_rng(seed)
    rows, reps = [], {}
    for j in range(4):
        level = rng.normal(0, 0.3)
        for n in (2048, 4096):
            for b in (1, 2, 3, 4):
                occ = 12.5 * b + rng.normal(0, 0.5)
                us = 2 * n ** 3 / 1e8 * math.exp(-(level + effect * occ) + rng.normal(0, 0.005))
                r = _run(f"k{j}", n, "int8", us, occ, 1e8 * b, **{"launch.blocks_per_sm": b, "tile.warps": j})
                rep = us * np.exp(rng.normal(0, 0.01, 5))
                reps[r["run_id"]] = list(rep)
                r["median_us"] = float(np.median(rep))
                rows.append(r)
    return pd.DataFrame(rows), (reps if replicates else None)


def test_interventional_effect_is_recovered_over_the_observed_range_within_its_interval():
    d, reps = _levers()
    t = interventional(d, reps, n_boot=200)
    occ = t[t["lever"] == "occupancy"]
    assert list(occ["size"]) == ["2048", "4096"] and (occ["kernels"] == 4).all() and (occ["runs"] == 16).all()
    for _, r in occ.iterrows():
        assert 11 < r["x_low"] < 14 and 48 < r["x_high"] < 52            # occupancy 12.5..50 as built
        built = 100 * (math.exp(-0.01 * (r["x_high"] - r["x_low"])) - 1)   # about -31 % over the range
        assert r["effect"] == pytest.approx(built, abs=1.0)
        assert r["rep_low"] <= built <= r["rep_high"] and r["kern_low"] <= built <= r["kern_high"]
        assert r["per_step"] == pytest.approx(100 * (math.exp(-0.05) - 1), abs=0.2)   # -4.9 % per +5 points
        assert r["ci_source"] == "replicates" and r["p"] < 1e-3 and r["across"] == "4 kernels"
    assert t[t["lever"] == "DRAM traffic"].empty                    # no traffic lever was moved
    res = predictor_study(d, n_boot=100, replicates=reps)
    r = res.interventional.iloc[0]
    assert res.verdict.startswith("Changing occupancy through launch.blocks_per_sm with the kernel held fixed "
                                  "(4 kernel(s) per stratum at most, 32 runs, 2 precision x size strata) changed "
                                  "throughput over the range of achieved occupancy each stratum's runs hold by "
                                  f"int8 N=2048 {r['effect']:+.3g} % from {r['x_low']:.3g} to {r['x_high']:.3g} "
                                  f"points [{r['rep_low']:+.2f}, {r['rep_high']:+.2f}]")
    assert "across kernels (2 stratum(s) with >= 3 kernels) 2 have Holm-adjusted p < 0.05" in res.verdict
    assert res.interventional["p_adj"].notna().all() and res.family_size == 2 + res.tests["p"].notna().sum()


def test_a_lever_that_barely_moves_dram_bytes_gives_no_effect_never_a_per_doubling_number():
    """The H200 case: the operands fit in L2, the traffic levers move DRAM bytes 8.50e6 -> 8.51e6."""
    d, reps = _levers()
    d = d[(d["tile.warps"] == 0) & (d["size"] == "2048")].copy()                 # one kernel, one size
    d["launch.blocks_per_sm"] = 0
    d["tile.group_m"] = d.pop("achieved_occupancy_pct").rank().astype(int)      # four settings of the lever
    d["dram_bytes"] = 8.50e6 + 2.5e3 * (d["tile.group_m"] - 1)                  # +0.09 % at most
    t = interventional(d, reps, n_boot=50)
    r = t.iloc[0]
    assert (r["lever"], r["kernels"], r["runs"]) == ("DRAM traffic", 1, 4)
    assert math.isnan(r["effect"]) and math.isnan(r["per_step"]) and math.isnan(r["p"])
    assert r["note"] == ("the levers did not change DRAM bytes here (8.5e+06..8.51e+06 B, max/min 1.001; an "
                         "estimate needs max/min >= 1.10): no effect estimated")
    res = predictor_study(d, n_boot=20, replicates=reps)
    assert res.verdict.startswith("Changing DRAM traffic through tile.group_m with the kernel held fixed (1 kernel(s) "
                                  "per stratum at most, 4 runs, 1 precision x size strata) did not change DRAM bytes "
                                  "in 1 stratum(s) (int8 N=2048: 8.5e+06..8.51e+06 B, max/min 1.001; an estimate "
                                  "needs max/min >= 1.10): no effect estimated there.")
    assert "doubling of DRAM bytes" not in res.verdict
    shown = predictors.tables(res)["interventional"].iloc[0]
    assert (shown["throughput change over the range (%)"], shown["across kernels (95% CI of the change)"]) == \
        ("no effect estimated", "-")


def test_with_two_kernels_whether_the_effect_generalises_cannot_be_said():
    d, reps = _levers()
    d = d[d["tile.warps"] < 2]
    res = predictor_study(d, n_boot=50, replicates=reps)
    iv = res.interventional
    assert (iv["kernels"] == 2).all() and iv["p"].isna().all() and iv["kern_low"].isna().all()
    assert (iv["across"] == "cannot be said: 2 kernel(s), at least 3 needed").all()
    assert (iv["rep_high"] < 0).all()                       # measured for these two kernels: a fall
    assert ("whether this holds for other kernels cannot be said: 2 kernel(s) per stratum at most, at least 3 "
            "needed.") in res.verdict
    assert res.family_size == res.tests["p"].notna().sum()   # Holm over the tests that exist only
    assert "Holm-adjusted" not in res.verdict.split("Observationally")[0]


def test_without_replicates_the_interval_comes_from_the_batch_spread_and_says_so():
    d, _ = _levers(replicates=False)
    t = interventional(d, None, n_boot=100)
    assert set(t["ci_source"]) == {"batch spread"}


def test_same_kernel_is_the_run_key_identity_without_the_lever():
    d, _ = _levers()
    d["spec.entry"] = d["kernel"] + "_b" + d["launch.blocks_per_sm"].astype(str)     # spells the lever too
    cols = kernel_identity(d, predictors.OCCUPANCY_LEVERS)
    assert "launch.blocks_per_sm" not in cols and "verify.seed_used" not in cols and "spec.entry" not in cols
    assert {"pipeline.stages", "tile.warps", "m", "n", "k", "gpu"} <= set(cols)
    # kernels that differ in a non-lever param are never compared with each other
    d.loc[d["launch.blocks_per_sm"] == 2, "pipeline.stages"] = 3
    t = interventional(d, None, n_boot=50)
    assert (t["runs"] == 12).all()                       # blocks_per_sm 1, 3, 4 of each kernel only
    # a traffic lever read back as a nullable integer with missing values (runs logged before it existed)
    d["tile.group_m"] = pd.array([pd.NA if b == 1 else 8 for b in d["launch.blocks_per_sm"]], dtype="Int64")
    assert set(interventional(d, None, n_boot=20)["lever"]) == {"occupancy"}


def test_lever_runs_without_the_counter_say_what_is_missing():
    d, reps = _levers()
    d["launch.blocks_per_sm"] = 0
    d["cache.l2_prefetch"] = ["256B" if b % 2 else "none" for b in range(len(d))]
    d["dram_bytes"] = float("nan")
    t = interventional(d, reps, n_boot=20)
    assert list(t["lever"].unique()) == ["DRAM traffic"] and t["effect"].isna().all()
    res = predictor_study(d, n_boot=20, replicates=reps)
    assert res.verdict.startswith("2 stratum(s) hold runs of one kernel at several settings of cache.l2_prefetch, "
                                  "but no run has DRAM bytes (profile the runs): the effect of DRAM traffic is not "
                                  "measured.")


def test_without_lever_runs_the_answer_says_so_first():
    res = predictor_study(_observed(), n_boot=50)
    assert res.interventional.empty and res.verdict.startswith("No interventional runs are here")


def test_partial_rank_correlation_equals_the_residualised_one():
    from analysis import stats
    d = _simpson()
    x, y = d["achieved_occupancy_pct"].to_numpy(), np.log(d["throughput"].to_numpy())
    strata = (d["size"] + "/" + d["precision"]).to_numpy()
    got = predictors._rho(x, y, np.unique(strata, return_inverse=True)[1])
    assert got == pytest.approx(stats.correlation(x, y, "spearman", stats.design_matrix(strata), n_boot=10).r,
                                abs=1e-12)


@pytest.fixture(scope="module")
def lever_store(tmp_path_factory):
    """One store (built once, its first migration is the slow part): experiment "caps" = one kernel at
    several block caps, oldest first, one logged before the cap existed; experiment "levers" = three
    kernels at caps 1, 2, 4 with achieved occupancy and four replicates each (metric history), throughput
    falling 1 % (ln) per occupancy point."""
    import sys
    from pathlib import Path

    from mlflow.entities import Metric
    sys.path.insert(0, str(Path(__file__).parent / "data" / "analysis"))
    import fixture_store
    uri = f"sqlite:///{tmp_path_factory.mktemp('levers') / 'mlflow.db'}"
    with fixture_store._no_fsync():
        st = fixture_store._Store(uri, "caps")
        tags = {"kernel": "gemm_x", "gpu": "G", "backend": "gpu", "verified": "true"}
        size = {"problem.m": 512, "problem.n": 512, "problem.k": 512, "precision": "int8"}
        for i, cap in enumerate((None, "0", "1", "2", "2")):
            params = size if cap is None else {**size, "launch.blocks_per_sm": cap}
            st.run(f"r{i}", params, tags, {"median_us": 10.0 + i, "throughput": 1.0}, start=1000 + i)
        st = fixture_store._Store(uri, "levers")
        rng = np.random.default_rng(4)
        for j in range(3):
            for cap in (1, 2, 4):
                occ = 12.5 * cap
                us = 100.0 * math.exp(0.01 * occ + 0.2 * j)
                reps = us * np.exp(rng.normal(0, 0.01, 4))
                params = {**size, "problem.m": 1024, "problem.n": 1024, "problem.k": 1024,
                          "launch.blocks_per_sm": cap, "tile.warps": f"[{j}, 4]"}
                rid = st.run(f"k{j} b{cap}", params, {**tags, "kernel": f"k{j}"},
                             {"median_us": float(np.median(reps)), "throughput": 2 * 1024 ** 3 / np.median(reps) / 1e6,
                              "ncu.achieved_occupancy_pct": occ})
                st.c.log_batch(rid, metrics=[Metric("replicate_median_us", float(v), 0, i) for i, v in enumerate(reps)])
    return uri


def test_runs_of_one_kernel_at_several_block_caps_are_not_duplicates(lever_store):
    """launch.blocks_per_sm leaves the PTX (and the kernel tag) as it is: load_runs keeps one row per cap,
    and a run logged before the cap existed is the uncapped one (0)."""
    from analysis.runs import load_runs
    d = load_runs(lever_store, "caps")
    assert sorted(d["median_us"]) == [11.0, 12.0, 14.0] and d.attrs["duplicates_dropped"] == 2


def test_report_of_a_store_with_lever_runs_takes_the_replicates_from_the_metric_history(lever_store, tmp_path):
    from analysis import report
    from analysis.runs import load_runs
    d = load_runs(lever_store, "levers")
    got = predictors.load_replicates(lever_store, d["run_id"])
    assert len(got) == 9 and all(len(v) == 4 for v in got.values())
    rep = report.write_report(d, tmp_path, "levers", n_boot=50)
    row = pd.read_csv(tmp_path / "predictor_interventions.csv").iloc[0]
    assert (row["lever"], row["kernels"], row["runs"], row["ci_source"]) == ("occupancy", 3, 9, "replicates")
    built = 100 * (math.exp(-0.01 * (row["x_high"] - row["x_low"])) - 1)           # -1 % (ln) per point
    assert (row["x_low"], row["x_high"]) == (12.5, 50.0) and row["rep_low"] <= built <= row["rep_high"]
    # the runs.csv the report writes carries the replicates: --table on it gives the same intervals
    from analysis.runs import read_table
    back = report.write_report(read_table(tmp_path / "runs.csv"), tmp_path / "again", "levers", n_boot=50)
    assert pd.read_csv(tmp_path / "again" / "predictor_interventions.csv").iloc[0]["ci_source"] == "replicates"
    assert back.text.split("**Answer.**")[1].split("\n")[0] == rep.text.split("**Answer.**")[1].split("\n")[0]
    assert "Changing occupancy through launch.blocks_per_sm with the kernel held fixed (3 kernel(s)" in rep.text


def test_the_observational_part_takes_each_lever_kernel_once_as_it_is_built():
    """Runs of one kernel at forced block caps are not "kernels as they are": with the 60 lever runs of
    experiment=predictors beside the study's, occupancy's observational slope swung to -20 % per +10 points
    while the levers themselves raised throughput. Only the run at the most default setting stays."""
    d, _ = _levers()
    rows = d.to_dict("records")
    for r in rows[:8]:                          # k0 (both sizes) also measured at cap 0: the kernel as built
        if r["launch.blocks_per_sm"] == 4:
            rows.append({**r, "launch.blocks_per_sm": 0, "run_id": r["run_id"][:-1] + "0"})
    d = pd.DataFrame(rows)
    kept = predictors.as_they_are(predictors._prepare(d))
    per_kernel = kept.groupby(["kernel", "size"])["launch.blocks_per_sm"].agg(list).to_dict()
    assert per_kernel[("k0", "2048")] == [0] and per_kernel[("k0", "4096")] == [0]
    assert per_kernel[("k1", "2048")] == [1] and len(kept) == 8          # no cap 0: the first setting
    res = predictor_study(d, n_boot=50)
    assert any("Observational analysis: kernels as they are; 26 run(s)" in n for n in res.notes)
    assert set(res.tests["n"]) == {8}
    plain = _observed()
    assert predictors.as_they_are(predictors._prepare(plain)).shape == predictors._prepare(plain).shape
