"""Verify and time the wgmma family on a Hopper GPU, one line per case; a failing case does not stop
the others. Usage: ``python tests/wgmma_gpu_check.py [--sizes 512 2048 8192] [--precisions ...]
[--variants]`` (--variants: also the axis variations of tests/test_wgmma.py at the first size).

Each line: precision, size, the point (non-default axes), verification (max error: integers
|C - ref|, floats |C - ref| / (|A| |B|)_ij; OK / FAIL), median microseconds of a launch (CUDA events
over batches of launches) and TFLOP/s (TOP/s for int8). Needs CuPy and the driver; no Hydra/MLflow.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments.families import get  # noqa: E402
from experiments.families.gpu import device_sm  # noqa: E402
from experiments.families.wgmma import geometry  # noqa: E402

PRECISIONS = ("fp16", "bf16", "fp8_e4m3", "int8")
SIZES = (512, 2048, 8192)
VARIANTS = ({"consumers": 1}, {"producer": "false"}, {"swizzle": 64}, {"swizzle": 32},
            {"persistent": "true"}, {"persistent": "true", "order": "row"}, {"bn": 128}, {"bn": 192},
            {"bn": 64, "stages": 6}, {"stages": 2}, {"persistent": "true", "producer": "false"})


def time_us(launch, min_ms: float = 50.0, batches: int = 5) -> float:
    """Median over ``batches`` of the mean time of one launch in a batch lasting >= min_ms."""
    import cupy
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    launch()
    cupy.cuda.Device().synchronize()
    n = 1
    while True:
        start.record()
        for _ in range(n):
            launch()
        stop.record()
        stop.synchronize()
        ms = cupy.cuda.get_elapsed_time(start, stop)
        if ms >= min_ms or n >= 1 << 14:
            break
        n = max(n * 2, int(n * min_ms / max(ms, 1e-3)) + 1)
    times = []
    for _ in range(batches):
        start.record()
        for _ in range(n):
            launch()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) * 1e3 / n)
    return sorted(times)[len(times) // 2]


def run_case(precision: str, size: int, opts: dict, timed: bool = True) -> bool:
    import cupy
    fam = get("wgmma")
    t0 = time.perf_counter()
    try:
        spec = fam.spec(precision, opts, f"sm_{device_sm()}")
        g = geometry(precision, spec.p)
        step = math.lcm(g["BM"], g["BN"], g["BK"])
        size = -(-size // step) * step          # e.g. bn=192: the next multiple of 384
        label = f"{precision:<9} {size:>5} {' '.join(f'{k}={v}' for k, v in opts.items()) or 'default':<34}"
        prep = fam.prepare(spec, fam.build(spec), size, size, size, seed=7)
        prep.launch()
        cupy.cuda.Device().synchronize()
        res = prep.verify()
        line = f"{label} max_error {res.max_error:.3g} {'OK' if res.ok else 'FAIL'}"
        if not res.ok:
            print(f"{line}  {res.message()}", flush=True)
            return False
        if timed:
            us = time_us(prep.launch)
            rate = fam.rate(spec, size, size, size, us)
            line += f"  {us:10.1f} us  {rate:7.1f} {fam.unit(spec)}"
        print(f"{line}  ({time.perf_counter() - t0:.1f} s)", flush=True)
        del prep
        cupy.get_default_memory_pool().free_all_blocks()
        return True
    except Exception as exc:  # noqa: BLE001 - report and go on with the next case
        label = f"{precision:<9} {size:>5} {opts}"
        print(f"{label} ERROR {type(exc).__name__}: {str(exc)[:400]}", flush=True)
        traceback.print_exc(limit=3)
        try:
            cupy.cuda.Device().synchronize()
        except Exception as sticky:  # noqa: BLE001
            print(f"sticky CUDA error, stopping: {sticky}", flush=True)
            sys.exit(2)
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    ap.add_argument("--precisions", nargs="+", default=list(PRECISIONS))
    ap.add_argument("--variants", action="store_true")
    args = ap.parse_args()
    ok = True
    for size in args.sizes:
        for prec in args.precisions:
            ok &= run_case(prec, size, {})
    if args.variants:
        for prec in args.precisions:
            for opts in VARIANTS:
                ok &= run_case(prec, args.sizes[0], opts)
    print("ALL OK" if ok else "SOME CASES FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
