"""A stand-in for the `ncu` executable in CPU tests of experiments.ncu.profile (no GPU, no Nsight Compute).

It answers `--version`, and for a profiling command line it reads the launcher's plan instead of
running it: every launch gets a row whose values are those of the H200 `--set full` fixture
(h200_raw_set_full.csv, kernel naive_gemm), with gpu__time_duration.sum = 10 * M ns. Like ncu it
returns only the requested metric names it knows and drops the others without an error. The
"report" it exports is JSON, which `--import R --csv --page raw` prints in ncu's CSV format.
Behaviour, from the environment: FAKE_NCU_MODE = ok | perm (ERR_NVGPUCTRPERM) | nokernels;
FAKE_NCU_FAULT = ENTRY:M (that launch kills the program under replay); FAKE_NCU_LOADFAIL = ENTRY
(the launcher cannot load it); FAKE_NCU_LOG = file that gets one JSON line of argv per call.
"""
import csv
import io
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

INFO = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
        "Grid Size", "Device", "CC"]
EXTRA = {  # mapped sm_90 names that the fixture's run did not request
    "dram__bytes.sum": ("byte", "8,396,800"),
    "sm__pipe_tensor_type_hmma_hgmma_qgmma_imma_igmma_bmma_bgmma_cycles_active.avg.pct_of_peak_sustained_active":
        ("%", "87.25"),
    "sm__pipe_tensor_op_hmma_type_hmma_hgmma_qgmma_cycles_active.avg.pct_of_peak_sustained_active": ("%", "0"),
    "l1tex__average_t_sectors_per_request_pipe_lsu_mem_global_op_ld.ratio": ("sector", "n/a"),
    "l1tex__average_t_sectors_per_request_pipe_lsu_mem_global_op_st.ratio": ("sector", "4"),
    "lts__throughput.avg.pct_of_peak_sustained_elapsed": ("%", "40.53"),
}


def known() -> dict:
    lines = (HERE / "h200_raw_set_full.csv").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID",'))
    header, units, row = list(csv.reader(io.StringIO("\n".join(lines[start:]))))[:3]
    return {**{h: (u, v) for h, u, v in zip(header, units, row, strict=True)}, **EXTRA}


def profile(argv: list) -> int:
    sys.path.insert(0, str(HERE.parents[2]))
    from experiments.ncu.launch import marker     # the launcher's own progress lines
    opt = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("-")}
    plan = json.loads(Path(argv[-1]).read_text())
    mode = os.environ.get("FAKE_NCU_MODE", "ok")
    print("==PROF== Connected to process 4242 (/usr/bin/python3)")
    if mode == "perm":
        print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
              "Performance Counters on the target device 0.")
        return 1
    if mode == "nokernels":
        print("==PROF== Disconnected from process 4242\n==WARNING== No kernels were profiled.")
        return 0
    loadfail = os.environ.get("FAKE_NCU_LOADFAIL")
    failed = {it["run_id"]: "PtxJitError: the driver could not load it" for it in plan["items"]
              if it["entry"] == loadfail}
    if failed:
        Path(plan["status"]).write_text(json.dumps({"failed": failed}))
        return 3
    values = known()
    wanted = [n for n in opt["--metrics"].split(",") if n in values]
    rows, code = [], 0
    for phase in ("warmup", "profile"):
        for i, it in enumerate(plan["items"]):
            print(marker("start", phase, i))
            if phase == "profile" and os.environ.get("FAKE_NCU_FAULT") == f"{it['entry']}:{it['m']}":
                print("==ERROR== An error was reported by the driver\n"
                      "==ERROR== The application returned an error code (1).")
                code = 1
                break
            print(marker("done", phase, i))
            if phase == "profile":
                v = {n: values[n] for n in wanted}
                v["gpu__time_duration.sum"] = ("ns", f"{10 * it['m']:,}")
                spec = it.get("spec", {"bn": max(it["n"], 1), "bm": max(it["m"], 1)})  # a family: its own grid
                bn, bm = int(spec["bn"]), int(spec["bm"])
                rows.append({"entry": it["entry"], "grid": f"({it['n'] // bn}, {it['m'] // bm}, 1)",
                             "values": v})
        if code:
            break
    if rows:
        Path(opt["--export"] + ".ncu-rep").write_text(json.dumps(rows))
    print("==PROF== Disconnected from process 4242")
    return code


def import_csv(path: str) -> int:
    rows = json.loads(Path(path).read_text())
    names = sorted({n for r in rows for n in r["values"]})
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
    w.writerow(INFO + names)
    w.writerow([""] * len(INFO) + [rows[0]["values"].get(n, ("", ""))[0] for n in names])
    for i, r in enumerate(rows):
        w.writerow([str(i), "4242", "python3", "127.0.0.1", r["entry"], "1", "7", "(256, 1, 1)", r["grid"],
                    "0", "9.0"] + [r["values"].get(n, ("", ""))[1] for n in names])
    print(buf.getvalue(), end="")
    return 0


def main(argv: list) -> int:
    if log := os.environ.get("FAKE_NCU_LOG"):
        with open(log, "a") as f:
            f.write(json.dumps(argv) + "\n")
    if "--version" in argv:
        print("NVIDIA (R) Nsight Compute Command Line Profiler\nCopyright (c) 2018-2025 NVIDIA Corporation\n"
              "Version 2025.3.1.0 (build 36398880) (public-release)")
        return 0
    if "--import" in argv:
        return import_csv(argv[argv.index("--import") + 1])
    return profile(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
