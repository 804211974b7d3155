"""analysis/predictors.py and analysis/report.py on the fixture store, tried as a new user would:
a sweep with ncu metrics and FAILED members, a sweep without ncu metrics, and a single kernel."""
import re
import sys
from pathlib import Path

import pytest

from analysis import report
from analysis.predictors import CIRCULARITY, predictor_study
from analysis.runs import load_runs

sys.path.insert(0, str(Path(__file__).parent / "data" / "analysis"))
import fixture_store  # noqa: E402


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return fixture_store.shared_store(tmp_path_factory)


@pytest.fixture(scope="module")
def ncu_runs(store):
    return load_runs(store["uri"], sweep=store["ncu"])


def test_predictor_study_flags_the_share_built_as_bytes_over_time(ncu_runs):
    """The fixture's share is compulsory bytes / (median time x 4.8 TB/s): circular, never a predictor."""
    res = predictor_study(ncu_runs, n_boot=100)
    assert res.n == 30 and res.n_kernels == 6 and res.sizes == ["512", "1024", "2048", "4096", "8192"]
    assert res.circularity.startswith(CIRCULARITY) and res.identity["explained"] > 0.9999
    assert res.identity["peak_tbps"] == pytest.approx(4.8, rel=1e-9) and "peak of 4.80 TB/s" in res.circularity
    assert "better predictor" not in res.verdict and "its correlation with throughput is circular" in res.verdict
    t = res.tests
    assert res.family_size == t["p"].notna().sum() == 6 and (t["p_adj"].dropna() >= t["p"].dropna() - 1e-15).all()
    occ = t[(t["predictor"] == "achieved_occupancy_pct") & (t["scope"] == "size x precision")
            & (t["test"] == "slope (cluster-robust OLS)")].iloc[0]
    assert occ["df"] == 5 and occ["n_kernels"] == 6                      # t on kernels - 1, not runs - k
    # the answer carries the numbers of the table it summarises, interventional part first
    assert res.verdict.startswith("No interventional runs are here")
    assert f"{occ['effect']:+.3g} % per +10 points of achieved occupancy" in res.verdict
    assert f"Holm p = {occ['p_adj']:.3g}" in res.verdict and f"over {res.family_size} tests" in res.verdict


def test_without_the_share_there_is_no_flag_and_the_count_is_traffic(ncu_runs):
    res = predictor_study(ncu_runs.assign(dram_active_pct=float("nan")), n_boot=50)
    assert res.circularity is None and "dram_active_pct" not in set(res.tests["predictor"])
    assert any(n.startswith("DRAM bandwidth utilisation (% of peak; circular with throughput): fewer than 4")
               for n in res.notes)
    assert "count of DRAM active cycles measures DRAM traffic" in res.verdict


def test_predictor_study_without_ncu_and_with_one_kernel(store, ncu_runs):
    plain = predictor_study(load_runs(store["uri"], sweep=store["plain"]), n_boot=100)
    assert plain.verdict.startswith("The predictor question cannot be answered from these runs: no run has")
    assert plain.tests.empty and "ncu.dram_active_pct" in plain.notes[0]
    one = predictor_study(load_runs(store["uri"], sweep=store["one"]), n_boot=100)
    assert ("(kernels as they are: 1 kernel(s), 5 runs, strata of size x precision, the kernel as the unit): no "
            "estimate for occupancy or DRAM traffic per operation (1 cluster(s): a cluster-robust error needs at "
            "least 2)") in one.verdict
    two_gpus = ncu_runs.copy()
    two_gpus.loc[two_gpus.index[:3], "gpu"] = "NVIDIA L4"
    with pytest.raises(ValueError, match="runs of 2 GPUs"):
        predictor_study(two_gpus)


def _png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_on_sweep_with_ncu_and_failed_members(store, tmp_path):
    out = tmp_path / "r"
    rep = report.main(["--uri", store["uri"], "--sweep", store["ncu"], "--out", str(out), "--n-boot", "100"])
    text = (out / "report.md").read_text()
    assert "32 run(s): 30 measured and verified, 1 FAILED, 1 skipped." in text
    assert "verification failed: 12 of 268435456 elements differ" in text
    assert "mma=m16n8k64 is not valid with precision=int8" in text
    assert "**Circularity flag (DRAM bandwidth utilisation).**" in text and "family of **6 tests**" in text
    assert "**Answer.** No interventional runs are here" in text
    assert "### Claims of the study" in text and "| C2b |" in text          # runs carry study kernel names
    for name in ("throughput_vs_size", "predictors_vs_throughput", "marginal_means"):
        assert _png(out / f"{name}.png") and f"]({name}.png)" in text
    assert not (out / "speedup_vs_baseline.png").exists()
    assert "Speedup over the baseline kernel, per size: not drawn, no baseline runs" in text
    assert "1 FAILED run(s) are left out of every statistic and claim" in text
    import mlflow
    logged = {Path(a.path).name for a in mlflow.MlflowClient(store["uri"]).list_artifacts(store["ncu"], "report")}
    assert {"report.md", "report.html", "throughput_vs_size.png", "claims.csv", "runs.csv"} <= logged
    assert rep.out_dir == out
    # the HTML report shows its figures wherever it is opened (MLflow's artifact view): inlined, padded cells
    page = (out / "report.html").read_text()
    assert page.count("<img src=\"data:image/png;base64,") == 3 and ".png)" not in page and ".png\"" not in page
    assert "<table>" in page and "padding:.25em .6em" in page and "<td>C2b</td>" in page
    # the parent's description ends with the verdict, the claims tally and the link to the HTML report
    client = mlflow.MlflowClient(store["uri"])
    run = client.get_run(store["ncu"])
    note = run.data.tags["mlflow.note.content"]
    link = f"(#/experiments/{run.info.experiment_id}/runs/{store['ncu']}/artifacts/report/report.html)"
    section = note[note.index("### Analysis"):].splitlines()
    assert section[2].startswith(f"[The analysis report]{link}")
    assert section[4] == f"- NVIDIA H200: {rep.summary[0].split(': ', 1)[1]}" and "No interventional" in section[4]
    assert re.fullmatch(r"- NVIDIA H200: claims of .+: \d+ hold, \d+ fail, \d+ inconclusive, \d+ not testable "
                        r"here", section[5]), section[5]
    # a second report replaces its part, the rest of the description stays
    before = note[:note.index("### Analysis")]
    report.describe_parent(client, store["ncu"], rep)
    again = client.get_run(store["ncu"]).data.tags["mlflow.note.content"]
    assert again.count("### Analysis") == 1 and again.startswith(before)


def test_report_to_a_markdown_file_keeps_its_figures_beside_it(store, tmp_path):
    """--out results/h200/l4_claims.md: the report is that file, its figures and tables in l4_claims/."""
    out = tmp_path / "l4_claims.md"
    report.main(["--uri", store["uri"], "--sweep", store["ncu"], "--out", str(out), "--n-boot", "50",
                 "--study", "none", "--no-log"])
    text = out.read_text()
    assert "](l4_claims/throughput_vs_size.png)" in text and _png(tmp_path / "l4_claims" / "throughput_vs_size.png")
    assert (tmp_path / "l4_claims" / "runs.csv").is_file() and not (tmp_path / "l4_claims" / "report.md").exists()


def test_report_from_a_committed_tidy_table_needs_no_store(tmp_path, capsys):
    """--table: the committed runs.csv of run 2 (30 real INT8 runs on the H200), the study's packaged
    tables as the reference; nothing logged (there is no store). The last line names both files."""
    table = Path(report.__file__).resolve().parents[1] / "results" / "h200" / "l4_run2_int8" / "runs.csv"
    out = tmp_path / "int8.md"
    report.main(["--table", str(table), "--study", "l4", "--out", str(out), "--n-boot", "20"])
    html = tmp_path / "int8" / "report.html"
    assert capsys.readouterr().out.splitlines()[-1] == \
        f"Report written: {out} (self-contained, figures inlined: {html})"
    assert html.read_text().count("data:image/png;base64,") == 4
    text = out.read_text()
    assert text.splitlines()[2].startswith(f"Tidy table `{table}`, experiment(s) tensor-core-ablations, sweep all")
    assert "| int8_ptx_mma_k32 | 47.1 | 108 | 131 | 142 | 143 |" in text
    assert ("0 hold, 0 fail, 20 are inconclusive and 0 are not testable on NVIDIA H200. One rule for every claim"
            in text)
    assert "| C5 |" in text and "needs timing.repeats >= 2" in text
    assert "The study's own numbers were not found" not in text                   # read from the package
    assert "](int8/marginal_means.png)" in text and _png(tmp_path / "int8" / "marginal_means.png")


def test_report_without_ncu_says_what_it_cannot_answer(store, tmp_path):
    df = load_runs(store["uri"], sweep=store["plain"])
    rep = report.write_report(df, tmp_path, "plain", n_boot=100)
    assert "The predictor question cannot be answered from these runs" in rep.text
    assert "Each ncu predictor against throughput, with a fit per size: not drawn, no run has the ncu" in rep.text
    assert not re.search(r"rho|Holm p|% per ", rep.text)                           # no invented numbers
    assert not (tmp_path / "predictors_vs_throughput.png").exists() and _png(tmp_path / "throughput_vs_size.png")
    assert "| int8_bk64_m16n8k32 | 27.3 | 137 | 573 | 654 | 696 |" in rep.text   # the real H200 numbers


def test_report_on_a_single_kernel(store, tmp_path):
    rep = report.write_report(load_runs(store["uri"], sweep=store["one"]), tmp_path, "one", n_boot=100)
    assert "no estimate for occupancy or DRAM traffic per operation (1 cluster(s)" in rep.text
    assert "every measured run has the same configuration: no axis to show the marginal means of" in rep.text


def test_report_errors_name_the_problem(store, tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        report.main(["--uri", store["uri"], "--experiment", "x", "--out", str(tmp_path)])
    assert done.value.code == 2 and "Cannot read the runs: experiment 'x' is not in" in capsys.readouterr().err


def test_report_on_a_sweep_of_static_runs_names_the_sweep_and_what_it_holds(tmp_path, capsys):
    """It said 'No runs in experiment ... (sweep latest)' of a sweep that had static runs."""
    from experiments.store.track import Tracker
    tr = Tracker(f"sqlite:///{tmp_path}/m.db", "tensor-core-ablations")
    parent = tr.start("sweep", {}, {"kind": "sweep", "sweep_key": "k"})
    for i in range(2):
        tr.end(tr.start(f"static {i}", {"precision": "int8"}, {"backend": "static", "outcome": "static"}, parent))
    tr.end(parent)
    with pytest.raises(SystemExit) as err:
        report.main(["--uri", tr.uri, "--sweep", "latest", "--out", str(tmp_path / "r")])
    said = capsys.readouterr().err
    assert err.value.code == 2 and not (tmp_path / "r").exists()
    assert said.strip() == (
        f"Nothing to report: sweep {parent} of experiment 'tensor-core-ablations' in {tr.uri} holds no run "
        "measured on a GPU (2 static): static runs are rendered and assembled only; their table: python -m "
        f"experiments.report --static --uri {tr.uri} --sweep {parent}. Run the sweep on a GPU, then report.")
    # a plain path to the store: the advice, not a traceback
    with pytest.raises(SystemExit) as err:
        report.main(["--uri", str(tmp_path / "m.db"), "--out", str(tmp_path / "r")])
    said = capsys.readouterr().err
    assert err.value.code == 2 and said.startswith("Cannot read the runs: ")
    assert "as a SQLite store it is sqlite:///" in said


def test_speedup_against_a_named_baseline(ncu_runs):
    from analysis.figures import speedup_table, speedup_vs_baseline
    table, note = speedup_table(ncu_runs, baseline="int4_ptx_mma_k32")
    k64 = table[(table["label"] == "int4_ptx_mma_k64")].set_index("size")["speedup"]
    assert note == "" and k64["512"] == pytest.approx(111.3 / 104.7) and k64["8192"] == pytest.approx(27517.2 / 25286.0)
    assert set(table["baseline"]) == {"int4_ptx_mma_k32"} and len(table) == 25        # 5 kernels x 5 sizes
    fig, note = speedup_vs_baseline(ncu_runs, baseline="no_such_kernel")
    assert fig is None and note.startswith("baseline 'no_such_kernel' has no measured run")


def test_study_kernels_beside_ours_relative_to_wmma():
    """Ours and the study's, each relative to its own <precision>_wmma at the same N (H200 int4
    figures of results/h200/l4_run3_int4 and the study's published ratio 4.27 at 8192)."""
    import pandas as pd

    from analysis.tables import beside_study
    ours = pd.DataFrame({"study_kernel": ["int4_wmma", "int4_ptx_mma_k64", "int4_ptx_mma_k64", "int8_dp4a"],
                         "precision": ["int4", "int4", "int4", "int8"], "n": [8192, 8192, 512, 8192],
                         "throughput": [31.9, 49.9, 30.9, 108.0], "throughput_unit": ["TOP/s"] * 4,
                         "mma_native": ["false", "false", "false", None]})
    ref = pd.DataFrame({"study_kernel": ["int4_wmma", "int4_ptx_mma_k64"], "precision": ["int4", "int4"],
                        "n": [8192, 8192], "throughput": [10.0, 42.7]})
    t = beside_study(ours, ref)
    assert list(t.columns) == ["study kernel", "N", "ours", "ours vs WMMA", "published vs WMMA",
                               "MMA emulated here"]
    rows = {(r[0], r[1]): r[2:] for r in t.itertuples(index=False)}
    assert rows["int4_ptx_mma_k64", 8192] == ("49.9 TOP/s", 49.9 / 31.9, 42.7 / 10.0, "yes")
    missing = lambda v: v != v  # noqa: E731 - NaN in the table, '-' in markdown
    assert all(map(missing, rows["int4_ptx_mma_k64", 512][1:3]))   # no WMMA run at 512 on either side
    assert all(map(missing, rows["int8_dp4a", 8192][1:3])) and rows["int8_dp4a", 8192][3] == "-"
    assert beside_study(ours.drop(columns="study_kernel"), ref).empty


def test_report_of_a_saved_table_prints_the_predictor_answer(store, ncu_runs, tmp_path, capsys):
    """--table results/h200/predictors/runs.csv --out results/h200/predictors.md: the committed table."""
    ncu_runs.to_csv(tmp_path / "runs.csv", index=False)
    rep = report.main(["--table", str(tmp_path / "runs.csv"), "--out", str(tmp_path / "predictors.md"),
                       "--study", "none", "--n-boot", "50"])
    out = capsys.readouterr().out
    direct = predictor_study(ncu_runs, n_boot=50)
    assert f"NVIDIA H200: {direct.verdict}" in out and f"**Answer.** {direct.verdict}" in rep.text
    assert "Not logged" not in out and "Logged to" not in out              # a table has no parent run to log to
    assert "| int8_bk64_m16n8k32 | 27.3 | 137 | 573 | 654 | 696 |" in (tmp_path / "predictors.md").read_text()


def test_html_report_inlines_each_figure_of_its_folder_and_links_the_rest(tmp_path):
    """Every ``![caption](name.png)`` whose file is in the folder becomes that file's bytes as base64
    (a name with a character HTML escapes included, a figure linked twice twice); a missing one stays a
    link; tables are HTML tables."""
    import base64
    figures = {"a.png": b"\x89PNG first", "x&y.png": b"\x89PNG second"}
    for name, data in figures.items():
        (tmp_path / name).write_bytes(data)
    page = report.html_report("| a | b |\n|---|---|\n| 1 | 2 |\n\n![one](a.png) ![two](x&y.png)\n\n![gone](m.png)"
                              "\n\n![again](a.png)\n", tmp_path, "t<")
    inlined = [f'src="data:image/png;base64,{base64.b64encode(d).decode()}"' for d in figures.values()]
    assert page.count(inlined[0]) == 2 and page.count(inlined[1]) == 1
    assert '<img src="m.png" alt="gone" />' in page and "<td>1</td>" in page and "<title>t&lt;</title>" in page


def _bad_inputs(tmp):
    """Tables that are not tidy tables, as a user may give them: (file, the reason the line gives)."""
    (tmp / "empty.csv").write_text("")
    (tmp / "text.csv").write_text("# Title\n\nsome prose, with a comma\nand, two, more\n")
    (tmp / "binary.csv").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    (tmp / "other.csv").write_text("a,b\n1,2\n")
    return [("empty.csv", "(empty)"), ("text.csv", "(Error tokenizing data. C error: Expected 2 fields in line 4, saw 3)"),
            ("binary.csv", "('utf-8' codec can't decode byte 0x89 in position 0: invalid start byte)"),
            ("other.csv", ": it has no column run_id, status, experiment, kernel, backend;")]


@pytest.mark.parametrize("module", ["analysis.report", "analysis.notebooks.__main__"])
def test_a_table_that_is_not_one_an_out_that_is_a_file_and_no_resamples_are_refused(module, tmp_path, module_cli):
    """An empty file, prose, binary data or another CSV given as --table, an --out that is a file or
    under one, and --n-boot 0 or -5: one line, exit 2, before any computation (these ended in pandas',
    NumPy's or mkdir's traceback, exit 1, after ~20 s; --n-boot 0 hung analysis.notebooks)."""
    table = str(Path(__file__).parents[1] / "results" / "h200" / "l4_claims" / "runs.csv")
    for name, why in _bad_inputs(tmp_path):
        rc, out, err = module_cli(module, "--table", str(tmp_path / name), "--out", str(tmp_path / "o"))
        assert (rc, out) == (2, "") and err.startswith(f"Cannot read the runs: {tmp_path / name} is not a tidy table"), err
        assert why in err and err.count("\n") == 1, err
    (tmp_path / "afile").write_text("")
    for out_dir in ("afile", "afile/sub"):
        rc, out, err = module_cli(module, "--table", table, "--out", str(tmp_path / out_dir))
        assert (rc, err) == (2, f"Could not write --out {tmp_path / out_dir}: {tmp_path / 'afile'} is a file, "
                                "not a folder\n")
    for n in ("0", "-5"):
        rc, _, err = module_cli(module, "--table", table, "--out", str(tmp_path / "o"), "--n-boot", n)
        assert rc == 2 and err.endswith(f"error: argument --n-boot: {n} is not a count: give 1 or more\n"), err
    assert not (tmp_path / "o").exists()


def test_help_shows_each_example_line_as_written(capsys):
    """--help prints the module's examples line for line (a continued command keeps its line break)."""
    with pytest.raises(SystemExit) as exc:
        report.main(["--help"])
    assert exc.value.code == 0
    shown = capsys.readouterr().out.splitlines()
    examples = [line for line in report.__doc__.splitlines() if line.startswith("    ")]
    assert len(examples) == 5 and examples[3].endswith("--no-log \\") and examples[4].startswith("        --out")
    assert all(line in shown for line in examples), [line for line in examples if line not in shown]


def test_a_tracking_server_that_does_not_answer_is_one_line(tmp_path, module_cli):
    """--uri of a port where no MLflow server listens: one line naming the URI and the option, exit 2
    (MLflow's client retried for 4 minutes, then printed a 100-line traceback)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{s.getsockname()[1]}"      # bound, not listening: connection refused
        rc, out, err = module_cli("analysis.report", "--uri", uri, "--sweep", "latest", "--out", str(tmp_path / "o"))
    assert (rc, out) == (2, "") and err.count("\n") == 1, err
    assert err.startswith(f"Cannot read the runs: no MLflow tracking server answers at {uri} (") and \
        err.endswith("or give another --uri\n"), err
    assert not (tmp_path / "o").exists()


def test_report_options_that_name_nothing_are_refused_in_one_line(store, tmp_path, module_cli):
    """A filter MLflow cannot parse, a YAML that is no claims file, a --reference-dir that is not
    there, a --baseline no run has, a kernel's run given as --sweep, and store options beside --table:
    one line, exit 2, nothing written (they ended in tracebacks, exit 1, or exit 0 with the option
    ignored and a note deep in report.md)."""
    table = str(Path(__file__).parents[1] / "results" / "h200" / "l4_claims" / "runs.csv")
    (tmp_path / "text.yaml").write_text("just: text\n")
    kernel_run = load_runs(store["uri"], sweep=store["one"])["run_id"].iloc[0]
    out = ["--out", str(tmp_path / "o"), "--no-log"]
    cases = [
        (["--uri", store["uri"], "--filter", "params.precision == int8 AND"],
         "Cannot read the runs: the filter 'params.precision == int8 AND' is not an MLflow search filter ("),
        (["--table", table, "--study", str(tmp_path / "text.yaml")],
         f"Cannot read the claims file {tmp_path / 'text.yaml'}: a claims file needs a top-level list `claims:`"),
        (["--table", table, "--reference-dir", str(tmp_path / "nowhere")],
         f"error: --reference-dir {tmp_path / 'nowhere'}: no such folder; the L4 study's CSVs are in "),
        (["--table", table, "--baseline", "nosuchkernel"],
         "--baseline nosuchkernel: no measured run of that kernel, study kernel or family; valid: a kernel of "
         "these runs, or one of dp4a, fp16_ptx_3stage, fp16_ptx_fp16acc, "),
        (["--uri", store["uri"], "--sweep", kernel_run],
         f"Cannot read the runs: sweep={kernel_run!r} is the run of one kernel, not a sweep's parent run; "
         f"its sweep is {store['one']} (or use sweep='latest')"),
        (["--table", table, "--sweep", "latest", "--filter", "x"],
         "error: --table reads a tidy table, not a store: --sweep, --filter would be ignored; leave them out"),
    ]
    for args, line in cases:
        rc, stdout, err = module_cli("analysis.report", *args, *out)
        assert (rc, stdout) == (2, ""), (args, stdout, err)
        assert line in err.splitlines()[-1], (args, err)
        assert len(err.splitlines()) == 1 or line.startswith("error:") and err.startswith(   # argparse's: usage
            "usage: python -m analysis.report [-h]"), (args, err)
    rc, _, err = module_cli("analysis.notebooks.__main__", "--table", table, "--experiment", "x", "--out",
                            str(tmp_path / "o"))
    assert rc == 2 and "error: --table reads a tidy table, not a store: --experiment would be ignored" in err
    assert not (tmp_path / "o").exists()
