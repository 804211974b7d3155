"""Print (or write) the results table of a store: kernel, size, median us, throughput, spread.

    python -m experiments.report [--uri URI] [--experiment NAME] [--out results/h200/main_job.md]
"""
from __future__ import annotations

import argparse
from pathlib import Path

from .track import StoreError, Tracker, resolve_uri

__all__ = ["results_table", "main"]


def results_table(uri: str, experiment: str = "tensor-core-ablations") -> str:
    """Markdown table of every GPU run (FINISHED and FAILED) in the store, grouped by GPU, sorted by
    kernel and size; throughput is TFLOP/s for float types and TOP/s for integer types.

    Read-only: raises StoreError when the store or the experiment does not exist."""
    tr = Tracker(uri, experiment, create=False)
    runs = tr.client.search_runs([tr.experiment_id], "tags.backend = 'gpu'", max_results=50000)
    rows = []
    for r in runs:
        p, m, t = r.data.params, r.data.metrics, r.data.tags
        if "problem.m" not in p:
            continue
        size = (int(p["problem.m"]), int(p["problem.n"]), int(p["problem.k"]))
        status = "verified" if r.info.status == "FINISHED" else r.info.status.lower()
        rows.append((t.get("kernel", "?"), size, m.get("median_us"), m.get("throughput"),
                     t.get("throughput_unit", ""), m.get("spread"), status, t.get("gpu", "")))
    rows.sort(key=lambda x: (x[7], x[0], x[1]))
    gpus = sorted({x[7] for x in rows})
    out = [f"GPU: {', '.join(gpus) or '-'}; store: {uri}", "",
           "| GPU | kernel | M x N x K | median us | throughput | spread | status |",
           "| --- | --- | --- | ---: | ---: | ---: | --- |"]
    for kern, size, us, thr, unit, spread, status, gpu in rows:
        f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
        out.append(f"| {gpu} | {kern} | {'x'.join(map(str, size))} | {f(us, '.1f')} | "
                   f"{f(thr, '.1f')} {unit} | {f(spread, '.1%')} | {status} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uri", default=None, help="tracking URI (default: as run.py resolves it)")
    ap.add_argument("--experiment", default="tensor-core-ablations")
    ap.add_argument("--out", default=None, help="also write the table to this file")
    args = ap.parse_args(argv)
    try:
        text = results_table(resolve_uri(args.uri, create=False), args.experiment)
    except StoreError as exc:
        raise SystemExit(f"Store error: {exc}") from None
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
