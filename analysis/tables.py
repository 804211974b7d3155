"""Markdown tables of the analysis results (no dependency beyond pandas)."""
from __future__ import annotations

import math

import pandas as pd

__all__ = ["markdown", "fmt", "correlation_table", "williams_table", "regression_table", "results_pivot",
           "beside_study"]


def fmt(v, digits: int = 3) -> str:
    """A cell: '-' for missing, ``digits`` significant digits for floats, else str()."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return "0" if v == 0 else f"{v:.{digits}g}"
    return str(v).replace("|", "/").replace("\n", " ")


def markdown(df: pd.DataFrame, digits: int = 3) -> str:
    """GitHub markdown table of a DataFrame (index dropped); empty string for an empty frame."""
    if df is None or df.empty:
        return ""
    head = "| " + " | ".join(map(str, df.columns)) + " |"
    rule = "| " + " | ".join("---" for _ in df.columns) + " |"
    body = ["| " + " | ".join(fmt(v, digits) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, rule, *body]) + "\n"


def _ci(lo, hi) -> str:
    return "-" if not (math.isfinite(lo) and math.isfinite(hi)) else f"[{lo:.2f}, {hi:.2f}]"


def correlation_table(tests: pd.DataFrame, labels: dict) -> pd.DataFrame:
    """Correlation rows of a predictor study for display: predictor | scope | method | r | 95% CI |
    n | p | Holm p | note."""
    t = tests[tests["test"].str.contains("correlation")]
    return pd.DataFrame({"predictor": t["predictor"].map(lambda c: labels.get(c, c)), "scope": t["scope"],
                         "method": t["method"], "r": t["estimate"],
                         "95% CI (bootstrap)": [_ci(a, b)
                                                for a, b in zip(t["ci_low"], t["ci_high"], strict=True)],
                         "n": t["n"], "p": t["p"], "Holm p": t["p_adj"], "note": t["note"]})


def williams_table(tests: pd.DataFrame) -> pd.DataFrame:
    """Williams' T2 rows: comparison | scope | method | abs(r1) - abs(r2) | t | df | p | Holm p | note."""
    t = tests[tests["test"] == "Williams T2"]
    return pd.DataFrame({"comparison": t["predictor"], "scope": t["scope"], "method": t["method"],
                         "abs(r1) - abs(r2)": t["estimate"], "t": t["stat"], "df": t["df"], "p": t["p"],
                         "Holm p": t["p_adj"], "note": t["note"]})


def regression_table(reg: pd.DataFrame, labels: dict) -> pd.DataFrame:
    """Standardised coefficients: predictor | beta | 95% CI | p | Holm p | n."""
    return pd.DataFrame({"predictor": reg["term"].map(lambda c: labels.get(c, c)),
                         "beta (SD/SD)": reg["beta"],
                         "95% CI": [_ci(a, b) for a, b in zip(reg["ci_low"], reg["ci_high"], strict=True)],
                         "p": reg["p"], "Holm p": reg["p_adj"], "n": reg["n"]})


def results_pivot(d: pd.DataFrame) -> pd.DataFrame:
    """Throughput per kernel (rows) and size (columns) of labelled measured runs (figures.labelled)."""
    if d.empty:
        return pd.DataFrame()
    p = d.pivot_table(index="label", columns="size", values="throughput", aggfunc="max", observed=True)
    p.columns = [f"N={c}" for c in p.columns]
    return p.reset_index().rename(columns={"label": "kernel"})


def beside_study(d: pd.DataFrame, reference: pd.DataFrame | None) -> pd.DataFrame:
    """The study's kernels as it reports them, relative to its WMMA baseline of the same precision
    (``<precision>_wmma``) at each N, beside ours measured the same way: study kernel | N | ours
    (throughput, its unit) | ours vs WMMA | published vs WMMA | MMA emulated here (tag mma_native:
    "yes" when the SASS holds no tensor-core MMA of the type). ``d``: verified runs of one GPU (tidy
    table of :mod:`analysis.runs`); ``reference``: the study's tidy table (None: published column '-').
    Rows only for runs that carry a study kernel name; '-' where a baseline or number is missing."""
    cols = ["study kernel", "N", "ours", "ours vs WMMA", "published vs WMMA", "MMA emulated here"]
    ours = d[d["study_kernel"].notna()] if "study_kernel" in d else d.iloc[0:0]
    if ours.empty:
        return pd.DataFrame(columns=cols)

    def by(df):
        return {(r.study_kernel, int(r.n)): float(r.throughput) for r in df.itertuples()
                if isinstance(r.study_kernel, str) and r.throughput == r.throughput}
    mine = by(ours)
    pub = by(reference) if reference is not None and not reference.empty else {}
    rows = []
    for r in ours.sort_values(["study_kernel", "n"]).itertuples():
        n, base = int(r.n), f"{r.precision}_wmma"
        native = getattr(r, "mma_native", None)
        rows.append([r.study_kernel, n, f"{r.throughput:.3g} {r.throughput_unit}",
                     _relative(mine, r.study_kernel, base, n), _relative(pub, r.study_kernel, base, n),
                     {"false": "yes", "true": "no"}.get(native, "-")])
    return pd.DataFrame(rows, columns=cols)


def _relative(table: dict, kernel: str, base: str, n: int) -> float | None:
    """table[kernel, n] / table[base, n], None when either is missing."""
    if (kernel, n) in table and (base, n) in table and table[base, n]:
        return table[kernel, n] / table[base, n]
    return None
