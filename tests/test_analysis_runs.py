"""analysis/runs.py: the tidy table read from an MLflow store (the fixture store of tests/data/analysis)."""
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from analysis.runs import COLUMNS, RunsError, config_axes, load_runs, ok_runs, short_labels, tidy_from_runs

sys.path.insert(0, str(Path(__file__).parent / "data" / "analysis"))
import fixture_store  # noqa: E402

INT8_64 = "gemm_int8_bk64_m16n8k32_ldx4x2_cg_bcol_s3_256x128_w4x2_g8"
BF16 = "gemm_bf16_bk32_m16n8k16_ldx4x2_cg_bcol_s3_256x128_w4x2_g8"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return fixture_store.shared_store(tmp_path_factory)


def test_declared_names_cover_the_ncu_step_and_tracking():
    keys = {c.key for c in COLUMNS}
    for key in ("ncu.duration_us", "ncu.achieved_occupancy_pct", "ncu.theoretical_occupancy_pct",
                "ncu.dram_cycles_active", "ncu.dram_active_pct", "ncu.dram_bytes", "ncu.l1_hit_rate_pct",
                "ncu.l2_hit_rate_pct", "ncu.tensor_pipe_active_pct", "ncu.sm_clock_hz", "ncu.ipc",
                "ncu.inst_executed", "median_us", "min_us", "max_us", "spread", "throughput", "registers",
                "theoretical_occupancy", "theoretical_occupancy_pct", "kernel", "gpu", "compute_capability",
                "backend", "verified",
                "throughput_unit", "problem.m", "problem.n", "problem.k", "study_kernel", "family"):
        assert key in keys, key
    assert len({(c.name, c.source) for c in COLUMNS}) == len(COLUMNS)     # one source per name and kind


def test_sweep_with_ncu_one_row_per_kernel_size_gpu(store):
    df = load_runs(store["uri"], sweep=store["ncu"])
    assert len(df) == 32 and df.attrs["duplicates_dropped"] == 1 and df.attrs["sweep"] == store["ncu"]
    assert df["status"].value_counts().to_dict() == {"FINISHED": 31, "FAILED": 1}      # a skipped run FINISHES
    assert df["outcome"].value_counts().to_dict() == {"verified": 30, "failed": 1, "skipped": 1}
    assert len(ok_runs(df)) == 30
    # the older FAILED run of bf16 at 512 lost to the FINISHED one
    bf = df[(df["kernel"] == BF16) & (df["size"] == "512")]
    assert len(bf) == 1 and bf.iloc[0]["status"] == "FINISHED" and bf.iloc[0]["median_us"] == 15.5
    row = df[(df["kernel"] == INT8_64) & (df["size"] == "8192")].iloc[0]
    assert (row["median_us"], row["throughput"], row["spread"]) == (1579.1, 696.3, 0.035)
    assert row["m"] == row["n"] == row["k"] == 8192 and row["flop"] == 2.0 * 8192 ** 3
    assert row["tile.block"] == (256, 128) and row["tile.warps"] == (4, 2)
    assert row["ktile"] == 64 and str(df["ktile"].dtype) == "Int64" and row["pipeline.stages"] == 3
    assert row["precision"] == "int8" and row["eviction.cache"] == "cg" and row["verified"] is True
    assert row["family"] == "mma_sync" and row["gpu"] == "NVIDIA H200" and row["compute_capability"] == "90"
    assert row["params.backend"] == "auto" and row["backend"] == "gpu"      # param and tag kept apart
    assert row["registers"] == 224 and row["dram_active_pct"] > 0
    assert df.loc[df["kernel"].str.startswith("gemm_int8_bk32", na=False), "study_kernel"].unique().tolist() \
        == ["int8_ptx_mma_k32"]
    failed = df[df["status"] == "FAILED"].iloc[0]
    assert failed["size"] == "16384" and failed["verified"] is False and failed["error"].startswith("verification")


def test_sweep_without_ncu_has_the_columns_all_missing(store):
    df = load_runs(store["uri"], sweep=store["plain"])
    assert len(df) == 30 and (df["status"] == "FINISHED").all()
    for col in ("achieved_occupancy_pct", "dram_active_pct", "dram_cycles_active", "inst_executed"):
        assert col in df and df[col].isna().all()


def test_latest_sweep_filter_and_every_experiment(store):
    assert load_runs(store["uri"], sweep="latest").attrs["sweep"] == store["one"]
    int8 = load_runs(store["uri"], sweep=store["ncu"], filter_string="params.precision = 'int8'")
    measured = ok_runs(int8)             # the skipped run asked for precision=int8 too, without a kernel
    assert sorted(measured["kernel"].str[:14].unique()) == ["gemm_int8_bk32", "gemm_int8_bk64"]
    assert len(measured) == 10 and len(int8) == 11 and int8["kernel"].isna().sum() == 1
    if store["reference"]:
        every = load_runs(store["uri"], experiment=None)
        ref = every[every["backend"] == "reference"]
        assert len(ref) == 110 and set(ref["gpu"]) == {"NVIDIA L4"} and set(ref["compute_capability"]) == {"89"}


def test_errors_name_what_exists(store, tmp_path):
    with pytest.raises(RunsError, match="experiment 'nope' is not in .*tensor-core-ablations"):
        load_runs(store["uri"], experiment="nope")
    with pytest.raises(RunsError, match="sweep='deadbeef' is not a run id"):
        load_runs(store["uri"], sweep="deadbeef")
    with pytest.raises(RunsError, match="no store at "):
        load_runs(f"sqlite:///{tmp_path}/none.db")


def test_tidy_maps_stall_metrics_and_infers_unknown_params():
    run = SimpleNamespace(info=SimpleNamespace(run_id="r1", status="FINISHED", start_time=1),
                          data=SimpleNamespace(tags={"kernel": "k", "backend": "gpu"},
                                               params={"problem.m": "64", "problem.n": "32", "problem.k": "16",
                                                       "study_kernel": "null",
                                                       "spec.mma_k": "16", "spec.arch": "sm_90"},
                                               metrics={"ncu.stall_long_scoreboard": 2.5, "median_us": 3.0,
                                                        "ncu.global_load_sectors_per_request": 4.0}))
    df = tidy_from_runs([run])
    assert df.loc[0, "stall_long_scoreboard"] == 2.5 and df.loc[0, "size"] == "64x32x16"
    assert df.loc[0, "ncu_global_load_sectors_per_request"] == 4.0
    assert df.loc[0, "spec.mma_k"] == 16 and df.loc[0, "spec.arch"] == "sm_90"
    assert df.loc[0, "family"] == "mma_sync" and pd.isna(df.loc[0, "dram_active_pct"])
    assert df.loc[0, "study_kernel"] is None                   # the config's null is no study name


def test_short_labels_and_config_axes(store):
    names = ["gemm_int8_bk32_m16n8k32_x_g8", "gemm_int4_bk64_m16n8k64_x_g8"]
    assert short_labels(names) == {names[0]: "int8_bk32_m16n8k32", names[1]: "int4_bk64_m16n8k64"}
    assert short_labels(["only_one"]) == {"only_one": "only_one"}
    df = ok_runs(load_runs(store["uri"], sweep=store["ncu"]))
    assert config_axes(df) == ["precision", "ktile", "mma"]
    assert config_axes(ok_runs(load_runs(store["uri"], sweep=store["one"]))) == []


def test_params_cast_back_to_schema_types():
    from typing import List, Optional

    from analysis.schema import cast, schema_types
    types = schema_types()
    assert types["ktile"] is int and types["tile.block"] == List[int] and types["verify.seed"] is int
    assert types["timing.cuda_graph"] is bool and types["verify.rtol"] is float
    assert cast("[256, 128]", List[int]) == (256, 128)
    assert cast("[[512, 256, 128], [64, 64, 64]]", List[List[int]]) == ((512, 256, 128), (64, 64, 64))
    assert cast("null", Optional[int]) is None and cast("True", bool) is True and cast("0.001", float) == 0.001
    assert cast("int8", types["precision"]) == "int8"                  # enums stay their value


def test_record_names_match_the_run_record_and_the_ncu_metric_table():
    """Every name COLUMNS reads is declared by the run record (experiments/store/record.py), the metric
    declarations (experiments/metrics.py) or the ncu metric table (conf/ncu/metrics.yaml): a rename
    there fails here, pointing at analysis/runs.py; a metric column's doc is its declared unit and meaning."""
    record = pytest.importorskip("experiments.store.record")
    from experiments import metrics
    import yaml
    table = Path(__file__).resolve().parents[1] / "conf" / "ncu" / "metrics.yaml"
    ncu = set(yaml.safe_load(table.read_text())["metrics"]) if table.is_file() else None
    builtin = {"run_id", "status", "start_time", "mlflow.parentRunId", "problem.m", "problem.n", "problem.k",
               "family", "implausible", "derived"}      # MLflow's own, the problem size, reference-only tags
    for c in COLUMNS:
        if c.key in builtin:
            continue
        if c.key.startswith("ncu."):
            if ncu is not None:
                assert c.key[len("ncu."):] in ncu, f"{c.key} is not in {table}"
        elif c.source == "metric":
            decl = metrics.lookup(c.key)
            assert decl is not None and decl.name == c.key, f"{c.key} is not declared in experiments/metrics.py"
        else:
            assert c.key in record.TAGS, f"{c.key} is not in experiments/store/record.py"
        if c.source == "metric":
            unit = metrics.lookup(c.key).unit
            assert c.doc == metrics.describe(c.key) and c.doc.startswith(unit + ": "), c


def test_every_metric_of_a_run_is_kept():
    """Metrics without a column of their own (relations, power, SASS counts, undeclared names) are
    columns under their own names; one named like a column or a config key is ``metrics.<name>``."""
    run = SimpleNamespace(info=SimpleNamespace(run_id="a", status="FINISHED", start_time=1), data=SimpleNamespace(
        tags={"kernel": "k"}, params={"ktile": "64"},
        metrics={"throughput": 500.0, "pct_of_peak": 61.25, "speedup_vs_cublas": 0.8123, "speedup_vs_wmma": 2.5,
                 "power_w_mean": 650.5, "throughput_per_w": 0.769, "sass_HMMA": 64.0, "ncu.stall_wait": 2.2,
                 "ncu.my_counter": 7.0, "not_declared_anywhere": 3.0, "kernel": 1.0, "ktile": 2.0}))
    row = tidy_from_runs([run]).iloc[0]
    assert (row["throughput"], row["pct_of_peak"], row["speedup_vs_cublas"], row["speedup_vs_wmma"]) == (
        500.0, 61.25, 0.8123, 2.5)
    assert (row["power_w_mean"], row["throughput_per_w"], row["sass_HMMA"]) == (650.5, 0.769, 64.0)
    assert (row["stall_wait"], row["ncu_my_counter"], row["not_declared_anywhere"]) == (2.2, 7.0, 3.0)
    assert (row["kernel"], row["metrics.kernel"], row["ktile"], row["metrics.ktile"]) == ("k", 1.0, 64, 2.0)


def test_outcome_from_tag_or_status():
    def run(rid, status, tags):
        return SimpleNamespace(info=SimpleNamespace(run_id=rid, status=status, start_time=1),
                               data=SimpleNamespace(tags=tags, params={}, metrics={}))
    df = tidy_from_runs([run("a", "KILLED", {"outcome": "interrupted"}), run("b", "KILLED", {}),
                         run("c", "FINISHED", {"backend": "static"}), run("d", "FAILED", {})])
    assert df["outcome"].tolist() == ["interrupted", "skipped", "static", "failed"]


def test_store_experiments_keep_artifacts_beside_the_database(store):
    """An experiment made without an artifact location sends its artifacts to ./mlruns of the working
    folder (MLflow's default): the test suite left an mlruns/ folder in the checkout."""
    import mlflow

    from experiments.store.track import sqlite_path
    client = mlflow.MlflowClient(store["uri"])
    beside = (sqlite_path(store["uri"]).parent / "artifacts").as_uri()
    made = [e for e in client.search_experiments() if e.name != "Default"]     # MLflow's own, never used
    assert made and {e.artifact_location for e in made} == {beside}
    if store["reference"]:                   # analysis.reference.load_into_mlflow made it
        assert "reference-l4-study" in {e.name for e in made}
