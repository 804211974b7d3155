"""The predictor question: does achieved occupancy or DRAM activity predict throughput?

One GPU's measured runs (rows of the tidy table, :mod:`analysis.runs`) go in; two analyses and a
one-paragraph answer built from their numbers come out.

- **Interventional** (:func:`interventional`): runs of one kernel that differ only in a lever, either
  ``launch.blocks_per_sm`` (occupancy) or a DRAM-traffic setting (:data:`TRAFFIC_LEVERS`). "The same
  kernel" is the run key's identity without the lever: every config param of the run (the kernel
  spec, ``data``, the timing and verification settings), the problem size and the GPU, less the
  lever's params (and their ``spec.``/``family.`` mirrors) and bookkeeping that is not in the run key
  (seeds, tracking, the sweep's size list, ``timing.timeout_s``). Per precision and size, the effect
  is the within-kernel slope of log throughput on achieved occupancy (theoretical where no counters)
  or on log DRAM bytes, given as the change over the range of the measure the runs hold (none where
  the levers barely moved it), with the interval from the replicates (``replicate_median_us`` steps
  0..R-1; else the timed batches' min..max, said so): the precision for these kernels; whether it
  holds for other kernels (bootstrap over kernels, p) only with 3 or more kernels.
- **Observational** (:func:`observational`): across kernels as they are, strata of size x precision
  (indicators), the kernel as the unit (cluster-robust OLS with t on kernels - 1 df, cluster
  bootstrap over kernels), rates on log scales. Measures are named for what they are: DRAM traffic
  (bytes per FLOP), DRAM bandwidth utilisation (the share, flagged circular with a measured check of
  the identity share = throughput x bytes/FLOP / peak), and the study's count of DRAM active cycles
  (reported as the study used it; it measures traffic).

One Holm correction covers every p-value of both tables.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats as sps

from . import stats
from .runs import (DRAM_COUNT, DRAM_SHARE, MEDIAN_US, NCU_DURATION, OCCUPANCY, THROUGHPUT, ok_runs,
                   size_order, value_text)

__all__ = ["PREDICTORS", "MEASURES", "CIRCULARITY", "OCCUPANCY_LEVERS", "TRAFFIC_LEVERS", "as_they_are",
           "PredictorResult", "predictor_study", "observational", "interventional", "share_identity",
           "kernel_identity",
           "load_replicates", "DRAM_BOUND_PCT"]

DRAM_BYTES, BYTES_PER_FLOP, THEORETICAL = "dram_bytes", "dram_bytes_per_flop", "theoretical_occupancy_pct"
# the ncu columns the figures draw: column -> (label, scale of the statistics)
PREDICTORS = {
    OCCUPANCY: ("achieved occupancy (%)", "linear"),
    DRAM_SHARE: ("DRAM bandwidth utilisation (% of peak; circular with throughput)", "log"),
    DRAM_COUNT: ("DRAM active cycles (the study's count; it measures DRAM traffic)", "log"),
}
# every measure the observational table tests, in the order shown
MEASURES = {OCCUPANCY: PREDICTORS[OCCUPANCY],
            BYTES_PER_FLOP: ("DRAM traffic per operation (bytes/FLOP)", "log"),
            DRAM_SHARE: PREDICTORS[DRAM_SHARE], DRAM_COUNT: PREDICTORS[DRAM_COUNT]}
CIRCULARITY = ("DRAM bandwidth utilisation (ncu.dram_active_pct, DRAM active cycles as a share of the "
               "elapsed ones) is DRAM bytes / (duration x peak bandwidth) = throughput x bytes per FLOP / "
               "peak: its association with throughput is an accounting identity, not evidence that DRAM "
               "limits the kernel, and it is never called a predictor here.")
OCCUPANCY_LEVERS = ("launch.blocks_per_sm",)
TRAFFIC_LEVERS = ("tile.group_m", "tile.order", "cache.l2_hint_a", "cache.l2_hint_b", "cache.l2_prefetch")
LEVER_DEFAULTS = {"launch.blocks_per_sm": 0}          # a run logged before the lever existed ran with it
# params of a run that are not in its run key (experiments/runner/job.py) and so do not tell kernels
# apart, and
# the entry name some families log (spec.entry: it spells every setting, the lever's too)
NOT_IDENTITY = ("verify.seed", "verify.seed_used", "problem.sizes", "problem.shapes", "timing.timeout_s",
                "study_kernel", "variant", "spec.entry")
DRAM_BOUND_PCT, CIRCULAR_EXPLAINED, MIN_N, ALPHA = 60.0, 0.9, 4, 0.05
# an interventional effect is estimated only where the levers moved the measure at least this much
# (DRAM bytes max/min, occupancy range in points), and said to generalise only over this many kernels
MIN_RATIO, MIN_POINTS, MIN_KERNELS = 1.10, 5.0, 3
STEPS = {"log": f"% throughput per +{100 * (MIN_RATIO - 1):.0f} % of the measure",
         "linear": f"% throughput per +{MIN_POINTS:g} points"}
SCOPES = {"size x precision": ("size", "precision"), "size only (the study's control)": ("size",)}
PRIMARY = "size x precision"


@dataclass
class PredictorResult:
    """Everything :func:`predictor_study` found; tables are pandas DataFrames."""
    tests: pd.DataFrame                      # observational rows, with p and Holm-adjusted p_adj
    regression: pd.DataFrame | None = None   # kept for callers of older versions: always None
    r2: float = math.nan
    family_size: int = 0
    verdict: str = ""                        # the one-paragraph answer
    notes: list[str] = field(default_factory=list)
    circularity: str | None = None           # the flag on the share, with its measured diagnostic
    n: int = 0
    sizes: list[str] = field(default_factory=list)
    n_kernels: int = 0
    identity: dict = field(default_factory=dict)           # share_identity() and the count's check
    interventional: pd.DataFrame = field(default_factory=pd.DataFrame)


def _prepare(df: pd.DataFrame) -> pd.DataFrame:
    d = ok_runs(df)
    d = d[d[THROUGHPUT].notna() & (d[THROUGHPUT] > 0)].copy()
    d[BYTES_PER_FLOP] = d[DRAM_BYTES] / d["flop"] if DRAM_BYTES in d else np.nan
    if "precision" not in d:
        d["precision"] = "-"
    d["precision"] = d["precision"].fillna("-").astype(str)
    d["size"] = d["size"].astype(str)
    return d


def _x(d: pd.DataFrame, col: str) -> np.ndarray:
    v = pd.to_numeric(d[col], errors="coerce").to_numpy(float)
    if MEASURES[col][1] == "log":
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log(np.where(v > 0, v, np.nan))
    return v


def _effect(b: float, scale: str) -> float:
    """% change of throughput per +10 points (linear measure) or per doubling (log measure)."""
    return 100 * (math.exp(10 * b) - 1) if scale == "linear" else 100 * (2.0 ** b - 1)


UNITS = {"linear": "% throughput per +10 points", "log": "% throughput per doubling"}


def _join(d: pd.DataFrame, cols, sep: str = " / ") -> pd.Series:
    """One label per row: the values of ``cols`` as text ('-' for missing), joined by ``sep``."""
    return d[list(cols)].apply(lambda c: c.map(value_text)).agg(sep.join, axis=1)


def _strata(d: pd.DataFrame, cols) -> np.ndarray:
    return _join(d, cols).to_numpy()


def _rho(x, y, codes) -> float:
    """Partial Spearman rho of x and y given stratum indicators (integer ``codes``): the ranks centred
    within each stratum (the residuals of regressing them on the indicators), then Pearson r."""
    rx, ry = sps.rankdata(x), sps.rankdata(y)
    _, inv, cnt = np.unique(codes, return_inverse=True, return_counts=True)
    rx = rx - (np.bincount(inv, rx) / cnt)[inv]
    ry = ry - (np.bincount(inv, ry) / cnt)[inv]
    return float(stats._r(rx, ry))


def observational(d: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Observational table: for each measure of :data:`MEASURES` the runs have, and each stratification
    of :data:`SCOPES`, (1) the cluster-robust OLS slope of ln throughput on the measure (ln for rates,
    points for occupancy) with stratum indicators, kernels as clusters (t on kernels - 1 df), as an
    effect in % throughput per +10 points or per doubling with its 95 % interval; (2) the partial
    Spearman rho with stratum indicators, its 95 % interval from a bootstrap over whole kernels
    (``n_boot``, ``seed``) beside the row bootstrap's (which treats runs as independent).
    ``d``: prepared measured runs (one GPU). Columns: test, predictor, scope, method, estimate,
    ci_low, ci_high, effect, effect_low, effect_high, unit, row_ci_low, row_ci_high, stat, df, n,
    n_kernels, p, note."""
    rows = []
    y = np.log(d[THROUGHPUT].to_numpy(float))
    for col, (_, scale) in MEASURES.items():
        if col not in d or d[col].notna().sum() < MIN_N:
            continue
        x = _x(d, col)
        keep = np.isfinite(x)
        for scope, cols in SCOPES.items():
            s = _strata(d, cols)[keep]
            k = d["kernel"].astype(str).to_numpy()[keep]
            f = stats.cluster_ols(y[keep], x[keep], s, k)
            base = {"predictor": col, "scope": scope, "n": int(keep.sum()), "n_kernels": len(set(k))}
            eff = [_effect(v, scale) if math.isfinite(v) else math.nan for v in (f.b, f.lo, f.hi)]
            rows.append({**base, "test": "slope (cluster-robust OLS)", "method": "ols, ln throughput",
                         "estimate": f.b, "ci_low": f.lo, "ci_high": f.hi, "effect": eff[0],
                         "effect_low": eff[1], "effect_high": eff[2], "unit": UNITS[scale], "stat": f.t,
                         "df": f.df, "p": f.p, "note": f.note})
            xs, ys, codes = x[keep], y[keep], np.unique(s, return_inverse=True)[1]
            r = _rho(xs, ys, codes) if len(xs) > codes.max() + 2 else math.nan

            def boot(i, xs=xs, ys=ys, codes=codes):
                return _rho(xs[i], ys[i], codes[i])
            lo, hi, _ = stats.cluster_bootstrap(boot, k, n_boot, seed=seed)
            rlo, rhi, _ = stats.cluster_bootstrap(boot, np.arange(len(xs)), n_boot, seed=seed)
            rows.append({**base, "test": "partial rank correlation", "method": "spearman", "estimate": r,
                         "ci_low": lo, "ci_high": hi, "effect": math.nan, "effect_low": math.nan,
                         "effect_high": math.nan, "unit": "rho", "row_ci_low": rlo, "row_ci_high": rhi,
                         "stat": math.nan, "df": math.nan, "p": math.nan,
                         "note": "interval: bootstrap over kernels; row bootstrap beside it"})
    return pd.DataFrame(rows)


def share_identity(d: pd.DataFrame) -> dict:
    """How much of ln(share) the identity share = throughput x bytes/FLOP / peak explains.

    With coefficients fixed at 1 (no fit), the residual e = ln(share) - ln(throughput) - ln(bytes/FLOP)
    is -ln(peak) plus what the identity misses (the profiled duration is not the timed one);
    ``explained`` = 1 - var(e) / var(ln share): close to 1 only when the share is the identity, and
    below 0 for a share unrelated to throughput. ``peak_tbps``: DRAM bandwidth the share implies,
    bytes / (profiled duration x share) (median over runs). Also the count's check: R^2 and slope of
    ln(count) on ln(DRAM bytes). Keys absent where the runs lack the columns; ``n`` rows used."""
    out: dict = {}
    need = [DRAM_SHARE, DRAM_BYTES, THROUGHPUT, "flop"]
    if all(c in d for c in need):
        t = d[need + [NCU_DURATION]].apply(pd.to_numeric, errors="coerce")
        t = t[(t[need] > 0).all(axis=1)]
        if len(t) >= MIN_N:
            ls = np.log(t[DRAM_SHARE] / 100)
            e = ls - np.log(t[THROUGHPUT] * 1e12) - np.log(t[DRAM_BYTES] / t["flop"])
            out.update(n=len(t), explained=float(1 - e.var() / ls.var()) if ls.var() > 0 else math.nan,
                       resid_sd=float(e.std()))
            dur = t[NCU_DURATION].where(t[NCU_DURATION] > 0)
            peak = t[DRAM_BYTES] / (dur * 1e-6 * t[DRAM_SHARE] / 100) / 1e12
            out["peak_tbps"] = float(peak.median()) if peak.notna().any() else math.nan
    if DRAM_COUNT in d and DRAM_BYTES in d:
        c = d[[DRAM_COUNT, DRAM_BYTES]].apply(pd.to_numeric, errors="coerce")
        c = c[(c > 0).all(axis=1)]
        if len(c) >= MIN_N:
            fit = sps.linregress(np.log(c[DRAM_BYTES]), np.log(c[DRAM_COUNT]))
            out.update(count_n=len(c), count_r2=float(fit.rvalue ** 2), count_slope=float(fit.slope))
    if DRAM_SHARE in d and d[DRAM_SHARE].notna().any():
        s = d[DRAM_SHARE].dropna()
        out.update(share_max=float(s.max()), share_n=len(s), bound=int((s >= DRAM_BOUND_PCT).sum()),
                   bound_kernels=int(d.loc[d[DRAM_SHARE] >= DRAM_BOUND_PCT, "kernel"].nunique()),
                   under10=int((s < 10).sum()))
    return out


def _circularity_text(ident: dict) -> str:
    text = CIRCULARITY
    if "explained" in ident:
        verdict = ("it holds here" if ident["explained"] >= CIRCULAR_EXPLAINED else
                   "it holds only loosely here; the flag stands by the metric's definition")
        text += (f" Check (no fitted coefficients): ln(throughput) + ln(bytes/FLOP) explain "
                 f"{100 * ident['explained']:.1f} % of the variance of ln(share) over {ident['n']} runs "
                 f"(residual SD {ident['resid_sd']:.3f}), {verdict}")
        text += (f"; the share implies a peak of {ident['peak_tbps']:.2f} TB/s." if
                 math.isfinite(ident.get("peak_tbps", math.nan)) else ".")
    else:
        text += (" The runs have no ncu.dram_bytes: the identity is not checked here, the flag stands by "
                 "definition.")
    if "count_r2" in ident:
        text += (" The study's count of DRAM active cycles tracks DRAM traffic: ln(count) on ln(DRAM bytes) "
                 f"has R^2 = {ident['count_r2']:.5f}, slope {ident['count_slope']:.3f} "
                 f"({ident['count_n']} runs).")
    return text


def kernel_identity(d: pd.DataFrame, levers) -> list[str]:
    """Columns that say "the same kernel" apart from ``levers``: the run's config params (schema keys
    and every dotted param column, ``data`` and ``family``) less the levers, their ``spec.``/
    ``family.`` mirrors and :data:`NOT_IDENTITY` (not in the run key), plus m, n, k and gpu."""
    from .schema import schema_types
    keys = set(schema_types())
    tails = {lv.rsplit(".", 1)[-1] for lv in levers}
    cols = []
    for c in d.columns:
        is_param = c in keys or c in ("data", "family") or ("." in c and not c.startswith("metrics."))
        mirror = c.startswith(("spec.", "family.")) and c.rsplit(".", 1)[-1] in tails
        if (is_param and c not in levers and not mirror and c not in NOT_IDENTITY
                and not c.startswith("tracking.")):
            cols.append(c)
    return cols + [c for c in ("m", "n", "k", "gpu") if c in d and c not in cols]


def load_replicates(uri: str, run_ids) -> dict:
    """run id -> replicate medians (us, MLflow steps 0..R-1 of metric ``replicate_median_us``) of the
    runs that logged them. Raises what MlflowClient raises for an unreachable store."""
    import mlflow
    client = mlflow.MlflowClient(tracking_uri=uri)
    out = {}
    for rid in run_ids:
        hist = sorted(client.get_metric_history(rid, "replicate_median_us"), key=lambda m: m.step)
        if hist:
            out[rid] = [m.value for m in hist]
    return out


def _lever_runs(d: pd.DataFrame, levers) -> pd.DataFrame:
    """Rows of kernels measured at two or more settings of ``levers``, with column ``_group``."""
    present = [c for c in levers if c in d and d[c].notna().any()]
    if not present:
        return d.iloc[:0]
    d = d.copy()
    for c in present:
        d[c] = d[c].astype(object).where(d[c].notna(), LEVER_DEFAULTS.get(c, "-"))
    ident = kernel_identity(d, levers)
    d["_group"] = _join(d, ident, "|") if ident else "all"
    d["_setting"] = _join(d, present, "|")
    n_set = d.groupby("_group")["_setting"].transform("nunique")
    return d[n_set >= 2]


# each lever's setting of a kernel as it is built by default; a kernel measured at several settings is
# one kernel "as it is" for the observational analysis: its run at the most default setting
AS_BUILT = {"launch.blocks_per_sm": 0, "tile.group_m": 8, "tile.order": "grouped", "cache.l2_hint_a": "none",
            "cache.l2_hint_b": "none", "cache.l2_prefetch": "none"}


def as_they_are(d: pd.DataFrame) -> pd.DataFrame:
    """The runs of ``d`` the observational analysis takes, kernels as they are: of a kernel measured at
    two or more lever settings (:func:`_lever_runs` over every lever), only the runs at the setting with
    the most levers as built (:data:`AS_BUILT`; ties: the first such setting); every other run kept."""
    runs = _lever_runs(d, OCCUPANCY_LEVERS + TRAFFIC_LEVERS)
    if runs.empty:
        return d
    present = [c for c in AS_BUILT if c in runs]
    score = sum((runs[c].astype(str) == str(AS_BUILT[c])).astype(int) for c in present)
    best = score.groupby(runs["_group"]).transform("max")
    first = runs[score == best].groupby("_group")["_setting"].transform("min")
    drop = runs.index[(score != best) | (runs["_setting"] != first.reindex(runs.index))]
    return d.drop(index=drop)


def _run_y(d: pd.DataFrame, replicates: dict):
    """Per run: ln throughput (mean over replicates where logged) and a sampler of it for the
    measurement bootstrap; the source named ('replicates', 'batch spread' or 'none')."""
    ys, draws, kinds = [], [], []
    for _, r in d.iterrows():
        thr, med = float(r[THROUGHPUT]), float(r[MEDIAN_US])
        rep = np.asarray(replicates.get(r.get("run_id"), []), float)
        rep = rep[np.isfinite(rep) & (rep > 0)]
        if len(rep) >= 2:
            yr = np.log(thr * med / rep)
            ys.append(float(yr.mean()))
            draws.append(lambda rng, yr=yr: float(rng.choice(yr, len(yr)).mean()))
            kinds.append("replicates")
            continue
        ys.append(math.log(thr))
        lo_us, hi_us = (float(r.get(c, math.nan)) for c in ("min_us", "max_us"))
        if math.isfinite(lo_us) and math.isfinite(hi_us) and 0 < lo_us <= hi_us:
            a, b = math.log(thr * med / hi_us), math.log(thr * med / lo_us)
            draws.append(lambda rng, a=a, b=b: float(rng.uniform(a, b)))
            kinds.append("batch spread")
        else:
            draws.append(lambda rng, v=ys[-1]: v)
            kinds.append("none")
    return np.array(ys), draws, kinds


def interventional(df: pd.DataFrame, replicates: dict | None = None, n_boot: int = 2000,
                   seed: int = 0) -> pd.DataFrame:
    """Interventional table: per lever (occupancy, DRAM traffic), precision and size, the effect on
    throughput of the lever's measure holding the kernel fixed (:func:`kernel_identity`).

    The slope is the within-kernel one of ln throughput on achieved occupancy (points; theoretical
    occupancy x 100 where a group lacks the counter) or on ln DRAM bytes; ``effect`` is the % change of
    throughput it gives from the lowest to the highest value of the measure the runs hold (``x_low``,
    ``x_high``), ``per_step`` the same per +5 points or +10 % (within that range). No effect (NaN, with
    ``note``) where the levers moved the measure by less than :data:`MIN_RATIO` / :data:`MIN_POINTS`.
    Intervals (95 %): ``rep_*`` / ``step_*`` from resampling each run's replicates (``replicates``: run
    id -> replicate medians in us; else the timed batches' min..max, named in ``ci_source``): what was
    measured for these kernels; ``kern_*`` from a bootstrap over kernels and ``p`` (one-sample t-test of
    the per-kernel slopes, df = kernels - 1): whether it holds for other kernels, only with
    :data:`MIN_KERNELS` or more (``across`` says so). Empty when no kernel was measured at two settings
    of a lever."""
    replicates = replicates or {}
    d = _prepare(df) if "flop" in df and BYTES_PER_FLOP not in df else df
    rows = []
    for lever, levers in (("occupancy", OCCUPANCY_LEVERS), ("DRAM traffic", TRAFFIC_LEVERS)):
        runs = _lever_runs(d, levers)
        for (prec, size), g in runs.groupby(["precision", "size"], sort=False):
            row = {"lever": lever, "levers": ", ".join(c for c in levers if c in g), "precision": prec,
                   "size": size}
            rows.append({**row, **_stratum_effect(g, lever, replicates, n_boot, seed)})
    return pd.DataFrame(rows)


def _lever_measure(g: pd.DataFrame, lever: str) -> tuple[np.ndarray, str, str]:
    """The lever's measure per run (x), its name and its scale ('linear' points or 'log')."""
    if lever != "occupancy":
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log(pd.to_numeric(g[DRAM_BYTES], errors="coerce").to_numpy(float)), "DRAM bytes", "log"
    ach = pd.to_numeric(g[OCCUPANCY], errors="coerce")
    theo = pd.to_numeric(g.get(THEORETICAL, pd.Series(np.nan, g.index)), errors="coerce")
    has = ach.notna().groupby(g["_group"]).transform("all")      # a kernel's runs all have the counter
    name = ("achieved occupancy" if has.all() else "theoretical occupancy" if not has.any()
            else "achieved (theoretical where missing) occupancy")
    return ach.where(has, theo).to_numpy(float), name, "linear"


def _moved(lo: float, hi: float, scale: str) -> bool:
    """Whether the levers moved the measure enough to estimate an effect: max/min >= :data:`MIN_RATIO`
    for a log measure (x in ln units), a range >= :data:`MIN_POINTS` points for a linear one."""
    return hi - lo >= (math.log(MIN_RATIO) if scale == "log" else MIN_POINTS)


def _range_text(lo: float, hi: float, scale: str) -> str:
    return f"{lo:.3g}..{hi:.3g} points" if scale == "linear" else \
        f"{math.exp(lo):.3g}..{math.exp(hi):.3g} B, max/min {math.exp(hi - lo):.3f}"


def _stratum_effect(g: pd.DataFrame, lever: str, replicates: dict, n_boot: int, seed: int) -> dict:
    """The within-kernel effect of one precision x size stratum of lever runs, with its intervals.

    ``effect``: % throughput change from the lowest to the highest value of the measure the runs hold
    (the within-kernel slope times that range); ``per_step``: the slope per :data:`STEPS` step, which
    is never wider than the range (a stratum whose range is narrower gets no estimate). ``rep_*``: 95 %
    interval from the runs' replicates (the measurement precision for these kernels); ``kern_*``, ``p``:
    across kernels, only with :data:`MIN_KERNELS` or more (``across`` says which)."""
    x, measure, scale = _lever_measure(g, lever)
    keep = np.isfinite(x)
    nk = g["_group"].nunique()
    base = {"measure": measure, "kernels": nk, "runs": len(g), "slope": math.nan, "effect": math.nan,
            "per_step": math.nan, "step": STEPS[scale], "p": math.nan, "ci_source": "-", "x_range": "-",
            "x_low": math.nan, "x_high": math.nan, "across": "-", "note": None,
            **dict.fromkeys(("rep_low", "rep_high", "step_low", "step_high", "kern_low", "kern_high"),
                            math.nan)}
    if not keep.any():
        return {**base, "note": f"no run has {measure} (profile the runs)"}
    g, x = g[keep], x[keep]
    lo, hi = float(np.min(x)), float(np.max(x))
    base.update(x_range=_range_text(lo, hi, scale), x_low=lo if scale == "linear" else math.exp(lo),
                x_high=hi if scale == "linear" else math.exp(hi), runs=len(g))
    if not _moved(lo, hi, scale):
        need = f"max/min >= {MIN_RATIO:.2f}" if scale == "log" else f"a range >= {MIN_POINTS:g} points"
        return {**base, "note": f"the levers did not change {measure} here ({base['x_range']}; an estimate "
                                f"needs {need}): no effect estimated"}
    y, draws, kinds = _run_y(g, replicates)
    grp = g["_group"].to_numpy()
    b = stats.within_slope(y, x, grp)
    slopes = [stats.within_slope(y[grp == k], x[grp == k], grp[grp == k]) for k in dict.fromkeys(grp)]
    slopes = [v for v in slopes if math.isfinite(v)]
    rng = np.random.default_rng(seed)
    rep = [stats.within_slope([draw(rng) for draw in draws], x, grp) for _ in range(n_boot)]
    rlo, rhi = np.quantile(rep, [0.025, 0.975]) if math.isfinite(b) else (math.nan, math.nan)
    klo = khi = p = math.nan
    if len(slopes) >= MIN_KERNELS:
        klo, khi, _ = stats.cluster_bootstrap(lambda i: stats.within_slope(y[i], x[i], grp[i]), grp,
                                              n_boot, seed=seed)
        p = float(sps.ttest_1samp(slopes, 0.0).pvalue)
    step = math.log(MIN_RATIO) if scale == "log" else MIN_POINTS

    def pct(v, width):
        return 100 * (math.exp(v * width) - 1) if math.isfinite(v) else math.nan
    across = ("cannot be said: " f"{len(slopes)} kernel(s), at least {MIN_KERNELS} needed"
              if len(slopes) < MIN_KERNELS else f"{len(slopes)} kernels")
    return {**base, "kernels": len(slopes), "slope": b, "effect": pct(b, hi - lo),
            "rep_low": pct(rlo, hi - lo), "rep_high": pct(rhi, hi - lo),
            "per_step": pct(b, step), "step_low": pct(rlo, step), "step_high": pct(rhi, step),
            "ci_source": " and ".join(sorted(set(kinds))), "across": across,
            "kern_low": pct(klo, hi - lo), "kern_high": pct(khi, hi - lo), "p": p}


def predictor_study(df: pd.DataFrame, n_boot: int = 2000, seed: int = 0, alpha: float = ALPHA,
                    replicates: dict | None = None) -> PredictorResult:
    """Answer the predictor question for the measured runs of ONE GPU.

    df: tidy table (:func:`analysis.runs.load_runs`); only :func:`~analysis.runs.ok_runs` rows with a
    throughput are used. ``replicates``: run id -> replicate medians (us) for the interventional
    intervals (:func:`load_replicates`). Returns the observational table (``tests``), the
    interventional one, the share's identity check (``identity``, ``circularity``), one Holm
    correction over every p-value of both tables (``family_size``) and ``verdict``, the one-paragraph
    answer. Raises ValueError when df holds runs of several GPUs (analyse each GPU separately).
    """
    gpus = df["gpu"].dropna().unique()
    if len(gpus) > 1:
        raise ValueError(f"runs of {len(gpus)} GPUs ({', '.join(map(str, gpus))}): pass one GPU's runs")
    d = _prepare(df)
    notes: list[str] = []
    res = PredictorResult(pd.DataFrame(), n=len(d), sizes=size_order(d), notes=notes,
                          n_kernels=int(d["kernel"].nunique()))
    res.interventional = interventional(d, replicates, n_boot, seed)
    have = [c for c in MEASURES if c in d and d[c].notna().sum() >= MIN_N]
    if not [c for c in have if c != BYTES_PER_FLOP] and res.interventional.empty:
        notes.append("No run has the Nsight Compute metrics (ncu.achieved_occupancy_pct, ncu.dram_bytes, "
                     "ncu.dram_active_pct, ncu.dram_cycles_active): profile the runs first; nothing is said "
                     "about occupancy or DRAM activity.")
        res.verdict = ("The predictor question cannot be answered from these runs: no run has the Nsight "
                       "Compute metrics it needs (profile the runs first), and no kernel was measured at two "
                       "settings of an occupancy or DRAM-traffic lever.")
        return res
    for c in MEASURES:
        if c not in have:
            notes.append(f"{MEASURES[c][0]}: fewer than {MIN_N} measured runs have it; left out.")
    obs = as_they_are(d)
    if len(obs) < len(d):
        notes.append(f"Observational analysis: kernels as they are; {len(d) - len(obs)} run(s) at other "
                     "settings of a lever of a kernel measured at several are left to the interventional "
                     "analysis.")
    res.tests = observational(obs, n_boot, seed) if len(obs) >= MIN_N else pd.DataFrame()
    pvals = list(res.tests.get("p", [])) + list(res.interventional.get("p", []))
    adj = stats.adjust_pvalues(pvals)
    if not res.tests.empty:
        res.tests["p_adj"] = adj[:len(res.tests)]
    if not res.interventional.empty:
        res.interventional["p_adj"] = adj[len(res.tests):]
    res.family_size = int(np.isfinite(np.asarray(pvals, float)).sum())
    res.identity = share_identity(d)
    if DRAM_SHARE in have:
        res.circularity = _circularity_text(res.identity)
    res.verdict = _answer(res, alpha)
    return res


def _ci(lo, hi, digits=0) -> str:
    return "-" if not (math.isfinite(lo) and math.isfinite(hi)) else f"[{lo:+.{digits}f}, {hi:+.{digits}f}]"


def _stratum_text(r) -> str:
    where = f"{r['precision']} N={r['size']}"
    if not math.isfinite(r["effect"]):
        return f"{where} none ({r['note']})" if isinstance(r.get("note"), str) else f"{where} none"
    unit = "points" if r["step"] == STEPS["linear"] else "B"
    return (f"{where} {r['effect']:+.3g} % from {r['x_low']:.3g} to {r['x_high']:.3g} {unit} "
            f"{_ci(r['rep_low'], r['rep_high'], 2)}")


def _interventional_text(res: PredictorResult, alpha: float) -> str:
    t = res.interventional
    if t.empty:
        return (f"No interventional runs are here: no kernel was measured at two settings of "
                f"{', '.join(OCCUPANCY_LEVERS)} (occupancy) or of {', '.join(TRAFFIC_LEVERS)} (DRAM traffic) "
                "with everything else equal (experiment=predictors makes such runs), so what changing "
                "occupancy or DRAM traffic does to throughput is not measured by these runs.")
    parts = []
    for lever, g in t.groupby("lever", sort=False):
        if g["x_low"].isna().all():
            missing = g["note"].dropna().iloc[0] if "note" in g else "no measure"
            parts.append(f"{len(g)} stratum(s) hold runs of one kernel at several settings of "
                         f"{g['levers'].iloc[0]}, but {missing}: "
                         f"the effect of {lever} is not measured.")
            continue
        est, flat = g[g["effect"].notna()], g[g["effect"].isna()]
        text = (f"Changing {lever} through {g['levers'].iloc[0]} with the kernel held fixed "
                f"({int(g['kernels'].max())} kernel(s) per stratum at most, {int(g['runs'].sum())} runs, "
                f"{len(g)} precision x size strata)")
        if len(flat):
            text += (f" did not change {g['measure'].iloc[0]} in {len(flat)} stratum(s) ("
                     + "; ".join(f"{r['precision']} N={r['size']}: {r['x_range']}"
                                 for _, r in flat.iterrows())
                     + "; an estimate needs " + (f"max/min >= {MIN_RATIO:.2f}" if lever != "occupancy"
                                                 else f"a range >= {MIN_POINTS:g} points") + "): "
                     "no effect estimated there")
        if len(est):
            text += ((";" if len(flat) else "") + f" changed throughput over the range of "
                     f"{est['measure'].iloc[0]} each stratum's runs hold by "
                     + ", ".join(_stratum_text(r) for _, r in est.iterrows())
                     + f" (95 % intervals from {', '.join(sorted(set(est['ci_source'])))}: the measurement "
                     "precision for these kernels)")
            few = est[est["kernels"] < MIN_KERNELS]
            if len(few) == len(est):
                text += (f"; whether this holds for other kernels cannot be said: "
                         f"{int(est['kernels'].max())} kernel(s) per stratum at most, at least "
                         f"{MIN_KERNELS} needed")
            else:
                sig = est[est["p_adj"] < alpha]
                text += (f"; across kernels ({len(est) - len(few)} stratum(s) with >= {MIN_KERNELS} kernels) "
                         f"{len(sig)} have Holm-adjusted p < {alpha}"
                         + (f", {len(few)} cannot be said (fewer kernels)" if len(few) else ""))
        parts.append(text + ".")
    return " ".join(parts)


def _obs_row(t, col, scope):
    r = t[(t["predictor"] == col) & (t["scope"] == scope) & (t["test"] == "slope (cluster-robust OLS)")]
    return None if r.empty or not math.isfinite(r.iloc[0]["estimate"]) else r.iloc[0]


def _observational_text(res: PredictorResult, alpha: float) -> str:
    t = res.tests
    if t.empty:
        return "Observationally nothing can be said: too few measured runs with the ncu metrics."
    first = t.iloc[0]
    head = (f"Observationally (kernels as they are: {first['n_kernels']} kernel(s), {first['n']} runs, "
            f"strata of size x precision, the kernel as the unit)")
    said = []
    for col in (OCCUPANCY, BYTES_PER_FLOP):
        r = _obs_row(t, col, PRIMARY)
        if r is None:
            continue
        sig = "significant" if r["p_adj"] < alpha else "not significant"
        said.append(f"{r['effect']:+.3g} {r['unit'].replace('% throughput ', '% ')} of "
                    f"{MEASURES[col][0].split(' (')[0]} "
                    f"(95 % CI {_ci(r['effect_low'], r['effect_high'], 1)}, "
                    f"Holm p = {r['p_adj']:.3g}, {sig})")
    notes = t.loc[t["scope"] == PRIMARY, "note"]
    why = "; ".join(dict.fromkeys(n for n in notes if n and "bootstrap" not in n))
    text = head + (", throughput changes by " + " and by ".join(said) + "." if said else
                   f": no estimate for occupancy or DRAM traffic per operation ({why or 'not measured'}).")
    flips = []
    for col in (OCCUPANCY, BYTES_PER_FLOP):
        a, b = _obs_row(t, col, PRIMARY), _obs_row(t, col, "size only (the study's control)")
        if a is not None and b is not None and np.sign(a["estimate"]) != np.sign(b["estimate"]):
            flips.append(f"{MEASURES[col][0].split(' (')[0]} ({b['effect']:+.3g} pooled over precision, "
                         f"{a['effect']:+.3g} within)")
    if flips:
        text += (" Controlling for size only, as the study did, flips the sign for " + " and ".join(flips)
                 + ": precision confounds that comparison.")
    return text


def _answer(res: PredictorResult, alpha: float) -> str:
    text = _interventional_text(res, alpha) + " " + _observational_text(res, alpha)
    ident = res.identity
    if res.circularity:
        share = (f" (that identity explains {100 * ident['explained']:.1f} % of its log variance)"
                 if "explained" in ident else "")
        text += (" DRAM bandwidth utilisation is not evidence either way: it is throughput x bytes/FLOP / "
                 f"peak{share}, so its correlation with throughput is circular.")
    if "count_r2" in ident:
        text += (" The study's count of DRAM active cycles measures DRAM traffic "
                 f"(R^2 = {ident['count_r2']:.4f} against DRAM bytes, log scales), not time.")
    if "share_max" in ident and ident["bound_kernels"] < MIN_N:
        text += (f" Whether DRAM bandwidth limits throughput cannot be answered on this GPU: "
                 f"{ident['bound']} of {ident['share_n']} runs ({ident['bound_kernels']} kernel(s)) use "
                 f">= {DRAM_BOUND_PCT:.0f} % of DRAM bandwidth (highest {ident['share_max']:.1f} %) and "
                 f"{ident['under10']} use under 10 %: too few kernels are DRAM-bound to tell.")
    elif "share_max" in ident:
        text += (f" {ident['bound']} of {ident['share_n']} runs ({ident['bound_kernels']} kernels) use >= "
                 f"{DRAM_BOUND_PCT:.0f} % of DRAM bandwidth (highest {ident['share_max']:.1f} %): whether "
                 "bandwidth limits them is for the DRAM-traffic interventions to show, not the share.")
    return text + f" (One Holm correction over {res.family_size} tests.)"


def tables(res: PredictorResult) -> dict[str, pd.DataFrame]:
    """Display tables of a result: 'interventional', 'slopes', 'ranks', 'diagnostics' (those it has)."""
    out = {}
    names = {"n": "runs in the identity check", "explained": "share of var ln(share) the identity explains",
             "resid_sd": "SD of the identity's residual (ln)",
             "peak_tbps": "peak DRAM bandwidth the share implies (TB/s)",
             "count_n": "runs in the count check", "count_r2": "R^2 of ln(count) on ln(DRAM bytes)",
             "count_slope": "slope of ln(count) on ln(DRAM bytes)", "share_n": "runs with the share",
             "share_max": "highest DRAM bandwidth utilisation (%)",
             "bound": f"runs at >= {DRAM_BOUND_PCT:.0f} % of DRAM bandwidth",
             "bound_kernels": f"kernels with a run at >= {DRAM_BOUND_PCT:.0f} %",
             "under10": "runs under 10 %"}
    if res.identity:
        out["diagnostics"] = pd.DataFrame({"DRAM diagnostic": [names[k] for k in res.identity],
                                           "value": [f"{v:.5g}" for v in res.identity.values()]})
    iv = res.interventional
    if not iv.empty:
        across = [_ci(a, b, 1) + f", p = {p:.3g}, Holm p = {q:.3g}" if math.isfinite(p) else
                  (w if isinstance(w, str) else "-")
                  for a, b, p, q, w in zip(iv["kern_low"], iv["kern_high"], iv["p"], iv["p_adj"],
                                           iv.get("across", pd.Series("-", iv.index)), strict=True)]
        out["interventional"] = pd.DataFrame({
            "lever": iv["lever"], "measure": iv["measure"], "precision": iv["precision"], "N": iv["size"],
            "kernels": iv["kernels"], "runs": iv["runs"], "range of the measure": iv["x_range"],
            "throughput change over the range (%)": iv["effect"].map(
                lambda v: f"{v:+.3g}" if math.isfinite(v) else "no effect estimated"),
            "95% CI, replicates": [_ci(a, b, 2) for a, b in zip(iv["rep_low"], iv["rep_high"], strict=True)],
            "from": iv["ci_source"],
            "per step, within the range": [f"{v:+.3g} {u.replace('% throughput ', '% ')} {_ci(a, b, 2)}"
                                           if math.isfinite(v) else "-" for v, u, a, b in
                                           zip(iv["per_step"], iv["step"], iv["step_low"], iv["step_high"],
                                               strict=True)],
            "across kernels (95% CI of the change)": across})
    t = res.tests
    if not t.empty:
        s = t[t["test"] == "slope (cluster-robust OLS)"]
        out["slopes"] = pd.DataFrame({
            "measure": s["predictor"].map(lambda c: MEASURES[c][0]), "strata": s["scope"],
            "effect": s["effect"], "unit": s["unit"],
            "95% CI": [_ci(a, b, 1) for a, b in zip(s["effect_low"], s["effect_high"], strict=True)],
            "t": s["stat"], "df": s["df"], "p": s["p"], "Holm p": s["p_adj"], "runs": s["n"],
            "kernels": s["n_kernels"], "note": s["note"]})
        r = t[t["test"] == "partial rank correlation"]
        out["ranks"] = pd.DataFrame({
            "measure": r["predictor"].map(lambda c: MEASURES[c][0]), "strata": r["scope"],
            "rho": r["estimate"],
            "95% CI, kernels resampled": [_ci(a, b, 2) for a, b in zip(r["ci_low"], r["ci_high"],
                                                                         strict=True)],
            "95% CI, runs resampled": [_ci(a, b, 2) for a, b in zip(r["row_ci_low"], r["row_ci_high"],
                                                                      strict=True)],
            "runs": r["n"], "kernels": r["n_kernels"]})
    return out
