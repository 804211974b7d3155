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
# # The L4 study's claims on this GPU
#
# `analysis/claims/l4.yaml` states each conclusion of the study as data: which kernels, which sizes,
# what to compute, the published value and a relative tolerance. Here every claim is evaluated
# against the tracked runs (holds / fails / inconclusive, with the reason) and recomputed from the
# study's own numbers, which also shows where a published value cannot be right.
#
# Run it headless with `python -m analysis.notebooks --table results/h200/l4_claims/runs.csv --out DIR`
# (both notebooks, executed copies and outputs in DIR, one folder per GPU), or open it in Jupyter.

# %%
import builtins
import os
from pathlib import Path

from analysis import claims, figures, tables
from analysis.notebooks import DEFAULT_SWEEP, gpu_folder, load, output_folder
from analysis.reference import DEFAULT_CLAIMS, DEFAULT_DIR, load_spec, read_study
from analysis.runs import RunsError, load_runs, ok_runs

show = getattr(builtins, "display", print)
CLAIMS = Path(os.environ.get("ANALYSIS_CLAIMS", str(DEFAULT_CLAIMS)))
REFERENCE_DIR = Path(os.environ.get("ANALYSIS_REFERENCE_DIR", str(DEFAULT_DIR)))   # packaged with analysis
OUT = output_folder("claims")
spec = claims.load_claims(CLAIMS)

# %% [markdown]
# ## The study's own numbers
# From the store's reference experiment (`python -m analysis.reference` loads it), else from the
# study's tables that ship with the package (analysis/data/paper_l4).
# Durations whose single-GEMM rate is below the plausibility floor of the claims file are flagged.

# %%
reference = None
if "reference" not in spec:
    print(f"reference: {CLAIMS.name} names no published study to recheck")
else:
    try:
        if os.environ.get("ANALYSIS_TABLE"):
            raise RunsError("tidy tables hold no reference experiment")
        reference = load_runs(os.environ.get("ANALYSIS_URI"), spec["reference"]["experiment"])
        print(f"reference: {len(reference)} runs from the store")
    except RunsError:
        reference = read_study(REFERENCE_DIR, load_spec(CLAIMS)) if REFERENCE_DIR.is_dir() else None
        print("reference:", "read from " + str(REFERENCE_DIR) if reference is not None else "not available")
if reference is not None:
    flagged = reference.dropna(subset=["implausible"])
    print(f"{len(flagged)} of {len(reference)} published durations flagged implausible")
    show(flagged[["study_kernel", "size", "median_us", "throughput"]].head(10))

# %% [markdown]
# ## Claims, one GPU at a time
# Each verdict follows one rule: every value's margin to the published range against the replicate
# noise of its runs (`timing.repeats` >= 2); "not testable here" where a run emulates its MMA.

# %%
runs = load(default_sweep=DEFAULT_SWEEP["claims"])
measured = ok_runs(runs)
print(f"{len(runs)} runs, {len(measured)} measured; GPUs: {', '.join(measured['gpu'].dropna().unique())}")
for gpu in measured["gpu"].dropna().unique():
    table = claims.evaluate(spec, runs[runs["gpu"] == gpu], reference)
    print(f"{gpu}: " + ", ".join(f"{n} {v}" for v, n in table["verdict"].value_counts().items()))
    show(table[["id", "published", "this_gpu", "verdict", "reason"]])
    folder = gpu_folder(OUT, gpu)
    table.to_csv(folder / "claims.csv", index=False)
    (folder / "claims.md").write_text(tables.markdown(table))

# %% [markdown]
# ## Speedup against the baseline, as the study plots it

# %%
for gpu in measured["gpu"].dropna().unique():
    fig, note = figures.speedup_vs_baseline(runs[runs["gpu"] == gpu])
    print(f"{gpu}: speedup figure", "drawn" if fig is not None else "not drawn, " + note)
    figures.save({"speedup_vs_baseline": (fig, note)}, gpu_folder(OUT, gpu))
if reference is not None:
    figures.save({"speedup_vs_baseline": figures.speedup_vs_baseline(reference)},
                 gpu_folder(OUT, spec["reference"]["gpu"]))
