"""The MLflow UI's view of a sweep (experiments/store/view.py): what the sweep stores and prints, and what
a real browser shows of it (headless Chromium through Selenium, ``mlflow server`` on loopback)."""
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

from experiments.store.view import COLOR_TAG, description_link, publish, run_colors, sweep_link, sweep_view
from test_cli import EXPERIMENT, all_runs, run_cli, store_args

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tools import ui_screenshots  # noqa: E402


def _run(rid, params, metrics=None, tags=None, name="r"):
    return NS(info=NS(run_id=rid, run_name=name, status="FINISHED"),
              data=NS(params=params, metrics=metrics or {}, tags=tags or {}))


def test_view_groups_by_size_shows_every_run_and_the_swept_axes():
    runs = [_run("a", {"size": "512", "precision": "int8", "ktile": "32", "tile.block": "[128, 128]"},
                 {"throughput": 1.0, "ncu.dram_bytes": 9.0}),
            _run("b", {"size": "512", "precision": "int8", "ktile": "64", "tile.block": "[256, 128]"})]
    tag, value = sweep_view("abc123", runs)
    state = json.loads(value)
    assert tag == "mlflow.sharedViewState.abc123"
    assert state["searchFilter"] == "tags.`in_sweep.abc123` LIKE '%'"            # the runs it made or reused
    assert state["groupBy"] == {"aggregateFunction": "max",
                                "groupByKeys": [{"mode": "param", "groupByData": "size"}]}
    assert state["runsHiddenMode"] == "SHOW_ALL" and state["useGroupedValuesInCharts"] is False
    assert state["groupsExpanded"] == {"param.size": True}         # runs without a size: open too
    cols = state["selectedColumns"]
    assert cols[:5] == ["metrics.`throughput`", "tags.`throughput_unit`", "metrics.`median_us`",
                        "tags.`outcome`", "tags.`mma_native`"]
    # the counters the runs have, the size, the params in which the runs differ, membership
    assert "metrics.`ncu.dram_bytes`" in cols and "metrics.`ncu.achieved_occupancy_pct`" not in cols
    assert cols[6:9] == ["params.`size`", "params.`ktile`", "params.`tile.block`"]
    assert cols[-1] == "tags.`in_sweep.abc123`" and "params.`variant`" not in cols      # no run has it
    assert state["columnOrder"][1:-2] == cols
    # the charts: throughput against size; the predictors only where the runs have them
    charts = state["compareRunCharts"]
    assert [(c["xaxis"]["key"], c["yaxis"]["key"], c["metricSectionId"]) for c in charts] == [
        ("size", "throughput", "sweep")]
    more = [_run("c", {"size": "1024"}, {"ncu.achieved_occupancy_pct": 12.0, "ncu.dram_active_pct": 40.0})]
    charts = json.loads(sweep_view("abc123", runs + more)[1])["compareRunCharts"]
    assert [c["xaxis"]["key"] for c in charts] == ["size", "ncu.achieved_occupancy_pct", "ncu.dram_active_pct"]
    assert [s["name"] for s in json.loads(value)["compareRunSections"]] == ["This sweep", "Model metrics"]


def test_colours_a_hue_per_precision_and_a_shade_per_kernel():
    def run(rid, prec, kernel, size, variant="none"):
        return _run(rid, {"precision": prec, "size": size, "variant": variant}, tags={"kernel": kernel})
    runs = [run("1", "int8", "k8a", "512"), run("2", "int8", "k8a", "1024"), run("3", "int8", "k8b", "512"),
            run("4", "int4", "k4a", "512"), run("5", "fp16", "k16", "512", variant="fp16_ptx_mma"),
            run("6", "fp16", "k16x", "1024", variant="fp16_ptx_mma")]
    colors = run_colors(runs)
    assert colors == run_colors(list(reversed(runs)))                  # stable: the same runs, the same colours
    assert colors["1"] == colors["2"] != colors["3"]                   # a kernel keeps its colour at every size
    assert colors["5"] == colors["6"]                                  # a variant is one kernel (tile=auto)
    assert len({colors["1"], colors["4"], colors["5"]}) == 3
    hue = {rid: __import__("colorsys").rgb_to_hls(*(int(c[i:i + 2], 16) / 255 for i in (1, 3, 5)))[0]
           for rid, c in colors.items()}
    assert abs(hue["1"] - hue["3"]) < 0.02 and abs(hue["1"] - hue["4"]) > 0.3     # int8 green, int4 red


def test_a_sweep_stores_its_view_colours_its_runs_and_prints_the_link(tmp_path, need_ptxas):
    """run.py -m over two precisions (static runs): the printed link opens the runs layout with the view,
    the experiment holds that view (static runs: in run order, their registers, the precision column),
    every run has its colour,
    and the parent's description starts with the same link within the UI."""
    rc, out = run_cli(tmp_path, "-m", "precision=int4,int8", "ktile=64", *store_args(tmp_path))
    assert rc == 0, out
    (parent,), children = all_runs(tmp_path)
    import mlflow
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name(EXPERIMENT)
    pid = parent.info.run_id
    link = f"#/experiments/{exp.experiment_id}/runs?viewStateShareKey={pid}&workflowType=machine_learning"
    assert f"  this sweep: http://127.0.0.1:5000/{link}\n" in out
    assert parent.data.tags["mlflow.note.content"].startswith(
        f"{description_link(exp.experiment_id, pid)}\n\n`python run.py -m precision=int4,int8 ktile=64 ")
    assert description_link(exp.experiment_id, pid).endswith(f"({link})") and sweep_link(exp.experiment_id, pid) == link
    state = json.loads(exp.tags[f"mlflow.sharedViewState.{pid}"])
    assert "groupBy" not in state and state["orderByKey"] == "attributes.start_time"    # static: no size
    assert state["selectedColumns"][0] == "metrics.`registers`"
    assert "params.`precision`" in state["selectedColumns"] and "params.`ktile`" not in state["selectedColumns"]
    colors = {c.info.run_id: c.data.tags[COLOR_TAG] for c in children}
    assert len(children) == 2 and len(set(colors.values())) == 2
    assert colors == run_colors(children)


# -- in a real browser ------------------------------------------------------------------------------

SIZES, KERNELS = (1024, 4096, 8192), (("int4", 32), ("int4", 64), ("int8", 32), ("int8", 64))


def _store_through(base: str) -> tuple:
    """A sweep of 12 verified runs (2 precisions x 2 K tiles x 3 sizes, with Nsight Compute counters) in the
    store behind the server ``base``, with its description and view as run.py writes them; returns
    (client, experiment id, parent run id, {run id: kernel}, the description)."""
    import mlflow
    from mlflow.entities import Metric, Param

    from experiments.store.record import MEMBER, NEW, sweep_note
    from experiments.store.track import sweep_runs
    client = mlflow.MlflowClient(base)
    exp = client.create_experiment(EXPERIMENT)
    t0 = int(time.time() * 1000) - 100_000
    parent = client.create_run(exp, run_name="sweep precision=int4,int8 ktile=32,64", start_time=t0,
                               tags={"kind": "sweep"}).info.run_id
    kernels = {}
    for i, (n, (prec, bk)) in enumerate((n, k) for n in SIZES for k in KERNELS):
        thr = n / 16 * (1.3 if prec == "int8" else 1.0) * bk / 32
        rid = client.create_run(exp, run_name=f"{n} {prec} bk{bk} m16n8k32 s3 256x128", start_time=t0 + i + 1, tags={
            "mlflow.parentRunId": parent, MEMBER.format(parent): NEW, "outcome": "verified",
            "kernel": f"gemm_{prec}_bk{bk}", "throughput_unit": "TOP/s", "mma_native": str(prec == "int8").lower(),
            "mlflow.note.content": f"{n}x{n}x{n}: {thr:.1f} TOP/s, verified"}).info.run_id
        metrics = {"throughput": thr, "median_us": n / 10, "ncu.achieved_occupancy_pct": 10 + bk / 8,
                   "ncu.dram_active_pct": 30 + n / 512, "ncu.dram_bytes": 3.0 * n * n}
        client.log_batch(rid, metrics=[Metric(k, v, 0, 0) for k, v in metrics.items()],
                         params=[Param(k, str(v)) for k, v in (("size", n), ("precision", prec), ("ktile", bk),
                                                                ("variant", "none"), ("study_kernel", "none"))])
        client.set_terminated(rid)
        kernels[rid] = f"{prec} bk{bk}"
    runs = sweep_runs(client, [exp], parent)
    note = (description_link(exp, parent) + "\n\n"
            + sweep_note("python run.py -m precision=int4,int8 ktile=32,64", runs, parent))
    client.set_tag(parent, "mlflow.note.content", note)
    client.set_terminated(parent)
    publish(client, exp, parent, runs)
    return client, exp, parent, kernels, note


@pytest.fixture(scope="module")
def ui():
    """(the server's address, the store's facts of :func:`_store_through`, a browser tab)."""
    if reason := ui_screenshots.why_no_browser():
        pytest.skip(f"no browser to open the MLflow UI in: {reason}")
    import tempfile
    with tempfile.TemporaryDirectory(prefix="ui_view_") as folder, \
            ui_screenshots.ui(f"sqlite:///{folder}/mlflow.db") as base, ui_screenshots.browser((2400, 900)) as tab:
        yield base, _store_through(base), tab


def _cells(tab, col: str) -> list:
    return [c.text for c in tab.find_elements("css selector", f'.ag-row [col-id="{col}"]')]


def test_the_sweep_link_opens_every_run_grouped_by_size_with_its_columns_and_colours(ui):
    base, (client, exp, parent, kernels, _), tab = ui
    tab.get(base + "/" + sweep_link(exp, parent))
    ui_screenshots.wait_for(tab, ".ag-row a[href*='/runs/']", 60)
    assert "workflowType=machine_learning" in tab.current_url
    ui_screenshots.wait_for(tab, "body", 10, "12 matching runs")
    # every run shown, in a group per size whose row holds the best throughput of the group
    groups = _cells(tab, "attributes.`Run Name`")
    assert [g.split("\n")[0] for g in groups if g.startswith("Group:")] == ["Group: 8192", "Group: 4096",
                                                                             "Group: 1024"], groups
    links = [a for a in tab.find_elements("css selector", ".ag-row a[href*='/runs/']") if a.is_displayed()]
    shown = {a.get_attribute("href").rsplit("/", 1)[1] for a in links}
    assert shown == set(kernels), groups
    best = [t for t in _cells(tab, "metrics.`throughput`") if "(max)" in t]
    assert [float(t.split()[0]) for t in best] == [1331.2, 665.6, 166.4], best
    # the columns: result, unit, outcome, mma_native, counters, size and the swept axes
    header = {h.get_attribute("col-id") for h in tab.find_elements("css selector", ".ag-header-cell")}
    assert {"metrics.`throughput`", "tags.`throughput_unit`", "tags.`outcome`", "tags.`mma_native`",
            "metrics.`ncu.achieved_occupancy_pct`", "metrics.`ncu.dram_bytes`", "params.`size`",
            "params.`precision`", "params.`ktile`"} <= header, header
    # each run in its kernel's colour (the tag the view set), the same at every size
    seen = {}
    for cell in tab.find_elements("css selector", '.ag-row [col-id="attributes.`Run Name`"]'):
        for chip, link in zip(cell.find_elements("css selector", "[data-testid=experiment-view-table-run-color] input"),
                              cell.find_elements("css selector", "a[href*='/runs/']"), strict=True):
            seen[link.get_attribute("href").rsplit("/", 1)[1]] = chip.get_attribute("value")
    tagged = {r.info.run_id: r.data.tags[COLOR_TAG] for r in client.search_runs([exp]) if r.info.run_id in kernels}
    assert seen == tagged
    by_kernel = {}
    for rid, colour in seen.items():
        by_kernel.setdefault(kernels[rid], set()).add(colour)
    assert len(by_kernel) == 4 and all(len(c) == 1 for c in by_kernel.values()), by_kernel
    assert len(set().union(*by_kernel.values())) == 4


def test_the_charts_answer_the_sweep_first(ui):
    base, (_, exp, parent, _, _), tab = ui
    ui_screenshots.open_page(tab, base + "/" + sweep_link(exp, parent) + "&compareRunsMode=CHART")
    ui_screenshots.wait_for(tab, "h4", 60, "size vs. throughput")
    # this sweep's section first, open, with its three charts; every metric's own chart below, closed
    titles = [h.get_attribute("textContent") for h in tab.find_elements("css selector", "h4")]
    assert titles == ["size vs. throughput", "ncu.achieved_occupancy_pct vs. throughput",
                      "ncu.dram_active_pct vs. throughput"], titles
    text = tab.find_element("css selector", "body").text
    assert text.index("This sweep\n(3)") < text.index("Model metrics\n(5)"), text


def test_the_parent_shows_its_description_on_its_first_screen(ui):
    """At 1500 x 900, as the README's screenshots: the command, the counts and the link to the view."""
    base, (_, exp, parent, _, note), tab = ui
    ui_screenshots.resize(tab, ui_screenshots.SIZE)
    ui_screenshots.open_page(tab, f"{base}/#/experiments/{exp}/runs/{parent}?workflowType=machine_learning")
    shown = [ui_screenshots.wait_for(tab, css, 60, text) for css, text in (
        ("a", "This sweep's runs"), ("code, p", "python run.py -m precision=int4,int8 ktile=32,64"),
        ("p", "12 verified."))]
    height = tab.execute_script("return innerHeight")
    assert all(0 < el.rect["y"] and el.rect["y"] + el.rect["height"] < height for el in shown)
    assert shown[0].get_attribute("href") == base + "/" + sweep_link(exp, parent)
    ui_screenshots.open_page(tab, shown[0].get_attribute("href"))       # the link opens a new tab
    ui_screenshots.wait_for(tab, "body", 60, "12 matching runs")
    assert "Group by: size" in tab.find_element("css selector", "body").text


def test_the_screenshot_script_plans_the_pages_the_store_has(ui):
    """tools/ui_screenshots.py: the sweep's runs and charts, its parent, a verified run's page; no figure,
    PTX, skipped or failed run where the store has none; a store without the experiment says so."""
    base, (_, exp, parent, kernels, _), _ = ui
    plan = ui_screenshots.shots(base, EXPERIMENT, None)
    assert [name for name, _, _ in plan] == ["ui_sweep_runs", "ui_sweep_charts", "ui_sweep_parent", "ui_run_page"]
    assert plan[0][1] == sweep_link(exp, parent) and plan[1][1] == sweep_link(exp, parent) + "&compareRunsMode=CHART"
    assert plan[2][1] == f"#/experiments/{exp}/runs/{parent}?workflowType=machine_learning"
    assert plan[3][1].split("/runs/")[1].split("?")[0] in kernels
    with pytest.raises(SystemExit, match="has no experiment 'nope' \\(--experiment NAME\\)"):
        ui_screenshots.shots(base, "nope", None)


def test_a_sweep_of_static_runs_shows_what_ptxas_says_in_the_order_it_ran():
    """A GPU-less sweep's view grouped by a size its runs do not have ("Group: none") and sorted by a
    throughput no run has: it shows registers, spills, occupancy and SASS instructions in run order."""
    runs = [_run("a", {"size": "none", "precision": "int8", "ktile": "32"},
                 {"registers": 96.0, "spill_stores_bytes": 0.0, "theoretical_occupancy_pct": 12.5}),
            _run("b", {"size": "none", "precision": "int8", "ktile": "64"},
                 {"registers": 128.0, "spill_stores_bytes": 0.0, "theoretical_occupancy_pct": 12.5})]
    state = json.loads(sweep_view("p1", runs)[1])
    assert "groupBy" not in state and "groupsExpanded" not in state
    assert (state["orderByKey"], state["orderByAsc"]) == ("attributes.start_time", True)
    assert state["selectedColumns"][:5] == ["metrics.`registers`", "metrics.`spill_stores_bytes`",
                                            "metrics.`theoretical_occupancy_pct`", "tags.`outcome`",
                                            "tags.`mma_native`"]
    assert "params.`ktile`" in state["selectedColumns"] and "metrics.`throughput`" not in state["selectedColumns"]
