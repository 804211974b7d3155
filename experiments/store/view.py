"""How a sweep shows itself in the MLflow UI: the runs page's shared view, the runs' colours and the link.

A sweep stores its view in the experiment as the UI's shared view state (experiment tag
``mlflow.sharedViewState.<parent run id>``); the link :func:`sweep_link` opens it in the UI's plain
runs layout (``workflowType=machine_learning``, not the GenAI start page). The view:

- lists the sweep's runs, those it reused included (tag ``in_sweep.<parent>``), every one visible:
  grouped by problem size (param ``size``), each group's row holding the best (max) of every metric,
  best throughput first; a sweep of static runs (no GPU) in the order it ran, with the registers,
  spills, theoretical occupancy and SASS instructions of its kernels instead of the timing columns;
- shows the description, throughput and its unit, median time, outcome, ``mma_native``, kernel, the
  params in which its runs differ (the axes it varied), the key Nsight Compute counters when the runs
  have them, and the membership tag (``new`` or ``reused``);
- opens its charts on what the sweep asks: throughput against problem size, and throughput against
  achieved occupancy and against DRAM activity when the runs have those counters. Every other metric
  keeps its generated chart in the collapsed section below.

Run colours (tag ``mlflow.runColor``, :func:`run_colors`): one hue per precision (the order of
experiments.dtypes.DType), one shade of it per kernel of the sweep, so that the size chart separates the
kernels and the counter charts the precisions. The tag is the run's: a run a later sweep reuses takes
that sweep's colour. The state's field names are those of MLflow 3.17's ``ExperimentPageUIState``,
``RunsGroupByConfig`` and ``RunsChartsCardConfig`` (its frontend, ``mlflow/server/js``);
tests/test_ui_view.py checks them in a browser.
"""
from __future__ import annotations

import colorsys
import json

from ..dtypes import DType
from ..ncu import PREFIX as NCU
from .record import MEMBER, swept_axes

__all__ = ["VIEW_TAG", "COLOR_TAG", "SIZE", "COUNTERS", "STATIC", "PREDICTORS", "sweep_link",
           "description_link", "sweep_view", "run_colors", "publish"]

VIEW_TAG, COLOR_TAG = "mlflow.sharedViewState.{}", "mlflow.runColor"
SIZE = "size"                       # the param of a run's problem size: "8192", or "MxNxK"
COUNTERS = (NCU + "achieved_occupancy_pct", NCU + "dram_bytes")            # columns, when present
STATIC = ("registers", "spill_stores_bytes", "theoretical_occupancy_pct", "sass_instructions")  # no GPU
PREDICTORS = (NCU + "achieved_occupancy_pct", NCU + "dram_active_pct")     # charts, when present
# hues (0..1) of the precisions in DType order, then again; lightness of a precision's kernels in turn
_HUES = (0.58, 0.07, 0.33, 0.97, 0.76, 0.47, 0.88, 0.14)
_SHADES = (0.42, 0.25, 0.62, 0.33, 0.72, 0.52, 0.18, 0.80)
_UNKNOWN = len(DType)               # the hue of a run without a known precision
_NO_VALUE = ("none", "null", "None")    # a param logged for a run that has no value of it


def sweep_link(experiment_id: str, parent: str, base: str = "") -> str:
    """The runs page of the sweep ``parent`` with its view, in the UI's runs layout: ``base`` (the UI's
    address with its slash, e.g. ``http://127.0.0.1:5000/``; empty: a link within the UI) +
    ``#/experiments/<id>/runs?viewStateShareKey=<parent>&workflowType=machine_learning``."""
    return (f"{base}#/experiments/{experiment_id}/runs?viewStateShareKey={parent}"
            "&workflowType=machine_learning")


def description_link(experiment_id: str, parent: str) -> str:
    """The line of the sweep's description (markdown) that opens its view (:func:`sweep_link`, a link
    within the UI: it works on any server of the store)."""
    return f"[This sweep's runs, grouped by size, and its charts]({sweep_link(experiment_id, parent)})"


def _precision_rank(run) -> int:
    try:
        return list(DType).index(DType[run.data.params.get("precision", "")])
    except KeyError:
        return _UNKNOWN


def _kernel_of(run) -> str:
    """What a colour stands for: the param ``variant`` (the ``variant=NAME`` that chose the kernel, the
    same at every size), else the tag ``kernel`` (the entry name), else the run name without its size."""
    for value in (run.data.params.get("variant"), run.data.tags.get("kernel")):
        if value and value not in _NO_VALUE:
            return value
    return run.info.run_name.split(" ", 1)[-1]


def _hex(hue: float, light: float) -> str:
    r, g, b = colorsys.hls_to_rgb(hue, light, 0.65)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def run_colors(runs: list) -> dict[str, str]:
    """The colour of each of ``runs`` (run id -> ``#rrggbb``, the value of tag ``mlflow.runColor``): the
    hue of its precision (param ``precision``), the shade of its kernel among the kernels of that
    precision in ``runs`` (sorted by name: the same runs always get the same colours)."""
    kernels: dict[int, set] = {}
    for r in runs:
        kernels.setdefault(_precision_rank(r), set()).add(_kernel_of(r))
    order = {p: sorted(ks) for p, ks in kernels.items()}
    colors = {}
    for r in runs:
        p = _precision_rank(r)
        shade = order[p].index(_kernel_of(r))
        colors[r.info.run_id] = _hex(_HUES[p % len(_HUES)], _SHADES[shade % len(_SHADES)])
    return colors


def _column(kind: str, name: str) -> str:
    """A column's key in the UI's state: ``<kind>.`<name>```."""
    return f"{kind}.`{name}`"


def _scatter(uuid: str, x: tuple, y: tuple, section: str) -> dict:
    """One scatter chart card (``RunsChartsScatterCardConfig``): x and y are (kind, key), kind
    ``METRIC`` or ``PARAM``; every run of the view is a point in its colour."""
    return {"uuid": uuid, "type": "SCATTER", "metricSectionId": section,
            "xaxis": {"key": x[1], "type": x[0]}, "yaxis": {"key": y[1], "type": y[0]},
            "runsCountToCompare": 10000, "deleted": False, "isGenerated": False}


def _charts(metrics: set) -> tuple[list, list]:
    """The view's chart cards and sections: this sweep's charts first, open; every metric's generated
    chart (the UI adds one per metric to its "Model metrics" section) after them, closed."""
    charts = [_scatter("sweep-size", ("PARAM", SIZE), ("METRIC", "throughput"), "sweep")]
    charts += [_scatter(f"sweep-{name}", ("METRIC", name), ("METRIC", "throughput"), "sweep")
               for name in PREDICTORS if name in metrics]
    sections = [{"uuid": "sweep", "name": "This sweep", "display": True, "isReordered": True},
                {"uuid": "metrics", "name": "Model metrics", "display": False, "isReordered": True}]
    return charts, sections


def sweep_view(parent: str, runs: list = ()) -> tuple[str, str]:
    """The UI's shared view of the sweep ``parent`` over its runs ``runs`` (MLflow runs): (experiment tag
    name, JSON value). Its axis columns are the params in which the runs differ
    (experiments.store.record.swept_axes, which the sweep's description lists too). See the module
    docstring for what it shows."""
    member = MEMBER.format(parent)
    metrics = {k for r in runs for k in r.data.metrics}
    measured = "throughput" in metrics or not runs
    if measured:
        cols = [_column("metrics", "throughput"), _column("tags", "throughput_unit"),
                _column("metrics", "median_us")]
    else:       # static runs (no GPU): what ptxas says of each kernel, in order of the sweep
        cols = [_column("metrics", m) for m in STATIC if m in metrics]
    cols += [_column("tags", "outcome"), _column("tags", "mma_native")]
    cols += [_column("metrics", m) for m in COUNTERS if m in metrics]
    cols += [_column("params", p) for p in [SIZE, *swept_axes(runs)]]
    cols += [_column("attributes", "Description"), _column("tags", "kernel"), _column("tags", member)]
    cols = list(dict.fromkeys(cols))
    charts, sections = _charts(metrics)
    state = {"searchFilter": f"tags.`{member}` LIKE '%'",
             "orderByKey": "metrics.`throughput`" if measured else "attributes.start_time",
             "orderByAsc": not measured, "selectedColumns": cols,
             "columnOrder": [_column("attributes", "Run Name"), *cols, "runDateAndNestInfo", "duration"],
             "columnWidths": {_column("attributes", "Run Name"): 230,
                              _column("attributes", "Description"): 260},
             "groupBy": {"aggregateFunction": "max", "groupByKeys": [{"mode": "param", "groupByData": SIZE}]},
             # the group of runs without the param (static runs of old, a parent) open too
             "groupsExpanded": {f"param.{SIZE}": True}, "runsHiddenMode": "SHOW_ALL",
             "useGroupedValuesInCharts": False,
             "hideEmptyCharts": True, "compareRunCharts": charts, "compareRunSections": sections,
             "isAccordionReordered": True}
    if not measured:            # static runs have no size to group by (param size "none")
        del state["groupBy"], state["groupsExpanded"]
    return VIEW_TAG.format(parent), json.dumps(state)


def publish(client, experiment_id: str, parent: str, runs: list) -> None:
    """Store the UI's view of the sweep ``parent`` (:func:`sweep_view`) in the experiment
    ``experiment_id`` and colour its runs ``runs`` (:func:`run_colors`; a run whose colour is already
    right is not written again). ``client``: an ``mlflow.MlflowClient`` of the store."""
    client.set_experiment_tag(experiment_id, *sweep_view(parent, runs))
    colors = run_colors(runs)
    for r in runs:
        if r.data.tags.get(COLOR_TAG) != colors[r.info.run_id]:
            client.set_tag(r.info.run_id, COLOR_TAG, colors[r.info.run_id])
