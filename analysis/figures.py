"""Figures of a tidy run table (seaborn): throughput vs size per kernel, each predictor vs throughput
with fits, speedup vs a baseline per size, and the marginal means of each configuration axis.

Every throughput axis carries one unit (the runs' ``throughput_unit``: TFLOP/s for float types, TOP/s
for integers), so figures of several precisions are faceted by precision; rates and shares that
span decades are on log scales; legends sit outside the plotting area.

Every function returns ``(figure or None, note)``: None with a note that says why the figure cannot
be drawn from these runs (no baseline, one configuration, no ncu metrics), never an empty plot.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .predictors import PREDICTORS
from .runs import MEDIAN_US, THROUGHPUT, config_axes, ok_runs, short_labels, size_order
from experiments.store.record import EMULATED

__all__ = ["labelled", "throughput_vs_size", "predictors_vs_throughput", "speedup_table",
           "speedup_vs_baseline", "marginal_means", "all_figures", "save"]

BASELINE_FAMILIES = ("wmma", "cublas")
_STYLES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _plt():
    import matplotlib.pyplot as plt
    import seaborn as sns
    sns.set_theme(style="whitegrid", context="paper")
    return plt, sns


def labelled(df: pd.DataFrame) -> pd.DataFrame:
    """Measured rows with a display ``label`` (the study's name when a run has one, else the kernel
    name without the tokens all kernels share; followed by EMULATED where the kernel emulates its MMA,
    tag mma_native=false) and ``size`` as an ordered categorical."""
    d = ok_runs(df).copy()
    short = short_labels(d["kernel"].dropna())
    d["label"] = [(s if isinstance(s, str) else short.get(k, k)) + (f" {EMULATED}" if m == "false" else "")
                  for s, k, m in zip(d["study_kernel"], d["kernel"], d["mma_native"], strict=True)]
    d["size"] = pd.Categorical(d["size"], categories=size_order(d), ordered=True)
    return d


def _unit(d: pd.DataFrame) -> str:
    """The one throughput unit of these rows (callers facet by precision so that there is one)."""
    units = sorted(d["throughput_unit"].dropna().unique())
    return units[0] if len(units) == 1 else "T(FL)OP/s"


def _panels(d: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(precision, its rows), one facet per precision (rows without one: the unit's name)."""
    key = d["precision"].fillna(d["throughput_unit"]).fillna("-").astype(str)
    return [(str(p), g) for p, g in d.groupby(key, sort=True)]


def _grid(plt, n: int, cols: int, w: float, h: float):
    cols = max(1, min(cols, n))
    rows = -(-n // cols)
    fig, axs = plt.subplots(rows, cols, figsize=(w * cols, h * rows), squeeze=False)
    for ax in axs.flat[n:]:
        ax.set_visible(False)
    return fig, list(axs.flat[:n])


def throughput_vs_size(df: pd.DataFrame):
    """Throughput against problem size (both log), one panel per precision, one line per kernel
    (colour, line style and marker together tell the kernels of a panel apart)."""
    d = labelled(df)
    d = d[d["m"].notna()]
    if d.empty:
        return None, "no measured runs"
    plt, sns = _plt()
    panels = _panels(d)
    fig, axs = _grid(plt, len(panels), 2, 6.4, 3.8)
    for ax, (prec, g) in zip(axs, panels, strict=True):
        labels = sorted(g["label"].unique())
        colours = sns.color_palette("tab10" if len(labels) <= 10 else "tab20", len(labels))
        for i, lab in enumerate(labels):
            k = g[g["label"] == lab].sort_values("flop")
            ax.plot(k["m"].astype(float), k[THROUGHPUT], color=colours[i], ls=_STYLES[i % len(_STYLES)],
                    marker=_MARKERS[i % len(_MARKERS)], ms=4, lw=1.2, label=lab)
        emulated = g["mma_native"].astype(str).str.lower().eq("false").all()
        ax.set(xscale="log", yscale="log", xlabel="problem size N (N x N x N)",
               title=prec + (" (MMA emulated here: mma_native=false)" if emulated else ""),
               ylabel=f"throughput ({_unit(g)})")
        ax.set_xticks(sorted(g["m"].astype(float).unique()), map(str, sorted(g["m"].astype(int).unique())))
        ax.minorticks_off()
        ax.legend(fontsize=6.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), title=None, frameon=False)
    fig.suptitle(f"Throughput per kernel ({', '.join(map(str, d['gpu'].dropna().unique()))})")
    fig.tight_layout()
    return fig, ""


def _spans_decades(x: pd.Series) -> bool:
    x = x[x > 0]
    return len(x) >= 2 and x.max() / x.min() >= 10


def predictors_vs_throughput(df: pd.DataFrame):
    """Throughput (log) against each ncu predictor the runs have: one row of panels per precision
    (one unit per axis), one colour per size with a linear fit within each size; a predictor whose
    values span a decade or more (the DRAM share, the count) on a log axis."""
    d = labelled(df)
    have = [c for c in PREDICTORS if d[c].notna().sum() >= 2]
    if not have:
        return None, "no run has the ncu predictors (" + ", ".join(PREDICTORS) + ")"
    plt, sns = _plt()
    panels = [(p, g) for p, g in _panels(d) if g[have].notna().any().any()]
    fig, axs = plt.subplots(len(panels), len(have), figsize=(4.4 * len(have), 3.4 * len(panels)),
                            squeeze=False)
    cats = d["size"].cat.categories
    pal = dict(zip(cats, sns.color_palette("viridis", len(cats)), strict=True))
    logx = {col: _spans_decades(d[col].dropna()) for col in have}
    for row, (prec, g) in zip(axs, panels, strict=True):
        for ax, col in zip(row, have, strict=True):
            for size, s in g.dropna(subset=[col]).groupby("size", observed=True):
                x = np.log10(s[col]) if logx[col] else s[col]
                sns.regplot(x=x, y=np.log10(s[THROUGHPUT]), ax=ax, ci=None, color=pal[size],
                            label=f"N={size}",
                            fit_reg=len(s) >= 3, scatter_kws={"s": 18}, truncate=True)
            name = PREDICTORS[col][0]
            emulated = g["mma_native"].astype(str).str.lower().eq("false").all()
            ax.set(xlabel=f"log10 {name}" if logx[col] else name, ylabel=f"log10 throughput ({_unit(g)})",
                   title=prec + (" (MMA emulated here)" if emulated else ""))
    handles, labels = axs[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7, frameon=False)
    fig.suptitle("Throughput against each predictor, per precision; linear fit within each size")
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


def marginal_means(df: pd.DataFrame, n_boot: int = 1000):
    """Per configuration axis with >= 2 values: mean log2(throughput / the size's median) per value,
    with a 95% bootstrap interval (seaborn pointplot) and the number of runs per value. These are
    marginal means, not main effects: the runs are not a factorial design, so the other axes differ
    between the values of one axis. Runs without a value for an axis are left out of its panel."""
    d = labelled(df)
    axes_ = config_axes(d)
    if not axes_:
        return None, "every measured run has the same configuration: no axis to show the marginal means of"
    d["relative"] = np.log2(d[THROUGHPUT] / d.groupby("size", observed=True)[THROUGHPUT].transform("median"))
    plt, sns = _plt()
    fig, axs = _grid(plt, len(axes_), 4, 3.2, 3.0)
    for ax, col in zip(axs, axes_, strict=True):
        g = d[d[col].notna()]
        g = g.assign(level=g[col].map(lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v)))
        order = sorted(g["level"].unique(), key=lambda s: (len(s), s))
        sns.pointplot(g, x="level", y="relative", ax=ax, errorbar=("ci", 95), n_boot=n_boot, seed=0,
                      order=order, linestyle="none")
        counts = g["level"].value_counts()
        ax.set_xticks(range(len(order)), [f"{lv}\n(n={counts[lv]})" for lv in order], fontsize=7)
        ax.axhline(0.0, color="grey", lw=0.6)
        ax.set(xlabel=col, ylabel="log2(throughput / size median)")
    fig.suptitle("Marginal means per axis value (not main effects: the design is not factorial)")
    fig.tight_layout()
    return fig, ""


def all_figures(df: pd.DataFrame, baseline: str | None = None) -> dict:
    """name -> (figure or None, note) for the four figures of a report."""
    return {"throughput_vs_size": throughput_vs_size(df),
            "predictors_vs_throughput": predictors_vs_throughput(df),
            "speedup_vs_baseline": speedup_vs_baseline(df, baseline),
            "marginal_means": marginal_means(df)}


def save(figs: dict, out_dir: str | Path, dpi: int = 110) -> dict:
    """Write each figure as ``<name>.png`` in out_dir (closed afterwards); returns name -> Path."""
    import matplotlib.pyplot as plt
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, (fig, _) in figs.items():
        if fig is not None:
            paths[name] = out / f"{name}.png"
            fig.savefig(paths[name], dpi=dpi, bbox_inches="tight")     # legends outside the axes
            plt.close(fig)
    return paths
