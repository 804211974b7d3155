"""analysis/stats.py: correlations, partial correlations, Williams' T2, Steiger's Z, OLS, Holm."""
import math

import numpy as np
import pytest
from scipy import stats as sps

from analysis import stats


def test_williams_t2_matches_howell_worked_example():
    # Howell, Statistical Methods for Psychology (6th ed., p. 262): r12 = .80, r13 = .72, r23 = .89,
    # n = 26 give t = 1.361 with df = 23, p = .187 -- as reproduced by B. Weaver's SPSS syntax on the
    # MRC CBU statistics wiki, https://imaging.mrc-cbu.cam.ac.uk/statswiki/FAQ/Will
    t, df, p = stats.williams_t(0.80, 0.72, 0.89, 26)
    assert round(t, 3) == 1.361
    assert df == 23
    assert round(p, 3) == 0.187


def test_williams_t2_is_antisymmetric_and_zero_for_equal_correlations():
    t1, _, p1 = stats.williams_t(0.6, 0.3, 0.4, 40)
    t2, _, p2 = stats.williams_t(0.3, 0.6, 0.4, 40)
    assert t1 == pytest.approx(-t2, abs=1e-12) and p1 == pytest.approx(p2, abs=1e-12)
    assert stats.williams_t(0.5, 0.5, 0.2, 30)[0] == 0.0


def test_williams_rejects_too_few_and_singular():
    with pytest.raises(ValueError, match="n >= 4"):
        stats.williams_t(0.5, 0.4, 0.3, 3)
    with pytest.raises(ValueError, match="singular"):
        stats.williams_t(1.0, 1.0, 0.5, 30)


def test_steiger_z_is_zero_for_equal_and_close_to_williams_for_large_n():
    assert stats.steiger_z(0.4, 0.4, 0.3, 50)[0] == 0.0
    z, p = stats.steiger_z(0.5, 0.45, 0.4, 2000)
    t, df, pt = stats.williams_t(0.5, 0.45, 0.4, 2000)
    assert round(z, 3) == 2.428 and round(t, 3) == 2.430   # the same hypothesis; they converge in n
    assert p == pytest.approx(pt, rel=1e-3) and 0.01 < p < 0.02


@pytest.fixture
def xy():
    rng = np.random.default_rng(7)
    x = rng.normal(size=40)
    return x, 0.6 * x + rng.normal(size=40)


def test_correlation_equals_scipy(xy):
    x, y = xy
    pr, sr = stats.correlation(x, y, "pearson", n_boot=300), stats.correlation(x, y, "spearman", n_boot=300)
    assert pr.r == pytest.approx(sps.pearsonr(x, y)[0], abs=1e-12)
    assert pr.p == pytest.approx(sps.pearsonr(x, y)[1], rel=1e-9)
    assert sr.r == pytest.approx(sps.spearmanr(x, y)[0], abs=1e-12)
    assert sr.p == pytest.approx(sps.spearmanr(x, y)[1], rel=1e-9)
    assert pr.n == 40 and pr.df == 38 and pr.k == 0
    assert pr.lo < pr.r < pr.hi and -1 <= pr.lo and pr.hi <= 1


def test_bootstrap_is_reproducible_and_seeded(xy):
    x, y = xy
    a = stats.correlation(x, y, "spearman", n_boot=400, seed=3)
    b = stats.correlation(x, y, "spearman", n_boot=400, seed=3)
    c = stats.correlation(x, y, "spearman", n_boot=400, seed=4)
    assert (a.lo, a.hi) == (b.lo, b.hi)
    assert (a.lo, a.hi) != (c.lo, c.hi)


def test_partial_correlation_matches_closed_form(xy):
    x, y = xy
    z = np.random.default_rng(11).normal(size=40) + 0.5 * x
    rxy, rxz, ryz = (sps.pearsonr(a, b)[0] for a, b in ((x, y), (x, z), (y, z)))
    expected = (rxy - rxz * ryz) / math.sqrt((1 - rxz ** 2) * (1 - ryz ** 2))
    c = stats.correlation(x, y, "pearson", np.column_stack([np.ones(40), z]), n_boot=200)
    assert c.r == pytest.approx(expected, abs=1e-12)
    assert c.df == 37 and c.k == 1
    t = expected * math.sqrt(37 / (1 - expected ** 2))
    assert c.p == pytest.approx(2 * sps.t.sf(abs(t), 37), rel=1e-9)


def test_partial_for_groups_equals_within_group_correlation():
    # two groups with different means: partialling the group indicator removes the between-group part
    x = np.array([1, 2, 3, 4, 11, 12, 13, 14], float)
    y = np.array([2, 1, 4, 3, 30, 29, 32, 31], float)
    c = stats.correlation(x, y, "pearson", stats.design_matrix(["a"] * 4 + ["b"] * 4), n_boot=100)
    assert c.r == pytest.approx(0.6, abs=1e-12)      # within each group: r = 0.6
    assert stats.correlation(x, y, "pearson", n_boot=100).r > 0.95


def test_degenerate_inputs_give_nan_with_a_reason():
    c = stats.correlation([1, 2, 3], [2, 1, 3], "pearson", n_boot=50)
    assert c.df == 1 and c.r == pytest.approx(0.5, abs=1e-12)
    two = stats.correlation([1, 2], [2, 1], "pearson", n_boot=50)
    assert math.isnan(two.r) and two.note == "too few runs: n=2 with 0 covariate(s) leaves df=0"
    k = stats.correlation([1, 2, 3, 4, 5], [3, 3, 3, 3, 3], "spearman", n_boot=50)
    assert math.isnan(k.r) and "constant" in k.note
    few = stats.correlation([1, 2, 3, 4], [1, 3, 2, 4], "pearson", stats.design_matrix(list("abcd")), n_boot=50)
    assert math.isnan(few.r) and "df=-1" in few.note
    with pytest.raises(ValueError, match="valid values: spearman, pearson"):
        stats.correlation([1, 2], [1, 2], "kendall")


def test_compare_dependent_orients_signs_and_uses_williams():
    rng = np.random.default_rng(5)
    y = rng.normal(size=60)
    x1, x2 = y + 0.5 * rng.normal(size=60), -y + 2.0 * rng.normal(size=60)
    t = stats.compare_dependent(y, x1, x2, "pearson")
    r1, r2, r12 = sps.pearsonr(y, x1)[0], sps.pearsonr(y, x2)[0], sps.pearsonr(x1, x2)[0]
    assert (t.r1, t.r2) == pytest.approx((abs(r1), abs(r2)), abs=1e-12)
    assert t.r12 == pytest.approx(-r12, abs=1e-12)          # x2 flipped to a positive correlation
    assert (t.t, t.df, t.p) == pytest.approx(stats.williams_t(abs(r1), abs(r2), -r12, 60), abs=1e-12)


def test_standardized_ols_equals_normal_equations():
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=50), rng.normal(size=50)
    y = 2 * a - b + rng.normal(size=50)
    table, r2, n = stats.standardized_ols(y, {"a": a, "b": b})
    r = np.corrcoef([y, a, b])
    expected = np.linalg.solve(r[1:, 1:], r[1:, 0])        # standardised betas = Rxx^-1 rxy
    assert table["beta"].to_numpy() == pytest.approx(expected, abs=1e-10)
    assert r2 == pytest.approx(float(expected @ r[1:, 0]), abs=1e-10) and n == 50
    assert (table["ci_low"] < table["beta"]).all() and (table["beta"] < table["ci_high"]).all()


def test_holm_adjustment_exact_and_nan_left_out():
    adj = stats.adjust_pvalues([0.01, 0.04, float("nan"), 0.03])
    # Holm on three p-values: sorted 0.01, 0.03, 0.04 -> 0.03, 0.06, 0.06 (monotone)
    assert adj[0] == pytest.approx(0.03) and adj[3] == pytest.approx(0.06) and adj[1] == pytest.approx(0.06)
    assert math.isnan(adj[2])


@pytest.mark.parametrize("m", [1, 2, 7, 40])
def test_holm_adjustment_equals_statsmodels(m):
    """The adjusted p-values equal statsmodels' multipletests(method="holm"), ties and values that
    reach 1 included."""
    from statsmodels.stats.multitest import multipletests
    rng = np.random.default_rng(m)
    p = np.concatenate([rng.uniform(0, 0.2, m), [0.05, 0.05, 0.9]])
    rng.shuffle(p)
    assert stats.adjust_pvalues(p) == pytest.approx(multipletests(p, method="holm")[1], abs=1e-15)
    assert stats.adjust_pvalues([]).shape == (0,)


@pytest.mark.parametrize("bad", [float("inf"), -float("inf"), 1.5, -0.01])
def test_holm_refuses_what_is_no_p_value(bad):
    """±inf was dropped like NaN, which shrank the family (0.02 and 0.03 of three became 0.04 and 0.04,
    not 0.06 and 0.06)."""
    with pytest.raises(ValueError, match=r"p-values must lie in \[0, 1\] or be NaN"):
        stats.adjust_pvalues([0.02, bad, 0.03])


def _clustered(seed=1, kernels=8, sizes=5):
    """Runs of ``kernels`` kernels at ``sizes`` sizes: a kernel effect shared by all its runs."""
    rng = np.random.default_rng(seed)
    k = np.repeat(np.arange(kernels), sizes)
    s = np.tile(np.arange(sizes), kernels)
    x = rng.normal(size=kernels)[k] + 0.3 * rng.normal(size=len(k))
    y = 0.5 * x + s + rng.normal(size=kernels)[k] + 0.2 * rng.normal(size=len(k))
    return y, x, s, k


def test_cluster_ols_equals_statsmodels_cluster_robust():
    import statsmodels.api as sm
    y, x, s, k = _clustered()
    f = stats.cluster_ols(y, x, s, k)
    design = np.column_stack([x, stats._dummies(s)])
    ref = sm.OLS(y, design).fit(cov_type="cluster", cov_kwds={"groups": k}, use_t=True)
    assert f.b == pytest.approx(ref.params[0], abs=1e-10) and f.se == pytest.approx(ref.bse[0], abs=1e-10)
    assert f.p == pytest.approx(ref.pvalues[0], abs=1e-10) and f.df == 7 and (f.n, f.g) == (40, 8)
    assert (f.lo, f.hi) == pytest.approx(tuple(ref.conf_int()[0]), abs=1e-10)
    one = stats.cluster_ols(y[:5], x[:5], s[:5], k[:5])
    assert math.isnan(one.b) and one.note == "1 cluster(s): a cluster-robust error needs at least 2"


def test_within_slope_equals_ols_with_group_indicators():
    import statsmodels.api as sm
    y, x, _, k = _clustered(seed=3)
    ref = sm.OLS(y, np.column_stack([x, stats._dummies(k)])).fit()
    assert stats.within_slope(y, x, k) == pytest.approx(ref.params[0], abs=1e-10)
    assert math.isnan(stats.within_slope([1.0, 2.0], [3.0, 3.0], ["a", "a"]))     # no x variation


def test_cluster_bootstrap_on_near_duplicate_kernels_is_wider_than_the_row_bootstrap():
    # 6 kernels, each in 4 near-identical copies (as the int4 variants), at 5 sizes: 120 rows, 6 independent units
    rng = np.random.default_rng(0)
    base = np.repeat(np.arange(6), 4)
    k = np.repeat(np.arange(24), 5)
    xk, yk = rng.normal(size=6), rng.normal(size=6)
    x = xk[base][k] + 0.01 * rng.normal(size=120)
    y = 0.3 * xk[base][k] + yk[base][k] + 0.01 * rng.normal(size=120)
    r = lambda i: float(np.corrcoef(x[i], y[i])[0, 1])  # noqa: E731
    lo_c, hi_c, _ = stats.cluster_bootstrap(r, base[k], 400, seed=1)
    lo_r, hi_r, _ = stats.cluster_bootstrap(r, np.arange(120), 400, seed=1)
    assert lo_c < lo_r < r(np.arange(120)) < hi_r <= hi_c
    assert (hi_c - lo_c) > 2 * (hi_r - lo_r)
    # unique labels: the row bootstrap, resample for resample the same draws as NumPy's
    idx = np.random.default_rng(1).integers(0, 120, (400, 120))
    assert (lo_r, hi_r) == pytest.approx(tuple(np.quantile([r(i) for i in idx], [0.025, 0.975])), abs=1e-12)
