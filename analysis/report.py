r"""Write the analysis report of a sweep, an experiment or a study: ``report.md`` with its figures and
tables beside it, and ``report.html``, the same report self-contained (figures inlined), which the MLflow
UI shows with its figures; logged to the sweep's parent run (artifact folder ``report/``), whose
description then ends with the verdicts, the claims tally and a link to the HTML report.

    python -m analysis.report --sweep latest                     # the newest sweep in the default store
    python -m analysis.report --sweep <parent run id> --study l4 # with the L4 study's claims table
    python -m analysis.report --experiment tensor-core-ablations --out outputs/reports/all
    python -m analysis.report --table results/h200/l4_claims/runs.csv --study l4 --no-log \
        --out results/h200/l4_claims.md                        # from a committed tidy table, no store

The report says what the runs can and cannot answer: FAILED and skipped runs are listed with their
reasons and left out of the statistics; a question the runs cannot answer (no ncu metrics, one
kernel, no baseline) gets a sentence saying why instead of a number.
"""
from __future__ import annotations

import argparse
import sys
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from experiments.cli import out_problem, positive_int, refuse_store_options_with_table

from . import claims as claims_mod
from . import figures, tables
from .predictors import load_replicates, predictor_study
from .predictors import tables as predictor_tables
from .reference import DEFAULT_CLAIMS, DEFAULT_DIR, load_spec, read_study
from .runs import DEFAULT_EXPERIMENT, RunsError, load_runs, nothing_measured, ok_runs, read_table, size_order

__all__ = ["STUDIES", "Report", "write_report", "html_report", "describe_parent", "HTML", "main"]

STUDIES = {"l4": DEFAULT_CLAIMS}
_CAPTIONS = {"throughput_vs_size": "Throughput against problem size, per kernel",
             "predictors_vs_throughput": "Each ncu predictor against throughput, with a fit per size",
             "speedup_vs_baseline": "Speedup over the baseline kernel, per size",
             "marginal_means": "Marginal means of each configuration axis (not main effects: not factorial)"}


@dataclass
class Report:
    """What :func:`write_report` wrote: the markdown, its folder, the files, the notes, and the summary
    (per GPU the predictor study's answer and the claims tally, for the parent's description)."""
    text: str
    out_dir: Path
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", s).strip("_").lower()


def _overview(df: pd.DataFrame, notes: list[str]) -> list[str]:
    ok = ok_runs(df)
    failed = df[df["status"] == "FAILED"]
    skipped = df[df["outcome"] == "skipped"]          # FINISHED (KILLED in stores of older versions)
    stopped = df[df["outcome"] == "interrupted"]
    lines = ["## What these runs hold", "",
             f"- {len(df)} run(s): {len(ok)} measured and verified, {len(failed)} FAILED, "
             f"{len(skipped)} skipped" + (f", {len(stopped)} interrupted." if len(stopped) else "."),
             f"- GPUs: {', '.join(map(str, ok['gpu'].dropna().unique())) or '-'}; "
             f"kernels: {ok['kernel'].nunique()}; sizes: {', '.join(size_order(ok)) or '-'}."]
    if df.attrs.get("duplicates_dropped"):
        lines.append(f"- {df.attrs['duplicates_dropped']} older run(s) of the same kernel, size and GPU were "
                     "left out (a FINISHED run is kept before others, then the newest).")
    if len(failed):
        notes.append(f"{len(failed)} FAILED run(s) are left out of every statistic and claim (listed above).")
        t = pd.DataFrame({"kernel": failed["kernel"], "size": failed["size"],
                          "error": failed["error"].map(lambda e: str(e).splitlines()[0] if e else "-")})
        lines += ["", "FAILED runs (no timing is used from them):", "", tables.markdown(t)]
    if len(skipped):
        lines += ["", "Skipped configurations:", ""] + [f"- {r}" for r in skipped["skip_reason"].fillna("-")]
    if len(stopped):
        notes.append(f"{len(stopped)} run(s) were interrupted before a result; run the sweep again to "
                     "measure them (finished runs are not repeated).")
        t = pd.DataFrame({"kernel": stopped["kernel"], "size": stopped["size"],
                          "reason": stopped["skip_reason"].fillna("-")})
        lines += ["", "Interrupted runs:", "", tables.markdown(t)]
    if ok.empty:
        notes.append("No run was measured and verified: nothing can be concluded about throughput.")
    return lines + [""]


def _gpu_section(d: pd.DataFrame, gpu: str, suffix: str, out: Path, spec, reference, baseline,
                 n_boot: int, files: list, notes: list[str], summary: list[str]) -> list[str]:
    lines = [f"## {gpu}", ""]
    pivot = tables.results_pivot(figures.labelled(d))
    unit = ", ".join(d["throughput_unit"].dropna().unique()) or "-"
    lines += [f"Throughput ({unit}), measured and verified runs:", "", tables.markdown(pivot) or "(none)", ""]
    figs = figures.all_figures(d, baseline)
    paths = figures.save({f"{k}{suffix}": v for k, v in figs.items()}, out)
    files += paths.values()
    lines += ["### Figures", ""]
    for name, (_, note) in figs.items():
        if f"{name}{suffix}" in paths:
            lines.append(f"![{_CAPTIONS[name]}]({name}{suffix}.png)")
        else:
            lines.append(f"- {_CAPTIONS[name]}: not drawn, {note}.")
            notes.append(f"{gpu}: {_CAPTIONS[name].lower()}: {note}.")
    lines += ["", "### Does occupancy or DRAM activity predict throughput?", ""]
    lines += _predictor_lines(d, suffix, out, n_boot, files, notes, gpu, summary)
    lines.append("")
    side = tables.beside_study(ok_runs(d), reference)
    if not side.empty:
        side.to_csv(out / f"beside_study{suffix}.csv", index=False)
        files.append(out / f"beside_study{suffix}.csv")
        lines += ["### The study's kernels beside ours", "",
                  "Each kernel relative to the study's WMMA baseline of its precision at the same N, as the "
                  "study reports its results: ours on this GPU, and the study's published numbers on its "
                  "own. 'MMA emulated here' says whether the SASS of ours lacks the tensor-core MMA of its "
                  "type (tag mma_native): then the comparison is about ptxas' emulation, not the tensor "
                  "cores.", "",
                  tables.markdown(side), ""]
    if spec is not None:
        t = claims_mod.evaluate(spec, d, reference)
        t.to_csv(out / f"claims{suffix}.csv", index=False)
        files.append(out / f"claims{suffix}.csv")
        counts = t["verdict"].value_counts()
        summary.append(f"{gpu}: claims of {spec.get('study', 'the study')}: {counts.get('holds', 0)} hold, "
                       f"{counts.get('fails', 0)} fail, {counts.get('inconclusive', 0)} inconclusive, "
                       f"{counts.get('not testable here', 0)} not testable here")
        lines += [f"### Claims of the study: {spec.get('study', '')}", "",
                  f"{counts.get('holds', 0)} hold, {counts.get('fails', 0)} fail, "
                  f"{counts.get('inconclusive', 0)} are inconclusive and "
                  f"{counts.get('not testable here', 0)} are not testable on {gpu}. One rule for every "
                  "claim: each value's margin to the published range (a published number "
                  f"+-{spec['tolerance']:.0%}) against the replicate noise of its runs "
                  "(timing.repeats >= 2), inconclusive within it; not testable where a run emulates its MMA "
                  "(mma_native=false). "
                  "'study recomputed' is the same computation on the study's own published numbers.", ""]
        show = t.rename(columns={"this_gpu": "this GPU", "study_recomputed": "study recomputed",
                                 "published_flag": "flag on the published value"})
        lines += [tables.markdown(show.drop(columns=["sizes"])), ""]
    return lines


REPLICATES_COL = "replicate_medians_us"    # runs.csv: a run's replicate medians (us), ';'-joined


def _replicates(d: pd.DataFrame) -> dict:
    """Replicate medians of the runs that logged them: the metric history where the store is known,
    else column :data:`REPLICATES_COL` of a tidy table (written into runs.csv by :func:`write_report`)."""
    if REPLICATES_COL in d:
        pairs = zip(d["run_id"], d[REPLICATES_COL], strict=True)
        return {r: [float(v) for v in str(s).split(";")] for r, s in pairs if isinstance(s, str) and s}
    uri = d.attrs.get("uri")
    col = "replicate_median_us" if "replicate_median_us" in d else None
    if not uri or col is None or d[col].isna().all():
        return {}
    return load_replicates(uri, d.loc[d[col].notna(), "run_id"])


def _predictor_lines(d: pd.DataFrame, suffix: str, out: Path, n_boot: int, files: list, notes: list[str],
                     gpu: str, summary: list[str]) -> list[str]:
    """The predictor section: the one-paragraph answer, then the tables its numbers come from."""
    res = predictor_study(d, n_boot=n_boot, replicates=_replicates(d))
    print(f"{gpu}: {res.verdict}")
    summary.append(f"{gpu}: {res.verdict}")
    lines = [f"**Answer.** {res.verdict}", ""]
    if res.circularity:
        lines += [f"> **Circularity flag (DRAM bandwidth utilisation).** {res.circularity}", ""]
    if "diagnostics" in (shown := predictor_tables(res)):
        lines += [tables.markdown(shown["diagnostics"]), ""]
    notes += [f"{gpu}: {n}" for n in res.notes]
    if "interventional" in shown:
        lines += ["Interventional: runs of one kernel (the run's params less the lever's, with its size and "
                  "GPU) at several settings of a lever. The change is the within-kernel slope of ln "
                  "throughput times the range of the measure the runs hold (lowest to highest); none is "
                  "estimated where the levers moved DRAM bytes by less than x1.10 or occupancy by less "
                  "than 5 points. The replicate interval (each run's replicates, or, said so, its timed "
                  "batches' min..max) is the measurement precision for these kernels; whether the change "
                  "holds for other kernels (bootstrap over kernels, t-test of the per-kernel slopes, Holm) "
                  "needs 3 or more kernels per stratum.", "",
                  tables.markdown(shown["interventional"]), ""]
    if "slopes" in shown:
        lines += [f"Observational, {res.n_kernels} kernels and {res.n} runs: OLS of ln throughput on each "
                  "measure (ln for DRAM measures, points for occupancy) with one indicator per stratum; "
                  "standard errors cluster-robust over kernels (a kernel's runs at five sizes are not "
                  "independent), t on kernels - 1 df. One Holm correction covers the whole family of "
                  f"**{res.family_size} tests** (every p in the tables of this section).", "",
                  tables.markdown(shown["slopes"]), "",
                  "Partial Spearman rho within strata, 95 % intervals from resampling whole kernels and, "
                  "beside them, from resampling runs (which treats a kernel's runs as independent):", "",
                  tables.markdown(shown["ranks"]), ""]
        res.tests.to_csv(out / f"predictor_tests{suffix}.csv", index=False)
        files.append(out / f"predictor_tests{suffix}.csv")
    if not res.interventional.empty:
        res.interventional.to_csv(out / f"predictor_interventions{suffix}.csv", index=False)
        files.append(out / f"predictor_interventions{suffix}.csv")
    return lines


def write_report(df: pd.DataFrame, out_dir: str | Path, title: str, spec: dict | None = None,
                 reference: pd.DataFrame | None = None, baseline: str | None = None,
                 n_boot: int = 2000) -> Report:
    """Write report.md, its figures (PNG) and tables (CSV) for the tidy table ``df`` into out_dir.

    One section per GPU (figures, predictor study, and the claims table when ``spec`` is given,
    with ``reference`` = the study's tidy table for the published-value checks). Returns the Report.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    files: list[Path] = []
    summary: list[str] = []
    src = df.attrs
    lines = [f"# {title}", "",
             (f"Tidy table `{src['table']}`" if src.get("table") else f"Store `{src.get('uri', '-')}`")
             + f", experiment(s) {', '.join(src.get('experiments') or ['-'])}, "
             f"sweep {src.get('sweep') or 'all'}, filter {src.get('filter') or 'none'}; written "
             f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC by `python -m analysis.report`.", ""]
    lines += _overview(df, notes)
    gpus = list(ok_runs(df)["gpu"].dropna().unique())
    for gpu in gpus:
        d = df[df["gpu"] == gpu]
        suffix = "" if len(gpus) == 1 else "_" + _slug(gpu)
        lines += _gpu_section(d, gpu, suffix, out, spec, reference, baseline, n_boot, files, notes, summary)
    if spec is not None and "reference" in spec and reference is None:
        notes.append("The study's own numbers were not found (no reference experiment in the store and no "
                     "CSV folder): published values are not rechecked (python -m analysis.reference).")
    lines += ["## What these runs cannot tell", ""]
    lines += [f"- {n}" for n in notes] or ["- Nothing left open."]
    lines.append("")
    reps = _replicates(df) if "run_id" in df else {}
    if reps:                                  # so that --table on this runs.csv has the same intervals
        joined = df["run_id"].map(lambda r: ";".join(map(repr, reps.get(r, []))) or None)
        df = df.assign(**{REPLICATES_COL: joined})
    df.to_csv(out / "runs.csv", index=False)
    files.append(out / "runs.csv")
    text = "\n".join(lines)
    (out / "report.md").write_text(text)
    (out / HTML).write_text(html_report(text, out, title))
    files += [out / "report.md", out / HTML]
    return Report(text, out, files, notes, summary)


HTML = "report.html"        # the report, self-contained: what the MLflow UI shows with its figures
_STYLE = ("body{font-family:sans-serif;max-width:75em;margin:1em auto;line-height:1.4}"
          "table{border-collapse:collapse;margin:.5em 0}th,td{border:1px solid #ccc;padding:.25em .6em}"
          "img{max-width:100%}code{background:#f4f4f4}")


def html_report(text: str, folder: Path, title: str) -> str:
    """The Markdown report ``text`` as one self-contained HTML page: tables with padded cells, and each
    figure it links (``![caption](name.png)``, a file of ``folder``) inlined as base64 data, so that the
    page shows its figures wherever it is opened (MLflow's artifact view, a mail). A figure that is not
    in ``folder`` stays a link."""
    import base64
    import html

    from markdown_it import MarkdownIt
    from markdown_it.common.utils import escapeHtml

    md = MarkdownIt("commonmark").enable("table")
    body = md.render(text)
    # inlined after rendering: Markdown would percent-encode a data link character by character in
    # Python (0.4 s a figure)
    for name in dict.fromkeys(re.findall(r"!\[[^\]]*\]\(([^)/]+\.png)\)", text)):
        if (folder / name).is_file():
            data = base64.b64encode((folder / name).read_bytes()).decode()
            body = body.replace(f'src="{escapeHtml(md.normalizeLink(name))}"',
                                f'src="data:image/png;base64,{data}"')
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body>\n{body}</body></html>\n")


def describe_parent(client, parent: str, rep: Report) -> str:
    """End the description of the sweep's parent run ``parent`` with the report's part (replacing the
    one an earlier report wrote, experiments.store.record.with_analysis): a link to the HTML report in
    the run's artifacts (report/report.html, which the MLflow UI shows with its figures), the predictor
    study's answer and the claims tally per GPU. Returns the new description."""
    from experiments.store.record import ANALYSIS_HEAD, with_analysis
    run = client.get_run(parent)
    link = f"#/experiments/{run.info.experiment_id}/runs/{parent}/artifacts/report/{HTML}"
    section = [ANALYSIS_HEAD, "", f"[The analysis report]({link}) (`report/{HTML}`, figures inline; "
               "report.md, figures and tables beside it), written "
               f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC by `python -m analysis.report`.", ""]
    section += [f"- {line}" for line in rep.summary] or ["- No GPU run to analyse."]
    note = with_analysis(run.data.tags.get("mlflow.note.content", ""), section)
    client.set_tag(parent, "mlflow.note.content", note)
    return note


def main(argv=None) -> Report:
    head, rest = __doc__.split("\n\n", 1)     # what it does; the examples and the rest after the options
    ap = argparse.ArgumentParser(prog="python -m analysis.report", description=head,
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=rest)
    ap.add_argument("--uri", default=None, help="tracking URI (default: as run.py resolves it)")
    ap.add_argument("--experiment", default=DEFAULT_EXPERIMENT,
                    help=f"experiment of the store (default {DEFAULT_EXPERIMENT})")
    ap.add_argument("--table", nargs="+", default=None,
                    help="tidy table(s) (runs.csv of an earlier report) instead of the store")
    ap.add_argument("--sweep", default=None,
                    help="parent run id of a sweep, or 'latest' (default: every run)")
    ap.add_argument("--filter", default=None, help="MLflow filter, e.g. \"params.precision = 'int8'\"")
    ap.add_argument("--study", default="auto", help="claims to evaluate: l4, a YAML path, none, or auto "
                    "(l4 when runs carry study kernel names)")
    ap.add_argument("--reference-dir", default=str(DEFAULT_DIR),
                    help="the study's CSVs, when the store has no reference experiment")
    ap.add_argument("--baseline", default=None, help="kernel, study kernel or family for the speedup figure")
    ap.add_argument("--out", default=None,
                    help="output folder (default outputs/reports/<sweep or experiment>), or a .md file "
                         "(the figures and tables then go to the folder of its name beside it)")
    ap.add_argument("--n-boot", type=positive_int, default=2000, help="bootstrap resamples per interval")
    ap.add_argument("--no-log", action="store_true", help="do not log the report to the sweep's parent run")
    args = ap.parse_args(argv)
    if args.table:
        given = [f"--{k}" for k in ("sweep", "filter") if getattr(args, k) is not None]
        given += ["--experiment"] if args.experiment != DEFAULT_EXPERIMENT else []
        refuse_store_options_with_table(ap, given)
    if args.reference_dir != str(DEFAULT_DIR) and not Path(args.reference_dir).is_dir():
        ap.error(f"--reference-dir {args.reference_dir}: no such folder; the L4 study's CSVs are in "
                 f"{DEFAULT_DIR}")
    if args.study not in (*STUDIES, "none", "auto") and not Path(args.study).is_file():   # before the store
        ap.error(f"--study {args.study}: no such study or claims file; valid: {', '.join(STUDIES)}, none, "
                 "auto, or the path of a claims YAML file (e.g. analysis/claims/l4.yaml)")
    import matplotlib
    matplotlib.use("Agg")                    # files only: no display needed
    from experiments.store.track import StoreError
    try:
        df = read_table(args.table) if args.table else load_runs(args.uri, args.experiment, args.sweep,
                                                                 args.filter)
    except (RunsError, StoreError, FileNotFoundError) as exc:    # the store or table as given: exit 2
        print(f"Cannot read the runs: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if why := nothing_measured(df, args.table):
        where = f" (filter {args.filter})" if args.filter else ""
        then = "" if args.table else " Run the sweep on a GPU, then report."
        print(f"Nothing to report{where}: {why}.{then}", file=sys.stderr)
        raise SystemExit(2)
    study = args.study
    if study == "auto":
        study = "l4" if df["study_kernel"].notna().any() else "none"
    spec = reference = None
    if study != "none":
        try:
            spec = claims_mod.load_claims(STUDIES.get(study, study))
        except claims_mod.ClaimsError as exc:
            print(f"Cannot read the claims file {STUDIES.get(study, study)}: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
    if args.baseline and not any(df[c].eq(args.baseline).any() for c in ("kernel", "study_kernel", "family")):
        ok = ok_runs(df)
        names = sorted(set(ok["family"].dropna()) | set(ok["study_kernel"].dropna()))
        print(f"--baseline {args.baseline}: no measured run of that kernel, study kernel or family; "
              f"valid: a kernel of these runs, or one of {', '.join(names)}", file=sys.stderr)
        raise SystemExit(2)
    if spec is not None and "reference" in spec:
        try:
            if args.table:
                raise RunsError("a tidy table has no reference experiment")
            reference = load_runs(df.attrs["uri"], spec["reference"]["experiment"])
        except RunsError:
            reference = read_study(args.reference_dir, load_spec(STUDIES.get(study, study))) \
                if Path(args.reference_dir).is_dir() else None
    name = args.sweep and df.attrs["sweep"] or _slug(args.experiment)
    from experiments.store.track import PROJECT_ROOT
    out = Path(args.out) if args.out else PROJECT_ROOT / "outputs" / "reports" / str(name)
    single = out.suffix == ".md"            # --out results/h200/l4_claims.md: figures in l4_claims/
    folder = out.with_suffix("") if single else out
    if problem := out_problem(folder):       # before the figures and intervals are computed
        print(f"Could not write --out {args.out or out}: {problem}", file=sys.stderr)
        raise SystemExit(2)
    title = f"Report: {args.experiment}" + (f", sweep {df.attrs['sweep']}" if df.attrs["sweep"] else "")
    rep = write_report(df, folder, title, spec, reference, args.baseline, args.n_boot)
    if single:
        (folder / "report.md").unlink()
        out.write_text(re.sub(r"\]\(([^)/]+\.png)\)", lambda m: f"]({folder.name}/{m.group(1)})", rep.text))
        rep.files = [f for f in rep.files if f.name != "report.md"] + [out]
    print(f"Report written: {out if single else out / 'report.md'} (self-contained, figures inlined: "
          f"{folder / HTML})")
    # the sweep asked for (its runs may come from several parents: those it reused); else the runs' one
    parents = [df.attrs["sweep"]] if df.attrs["sweep"] else df["parent_run_id"].dropna().unique()
    if args.no_log or args.table:
        pass
    elif len(parents) == 1:
        import mlflow
        client = mlflow.MlflowClient(tracking_uri=df.attrs["uri"])
        client.log_artifacts(parents[0], str(folder), "report")
        if single:
            client.log_artifact(parents[0], str(out), "report")
        describe_parent(client, parents[0], rep)
        print(f"Logged to parent run {parents[0]} (artifacts/report/; its description links {HTML}).")
    else:
        print(f"Not logged: the runs belong to {len(parents)} sweeps; pass --sweep to log to one parent run.")
    return rep


if __name__ == "__main__":
    from experiments.cli import run_main
    sys.exit(run_main(main))
