"""The methodology preset (conf/experiment/methodology.yaml) and its report
(``python -m experiments.performance --methodology``): regimes, operand data, clocks and energy."""
import dataclasses
from pathlib import Path

import pytest
import yaml
from test_family_runner import _compose

from experiments.config import Config
from experiments.reports.performance import main, methodology
from experiments.store.track import Tracker
from experiments.runner.variants import register as register_variants
from experiments.runner.variants import swept_params

ROOT = Path(__file__).resolve().parent.parent
PRESET = ROOT / "conf" / "experiment" / "methodology.yaml"
GPU = {"backend": "gpu", "gpu": "NVIDIA H200", "driver": "580.159.04", "outcome": "verified"}

# (family, precision, N, regime, data or None (a run of before the data key), throughput, window clock MHz or
# None (NVML's mean then), W, J per launch). cuBLAS bf16 at 8192 as measured on an H200: sustained 667.6
# TFLOP/s (results/h200/generations.md) at the 700 W cap and a power-capped clock; burst 783.4 TFLOP/s (the
# mean of ten products after three warm-ups: 769-798). The wgmma and mma.sync throughputs are the
# generations table's (sustained); their burst and data rows, every W and clock but the cap's, are made up.
ROWS = [("cublas", "bf16", 8192, "sustained", "full", 667.6, 1785.0, 699.6, 0.001153),
        ("cublas", "bf16", 8192, "burst", "full", 783.4, 1980.0, 611.0, 0.000859),
        ("cublas", "bf16", 8192, "sustained", "uniform", 681.0, 1822.0, 699.1, 0.001128),
        ("cublas", "bf16", 8192, "sustained", "normal", 669.0, 1790.0, 699.8, 0.001150),
        ("wgmma", "bf16", 8192, "sustained", "full", 660.5, 1788.0, 699.0, 0.001162),
        ("wgmma", "bf16", 8192, "burst", "full", 770.0, 1975.0, 620.0, 0.000884),
        ("mma_sync", "bf16", 8192, "sustained", None, 445.3, None, 690.0, 0.001702)]


def _store(tmp_path, rows=ROWS):
    tr = Tracker(f"sqlite:///{tmp_path}/m.db", "e")
    parent = tr.start("sweep experiment=methodology", {}, {"kind": "sweep", "sweep_key": "m"})
    for fam, prec, n, regime, data, thr, window, watts, joules in rows:
        params = {"family": fam, "precision": prec, "timing.regime": regime,
                  **({"data": data} if data else {}), **{f"problem.{d}": n for d in "mnk"}}
        rid = tr.start(f"{n} {fam} {prec} {regime} {data}", params,
                       {**GPU, "throughput_unit": "TFLOP/s", "kernel": f"{fam}_{prec}"}, parent)
        m = {"throughput": thr, "throughput_per_w": round(thr / watts, 3), "energy_j_per_launch": joules,
             "spread": 0.0015, "sm_clock_mhz_mean": 1790.0}
        m.update({"sm_clock_mhz_window": window, "power_w_avg": watts} if window else {"power_w_mean": watts})
        tr.log(rid, m)
        tr.end(rid)
    tr.end(parent)
    return tr


def test_methodology_report_tables(tmp_path, capsys):
    """Each kernel x regime x data row with its window clock, power and throughput per W (NVML's mean,
    marked ~, for a run without the window clock; data full for a run without the data param); cuBLAS
    bf16 burst beside sustained at 8192; the relative change the regime and each data value make."""
    tr = _store(tmp_path)
    lines = methodology(tr.uri, "e").splitlines()
    assert ("| kernel | precision | N | regime | data | throughput | SM clock (window) MHz | power W | "
            "throughput per W | energy per launch J | spread |") in lines
    assert "| cuBLAS | bf16 | 8192 | sustained | full | 667.6 TFLOP/s | 1785 | 700 | 0.954 | 0.0012 | 0.15% |" in lines
    assert "| cuBLAS | bf16 | 8192 | burst | full | 783.4 TFLOP/s | 1980 | 611 | 1.282 | 0.0009 | 0.15% |" in lines
    assert "| mma.sync | bf16 | 8192 | sustained | full | 445.3 TFLOP/s | ~1790 | ~690 | 0.645 | 0.0017 | 0.15% |" in lines
    rows = [ln for ln in lines if ln.startswith("| cuBLAS | bf16 | 8192 | ")]
    assert [r.split(" | ")[3:5] for r in rows[:4]] == [["sustained", "full"], ["sustained", "normal"],
                                                       ["sustained", "uniform"], ["burst", "full"]]
    assert ("- burst 783.4 TFLOP/s at 1980 MHz, 611 W; sustained 667.6 TFLOP/s at 1785 MHz, 700 W: burst / "
            "sustained +17.3%") in lines
    assert "| kernel | precision | N | burst vs sustained (full) | normal vs full (sustained) | " \
           "uniform vs full (sustained) | " in lines
    assert "| cuBLAS | bf16 | 8192 | +17.3% | +0.2% | +2.0% | " in lines
    assert "| wgmma | bf16 | 8192 | +16.6% | - | - | " in lines
    assert "| mma.sync | bf16 | 8192 | - | - | - | " in lines
    out = tmp_path / "methodology.md"
    assert main(["--methodology", "--uri", tr.uri, "--experiment", "e", "--out", str(out)]) == 0
    assert out.read_text().splitlines() == lines
    assert main(["--methodology", "--uri", tr.uri, "--experiment", "e", "--sweep", "nope"]) == 2
    with pytest.raises(SystemExit):
        main(["--methodology", "--generations", "--uri", tr.uri])
    assert "give one" in capsys.readouterr().err


def test_methodology_report_without_its_kernels_says_what_to_run(tmp_path, capsys):
    tr = _store(tmp_path, [])
    assert main(["--methodology", "--uri", tr.uri, "--experiment", "e"]) == 2
    assert "python run.py -m experiment=methodology" in capsys.readouterr().err


def test_methodology_preset_sweeps_kernels_regimes_and_sizes():
    """The preset's sweep: 4 precisions x 2 regimes x 3 kernels, each at 2048 and 8192 (48 runs, as its
    header says), the wgmma kernel with the fastest settings of experiment=generations."""
    preset = yaml.safe_load(PRESET.read_text())
    params = swept_params(preset)
    assert params == {"precision": "fp16,bf16,int8,fp8_e4m3", "timing.regime": "sustained,burst",
                      "variant": "meth_mma_sync,meth_wgmma_best,meth_cublas"}
    runs = 1
    for values in params.values():
        runs *= len(values.split(","))
    assert runs * len(preset["problem"]["sizes"]) == 48 and "48 runs" in PRESET.read_text()
    register_variants()                 # the variants conf/experiment/ lists
    cfg = _compose("experiment=methodology", "variant=meth_wgmma_best", "timing.regime=burst")
    assert cfg.family.name == "wgmma" and cfg.family.cluster == 2 and cfg.timing.regime.name == "burst"


def test_methodology_preset_takes_the_data_axis():
    """With the root key ``data`` the preset's documented command adds the operand data to its sweep."""
    if "data" not in {f.name for f in dataclasses.fields(Config)}:
        pytest.skip("the root key `data` (operand data) is not in the config yet: "
                    "`python run.py -m experiment=methodology data=full,uniform,normal` needs it")
    assert "data=full,uniform,normal" in PRESET.read_text()
    register_variants()
    for value in ("full", "uniform", "normal"):
        assert str(_compose("experiment=methodology", "variant=meth_cublas", f"data={value}").data) in (
            value, f"Data.{value}")


def test_performance_and_generations_reports_show_power_and_energy(tmp_path):
    """The check's and the generations' reports add the mean power, throughput per W and energy per
    launch of the runs they compare (the sustained runs above); without power readings, one line says so."""
    from experiments.reports.performance import check, generations
    tr = _store(tmp_path, [r for r in ROWS if r[3] == "sustained" and r[4] in ("full", None)])
    gen = generations(tr.uri, "e").splitlines()
    assert ("| precision | N | mma.sync W | mma.sync per W | mma.sync J per launch | wgmma W | wgmma per W | "
            "wgmma J per launch | cuBLAS W | cuBLAS per W | cuBLAS J per launch |") in gen
    assert "| bf16 | 8192 | 690 | 0.645 | 0.0017 | 699 | 0.945 | 0.0012 | 700 | 0.954 | 0.0012 |" in gen
    perf = check(tr.uri, "e").markdown.splitlines()
    assert "| bf16 | 8192 | 690 | 0.645 | 0.0017 | 700 | 0.954 | 0.0012 |" in perf
    bare = Tracker(f"sqlite:///{tmp_path}/b.db", "e")
    parent = bare.start("sweep", {}, {"kind": "sweep", "sweep_key": "b"})
    rid = bare.start("8192 mma_sync", {"family": "mma_sync", "precision": "bf16",
                                       **{f"problem.{d}": 8192 for d in "mnk"}}, dict(GPU), parent)
    bare.log(rid, {"throughput": 445.3})
    bare.end(rid)
    bare.end(parent)
    assert "No power readings on these runs (NVML reads them where the driver permits)." in \
        check(bare.uri, "e").markdown.splitlines()
