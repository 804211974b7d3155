# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Does occupancy or DRAM activity predict throughput?
#
# The L4 study concludes that occupancy is a poor predictor of throughput and that, at large N,
# performance tracks DRAM activity. This notebook asks the same question of one GPU's tracked runs:
# rank and linear correlations (pooled, within each size, partial for size) with bootstrap
# intervals, Williams' test of the difference between the two dependent correlations, a regression
# with both predictors, and one Holm correction over the whole family.
#
# DRAM activity is read two ways. The share of elapsed cycles
# (`dram__cycles_active.avg.pct_of_peak_sustained_elapsed`) leads. The study's count
# (`dram__cycles_active.avg`) grows with the kernel's own duration, so its correlation with
# throughput is close to circular: it is shown, and flagged.
#
# Run it headless with `python -m analysis.notebooks --table results/h200/l4_claims/runs.csv --out DIR`
# (both notebooks, executed copies and outputs in DIR, one folder per GPU), or open it in Jupyter.

# %%
import builtins
import os

from analysis import figures, tables
from analysis.notebooks import DEFAULT_SWEEP, gpu_folder, load, output_folder
from analysis.predictors import PREDICTORS, predictor_study
from analysis.runs import ok_runs

show = getattr(builtins, "display", print)          # Jupyter's display, print when run as a script
OUT = output_folder("predictors")
N_BOOT = int(os.environ.get("ANALYSIS_N_BOOT", "2000"))

# %% [markdown]
# ## The runs
# One row per (kernel, size, GPU). FAILED and skipped runs stay in the table but not in the statistics.

# %%
runs = load(default_sweep=DEFAULT_SWEEP["predictors"])
measured = ok_runs(runs)
print(f"{len(runs)} runs, {len(measured)} measured; GPUs: {', '.join(measured['gpu'].dropna().unique())}")
show(runs[["kernel", "size", "status", "median_us", "throughput", *PREDICTORS]].head(12))

# %% [markdown]
# ## The tests, one GPU at a time

# %%
labels = {c: v[0] for c, v in PREDICTORS.items()}
results = {}
for gpu in measured["gpu"].dropna().unique():
    res = predictor_study(runs[runs["gpu"] == gpu], n_boot=N_BOOT)
    results[gpu] = res
    print(f"{gpu}: {res.verdict}")
    if res.circularity:
        print(f"CIRCULARITY FLAG: {res.circularity}")
    for note in res.notes:
        print(f"note: {note}")
    if not res.tests.empty:
        print(f"Holm correction over a family of {res.family_size} tests.")
        show(tables.correlation_table(res.tests, labels))
        show(tables.williams_table(res.tests))
        res.tests.to_csv(gpu_folder(OUT, gpu) / "predictor_tests.csv", index=False)
    if res.regression is not None:
        show(tables.regression_table(res.regression, labels))
        res.regression.to_csv(gpu_folder(OUT, gpu) / "regression.csv", index=False)

# %% [markdown]
# ## Each predictor against throughput
# One row of panels per precision (one unit per axis), a linear fit of log10 throughput within each
# size; a predictor that spans decades on a log axis, the count marked circular.

# %%
for gpu in measured["gpu"].dropna().unique():
    one = measured[measured["gpu"] == gpu]
    figs = {"predictors_vs_throughput": figures.predictors_vs_throughput(one),
            "throughput_vs_size": figures.throughput_vs_size(one)}
    for name, (fig, note) in figs.items():
        print(f"{gpu}: {name}: {'drawn' if fig is not None else 'not drawn, ' + note}")
    saved = figures.save(figs, gpu_folder(OUT, gpu))
    print("wrote", ", ".join(str(p) for p in saved.values()))
