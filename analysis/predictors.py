"""The predictor question: does achieved occupancy or DRAM activity predict throughput?

One GPU's measured runs (rows of the tidy table, :mod:`analysis.runs`) go in; a table of every test
(pooled, within each problem size, partial for size; rank and linear), Williams' tests of the
differences, a regression with both predictors, one Holm correction over the whole family and a
verdict sentence with its numbers come out. DRAM activity is used both as a share of elapsed cycles
(``dram__cycles_active.avg.pct_of_peak_sustained_elapsed``, the lead) and as the study's count
(``dram__cycles_active.avg``), which grows with the kernel's own duration: whenever the count is used
the result carries :data:`CIRCULARITY` and a measured diagnostic of it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from . import stats
from .runs import (COLUMNS, DRAM_COUNT, DRAM_SHARE, MEDIAN_US, NCU_DURATION, OCCUPANCY, THROUGHPUT, ok_runs,
                   size_order)

__all__ = ["PREDICTORS", "CIRCULARITY", "PredictorResult", "predictor_study"]

# column -> (label, scale for the linear statistics); the first is the lead
PREDICTORS = {
    DRAM_SHARE: ("DRAM active, share of elapsed cycles (%)", "linear"),
    OCCUPANCY: ("achieved occupancy (%)", "linear"),
    DRAM_COUNT: ("DRAM active cycles (count, the study's measure)", "log10"),
}
COMPARISONS = ((DRAM_SHARE, OCCUPANCY), (DRAM_COUNT, OCCUPANCY))
CIRCULARITY = ("dram__cycles_active.avg is a count of cycles that grows with the kernel's own duration: "
               "its correlation with throughput (work / duration) is close to circular. The share of "
               "elapsed cycles (dram__cycles_active.avg.pct_of_peak_sustained_elapsed) measures the "
               "same activity without that dependence and leads this analysis.")
MIN_N = 4


@dataclass
class PredictorResult:
    """Everything :func:`predictor_study` found; tables are pandas DataFrames."""
    tests: pd.DataFrame                      # one row per test, with p and Holm-adjusted p_adj
    regression: pd.DataFrame | None          # standardised coefficients (or None)
    r2: float = math.nan
    family_size: int = 0
    verdict: str = ""
    notes: list[str] = field(default_factory=list)
    circularity: str | None = None           # set when the count was used, with its diagnostic
    n: int = 0
    sizes: list[str] = field(default_factory=list)


def _lin(df: pd.DataFrame, col: str) -> np.ndarray:
    v = df[col].to_numpy(float)
    scale = "log10" if col == THROUGHPUT else PREDICTORS[col][1]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log10(np.where(v > 0, v, np.nan)) if scale == "log10" else v


def _row(test, predictor, scope, c: stats.Corr) -> dict:
    return {"test": test, "predictor": predictor, "scope": scope, "method": c.method, "estimate": c.r,
            "ci_low": c.lo, "ci_high": c.hi, "stat": math.nan, "df": c.df, "n": c.n, "p": c.p, "note": c.note}


def _usable(df: pd.DataFrame, notes: list[str]) -> list[str]:
    out = []
    keys = {c.name: c.key for c in COLUMNS}
    if df.empty or all(df[c].isna().all() for c in PREDICTORS):
        notes.append(f"No run has the Nsight Compute metrics ({', '.join(keys[c] for c in PREDICTORS)}): "
                     "profile the runs first; nothing is said about occupancy or DRAM activity.")
        return out
    for col, (label, _) in PREDICTORS.items():
        vals = df[col].dropna()
        if len(vals) < MIN_N:
            notes.append(f"{label}: {len(vals)} of {len(df)} measured runs have {keys[col]}; it is left out.")
        elif vals.nunique() < 2:
            notes.append(f"{label}: the same value in every run; it cannot predict anything.")
        else:
            out.append(col)
    return out


def _circularity(df: pd.DataFrame) -> str:
    """CIRCULARITY plus how much of the count duration and share explain (R^2 of logs); the
    duration is the profiled one (ncu.duration_us) where the runs have it, else the timed median."""
    dur = df[NCU_DURATION].where(df[NCU_DURATION].notna(), df[MEDIAN_US])
    d = pd.DataFrame({"count": df[DRAM_COUNT], "time": dur, "share": df[DRAM_SHARE]}).dropna()
    d = d[(d > 0).all(axis=1)]
    text = CIRCULARITY
    if len(d) >= MIN_N:
        r = stats.correlation(d["count"], d["time"], "spearman", n_boot=200).r
        text += f" Here the count and the kernel's duration have Spearman rho = {r:.2f} (n = {len(d)})."
        logs = np.log(d.to_numpy(float))
        x = np.column_stack([np.ones(len(d)), logs[:, 1], logs[:, 2]])
        resid = logs[:, 0] - x @ np.linalg.lstsq(x, logs[:, 0], rcond=None)[0]
        tot = ((logs[:, 0] - logs[:, 0].mean()) ** 2).sum()
        if tot > 0:
            text += (f" Duration and share together explain R^2 = {1 - (resid ** 2).sum() / tot:.3f} of "
                     "log(count): the count adds little beyond them.")
    return text


def predictor_study(df: pd.DataFrame, n_boot: int = 2000, seed: int = 0,
                    alpha: float = 0.05) -> PredictorResult:
    """Answer the predictor question for the measured runs of ONE GPU.

    df: tidy table (:func:`analysis.runs.load_runs`); only :func:`~analysis.runs.ok_runs` rows with a
    throughput are used. Rank (Spearman, on throughput) and linear (Pearson, on log10 throughput and
    log10 of the count) correlations with percentile bootstrap intervals (``n_boot``, ``seed``):
    pooled, within each size (sizes with >= 4 runs), and partial controlling for size (indicators).
    Williams' T2 compares each pair of :data:`COMPARISONS` (df = n - 3, minus the size indicators when
    partial). The regression puts the share and occupancy together (standardised, size indicators as
    controls). Every p-value goes into one Holm correction; ``family_size`` is its size.
    Raises ValueError when df holds runs of several GPUs (analyse each GPU separately).
    """
    gpus = df["gpu"].dropna().unique()
    if len(gpus) > 1:
        raise ValueError(f"runs of {len(gpus)} GPUs ({', '.join(map(str, gpus))}): pass one GPU's runs")
    d = ok_runs(df)
    d = d[d[THROUGHPUT].notna()]
    notes: list[str] = []
    res = PredictorResult(pd.DataFrame(), None, n=len(d), sizes=size_order(d), notes=notes)
    preds = _usable(d, notes)
    if len(d) < MIN_N or not preds:
        why = (f"only {len(d)} measured run(s)" if len(d) < MIN_N else
               "no run has the Nsight Compute metrics it needs (profile the runs first)")
        res.verdict = f"The predictor question cannot be answered from these runs: {why}."
        return res
    sizes = res.sizes
    cov = stats.design_matrix(d["size"]) if len(sizes) > 1 else None
    rows = []
    for col in preds:
        for method in stats.METHODS:
            y = d[THROUGHPUT].to_numpy(float) if method == "spearman" else _lin(d, THROUGHPUT)
            x = d[col].to_numpy(float) if method == "spearman" else _lin(d, col)
            rows.append(_row("correlation", col, "pooled",
                             stats.correlation(x, y, method, None, n_boot, seed=seed)))
            if cov is not None:
                rows.append(_row("partial correlation", col, "controlling for size",
                                 stats.correlation(x, y, method, cov, n_boot, seed=seed)))
            for s in sizes:
                m = (d["size"] == s).to_numpy()
                if m.sum() >= MIN_N:
                    rows.append(_row("correlation", col, f"N={s}",
                                     stats.correlation(x[m], y[m], method, None, n_boot, seed=seed)))
    small = [s for s in sizes if (d["size"] == s).sum() < MIN_N]
    if small:
        counts = ", ".join(str((d["size"] == s).sum()) for s in small)
        notes.append(f"Within-size correlations need >= {MIN_N} kernels per size; skipped for "
                     f"N = {', '.join(small)} ({counts} run(s)).")
    for a, b in COMPARISONS:
        if a not in preds or b not in preds:
            continue
        for method in stats.METHODS:
            y = d[THROUGHPUT].to_numpy(float) if method == "spearman" else _lin(d, THROUGHPUT)
            xa = d[a].to_numpy(float) if method == "spearman" else _lin(d, a)
            xb = d[b].to_numpy(float) if method == "spearman" else _lin(d, b)
            for scope, c in (("pooled", None), ("controlling for size", cov)):
                if scope != "pooled" and c is None:
                    continue
                t = stats.compare_dependent(y, xa, xb, method, c)
                rows.append({"test": "Williams T2", "predictor": f"{a} vs {b}", "scope": scope,
                             "method": method, "estimate": t.r1 - t.r2, "ci_low": math.nan,
                             "ci_high": math.nan, "stat": t.t, "df": t.df, "n": t.n, "p": t.p,
                             "note": t.note or f"abs(r): {t.r1:.3f} vs {t.r2:.3f}"})
    reg_cols = [c for c in (DRAM_SHARE, OCCUPANCY) if c in preds]
    if len(reg_cols) == 2:
        try:
            xs = {c: _lin(d, c) for c in reg_cols}
            table, res.r2, n = stats.standardized_ols(_lin(d, THROUGHPUT), xs, cov)
            table.insert(0, "test", "OLS (standardised)")
            table["n"] = n
            res.regression = table
        except ValueError as exc:
            notes.append(f"No regression: {exc}.")
    else:
        notes.append("No regression with both predictors: it needs the DRAM share and occupancy.")
    tests = pd.DataFrame(rows)
    pvals = list(tests["p"]) + ([] if res.regression is None else list(res.regression["p"]))
    adj = stats.adjust_pvalues(pvals)
    tests["p_adj"] = adj[:len(tests)]
    if res.regression is not None:
        res.regression["p_adj"] = adj[len(tests):]
    res.tests, res.family_size = tests, int(np.isfinite(np.asarray(pvals, float)).sum())
    if DRAM_COUNT in preds:
        res.circularity = _circularity(d)
    res.verdict = _verdict(res, preds, alpha)
    return res


def _fmt(row) -> str:
    ci = "" if not math.isfinite(row["ci_low"]) else f", 95% CI [{row['ci_low']:.2f}, {row['ci_high']:.2f}]"
    return f"rho = {row['estimate']:.2f}{ci}"


def _verdict(res: PredictorResult, preds: list[str], alpha: float) -> str:
    t = res.tests
    lead = [c for c in (DRAM_SHARE, DRAM_COUNT) if c in preds]
    partial = len(res.sizes) > 1
    scope = "controlling for size" if partial else "pooled"
    where = (f"Controlling for problem size ({res.n} runs, {len(res.sizes)} sizes)" if partial
             else f"Across {res.n} runs of one size (N = {res.sizes[0]})")
    pick = t[(t["method"] == "spearman") & (t["scope"] == scope) & t["test"].str.contains("correlation")]
    got = {r["predictor"]: r for _, r in pick.iterrows() if math.isfinite(r["estimate"])}
    if not got:
        why = "; ".join(dict.fromkeys(n for n in pick["note"] if n)) or "no estimable correlation"
        return (f"{where}: no verdict, {why}."
                + (" A correlation across sizes alone would measure the problem size, not the kernels."
                   if partial else ""))
    if OCCUPANCY not in got or not lead or lead[0] not in got:
        have = ", ".join(f"{PREDICTORS[c][0]} {_fmt(r)}" for c, r in got.items())
        gone = "achieved occupancy" if OCCUPANCY not in got else "DRAM activity"
        return f"{where}: {have}. The two predictors cannot be compared: {gone} is not measured or constant."
    dram = lead[0]
    w = t[(t["test"] == "Williams T2") & (t["predictor"] == f"{dram} vs {OCCUPANCY}")
          & (t["method"] == "spearman") & (t["scope"] == scope)]
    a, b = got[dram], got[OCCUPANCY]
    text = (f"{where}, throughput has partial Spearman " if partial else f"{where}, throughput has Spearman ")
    text += (f"{_fmt(a)} with {PREDICTORS[dram][0]} (Holm-adjusted p = {a['p_adj']:.3g}) and {_fmt(b)} with "
             f"achieved occupancy (adjusted p = {b['p_adj']:.3g}). ")
    if w.empty or not math.isfinite(w.iloc[0]["stat"]):
        return (text + "No test of the difference was possible"
                + (f": {w.iloc[0]['note']}." if len(w) else "."))
    w = w.iloc[0]
    better = PREDICTORS[dram][0] if abs(a["estimate"]) > abs(b["estimate"]) else "achieved occupancy"
    test = (f"Williams t({int(w['df'])}) = {w['stat']:.2f}, p = {w['p']:.3g}, "
            f"Holm-adjusted p = {w['p_adj']:.3g}")
    if w["p_adj"] < alpha:
        text += (f"{better[0].upper() + better[1:]} is the better predictor ({test}; "
                 f"family of {res.family_size} tests).")
    else:
        text += (f"The difference between the two is not significant ({test}; family of {res.family_size} "
                 "tests): these runs do not show that one predicts throughput better than the other.")
    if dram == DRAM_COUNT:
        text += " DRAM activity here is the count, which is close to circular (see the flag)."
    return text
