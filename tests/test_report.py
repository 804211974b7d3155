"""experiments/report.py: the results table groups runs by GPU and only reads the store."""
from experiments.report import results_table
from experiments.track import Tracker


def test_results_table_groups_by_gpu(tmp_path):
    tr = Tracker(f"sqlite:///{tmp_path}/m.db", "e")
    for gpu, us in (("NVIDIA L4", 9000.0), ("NVIDIA H200", 1605.0)):
        rid = tr.start("8192 int8", {"problem.m": 8192, "problem.n": 8192, "problem.k": 8192},
                       {"backend": "gpu", "gpu": gpu, "kernel": "gemm_int8_bk64", "throughput_unit": "TOP/s"})
        tr.log(rid, {"median_us": us, "throughput": 2 * 8192 ** 3 / us / 1e6, "spread": 0.028})
        tr.end(rid)
    lines = results_table(tr.uri, "e").splitlines()
    assert lines[0] == f"GPU: NVIDIA H200, NVIDIA L4; store: {tr.uri}"
    assert lines[4:] == ["| NVIDIA H200 | gemm_int8_bk64 | 8192x8192x8192 | 1605.0 | 685.1 TOP/s | 2.8% | verified |",
                         "| NVIDIA L4 | gemm_int8_bk64 | 8192x8192x8192 | 9000.0 | 122.2 TOP/s | 2.8% | verified |"]


def test_results_table_of_a_store_without_gpu_runs_says_so(tmp_path):
    tr = Tracker(f"sqlite:///{tmp_path}/m.db", "e")
    for _ in range(2):
        tr.end(tr.start("int8 bk64", {}, {"backend": "static"}))
    assert results_table(tr.uri, "e") == (f"No run in {tr.uri} was measured on a GPU yet: 2 static run(s) "
                                          "(rendered and assembled only; their registers, spills and occupancy "
                                          "are in the MLflow UI).\n")


def test_results_table_shows_the_sm_clock_of_runs_timed_with_it(tmp_path):
    tr = Tracker(f"sqlite:///{tmp_path}/m.db", "e")
    for clock in ({"sm_clock_mhz_mean": 1785.0, "throughput_at_max_clock": 364.0}, {}):
        rid = tr.start("8192 fp16", {"problem.m": 8192, "problem.n": 8192, "problem.k": 8192},
                       {"backend": "gpu", "gpu": "NVIDIA H200", "kernel": f"k{len(clock)}",
                        "throughput_unit": "TFLOP/s"})
        tr.log(rid, {"median_us": 3353.4, "throughput": 328.2, "spread": 0.018, **clock})
        tr.end(rid)
    lines = results_table(tr.uri, "e").splitlines()
    assert lines[2].endswith("| status | SM clock MHz | at max clock |")
    assert lines[4:] == ["| NVIDIA H200 | k0 | 8192x8192x8192 | 3353.4 | 328.2 TFLOP/s | 1.8% | verified | - | - |",
                         "| NVIDIA H200 | k2 | 8192x8192x8192 | 3353.4 | 328.2 TFLOP/s | 1.8% | verified | 1785 | 364.0 |"]


def test_families_table_of_a_store_without_gpu_runs_says_so(tmp_path):
    """It printed a bare header (a new user's static sweep): now one line saying why there is nothing."""
    from experiments.report import families_table
    tr = Tracker(f"sqlite:///{tmp_path}/m.db", "e")
    for _ in range(3):
        tr.end(tr.start("wgmma fp16", {"family": "wgmma"}, {"backend": "static"}))
    assert families_table(tr.uri, "e") == (f"No run in {tr.uri} was measured on a GPU yet: 3 static run(s) "
                                           "(rendered and assembled only): nothing to compare.\n")


def test_nothing_measured_leaves_the_out_file_alone(tmp_path, capsys):
    """`python -m experiments.report --by-family --out results/h200/baselines.md` on a store of static
    runs replaced the committed table by one line; now it exits 2 and leaves the file."""
    from experiments.report import main
    tr = Tracker(f"sqlite:///{tmp_path}/m.db", "e")
    tr.end(tr.start("int8 bk64", {}, {"backend": "static"}))
    out = tmp_path / "baselines.md"
    out.write_text("measured before\n")
    for extra in (["--by-family"], []):
        assert main(["--uri", tr.uri, "--experiment", "e", "--out", str(out), *extra]) == 2
        assert "was measured on a GPU yet: 1 static run(s)" in capsys.readouterr().err
    assert out.read_text() == "measured before\n"
