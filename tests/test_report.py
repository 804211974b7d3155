"""experiments/reports/report.py: the results table groups runs by GPU and only reads the store."""
import pytest
from test_cli import empty_store_at

from experiments.reports.report import results_table
from experiments.store.track import Tracker


def test_results_table_groups_by_gpu(tmp_path):
    tr = Tracker(empty_store_at(tmp_path / "m.db"), "e")
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
    tr = Tracker(empty_store_at(tmp_path / "m.db"), "e")
    for _ in range(2):
        tr.end(tr.start("int8 bk64", {}, {"backend": "static"}))
    assert results_table(tr.uri, "e") == (f"No run in {tr.uri} was measured on a GPU yet: 2 static run(s) "
                                          f"(rendered and assembled only; python -m experiments.report --static "
                                          f"--uri {tr.uri} --experiment e tables their registers, spills, "
                                          "occupancy and SASS).\n")


def test_results_table_shows_the_sm_clock_of_runs_timed_with_it(tmp_path):
    tr = Tracker(empty_store_at(tmp_path / "m.db"), "e")
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


def test_skipped_runs_are_not_counted_as_static(tmp_path):
    """A static sweep with skipped combinations (their backend is static too) said "N static run(s)" for
    all of them."""
    tr = Tracker(empty_store_at(tmp_path / "m.db"), "e")
    for outcome in ("static", "static", "skipped"):
        tr.end(tr.start("wgmma fp16", {}, {"backend": "static", "outcome": outcome}))
    assert results_table(tr.uri, "e") == (f"No run in {tr.uri} was measured on a GPU yet: 2 static run(s) "
                                          f"(rendered and assembled only; python -m experiments.report --static "
                                          f"--uri {tr.uri} --experiment e tables their registers, spills, "
                                          "occupancy and SASS) and 1 skipped (combinations that do not exist, "
                                          "each with its reason).\n")


def _static_store(tmp_path):
    """A sweep of static runs: an mma_sync kernel, an emulated int4 one (run twice: the latest counts),
    a library call without PTX, a skipped combination; and another sweep's kernel."""
    tr = Tracker(empty_store_at(tmp_path / "m.db"), "e")
    sweeps = [tr.start(f"sweep {i}", {}, {"kind": "sweep", "sweep_key": f"k{i}"}) for i in range(2)]
    asm = {"registers": 186, "spill_stores_bytes": 0, "spill_loads_bytes": 0, "smem_static_bytes": 0,
           "smem_dynamic_bytes": 55296, "theoretical_occupancy": 0.125, "sass_IMMA": 32, "sass_LDSM": 24,
           "sass_LDGSTS": 12, "sass_BAR": 2, "sass_HMMA": 0, "sass_instructions": 406}
    runs = [("gemm_int8", {**asm}, {"mma_native": "true"}, 0),
            ("gemm_int4", {**asm, "registers": 250}, {"mma_native": "false"}, 0),
            ("gemm_int4", {**asm, "registers": 197, "spill_stores_bytes": 8, "spill_loads_bytes": 16,
                           "sass_CALL": 32, "sass_IMMA": 2},
             {"mma_native": "false", "mma_native_reason": "ptxas emulates .s4 with IMMA.16816.S8.S8"}, 0),
            ("cublas_int8", {}, {"ptxas": "not applicable"}, 0),
            ("gemm_fp16", {**asm}, {"mma_native": "true"}, 1)]
    for kernel, metrics, tags, sweep in runs:
        rid = tr.start(kernel, {}, {"backend": "static", "outcome": "static", "kernel": kernel, "arch": "sm_90",
                                    **tags}, sweeps[sweep])
        tr.log(rid, metrics)
        tr.end(rid)
    tr.end(tr.start("skipped", {}, {"backend": "static", "outcome": "skipped"}, sweeps[0]))
    for rid in sweeps:
        tr.end(rid)
    return tr, sweeps


def test_static_table_one_row_per_kernel(tmp_path):
    """Without a GPU the reports had nothing to show: the static runs get a table of their own."""
    from experiments.reports.report import static_table
    tr, sweeps = _static_store(tmp_path)
    assert static_table(tr.uri, "e", sweeps[0]).splitlines() == [
        f"Static runs (rendered and assembled, not run) in sweep {sweeps[0]} of {tr.uri}: 3 kernel(s), 1 skipped", "",
        "| kernel | arch | registers | spills st/ld B | shared memory B | occupancy | SASS mix | mma_native |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | --- |",
        "| cublas_int8 | sm_90 | - | - | - | - | - | - |",
        "| gemm_int4 | sm_90 | 197 | 8 / 16 | 55296 | 12% | CALL 32, LDSM 24, LDGSTS 12, IMMA 2, BAR 2 of 406 | false |",
        "| gemm_int8 | sm_90 | 186 | 0 / 0 | 55296 | 12% | IMMA 32, LDSM 24, LDGSTS 12, BAR 2 of 406 | true |",
        "", "- gemm_int4: ptxas emulates .s4 with IMMA.16816.S8.S8", "", "Not assembled:", "- skipped (-): skipped: -"]
    every = static_table(tr.uri, "e")
    assert every.startswith(f"Static runs (rendered and assembled, not run) in {tr.uri}: 4 kernel(s)")
    assert "| gemm_fp16 | sm_90 | 186 |" in every
    assert static_table(tr.uri, "e", "latest") == static_table(tr.uri, "e", sweeps[1])


def test_static_report_command(tmp_path, capsys):
    from experiments.reports.report import main
    tr, sweeps = _static_store(tmp_path)
    out = tmp_path / "static.md"
    assert main(["--uri", tr.uri, "--experiment", "e", "--static", "--sweep", sweeps[0], "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| gemm_int8 | sm_90 | 186 |" in printed and out.read_text() == printed.removesuffix("\n")
    empty = Tracker(empty_store_at(tmp_path / "empty.db"), "e")
    empty.end(empty.start("gpu run", {}, {"backend": "gpu", "outcome": "verified"}))
    assert main(["--uri", empty.uri, "--experiment", "e", "--static"]) == 2
    assert capsys.readouterr().err == (f"No static run in {empty.uri}: a sweep without a GPU (or backend=static) "
                                       "makes them.\n")
    with pytest.raises(SystemExit) as err:
        main(["--uri", tr.uri, "--experiment", "e", "--static", "--by-family"])
    assert err.value.code == 2 and "--static tables the runs made without a GPU" in capsys.readouterr().err


def test_families_table_of_a_store_without_gpu_runs_says_so(tmp_path):
    """It printed a bare header (a new user's static sweep): now one line saying why there is nothing."""
    from experiments.reports.report import families_table
    tr = Tracker(empty_store_at(tmp_path / "m.db"), "e")
    for _ in range(3):
        tr.end(tr.start("wgmma fp16", {"family": "wgmma"}, {"backend": "static"}))
    assert families_table(tr.uri, "e") == (f"No run in {tr.uri} was measured on a GPU yet: 3 static run(s) "
                                           "(rendered and assembled only): nothing to compare.\n")


def test_nothing_measured_leaves_the_out_file_alone(tmp_path, capsys):
    """`python -m experiments.report --by-family --out results/h200/baselines.md` on a store of static
    runs replaced the committed table by one line; now it exits 2 and leaves the file."""
    from experiments.reports.report import main
    tr = Tracker(empty_store_at(tmp_path / "m.db"), "e")
    tr.end(tr.start("int8 bk64", {}, {"backend": "static"}))
    out = tmp_path / "baselines.md"
    out.write_text("measured before\n")
    for extra in (["--by-family"], []):
        assert main(["--uri", tr.uri, "--experiment", "e", "--out", str(out), *extra]) == 2
        assert "was measured on a GPU yet: 1 static run(s)" in capsys.readouterr().err
    assert out.read_text() == "measured before\n"


def _store(path, medians: dict, gpu: str, wall: float, busy: float, gpus: int):
    """A store with one sweep parent (its GPU-time metrics) and verified runs {(kernel, N): (us, spread)}."""
    tr = Tracker(empty_store_at(path), "e")
    parent = tr.start("sweep", {}, {"kind": "sweep", "sweep_key": "k"})
    tr.log(parent, {"sweep_wall_s": wall, "gpu_busy_s": busy, "gpus": gpus})
    tr.end(parent)
    for (kern, n), (us, spread) in medians.items():
        rid = tr.start(f"{n} {kern}", {"problem.m": n, "problem.n": n, "problem.k": n},
                       {"backend": "gpu", "outcome": "verified", "kernel": kern, "gpu_uuid": gpu}, parent)
        tr.log(rid, {"median_us": us, "spread": spread})
        tr.end(rid)
    return tr.uri


def test_against_compares_medians_within_the_first_spread(tmp_path):
    """One sweep on one GPU and on two (figures of the int8 study preset on a 2-GPU H200): per kernel and
    size the difference and whether it is within the first run's spread, then both sweeps' times."""
    from experiments.reports.report import against_table, main
    one = _store(tmp_path / "one.db", {("k32", 512): (5.71, 0.0021), ("k32", 8192): (7598.9, 0.001),
                                       ("wmma", 1024): (20.65, 0.0028)}, "GPU-aaaa1111", 19.4, 8.0, 1)
    two = _store(tmp_path / "two.db", {("k32", 512): (5.59, 0.003), ("k32", 8192): (7602.0, 0.002),
                                       ("other", 512): (1.0, 0.0)}, "GPU-bbbb2222", 14.0, 9.7, 2)
    lines = against_table(one, two, "e").splitlines()
    assert lines[3:7] == [
        "| kernel | M x N x K | first us | GPU | second us | GPU | difference | spread | within | verdict | reason |",
        "| --- | --- | ---: | --- | ---: | --- | ---: | ---: | --- | --- | --- |",
        "| k32 | 512x512x512 | 5.71 | aaaa1111 | 5.59 | bbbb2222 | -2.10% | 0.21% | no | ambiguous -2.1% | no replicates (timing.repeats): both runs have R = 1; -2.1% is not told from noise |",
        "| k32 | 8192x8192x8192 | 7598.90 | aaaa1111 | 7602.00 | bbbb2222 | +0.04% | 0.10% | yes | ambiguous +0.0% | no replicates (timing.repeats): both runs have R = 1; +0.0% is not told from noise |"]
    assert lines[-4:] == [
        "2 (kernel, size) pairs (1 only in the first store, 1 only in the second); 1 within the "
        "spread (on the same GPU: 0 of 0; on another GPU: 1 of 2); the largest difference -2.10% "
        "(k32 512x512x512); median |difference| 1.07%.",
        "Verdicts: 0 same, 0 faster, 0 slower, 2 ambiguous (2 without replicates: sweep with timing.repeats=5 to "
        "give each run its own). A verdict is of the second run against the first.",
        "First sweep: 19.4 s wall, GPU time 8.0 s on 1 GPU(s). Second sweep: 14.0 s wall, GPU time 9.7 s on "
        "2 GPU(s).",
        "Wall time ratio, second / first: 0.72."]
    out = tmp_path / "cmp.md"
    assert main(["--uri", one, "--against", two, "--experiment", "e", "--out", str(out)]) == 0
    assert out.read_text().splitlines() == lines


def test_repeats_give_the_single_gpu_spread_and_pairs_are_matched_on_their_gpu(tmp_path):
    """The first store holds the one-GPU sweep on each of two GPUs (a then b), and so does each repeat.
    The single-GPU spread is the largest |repeat - first| / first over (kernel, size, GPU): here 1.00 %
    (k32 512 on GPU a, 5.00 -> 4.95 us); each pair's spread is the larger of it and its batch spread.
    Each run of the second store is paired with the first store's run on its own GPU: on GPU b k32 512
    ran 5.30 us in the first store, so 5.31 there is +0.19 %, not +6.2 % against GPU a's 5.00."""
    from experiments.reports.report import against_table, main
    one = _store(tmp_path / "one.db", {("k32", 512): (5.00, 0.001), ("k32", 8192): (7600.0, 0.001),
                                       ("wmma", 1024): (20.0, 0.002)}, "GPU-aaaa1111", 20.0, 8.0, 1)
    _store(tmp_path / "one.db", {("k32", 512): (5.30, 0.001)}, "GPU-bbbb2222", 21.0, 8.0, 1)
    two = _store(tmp_path / "two.db", {("k32", 8192): (7660.0, 0.001), ("wmma", 1024): (20.03, 0.015)},
                 "GPU-aaaa1111", 10.0, 8.0, 2)
    _store(tmp_path / "two.db", {("k32", 512): (5.31, 0.001)}, "GPU-bbbb2222", 10.5, 8.0, 2)
    again = _store(tmp_path / "again.db", {("k32", 512): (4.95, 0.001), ("k32", 8192): (7601.0, 0.001)},
                   "GPU-aaaa1111", 20.0, 8.0, 1)
    again2 = _store(tmp_path / "again2.db", {("k32", 512): (5.32, 0.001)}, "GPU-bbbb2222", 20.0, 8.0, 1)
    lines = against_table(one, two, "e", (again, again2)).splitlines()
    assert lines[2] == ("Spread: the first run's batch spread, or where larger the single-GPU spread 1.00%: "
                        "the largest distance between a median of the first store and the same kernel, size "
                        f"and GPU in {again}, {again2} (3 pairs).")
    assert lines[6:9] == [
        "| k32 | 512x512x512 | 5.30 | bbbb2222 | 5.31 | bbbb2222 | +0.19% | 1.00% | yes | ambiguous +0.2% | no replicates (timing.repeats): both runs have R = 1; +0.2% is not told from noise |",
        "| k32 | 8192x8192x8192 | 7600.00 | aaaa1111 | 7660.00 | aaaa1111 | +0.79% | 1.00% | yes | ambiguous +0.8% | no replicates (timing.repeats): both runs have R = 1; +0.8% is not told from noise |",
        "| wmma | 1024x1024x1024 | 20.00 | aaaa1111 | 20.03 | aaaa1111 | +0.15% | 1.00% | yes | ambiguous +0.2% | no replicates (timing.repeats): both runs have R = 1; +0.2% is not told from noise |"]
    assert lines[-4].startswith(
        "3 (kernel, size) pairs (0 only in the first store, 0 only in the second); 3 within the spread (on the "
        "same GPU: 3 of 3; on another GPU: 0 of 0); the largest difference +0.79% (k32 8192x8192x8192); "
        "median |difference| 0.19%, the repeats' median distance from the first 0.38% (one-sided "
        "Mann-Whitney U, differences larger than those distances: p = ")
    assert main(["--uri", one, "--against", two, "--repeat", again, "--repeat", again2, "--experiment", "e"]) == 0
    # without repeats a pair's spread is its batch spread: k32 8192 (+0.79 % against 0.10 %) is outside
    lines = against_table(one, two, "e").splitlines()
    assert lines[6] == ("| k32 | 8192x8192x8192 | 7600.00 | aaaa1111 | 7660.00 | aaaa1111 | +0.79% | 0.10% | no"
                        " | ambiguous +0.8% | no replicates (timing.repeats): both runs have R = 1; +0.8% is not told from noise |")
    assert lines[-4].endswith("; median |difference| 0.19%.")


def test_medians_that_are_not_times_and_a_repeat_of_another_sweep_are_refused(tmp_path, capsys):
    """A median of 0 ended in ZeroDivisionError; one of 0 or -5 in a --repeat made the single-GPU spread
    100.5 % and every pair "within"; a --repeat sharing no (kernel, size, GPU) with the first store gave
    a spread of 0.00 % from 0 pairs; a first sweep of 0 s wall ended in ZeroDivisionError."""

    from experiments.reports.report import against_table, main
    one = _store(tmp_path / "one.db", {("k32", 512): (10.0, 0.002)}, "GPU-a", 20.0, 9.0, 1)
    two = _store(tmp_path / "two.db", {("k32", 512): (10.1, 0.002)}, "GPU-a", 11.0, 9.0, 2)
    for i, bad in enumerate((0.0, -5.0)):
        weird = _store(tmp_path / f"weird{i}.db", {("k32", 512): (bad, 0.0)}, "GPU-a", 20.0, 9.0, 1)
        for argv in (["--uri", weird, "--against", two], ["--uri", one, "--against", weird],
                     ["--uri", one, "--against", two, "--repeat", weird]):
            assert main([*argv, "--experiment", "e"]) == 2
            err = capsys.readouterr().err
            assert err.startswith("Store error: run ") and (
                f" in {weird} (k32 512x512x512) has median_us={bad}, which is not a time: it cannot be "
                "compared" in err), err
    other = _store(tmp_path / "other.db", {("k32", 512): (10.0, 0.002)}, "GPU-b", 20.0, 9.0, 1)
    assert main(["--uri", one, "--against", two, "--repeat", other, "--experiment", "e"]) == 2
    assert (f"--repeat {other} holds none of the runs of {one} (the same kernel, size and GPU): a repeat is the "
            "first sweep run again") in capsys.readouterr().err
    still = _store(tmp_path / "still.db", {("k32", 512): (10.0, 0.002)}, "GPU-a", 0.0, 0.0, 1)
    lines = against_table(still, two, "e").splitlines()
    assert lines[-1] == ("First sweep: 0.0 s wall, GPU time 0.0 s on 1 GPU(s). Second sweep: 11.0 s wall, GPU "
                         "time 9.0 s on 2 GPU(s).")


def test_a_copy_of_the_first_store_is_not_a_second_measurement(tmp_path, capsys):
    """A copy (or hard link) of the first store as --against or --repeat gave +0.00 % everywhere."""
    import os
    import shutil

    import pytest

    from experiments.reports.report import main
    one = _store(tmp_path / "one.db", {("k32", 512): (5.71, 0.0021)}, "GPU-a", 19.4, 8.0, 1)
    two = _store(tmp_path / "two.db", {("k32", 512): (5.75, 0.001)}, "GPU-a", 10.0, 8.0, 2)
    shutil.copy(tmp_path / "one.db", tmp_path / "copy.db")
    os.link(tmp_path / "one.db", tmp_path / "hard.db")
    for argv in (["--against", f"sqlite:///{tmp_path}/copy.db"],
                 ["--against", two, "--repeat", f"sqlite:///{tmp_path}/copy.db"]):
        assert main(["--uri", one, "--experiment", "e", *argv]) == 2
        assert (f"sqlite:///{tmp_path}/copy.db holds the same runs as {one} (a copy of that store?)"
                in capsys.readouterr().err)
    shutil.copy(tmp_path / "two.db", tmp_path / "two_copy.db")   # the repeat a copy of --against
    assert main(["--uri", one, "--experiment", "e", "--against", two, "--repeat",
                 f"sqlite:///{tmp_path}/two_copy.db"]) == 2
    assert f"sqlite:///{tmp_path}/two_copy.db holds the same runs as {two}" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--uri", one, "--experiment", "e", "--against", f"sqlite:///{tmp_path}/hard.db"])
    assert exc.value.code == 2 and "--against names the same store as --uri" in capsys.readouterr().err


def test_out_never_overwrites_a_store_or_names_a_folder(tmp_path, capsys):
    """`--out` naming a store (here the one being read) replaced the database by the Markdown table."""
    import pytest

    from experiments.reports.report import main
    one = _store(tmp_path / "one.db", {("k32", 512): (5.71, 0.0021)}, "GPU-a", 19.4, 8.0, 1)
    two = _store(tmp_path / "two.db", {("k32", 512): (5.75, 0.001)}, "GPU-a", 10.0, 8.0, 2)
    before = (tmp_path / "one.db").read_bytes()
    for out, text in ((tmp_path / "one.db", "is a database (an MLflow store?) and would be overwritten"),
                      (tmp_path, "is not a file name"), ("", "is not a file name"),
                      (f"{tmp_path}/fresh/", "is not a file name"),
                      # a store's side file: the store then read as "not an MLflow store"
                      (tmp_path / "one.db-journal", "is not a Markdown file name: give one that ends in .md"),
                      (tmp_path / "one.db.lock", "is not a Markdown file name")):
        with pytest.raises(SystemExit) as exc:
            main(["--uri", one, "--against", two, "--experiment", "e", "--out", str(out)])
        assert exc.value.code == 2 and text in capsys.readouterr().err
    assert (tmp_path / "one.db").read_bytes() == before
    (tmp_path / "notes.md").write_text("a file, not a folder\n")     # a folder that is a file
    assert main(["--uri", one, "--against", two, "--experiment", "e", "--out", f"{tmp_path}/notes.md/x.md"]) == 2
    assert (f"Could not write --out {tmp_path}/notes.md/x.md: {tmp_path}/notes.md is a file, not a folder"
            in capsys.readouterr().err)
    assert main(["--uri", one, "--against", two, "--experiment", "e", "--out", "/proc/nope/x.md"]) == 2
    assert "Could not write --out /proc/nope/x.md: " in capsys.readouterr().err     # nothing to write there
    assert not (tmp_path / "one.db-journal").exists()


def test_against_refuses_what_cannot_be_compared(tmp_path, capsys):
    """The same store twice, --by-family with --against, an empty --against, stores without a common
    (kernel, size); and a report never turns a file that is not a store into one."""
    import pytest

    from experiments.reports.report import main
    one = _store(tmp_path / "one.db", {("k32", 512): (5.71, 0.0021)}, "GPU-a", 19.4, 8.0, 1)
    two = _store(tmp_path / "two.db", {("k64", 512): (5.0, 0.001)}, "GPU-b", 14.0, 9.7, 2)
    three = _store(tmp_path / "three.db", {("k64", 512): (5.0, 0.001)}, "GPU-b", 14.0, 9.7, 2)
    for argv, text in ((["--against", one], "--against names the same store as --uri"),
                       (["--against", f"sqlite:///{tmp_path}/../{tmp_path.name}/one.db"],
                        "--against names the same store as --uri"),
                       (["--against", two, "--by-family"], "--against compares two stores run by run"),
                       (["--against", " "], "--against needs the URI of the other store"),
                       (["--repeat", two], "--repeat widens the spread of an --against comparison"),
                       (["--against", two, "--repeat", one], "--repeat needs a store of its own"),
                       (["--against", two, "--repeat", f"sqlite:///{tmp_path}/./two.db"],
                        "--repeat needs a store of its own"),
                       (["--against", two, "--repeat", ""], "--repeat needs a store of its own"),
                       (["--against", two, "--repeat", three, "--repeat", f"sqlite:///{tmp_path}/three.db"],
                        "--repeat needs a store of its own")):
        with pytest.raises(SystemExit) as exc:
            main(["--uri", one, "--experiment", "e", *argv])
        assert exc.value.code == 2 and text in capsys.readouterr().err
    assert main(["--uri", one, "--against", two, "--experiment", "e", "--out", str(tmp_path / "x.md")]) == 2
    assert (f"No run in {one} has a match in {two} (the same kernel at the same size, verified on a GPU): "
            "they hold 1 and 1 verified GPU run(s).") in capsys.readouterr().err
    assert not (tmp_path / "x.md").exists()
    for name, content, why in (("empty.db", b"", "is not an MLflow store"),
                               ("text.db", b"hello\n", "is not a SQLite database")):
        (tmp_path / name).write_bytes(content)
        assert main(["--uri", f"sqlite:///{tmp_path / name}"]) == 2 and why in capsys.readouterr().err
        assert (tmp_path / name).read_bytes() == content


def test_an_emulated_kernels_rows_say_so_and_old_occupancy_reads_as_percent(tmp_path):
    """int4 at 39 TOP/s beside int8 at 706: the emulated kernel's rows (tag mma_native=false) say EMULATED
    in the results table, the by-family table and the analysis table's label; a store logged before the
    % keeps its 0..1 occupancy, which the readers show in %."""
    from analysis.figures import labelled
    from analysis.runs import load_runs
    from experiments.reports.report import families_table, static_table
    tr = Tracker(empty_store_at(tmp_path / "m.db"), "e")
    for prec, us, native in (("int8", 1557.0, "true"), ("int4", 28120.0, "false")):
        rid = tr.start(f"8192 {prec}", {"problem.m": 8192, "problem.n": 8192, "problem.k": 8192, "precision": prec,
                                        "family": "mma_sync"},
                       {"backend": "gpu", "gpu": "NVIDIA H200", "kernel": f"gemm_{prec}", "throughput_unit": "TOP/s",
                        "mma_native": native, "outcome": "verified"})
        tr.log(rid, {"median_us": us, "throughput": round(2 * 8192 ** 3 / us / 1e6, 1), "spread": 0.02})
        tr.end(rid)
    static = tr.start("int8 old", {}, {"backend": "static", "kernel": "gemm_old", "arch": "sm_90", "outcome": "static"})
    tr.log(static, {"theoretical_occupancy": 0.125, "registers": 168})
    tr.end(static)
    rows = [line for line in results_table(tr.uri, "e").splitlines() if line.startswith("| NVIDIA H200")]
    assert [row.split(" | ")[1] for row in rows] == ["gemm_int4 EMULATED", "gemm_int8"]
    by_family = [line for line in families_table(tr.uri, "e").splitlines() if "| 8192x8192x8192 |" in line]
    assert [row.split(" | ")[3] for row in by_family] == ["gemm_int4 EMULATED", "gemm_int8"]
    assert "| 12% |" in static_table(tr.uri, "e")
    d = labelled(load_runs(tr.uri, "e"))
    assert sorted(d["label"]) == ["int4 EMULATED", "int8"]        # the tokens both share left out
