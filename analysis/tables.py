"""Markdown tables of the analysis results (no dependency beyond pandas)."""
from __future__ import annotations

import math

import pandas as pd

__all__ = ["markdown", "fmt", "correlation_table", "williams_table", "regression_table", "results_pivot"]


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
