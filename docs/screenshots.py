"""Screenshots of the MLflow UI for the README, taken with a real browser (Chromium through Playwright).

    mlflow ui --backend-store-uri sqlite:///STORE --port 5056 &
    python docs/screenshots.py --ui http://127.0.0.1:5056 --uri sqlite:///STORE --out docs/img

Needs ``pip install playwright`` and a Chromium (Debian: ``apt-get install chromium``; or
``playwright install chromium``). Takes: the headline sweep's runs from the link run.py prints (parent
expanded), a verified run's page, the sweep's figure, the PTX preview, a skipped and a failed run.
"""
from __future__ import annotations

import argparse
import shutil


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ui", default="http://127.0.0.1:5056")
    ap.add_argument("--uri", required=True)
    ap.add_argument("--experiment", default="tensor-core-ablations")
    ap.add_argument("--out", default="docs/img")
    ap.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"))
    args = ap.parse_args()

    import mlflow
    from playwright.sync_api import sync_playwright
    client = mlflow.MlflowClient(args.uri)
    exp = client.get_experiment_by_name(args.experiment)
    runs = client.search_runs([exp.experiment_id], max_results=5000)
    first = lambda pred: next(r for r in runs if pred(r))  # noqa: E731
    sweep = first(lambda r: r.info.run_name.startswith("sweep precision=int4,int8 ktile=32,64"))
    run = first(lambda r: r.info.run_name.startswith("8192 int8 bk64"))
    skipped = first(lambda r: r.data.tags.get("outcome") == "skipped")
    failed = first(lambda r: r.data.tags.get("outcome") == "failed")
    page = f"{args.ui}/#/experiments/{exp.experiment_id}/runs"
    shots = [("ui_sweep_runs", f"{page}?viewStateShareKey={sweep.info.run_id}", "expand"),
             ("ui_run_page", f"{page}/{run.info.run_id}", None),
             ("ui_sweep_figure", f"{page}/{sweep.info.run_id}", "throughput_vs_size.png"),
             ("ui_ptx_preview", f"{page}/{run.info.run_id}", "kernel.ptx.txt"),
             ("ui_skipped_run", f"{page}/{skipped.info.run_id}", None),
             ("ui_failed_run", f"{page}/{failed.info.run_id}", None)]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
        tab = browser.new_page(viewport={"width": 1500, "height": 900})
        for name, url, action in shots:
            tab.goto(url)
            tab.wait_for_timeout(5000)
            if action == "expand":                # the sweep's parent row: show its runs
                tab.locator(".ag-row button").first.click(timeout=5000)
            elif action:                          # an artifact: open the tab, then the file
                tab.get_by_text("Artifacts", exact=True).first.click()
                tab.wait_for_timeout(2500)
                tab.get_by_text(action).first.click()
            try:                                  # the UI's assistant panel takes a third of the page
                tab.locator('button[aria-label="Close"]').first.click(timeout=1500)
            except Exception:  # noqa: BLE001 - not shown in this MLflow version
                pass
            tab.wait_for_timeout(2000)
            tab.screenshot(path=f"{args.out}/{name}.png")
            print(f"{args.out}/{name}.png  <- {url} {action or ''}")
        browser.close()


if __name__ == "__main__":
    main()
