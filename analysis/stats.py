"""Statistical primitives: correlations with bootstrap intervals, partial correlations, the test for
two dependent correlations that share a variable, standardised regression, multiplicity correction.

Sources: Williams' T2 and Steiger's Z as given by Steiger (1980), "Tests for comparing elements of a
correlation matrix", Psychological Bulletin 87(2), 245-251, eq. 7 (T2, df = n - 3) and eq. 14 (Z with
the pooled r); Holm (1979), "A simple sequentially rejective multiple test procedure", Scand. J.
Statistics 6(2), 65-70, step-down adjusted p-values (as statsmodels' ``multipletests(method="holm")``
gives them, without the full garbage collection it runs on every call); OLS through
``statsmodels``; cluster-robust OLS (the CR1 sandwich with statsmodels' small-sample factor
G/(G-1) (N-1)/(N-K) and t with G - 1 df, Cameron & Miller 2015, "A practitioner's guide to
cluster-robust inference", J. Human Resources 50(2), eq. 11) and the cluster (block) bootstrap in NumPy.
Pure functions of arrays: no I/O, no module state.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats as sps

__all__ = ["Corr", "correlation", "williams_t", "steiger_z", "DependentTest", "compare_dependent",
           "standardized_ols", "adjust_pvalues", "design_matrix", "ClusterFit", "cluster_ols",
           "cluster_bootstrap", "within_slope"]

METHODS = ("spearman", "pearson")


@dataclass(frozen=True)
class Corr:
    """A correlation: estimate ``r``, bootstrap interval [lo, hi], t-test ``p`` with ``df``, ``n``
    pairs, ``k`` covariates partialled out; ``note`` says why a value is missing (NaN)."""
    method: str
    r: float
    lo: float
    hi: float
    p: float
    n: int
    df: int
    k: int = 0
    note: str = ""


def design_matrix(groups) -> np.ndarray:
    """Intercept plus one indicator column per level of ``groups`` after the first, float (n, levels)."""
    groups = np.asarray(groups)
    levels = list(dict.fromkeys(groups.tolist()))
    cols = [np.ones(len(groups))] + [(groups == lv).astype(float) for lv in levels[1:]]
    return np.column_stack(cols)


def _residualise(v: np.ndarray, z: np.ndarray | None) -> np.ndarray:
    if z is None:
        return v - v.mean(axis=-1, keepdims=True)
    beta, *_ = np.linalg.lstsq(z, v.T, rcond=None)
    return (v.T - z @ beta).T


def _r(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Row-wise Pearson r of centred rows; NaN where a row has no variance."""
    sxx, syy = (x * x).sum(-1), (y * y).sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = (x * y).sum(-1) / np.sqrt(sxx * syy)
    tiny = 1e-12 * np.maximum(1.0, np.maximum(np.abs(x).max(-1), np.abs(y).max(-1))) ** 2
    return np.where((sxx <= tiny) | (syy <= tiny), np.nan, np.clip(r, -1.0, 1.0))


def _stat(x, y, method, z):
    if method == "spearman":
        x, y = sps.rankdata(x, axis=-1), sps.rankdata(y, axis=-1)
    if z is None:
        return _r(_residualise(x, None), _residualise(y, None))
    return np.array([_r(_residualise(a, z), _residualise(b, z)) for a, b in
                     zip(np.atleast_2d(x), np.atleast_2d(y), strict=True)]).reshape(np.shape(x)[:-1])


def correlation(x, y, method: str = "spearman", covariates: np.ndarray | None = None,
                n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> Corr:
    """Spearman (rank) or Pearson (linear) correlation of paired samples, optionally partial.

    x, y: 1-D float arrays of equal length n (NaN pairs are dropped). ``covariates``: (n, q) design
    matrix with an intercept column (e.g. :func:`design_matrix` of the problem sizes); x and y (ranked
    first for Spearman) are residualised on it, so r is the partial correlation. The interval is the
    percentile bootstrap of ``n_boot`` resamples of pairs (``seed`` fixes them); the p-value is the
    two-sided t-test with df = n - 2 - (q - 1). Too few pairs (df < 1) or a constant variable give
    r = NaN with ``note`` saying which. Raises ValueError for an unknown method or unequal lengths.
    """
    if method not in METHODS:
        raise ValueError(f"method={method!r} is not valid; valid values: {', '.join(METHODS)}")
    x, y = np.asarray(x, float), np.asarray(y, float)
    if x.shape != y.shape:
        raise ValueError(f"x and y differ in length: {x.shape} vs {y.shape}")
    keep = np.isfinite(x) & np.isfinite(y)
    z = None if covariates is None else np.asarray(covariates, float)[keep]
    x, y = x[keep], y[keep]
    n, k = len(x), 0 if z is None else int(np.linalg.matrix_rank(z)) - 1
    dof = n - 2 - k
    nan = Corr(method, math.nan, math.nan, math.nan, math.nan, n, dof, k)
    if dof < 1:
        return replace(nan, note=f"too few runs: n={n} with {k} covariate(s) leaves df={dof}")
    r = float(_stat(x, y, method, z))
    if not math.isfinite(r):
        return replace(nan, note="a variable is constant (after removing the covariates)")
    t = r * math.sqrt(dof / max(1e-300, 1 - r * r))
    p = float(2 * sps.t.sf(abs(t), dof))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    if z is None:
        boot = _stat(x[idx], y[idx], method, None)
    else:
        boot = np.array([_stat(x[i], y[i], method, z[i]) for i in idx])
    boot = boot[np.isfinite(boot)]
    note, lo, hi = "", math.nan, math.nan
    if len(boot) >= 0.5 * n_boot:
        lo, hi = (float(v) for v in np.quantile(boot, [(1 - level) / 2, (1 + level) / 2]))
    else:
        note = f"no bootstrap interval: {n_boot - len(boot)} of {n_boot} resamples had a constant variable"
    return Corr(method, r, lo, hi, p, n, dof, k, note)


def williams_t(r12: float, r13: float, r23: float, n: float) -> tuple[float, int, float]:
    """Williams' T2 for H0: rho12 = rho13 (two correlations sharing variable 1), Steiger (1980) eq. 7.

    r12, r13: correlations of the shared variable with the two others; r23: their correlation;
    n: pairs (an effective n: subtract the covariates of partial correlations). Returns
    (t, df = n - 3, two-sided p). Raises ValueError when n < 4 or |R| <= 0 (a singular matrix).
    """
    if n < 4:
        raise ValueError(f"Williams' test needs n >= 4 (df = n - 3 >= 1); got n={n}")
    det = 1 - r12 ** 2 - r13 ** 2 - r23 ** 2 + 2 * r12 * r13 * r23
    if det <= 0:
        raise ValueError(f"correlations r12={r12:.3f}, r13={r13:.3f}, r23={r23:.3f} form a singular matrix")
    rbar = (r12 + r13) / 2
    t = (r12 - r13) * math.sqrt((n - 1) * (1 + r23)
                                / (2 * (n - 1) / (n - 3) * det + rbar ** 2 * (1 - r23) ** 3))
    df = int(round(n - 3))
    return t, df, float(2 * sps.t.sf(abs(t), n - 3))


def steiger_z(r12: float, r13: float, r23: float, n: float) -> tuple[float, float]:
    """Steiger's Z for H0: rho12 = rho13 on Fisher-z values with the pooled r, Steiger (1980) eq. 14.

    Same arguments as :func:`williams_t`; returns (z, two-sided p). Raises ValueError when n < 4.
    """
    if n < 4:
        raise ValueError(f"Steiger's Z needs n >= 4; got n={n}")
    rm = (r12 + r13) / 2
    psi = r23 * (1 - 2 * rm ** 2) - 0.5 * rm ** 2 * (1 - 2 * rm ** 2 - r23 ** 2)
    c = psi / (1 - rm ** 2) ** 2
    z = (math.atanh(r12) - math.atanh(r13)) * math.sqrt((n - 3) / (2 - 2 * c))
    return z, float(2 * sps.norm.sf(abs(z)))


@dataclass(frozen=True)
class DependentTest:
    """Williams' test of |r(y, x1)| = |r(y, x2)|: the oriented correlations, t, df, p and n."""
    method: str
    r1: float
    r2: float
    r12: float
    t: float
    df: int
    p: float
    n: int
    note: str = ""


def compare_dependent(y, x1, x2, method: str = "spearman",
                      covariates: np.ndarray | None = None) -> DependentTest:
    """Does y correlate more strongly with x1 than with x2? Williams' T2 on the same n rows.

    y, x1, x2: 1-D float arrays (rows with any NaN dropped). Spearman ranks first; with
    ``covariates`` (design matrix with intercept, q columns) the three correlations are partial and
    the effective n is n - (q - 1). The predictors are oriented so both correlations are positive
    (a predictor is as good whichever its sign): r1 = |r(y,x1)|, r2 = |r(y,x2)|, r12 signed to match.
    A missing value (NaN) comes with ``note`` saying why.
    """
    y, x1, x2 = (np.asarray(a, float) for a in (y, x1, x2))
    keep = np.isfinite(y) & np.isfinite(x1) & np.isfinite(x2)
    z = None if covariates is None else np.asarray(covariates, float)[keep]
    y, x1, x2 = y[keep], x1[keep], x2[keep]
    k = 0 if z is None else int(np.linalg.matrix_rank(z)) - 1
    n_eff = len(y) - k
    rs = [float(_stat(a, b, method, z)) if len(y) else math.nan for a, b in ((y, x1), (y, x2), (x1, x2))]
    base = DependentTest(method, rs[0], rs[1], rs[2], math.nan, n_eff - 3, math.nan, len(y))
    if n_eff < 4:
        return replace(base, note=f"too few runs: n={len(y)} with {k} covariate(s) leaves df={n_eff - 3}")
    if not all(map(math.isfinite, rs)):
        return replace(base, note="a variable is constant: no test")
    s1, s2 = math.copysign(1, rs[0]), math.copysign(1, rs[1])
    r1, r2, r12 = abs(rs[0]), abs(rs[1]), s1 * s2 * rs[2]
    try:
        t, df, p = williams_t(r1, r2, r12, n_eff)
    except ValueError as exc:
        return replace(base, r1=r1, r2=r2, r12=r12, note=str(exc))
    return DependentTest(method, r1, r2, r12, t, df, p, len(y))


def standardized_ols(y, xs: dict, covariates: np.ndarray | None = None, level: float = 0.95):
    """OLS of z-scored y on z-scored predictors (plus covariate columns, e.g. size indicators).

    y: 1-D array (n,); xs: name -> 1-D array (n,). Returns (table, r2, n): table rows (term, beta,
    ci_low, ci_high, p) for the predictors only, beta in standard deviations of y per standard
    deviation of the predictor; rows with any NaN are dropped. Raises ValueError when fewer rows
    than parameters + 1 remain.
    """
    import pandas as pd
    import statsmodels.api as sm
    cols = [np.asarray(y, float)] + [np.asarray(v, float) for v in xs.values()]
    keep = np.all([np.isfinite(c) for c in cols], axis=0)
    zs = [(c[keep] - c[keep].mean()) / c[keep].std(ddof=1) for c in cols]
    x = np.column_stack(zs[1:])
    z = np.ones((keep.sum(), 1)) if covariates is None else np.asarray(covariates, float)[keep]
    design = np.column_stack([x, z])
    if keep.sum() <= np.linalg.matrix_rank(design) + 1:
        raise ValueError(f"regression needs more rows than its {np.linalg.matrix_rank(design)} "
                         f"parameters + 1; got {int(keep.sum())}")
    fit = sm.OLS(zs[0], design).fit()
    ci = fit.conf_int(1 - level)
    table = pd.DataFrame({"term": list(xs), "beta": fit.params[:len(xs)], "ci_low": ci[:len(xs), 0],
                          "ci_high": ci[:len(xs), 1], "p": fit.pvalues[:len(xs)]})
    return table, float(fit.rsquared), int(keep.sum())


def adjust_pvalues(p) -> np.ndarray:
    """Holm's family-wise adjusted p-values of ``p`` (1-d, float), same shape: the i-th smallest of m
    p-values becomes max over j <= i of min(1, (m - j + 1) p_(j)) (Holm 1979; statsmodels'
    ``multipletests(method="holm")``). NaN entries (a test that could not be computed) stay NaN and are
    not counted in the family. Raises ValueError for a value outside [0, 1] (±inf included): no
    p-value, and left out silently it would shrink the family."""
    p = np.asarray(p, float)
    if (bad := p[~np.isnan(p) & ((p < 0) | (p > 1))]).size:
        raise ValueError(f"p-values must lie in [0, 1] or be NaN (a test not computed); got {bad.tolist()}")
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(~np.isnan(p))
    order = ok[np.argsort(p[ok], kind="stable")]
    out[order] = np.minimum(1.0, np.maximum.accumulate(p[order] * np.arange(len(order), 0, -1)))
    return out


def _dummies(strata) -> np.ndarray:
    """One indicator column per level of ``strata`` (no intercept), float (n, levels)."""
    strata = np.asarray(strata)
    levels = list(dict.fromkeys(strata.tolist()))
    return np.column_stack([(strata == lv).astype(float) for lv in levels])


@dataclass(frozen=True)
class ClusterFit:
    """Slope of y on x with stratum fixed effects: ``b`` (y units per x unit), cluster-robust ``se``,
    ``t``, ``df`` = clusters - 1, two-sided ``p``, 95 % interval [lo, hi], ``n`` rows, ``g`` clusters;
    ``note`` says why a value is missing (NaN)."""
    b: float
    se: float
    t: float
    df: int
    p: float
    lo: float
    hi: float
    n: int
    g: int
    note: str = ""


def cluster_ols(y, x, strata, clusters, level: float = 0.95) -> ClusterFit:
    """OLS of y on x plus one indicator per stratum, with a cluster-robust (CR1) standard error.

    y, x: 1-D float arrays (rows with NaN dropped); ``strata``: labels whose indicators absorb each
    stratum's mean (e.g. size x precision); ``clusters``: labels of the independent units (e.g. the
    kernel: its runs at several sizes are not independent). The covariance is
    c (X'X)^-1 (sum_g X_g'u_g u_g'X_g) (X'X)^-1 with c = G/(G-1) (N-1)/(N-K), K = rank of X; the
    test is t with G - 1 df (as statsmodels' ``cov_type='cluster'``, ``use_t=True``). Fewer than 2
    clusters, or no x variation within strata, give NaN with ``note``.
    """
    y, x = np.asarray(y, float), np.asarray(x, float)
    keep = np.isfinite(y) & np.isfinite(x)
    y, x = y[keep], x[keep]
    strata, clusters = np.asarray(strata)[keep], np.asarray(clusters)[keep]
    n, g = len(y), len(set(clusters.tolist()))
    nan = ClusterFit(*([math.nan] * 3), max(g - 1, 0), *([math.nan] * 3), n, g)
    if g < 2:
        return replace(nan, note=f"{g} cluster(s): a cluster-robust error needs at least 2")
    design = np.column_stack([x, _dummies(strata)])
    rank = int(np.linalg.matrix_rank(design))
    if rank < design.shape[1] or n <= rank:
        return replace(nan, note="x does not vary within any stratum (or too few rows): no slope")
    xtx_inv = np.linalg.inv(design.T @ design)
    beta = xtx_inv @ design.T @ y
    u = y - design @ beta
    meat = np.zeros_like(xtx_inv)
    for c in dict.fromkeys(clusters.tolist()):
        s = design[clusters == c].T @ u[clusters == c]
        meat += np.outer(s, s)
    cov = (g / (g - 1)) * ((n - 1) / (n - rank)) * xtx_inv @ meat @ xtx_inv
    b, se = float(beta[0]), float(math.sqrt(max(cov[0, 0], 0.0)))
    t = b / se if se > 0 else math.copysign(math.inf, b)
    q = float(sps.t.ppf((1 + level) / 2, g - 1))
    return ClusterFit(b, se, t, g - 1, float(2 * sps.t.sf(abs(t), g - 1)), b - q * se, b + q * se, n, g)


def cluster_bootstrap(statistic, clusters, n_boot: int = 2000, level: float = 0.95,
                      seed: int = 0) -> tuple[float, float, np.ndarray]:
    """Percentile interval of ``statistic(rows)`` over resamples of whole clusters.

    ``statistic``: function of an integer index array (rows of the data, repeats allowed) returning a
    float (NaN where it cannot be computed). ``clusters``: one label per row; each resample draws as
    many clusters as there are, with replacement, and takes all their rows (unique labels per row
    give the ordinary row bootstrap). Returns (lo, hi, finite resampled values); lo and hi are NaN
    when fewer than half of the resamples give a finite value.
    """
    labels = np.asarray(clusters)
    levels = list(dict.fromkeys(labels.tolist()))
    rows = [np.flatnonzero(labels == lv) for lv in levels]
    rng = np.random.default_rng(seed)
    vals = np.array([statistic(np.concatenate([rows[i] for i in rng.integers(0, len(rows), len(rows))]))
                     for _ in range(n_boot)], float)
    vals = vals[np.isfinite(vals)]
    if len(vals) < 0.5 * n_boot:
        return math.nan, math.nan, vals
    lo, hi = np.quantile(vals, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi), vals


def within_slope(y, x, groups) -> float:
    """Fixed-effects slope of y on x: both centred within each group, then sum(x y) / sum(x x).

    The effect of x on y holding the group (e.g. the kernel, all but one setting fixed) constant;
    groups without x variation add nothing. NaN when x does not vary within any group.
    """
    y, x = np.asarray(y, float), np.asarray(x, float)
    _, inv, cnt = np.unique(np.asarray(groups), return_inverse=True, return_counts=True)
    xc, yc = x - (np.bincount(inv, x) / cnt)[inv], y - (np.bincount(inv, y) / cnt)[inv]
    sxx = float((xc * xc).sum())
    return float((xc * yc).sum()) / sxx if sxx > 1e-12 * max(1.0, float((x * x).sum())) else math.nan
