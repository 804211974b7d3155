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
# Run it headless with `python analysis/notebooks/claims.py`, or open it in Jupyter.

# %%
import builtins
import os
from pathlib import Path

from analysis import claims, figures, tables
from analysis.reference import DEFAULT_CLAIMS, DEFAULT_DIR, load_spec, read_study
from analysis.runs import RunsError, load_runs, ok_runs, unmeasured_note

show = getattr(builtins, "display", print)
URI = os.environ.get("ANALYSIS_URI")
SWEEP = os.environ.get("ANALYSIS_SWEEP", "")                 # "" = every run of the experiment
EXPERIMENT = os.environ.get("ANALYSIS_EXPERIMENT", "tensor-core-ablations")
CLAIMS = Path(os.environ.get("ANALYSIS_CLAIMS", str(DEFAULT_CLAIMS)))
REFERENCE_DIR = Path(os.environ.get("ANALYSIS_REFERENCE_DIR", str(DEFAULT_DIR)))
OUT = Path(os.environ.get("ANALYSIS_OUT", "outputs/notebooks/claims"))
OUT.mkdir(parents=True, exist_ok=True)
spec = claims.load_claims(CLAIMS)

# %% [markdown]
# ## The study's own numbers
# From the store's reference experiment (`python -m analysis.reference` loads it), else from the CSVs.
# Durations whose single-GEMM rate is below the plausibility floor of the claims file are flagged.

# %%
reference = None
if "reference" not in spec:
    print(f"reference: {CLAIMS.name} names no published study to recheck")
else:
    try:
        reference = load_runs(URI, spec["reference"]["experiment"])
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

# %%
runs = load_runs(URI, EXPERIMENT, SWEEP or None)
if note := unmeasured_note(runs):
    print(note)
for gpu in ok_runs(runs)["gpu"].dropna().unique():
    table = claims.evaluate(spec, runs[runs["gpu"] == gpu], reference)
    print(f"{gpu}: " + ", ".join(f"{n} {v}" for v, n in table["verdict"].value_counts().items()))
    show(table[["id", "published", "this_gpu", "verdict", "reason"]])
    table.to_csv(OUT / "claims.csv", index=False)
    (OUT / "claims.md").write_text(tables.markdown(table))

# %% [markdown]
# ## Speedup against the baseline, as the study plots it

# %%
fig, note = figures.speedup_vs_baseline(runs)
print("speedup figure:", "drawn" if fig is not None else "not drawn, " + note)
figures.save({"speedup_vs_baseline": (fig, note)}, OUT)
if reference is not None:
    ref_fig = figures.speedup_vs_baseline(reference)
    figures.save({"study_speedup_vs_baseline": ref_fig}, OUT)
