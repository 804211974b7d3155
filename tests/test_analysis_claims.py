"""analysis/claims.py and analysis/reference.py: claims evaluated from data, published values checked.

Two kinds of real data: the study's own numbers (reference/paper_l4 in the shared folder beside the
repository; those tests skip without it) and the H200 runs of the fixture store."""
import sys
from pathlib import Path

import pytest

from analysis.claims import ClaimsError, evaluate, load_claims, validate
from analysis.reference import DEFAULT_CLAIMS, load_spec, read_study, study_records
from analysis.runs import load_runs

sys.path.insert(0, str(Path(__file__).parent / "data" / "analysis"))
import fixture_store  # noqa: E402

PAPER = Path(__file__).resolve().parents[2] / "shared" / "reference" / "paper_l4"
need_paper = pytest.mark.skipif(not PAPER.is_dir(), reason=f"the study's CSVs are not at {PAPER}")
H200_CLAIMS = Path(__file__).parent / "data" / "analysis" / "claims_h200.yaml"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return fixture_store.shared_store(tmp_path_factory)


@pytest.fixture(scope="module")
def study():
    return read_study(PAPER, load_spec())


@need_paper
def test_study_rows_units_and_derived_ablation(study):
    assert len(study) == 110                           # 17 kernels x 5 sizes + 5 ablation variants x 5
    row = study[(study["study_kernel"] == "int8_wmma") & (study["size"] == "8192")].iloc[0]
    assert row["median_us"] == 858300.0 and row["gpu"] == "NVIDIA L4" and row["compute_capability"] == "89"
    assert row["throughput"] == pytest.approx(2 * 8192 ** 3 / 0.8583 / 1e12)       # 1.281 TOP/s, Table I
    ms = study[(study["study_kernel"] == "fp16_wmma") & (study["size"] == "512")].iloc[0]
    assert ms["median_us"] == 680155.0 and ms["family"] == "wmma"
    trans = study[(study["study_kernel"] == "int4_ptx_mma_k64_x4_x2trans_ca") & (study["size"] == "8192")].iloc[0]
    assert trans["median_us"] == pytest.approx(167100 / 0.32) and "speedup 0.32" in trans["derived"]
    assert not (study["study_kernel"] == "int4_ptx_mma_k64_x4_x2nontrans_ca").any()    # an alias of k64


@need_paper
def test_fp16_durations_are_flagged_implausible(study):
    flagged = study.dropna(subset=["implausible"])
    assert set(flagged["precision"]) == {"fp16"} and len(flagged) == 30
    at512 = flagged[(flagged["study_kernel"] == "fp16_wmma") & (flagged["size"] == "512")].iloc[0]
    assert round(at512["throughput"], 5) == 0.00039                # about 0.0004 TFLOP/s at N=512
    assert "0.00039 TFLOP/s" in at512["implausible"] and "121 TFLOP/s" in at512["implausible"]


@need_paper
def test_claims_on_the_studys_own_numbers(study):
    t = evaluate(load_spec(), study, study).set_index("id")
    holds = ["C1", "C2a", "C2b", "C4", "C5", "C6a", "C6b", "C7a", "C7b", "C8a", "C8b", "C8c", "C11a", "C11b"]
    assert list(t.loc[holds, "verdict"].unique()) == ["holds"]
    assert list(t.loc[["C3", "C7c", "C9", "C10", "C3b"], "verdict"].unique()) == ["inconclusive"]
    assert t.loc["C2b", "this_gpu"] == "1.4 (N=512), 1.79 (N=8192)"      # 152/108.67 and 858.3/480.06
    assert t.loc["C5", "this_gpu"] == "0.729 (N=4096)"
    assert t.loc["C3", "reason"] == "no ncu.inst_executed for int8_ptx_mma_k32 or int8_wmma at N=512, 1024, 2048, 4096, 8192"
    assert "circular" in t.loc["C10", "reason"]
    # the published 34.4x: the study's own durations give 29.4x, and its FP16 baseline is implausible
    assert t.loc["C11a", "study_recomputed"] == "29.4 (N=8192)"
    assert "give int8_ptx_mma_k32 at N=8192: 29.4 outside [33.7, 35.1]" in t.loc["C11a", "published_flag"]
    assert "flagged implausible (fp16_wmma)" in t.loc["C11a", "published_flag"]
    assert "30 published duration(s) flagged implausible" in t.loc["C1", "published_flag"]
    assert t.loc["C2b", "published_flag"] == ""


@need_paper
def test_l4_claims_on_h200_runs_are_inconclusive_with_reasons(store, study):
    runs = load_runs(store["uri"], sweep=store["ncu"])
    t = evaluate(load_spec(), runs, study).set_index("id")
    assert set(t["verdict"]) == {"inconclusive"}
    assert t.loc["C2b", "reason"] == "no runs of int8_wmma on this GPU"
    assert t.loc["C7b", "reason"].startswith("where measured it holds, but no runs of int4_wmma, int4_ptx_manual_pack")
    assert t.loc["C7b", "this_gpu"] == "fastest at 3 of 3 sizes measured"     # k64 beats k32 at 2048-8192


def test_fixture_claims_reach_every_verdict(store):
    runs = load_runs(store["uri"], sweep=store["ncu"])
    t = evaluate(load_claims(H200_CLAIMS), runs).set_index("id")
    assert t["verdict"].to_dict() == {"H1": "holds", "H2": "fails", "H3": "inconclusive", "H4": "inconclusive",
                                      "H5": "holds", "H6": "fails", "H7": "inconclusive", "H8": "fails",
                                      "H9": "holds"}
    assert t.loc["H2", "reason"].startswith("at N=512 int4_k64 is faster (104.7 vs 111.3 us)")
    assert t.loc["H3", "reason"].startswith("within the measurement spread")
    assert "at N=16384 failed: verification failed: 12 of 268435456" in t.loc["H4", "reason"]
    assert t.loc["H4", "this_gpu"] == "1.04 (N=8192)"                      # 3391.0 / 3266.1
    assert t.loc["H5", "this_gpu"] == "1.1 (N=512), 1.25 (N=8192)"         # 10.8/9.8, 1971.5/1579.1
    assert t.loc["H6", "this_gpu"] == "1.1-1.25 (5 values)"
    assert t.loc["H7", "reason"] == "no runs of int8_wmma on this GPU"
    assert "circular" in t.loc["H8", "reason"] and "DRAM share ratio" in t.loc["H8", "reason"]
    assert t.loc["H9", "this_gpu"] == "true at 5 of 5 sizes measured"


def test_validation_names_claim_key_and_valid_values():
    base = {"claims": [{"id": "X", "claim": "c", "kind": "speedup", "kernel": "a", "baseline": "b", "published": 1}]}
    assert validate(base)["claims"][0]["tolerance"] == 0.0
    bad = {"claims": [{"id": "X", "claim": "c", "kind": "sped"}]}
    with pytest.raises(ClaimsError, match="claim X: kind='sped' is not valid; valid values: speedup, ratio"):
        validate(bad)
    with pytest.raises(ClaimsError, match="key 'baseline' is missing"):
        validate({"claims": [{"id": "X", "claim": "c", "kind": "speedup", "kernel": "a", "published": 1}]})
    with pytest.raises(ClaimsError, match="metric='dram' is not a column"):
        validate({"claims": [{"id": "X", "claim": "c", "kind": "ratio", "kernel": "a", "baseline": "b",
                              "published": 1, "metric": "dram"}]})
    with pytest.raises(ClaimsError, match=r"published=\[2, 1\] is not valid"):
        validate({"claims": [{"id": "X", "claim": "c", "kind": "speedup", "kernel": "a", "baseline": "b",
                              "published": [2, 1]}]})
    assert len(load_claims(DEFAULT_CLAIMS)["claims"]) == 18


def test_missing_csv_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="durations.csv does not exist"):
        study_records(tmp_path)


@need_paper
def test_reference_command_loads_once_and_prints_flags(store, capsys):
    import mlflow

    from analysis import reference
    reference.main(["--uri", store["uri"], "--dir", str(PAPER)])          # already loaded by the fixture
    out = capsys.readouterr().out
    assert f"(parent run {store['reference']})" in out
    assert out.count("flagged: fp16_") == 30 and "flagged: fp16_wmma N=512: the published duration implies" in out
    client = mlflow.MlflowClient(store["uri"])
    exp = client.get_experiment_by_name("reference-l4-study")
    assert len(client.search_runs([exp.experiment_id], max_results=1000)) == 111    # 110 + parent, no duplicates
