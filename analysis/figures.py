"""Figures of a tidy run table (seaborn): throughput vs size per kernel, each predictor vs throughput
with fits, speedup vs a baseline per size, and a main-effect plot per configuration axis.

Every function returns ``(figure or None, note)``: None with a note that says why the figure cannot
be drawn from these runs (no baseline, one configuration, no ncu metrics), never an empty plot.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .predictors import PREDICTORS
from .runs import DRAM_COUNT, MEDIAN_US, THROUGHPUT, config_axes, ok_runs, short_labels, size_order

__all__ = ["labelled", "throughput_vs_size", "predictors_vs_throughput", "speedup_table",
           "speedup_vs_baseline", "main_effects", "all_figures", "save"]

BASELINE_FAMILIES = ("wmma", "cublas")


def _plt():
    import matplotlib.pyplot as plt
    import seaborn as sns
    sns.set_theme(style="whitegrid", context="paper")
    return plt, sns


def labelled(df: pd.DataFrame) -> pd.DataFrame:
    """Measured rows with a display ``label`` (the study's name when a run has one, else the kernel
    name without the tokens all kernels share) and ``size`` as an ordered categorical."""
    d = ok_runs(df).copy()
    short = short_labels(d["kernel"].dropna())
    d["label"] = [s if isinstance(s, str) else short.get(k, k)
                  for s, k in zip(d["study_kernel"], d["kernel"], strict=True)]
    d["size"] = pd.Categorical(d["size"], categories=size_order(d), ordered=True)
    return d


def _unit(d: pd.DataFrame) -> str:
    units = sorted(d["throughput_unit"].dropna().unique())
    return units[0] if len(units) == 1 else " or ".join(units) or "T(FL)OP/s"


def throughput_vs_size(df: pd.DataFrame):
    """Throughput (log scale) against problem size, one line per kernel."""
    d = labelled(df)
    if d.empty:
        return None, "no measured runs"
    plt, sns = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    sns.lineplot(d, x="size", y=THROUGHPUT, hue="label", marker="o", ax=ax, sort=True)
    ax.set(yscale="log", xlabel="problem size (N for N x N x N)", ylabel=f"throughput ({_unit(d)})",
           title=f"Throughput per kernel ({', '.join(map(str, d['gpu'].dropna().unique()))})")
    ax.legend(fontsize=7, title=None)
    fig.tight_layout()
    return fig, ""


def predictors_vs_throughput(df: pd.DataFrame):
    """One panel per ncu predictor the runs have: throughput (log) against it, a fit per size."""
    d = labelled(df)
    have = [c for c in PREDICTORS if d[c].notna().sum() >= 2]
    if not have:
        return None, "no run has the ncu predictors (" + ", ".join(PREDICTORS) + ")"
    plt, sns = _plt()
    fig, axes = plt.subplots(1, len(have), figsize=(4.6 * len(have), 4), squeeze=False)
    cats = d["size"].cat.categories
    pal = dict(zip(cats, sns.color_palette("viridis", len(cats)), strict=True))
    for ax, col in zip(axes[0], have, strict=True):
        for size, g in d.dropna(subset=[col]).groupby("size", observed=True):
            x = np.log10(g[col]) if col == DRAM_COUNT else g[col]
            sns.regplot(x=x, y=np.log10(g[THROUGHPUT]), ax=ax, ci=None, color=pal[size], label=f"N={size}",
                        fit_reg=len(g) >= 3, scatter_kws={"s": 18})
        label = "log10 DRAM active cycles (count; circular)" if col == DRAM_COUNT else PREDICTORS[col][0]
        ax.set(xlabel=label, ylabel=f"log10 throughput ({_unit(d)})")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Throughput against each predictor, linear fit within each size")
    fig.tight_layout()
    return fig, ""


def speedup_table(df: pd.DataFrame, baseline: str | None = None) -> tuple[pd.DataFrame, str]:
    """Speedup = baseline median_us / kernel median_us at the same size (and GPU).

    ``baseline``: a kernel or study-kernel name (one baseline for every kernel), a family name, or
    None: per precision, the ``wmma`` family, else ``cublas``. Returns (table with label, size,
    precision, baseline, speedup; note); an empty table with a note when no baseline run exists.
    """
    d = labelled(df)
    by_name = bool(baseline) and (d["kernel"].eq(baseline) | d["study_kernel"].eq(baseline)).any()
    if baseline and not by_name and not d["family"].eq(baseline).any():
        return pd.DataFrame(), (f"baseline {baseline!r} has no measured run "
                                "(a kernel, study kernel or family name)")
    fams = [baseline] if baseline and not by_name else list(BASELINE_FAMILIES)
    rows = []
    for _, g in d.groupby(["gpu", "size"], observed=True):
        for _, r in g.iterrows():
            if by_name:
                b = g[g["kernel"].eq(baseline) | g["study_kernel"].eq(baseline)]
            else:
                same = g[g["precision"] == r.get("precision")]
                b = next((same[same["family"] == f] for f in fams if (same["family"] == f).any()),
                         same.iloc[:0])
            if b.empty or b.iloc[0]["run_id"] == r["run_id"]:
                continue
            rows.append({"label": r["label"], "size": r["size"], "precision": r.get("precision"),
                         "baseline": b.iloc[0]["label"], "speedup": b.iloc[0][MEDIAN_US] / r[MEDIAN_US]})
    if not rows:
        return pd.DataFrame(), ("no baseline runs (families " + ", ".join(BASELINE_FAMILIES) + " of the same "
                                "precision) among these runs; pass a baseline kernel to compare against")
    return pd.DataFrame(rows), ""


def speedup_vs_baseline(df: pd.DataFrame, baseline: str | None = None):
    """Bars of speedup vs the baseline per size, one bar per kernel; a line at 1."""
    table, note = speedup_table(df, baseline)
    if table.empty:
        return None, note
    plt, sns = _plt()
    groups = list(table.groupby("baseline", sort=True))
    fig, axs = plt.subplots(len(groups), 1, figsize=(8.5, 2.9 * len(groups)), squeeze=False)
    for ax, (base, g) in zip(axs[:, 0], groups, strict=True):
        sns.barplot(g, x="size", y="speedup", hue="label", ax=ax)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set(xlabel="problem size (N)", ylabel="speedup", title=f"vs {base} (baseline time / kernel time)")
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), title=None)
    fig.tight_layout()
    return fig, ""


def main_effects(df: pd.DataFrame, n_boot: int = 1000):
    """Per configuration axis with >= 2 values: mean log2(throughput / the size's median) per value,
    with a 95% bootstrap interval (seaborn pointplot). A main effect averages over the other axes."""
    d = labelled(df)
    axes_ = config_axes(d)
    if not axes_:
        return None, "every measured run has the same configuration: no axis to show a main effect of"
    d["relative"] = np.log2(d[THROUGHPUT] / d.groupby("size", observed=True)[THROUGHPUT].transform("median"))
    plt, sns = _plt()
    fig, axs = plt.subplots(1, len(axes_), figsize=(3.2 * len(axes_), 3.6), squeeze=False, sharey=True)
    for ax, col in zip(axs[0], axes_, strict=True):
        g = d.assign(level=d[col].map(lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v)))
        sns.pointplot(g, x="level", y="relative", ax=ax, errorbar=("ci", 95), n_boot=n_boot, seed=0,
                      order=sorted(g["level"].unique(), key=lambda s: (len(s), s)))
        ax.axhline(0.0, color="grey", lw=0.6)
        ax.set(xlabel=col, ylabel="log2(throughput / median at that size)")
    fig.suptitle("Main effects (mean over the other axes and sizes)")
    fig.tight_layout()
    return fig, ""


def all_figures(df: pd.DataFrame, baseline: str | None = None) -> dict:
    """name -> (figure or None, note) for the four figures of a report."""
    return {"throughput_vs_size": throughput_vs_size(df),
            "predictors_vs_throughput": predictors_vs_throughput(df),
            "speedup_vs_baseline": speedup_vs_baseline(df, baseline),
            "main_effects": main_effects(df)}


def save(figs: dict, out_dir: str | Path, dpi: int = 110) -> dict:
    """Write each figure as ``<name>.png`` in out_dir (closed afterwards); returns name -> Path."""
    import matplotlib.pyplot as plt
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, (fig, _) in figs.items():
        if fig is not None:
            paths[name] = out / f"{name}.png"
            fig.savefig(paths[name], dpi=dpi)
            plt.close(fig)
    return paths
