"""Screenshots of the MLflow UI for the README, from a given store, in a real headless browser:

    python tools/ui_screenshots.py --store sqlite:////path/to/mlflow.db --out docs/img/

Starts ``mlflow server`` on a free loopback port for the store, opens it in Debian's Chromium driven
by Selenium and chromedriver (apt-get install chromium chromium-driver; pip install selenium), and
takes, at 1500 x 900: the sweep's runs from the link run.py prints, its charts, the parent run's
page (its description) and figure, a verified (or static) run's page, its PTX preview, and a skipped
and a failed run where the store has them. The sweep is the latest one (``--sweep PARENT_RUN_ID`` for
another). The same server and browser set-up is what tests/test_ui_view.py checks the view with.
"""
from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tools.tracking_server import start_server, stop  # noqa: E402

SIZE = (1500, 900)          # the page the screenshots are taken of (CSS pixels)
# MLflow 3's assistant panel: marked as opened once and closed (the UI's own local-storage keys)
_SEEN_ASSISTANT = ("try { localStorage.setItem('mlflow.assistant.fab.autoOpenedOnFirstLoad_v1', 'true');"
                   " localStorage.setItem('mlflow.assistant.panelOpen_v1', 'false'); } catch (e) {}")


def chromium() -> tuple[str, str] | None:
    """(the Chromium binary, its chromedriver) found on PATH (Debian's names), or None."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def why_no_browser() -> str | None:
    """Why no browser can be driven here (what to install), or None when one can."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "Selenium is not installed (pip install selenium, or pip install -e '.[dev]')"
    if chromium() is None:
        return ("Chromium and chromedriver are not installed (Debian: apt-get install chromium "
                "chromium-driver)")
    return None


@contextlib.contextmanager
def ui(store: str):
    """``mlflow server`` for the store URI ``store`` on a free loopback port, for the block's length;
    yields its address (``http://127.0.0.1:PORT``). Raises RuntimeError when it does not start."""
    with tempfile.TemporaryDirectory(prefix="mlflow-ui-") as folder:
        uri, proc = start_server(store, Path(folder), workers=1)     # the UI needs one worker
        try:
            yield uri
        finally:
            stop(proc)


@contextlib.contextmanager
def browser(size: tuple[int, int] = SIZE):
    """A headless Chromium (Selenium WebDriver) with a ``size`` (width, height) window, quit at the
    block's end. Raises RuntimeError with :func:`why_no_browser`'s reason when none can be started."""
    if reason := why_no_browser():
        raise RuntimeError(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    binary, driver = chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={size[0]},{size[1]}", "--hide-scrollbars"):
        options.add_argument(arg)
    tab = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    try:
        # the UI's assistant opens itself once per browser profile, over a third of the page: as for a
        # user who has seen it, it stays closed
        tab.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": _SEEN_ASSISTANT})
        tab.get("about:blank")
        resize(tab, size)
        yield tab
    finally:
        tab.quit()


def resize(tab, size: tuple[int, int]) -> None:
    """Make the page (the viewport, not the window around it) of ``tab`` ``size`` (width, height)."""
    extra = tab.execute_script("return [outerWidth - innerWidth, outerHeight - innerHeight]")
    tab.set_window_size(size[0] + extra[0], size[1] + extra[1])


def open_page(tab, url: str) -> None:
    """Load ``url`` in ``tab`` as a new page (the UI's pages differ only after '#': without a new load
    the page would keep the state of the one before)."""
    tab.get("about:blank")
    tab.get(url)


def wait_for(tab, css: str, timeout: float = 20.0, text: str | None = None, exact: bool = False):
    """The first element matching the CSS selector ``css`` (and holding ``text`` when given; being it
    with ``exact``) once the page shows it; raises TimeoutError naming what was awaited."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for el in tab.find_elements("css selector", css):
            with contextlib.suppress(Exception):
                if el.is_displayed() and (text is None or (el.text == text if exact else text in el.text)):
                    return el
        time.sleep(0.2)
    raise TimeoutError(f"the page {tab.current_url} showed no {css!r}" + (f" with {text!r}" if text else "")
                       + f" within {timeout:.0f} s")


def _latest_sweep(client, experiment_id: str):
    sweeps = client.search_runs([experiment_id], "tags.kind = 'sweep'",
                                order_by=["attributes.start_time DESC"], max_results=1)
    if not sweeps:
        raise SystemExit("The store has no sweep (no parent run tagged kind=sweep): run one first, e.g. "
                         "python run.py -m precision=int4,int8 ktile=32,64")
    return sweeps[0]


def _sweep(client, run_id: str):
    """The sweep's parent run ``run_id`` (``--sweep``); SystemExit when the store has no such run, or
    the run is not a sweep's parent (a run of a sweep: its parent is named)."""
    from mlflow.exceptions import MlflowException
    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise SystemExit(f"--sweep {run_id} is not a run id in the store {client.tracking_uri}: give the "
                         "parent run id that run.py -m printed, or leave --sweep out for the latest"
                         ) from None
    if run.data.tags.get("kind") != "sweep":
        parent = run.data.tags.get("mlflow.parentRunId")
        raise SystemExit(f"--sweep {run_id} is not a sweep's parent run (no tag kind=sweep)"
                         + (f": it is a run of the sweep {parent}; give --sweep {parent}" if parent else
                            ": give the parent run id that run.py -m printed"))
    return run


def shots(store: str, experiment: str, sweep: str | None) -> list[tuple[str, str, str | None]]:
    """What to photograph: (file name, page below the UI's address, the artifact to open there or None).
    Raises SystemExit naming what the store lacks."""
    import mlflow

    from experiments.store.record import ARTIFACTS
    from experiments.store.track import sweep_runs
    from experiments.store.view import sweep_link
    client = mlflow.MlflowClient(store)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise SystemExit(f"The store {store} has no experiment {experiment!r} (--experiment NAME)")
    parent = _sweep(client, sweep) if sweep else _latest_sweep(client, exp.experiment_id)
    runs = sweep_runs(client, [exp.experiment_id], parent.info.run_id)
    link = sweep_link(exp.experiment_id, parent.info.run_id)

    def page(run, tab=""):       # a run's page, in the runs layout as the sweep's link opens it
        return f"#/experiments/{exp.experiment_id}/runs/{run.info.run_id}{tab}?workflowType=machine_learning"

    def has(run, name):
        return any(a.path == name for a in client.list_artifacts(run.info.run_id))
    out = [("ui_sweep_runs", link, None), ("ui_sweep_charts", link + "&compareRunsMode=CHART", None),
           ("ui_sweep_parent", page(parent), None)]
    if has(parent, ARTIFACTS["figure"]):
        out.append(("ui_sweep_figure", page(parent, "/artifacts"), ARTIFACTS["figure"]))
    by = {o: next((r for r in runs if r.data.tags.get("outcome") == o), None)
          for o in ("verified", "static", "skipped", "failed")}
    if run := by["verified"] or by["static"]:
        out.append(("ui_run_page", page(run), None))
        if has(run, ARTIFACTS["ptx"]):
            out.append(("ui_ptx_preview", page(run, "/artifacts"), ARTIFACTS["ptx"]))
    return out + [(f"ui_{o}_run", page(by[o]), None) for o in ("skipped", "failed") if by[o]]


def take(tab, url: str, artifact: str | None, path: Path) -> None:
    """Open ``url`` in ``tab`` (and the file ``artifact`` in its artifact browser) and save the page as
    the PNG file ``path``."""
    open_page(tab, url)
    wait_for(tab, "main, #root > *", 60)
    time.sleep(5)                      # the runs, their metrics and the charts arrive after the page
    if artifact:
        wait_for(tab, "span, div, a", 30, artifact, exact=True).click()
        time.sleep(3)
    tab.save_screenshot(str(path))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True, help="the store's URI (sqlite:///..., http://..., postgresql://...)")
    ap.add_argument("--experiment", default="tensor-core-ablations")
    ap.add_argument("--sweep", help="the parent run id of the sweep to show (default: the latest)")
    ap.add_argument("--out", default="docs/img", help="folder of the PNG files")
    args = ap.parse_args(argv)
    from experiments.store.track import StoreError, Tracker, resolve_uri, unwritable
    out = Path(args.out)
    try:      # no store there (none is made), no server answering, no such experiment: one line, exit 2
        store = resolve_uri(args.store, create=False)
        Tracker(store, args.experiment, create=False)
        if blocked := unwritable(out):
            raise SystemExit(f"--out {out} cannot be made or written: {blocked} is not writable for this "
                             "user; give a writable folder for the PNG files")
        todo = shots(store, args.experiment, args.sweep)
    except (StoreError, SystemExit) as exc:
        print(f"Store error: {exc}" if isinstance(exc, StoreError) else exc, file=sys.stderr)
        return 2
    if reason := why_no_browser():
        raise SystemExit(f"Cannot take screenshots: {reason}.")
    out.mkdir(parents=True, exist_ok=True)
    served = contextlib.nullcontext(store) if store.startswith("http") else ui(store)
    with served as base, browser() as tab:
        for name, page, artifact in todo:
            take(tab, f"{base}/{page}", artifact, out / f"{name}.png")
            print(f"{out / name}.png  <- {base}/{page} {artifact or ''}".rstrip(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
