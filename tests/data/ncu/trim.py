"""Make the trimmed ncu fixtures in this folder from the full files.

    python tests/data/ncu/trim.py REFERENCE_H200_DIR QUERY_DIR

REFERENCE_H200_DIR holds ncu's CSV exports from an H200 (shared/reference/h200); QUERY_DIR the
outputs of `ncu --query-metrics --chips <chip>` saved as query_metrics_<chip>.txt and of
`ncu --query-metrics --query-metrics-mode suffix --metrics dram__cycles_active,... --chips gh100`
saved as suffix_gh100.txt (ncu 2025.3.1). Rows and the lines before each CSV header are kept as
they are; only columns (CSV) and lines (query output) that the tests do not read are dropped.
Run it again after adding a metric to conf/ncu/metrics.yaml.
"""
import csv
import io
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
from experiments.ncu import load_table  # noqa: E402

DROP = ("device__", "nvlink__", "numa__", "profiler__", "c2clink__", "launch__")
KEEP_LAUNCH = ("launch__occupancy_limit_", "launch__registers_per_thread", "launch__grid_size")
FULL_EXTRA = {"TPC.TriageCompute.sm__cycles_active.avg", "derived__pct_occupancy_per_block_size",
              "LTS.TriageCompute.lts__average_t_sector_hit_rate_realtime.pct",
              "derived__l1tex__lsu_writeback_bytes_mem_lgds.sum.per_second", "launch__func_cache_config"}


def mapped_names() -> set:
    table = load_table()
    return {n for m in table.metrics.values() for n in m.ncu.values()}


def trim_csv(src: Path, dst: Path, keep) -> None:
    lines = src.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID",'))
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    cols = [i for i, h in enumerate(rows[0]) if i <= rows[0].index("CC") or keep(h)]
    buf = io.StringIO()
    csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows([[r[i] for i in cols] for r in rows])
    dst.write_text("\n".join(lines[:start]) + "\n" + buf.getvalue())


def trim_query(src: Path, dst: Path, bases: set) -> None:
    lines = src.read_text().splitlines()
    out = lines[:4] + [line for line in lines[4:] if line.split(" ", 1)[0] in bases or line.startswith("==")]
    dst.write_text("\n".join(out) + "\n")


def main(h200: Path, query: Path) -> None:
    names = mapped_names()
    plain = lambda h: not h.startswith(DROP) or h.startswith(KEEP_LAUNCH)  # noqa: E731
    for name in ("ncu_raw_metrics", "ncu_raw_two_launches", "ncu_raw_tensor_metrics_cublas_bf16"):
        trim_csv(h200 / f"{name}.csv", HERE / f"h200_{name[4:]}.csv", plain)
    trim_csv(h200 / "ncu_raw_set_full.csv", HERE / "h200_raw_set_full.csv",
             lambda h: h in names or h in FULL_EXTRA or h.split(".")[0] in {n.split(".")[0] for n in names})
    (HERE / "h200_details_name_base.csv").write_text((h200 / "ncu_details_name_base.csv").read_text())
    bases = {n.split(".")[0] for n in names}
    for chip in load_table().archs.values():
        trim_query(query / f"query_metrics_{chip}.txt", HERE / f"query_metrics_{chip}.txt", bases)
    lines = (query / "suffix_gh100.txt").read_text().splitlines()
    (HERE / "suffix_counter_gh100.txt").write_text("\n".join(
        lines[:4] + [line for line in lines[4:] if line.startswith("dram__cycles_active")]) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
