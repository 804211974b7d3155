"""Presets that list the points of their sweep (experiments.runner.variants): the jobs a preset's sweep
expands to, a listed variant's config against the file it stands for, the message for a bad entry,
and a listed sweep run again reusing every run."""
import re
import textwrap

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf, open_dict, read_write
from test_cli import ROOT, all_runs, run_cli, store_args

from experiments.config import register
from experiments.runner.sweep import sweep_variants
from experiments.runner.variants import VariantError, listed, variant_node
from experiments.runner.variants import register as register_variants

# the points of conf/experiment/generations.yaml (gen_<name>) and h200_performance.yaml (h200_perf_<name>),
# in the order their sweeps run them
GENERATIONS = ["mma_sync", "mma_sync_auto", "wgmma", "wgmma_auto", "cublas", "peak", "peak_wgmma", "wgmma_bn_128",
               "wgmma_bn_64", "wgmma_consumers_1", "wgmma_producer_false", "wgmma_stages_3", "wgmma_swizzle_64",
               "wgmma_persistent_true", "wgmma_cluster_2", "wgmma_cluster_4", "wgmma_stages_2", "wgmma_group_16",
               "wgmma_epilogue_tma", "wgmma_schedule_streamk", "wgmma_best", "wgmma_best_streamk"]
H200 = ["best", "best_bk128", "cublas", "peak", "peak_ldmatrix", "auto", "tile_256x128", "tile_128x256", "tile_128x128",
        "tile_128x128_w2x2", "tile_64x64", "tile_256x128_w4x4", "tile_128x256_w4x4", "tile_l4_32x64"]
PREDICTORS = ["best", "best_group_m_1", "best_group_m_32", "best_l2_hints", "best_l2_prefetch_256B", "64x64",
              "64x64_blocks_2", "64x64_blocks_1", "128x128_w2x2", "128x128_w2x2_blocks_1"]


def _compose(*overrides, hydra=False):
    register()
    register_variants()
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra)


def _jobs(preset: str) -> list:
    """The overrides of each job of ``python run.py -m experiment=PRESET``, in order: the preset's
    sweep as the sweep's start leaves it (sweep_variants), expanded by Hydra's basic sweeper."""
    cfg = _compose(f"experiment={preset}", hydra=True)
    variants = OmegaConf.select(cfg, "hydra.callbacks.tracking.variants")
    sweep_variants(cfg, variants and OmegaConf.to_container(variants))
    params = OmegaConf.to_container(cfg.hydra.sweeper.params)
    register()
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
        parsed = parser.parse_overrides([f"{k}={v}" for k, v in params.items()])
    return [list(job) for job in BasicSweeper.split_arguments(parsed, None)[0]]


@pytest.mark.parametrize("preset, precisions, points", [
    ("generations", ["fp16", "bf16", "int8", "fp8_e4m3"], [f"gen_{p}" for p in GENERATIONS]),
    ("h200_performance", ["fp16", "bf16", "int8"], [f"h200_perf_{p}" for p in H200]),
    ("predictors", ["fp16", "int8"], [f"pred_{p}" for p in PREDICTORS]),
])
def test_a_preset_sweeps_each_precision_times_its_listed_points(preset, precisions, points):
    """The jobs (and their numbers) the variant files of conf/variant/ gave these presets."""
    assert _jobs(preset) == [[f"precision={p}", f"variant={v}"] for p in precisions for v in points]


def test_every_predictors_point_is_a_kernel_and_the_sweep_is_60_runs(tmp_path, need_ptxas, monkeypatch):
    """experiment=predictors without a GPU (backend=static): every job composes and makes its kernel (no
    combination refused, every cap within what the kernel reaches by ptxas' resources), 60 runs on a GPU
    (each kernel at 2048, 4096 and 8192); the capped points keep their kernel's instructions and get the
    blocks per SM they ask for, the DRAM points keep the best kernel's main loop. ptxas assembles each
    source of the occupancy points once; the 128x256 kernels (one block per SM: 226-230 registers x 256
    threads) are not assembled, to keep the test short."""
    import experiments.runner.kernel
    from experiments.runner.kernel import make_kernel
    assembled, real = {}, experiments.runner.kernel.resources

    def resources(fam, spec, build, workdir):
        if (spec.bm, spec.bn) == (128, 256):
            return None, "not assembled in this test"
        if build.source not in assembled:
            assembled[build.source] = real(fam, spec, build, workdir)
        return assembled[build.source]
    monkeypatch.setattr(experiments.runner.kernel, "resources", resources)
    kernels, points = {}, {}
    register()
    register_variants()
    for precision, variant in _jobs("predictors"):      # one composition per point, each precision set on it
        if variant not in points:
            with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
                points[variant] = compose("config", overrides=["experiment=predictors", "backend=static", variant])
        cfg = points[variant].copy()
        cfg.precision = precision.split("=")[1]
        assert cfg.timing.repeats == 3
        kern = make_kernel(cfg, tmp_path, None, False, {}, print)
        kernels[(precision, variant)] = kern
        assert kern.shapes == [(n, n, n) for n in (2048, 4096, 8192)]
    assert sum(len(k.shapes) for k in kernels.values()) == 60
    for precision, most in (("fp16", 4), ("int8", 6)):
        get = lambda v, p=precision: kernels[(f"precision={p}", f"variant=pred_{v}")]  # noqa: E731
        assert [get(v).static["blocks_per_sm"] for v in ("64x64", "64x64_blocks_2", "64x64_blocks_1",
                                                         "128x128_w2x2", "128x128_w2x2_blocks_1")] == [most, 2, 1, 2, 1]
        assert get("64x64_blocks_1").sources == get("64x64").sources
        assert get("128x128_w2x2_blocks_1").sources == get("128x128_w2x2").sources
        for v in ("best_group_m_1", "best_group_m_32", "best_l2_hints", "best_l2_prefetch_256B"):
            assert get(v).entry != get("best").entry and _main_loop(get(v)) == _main_loop(get("best"))


def _main_loop(kern) -> str:
    """The PTX of a kernel's main loop without its L2 qualifiers (cache hints, prefetch size)."""
    src = next(iter(kern.sources.values()))
    return re.sub(r"\.L2::\w+|, %pol_[ab]", "", src[src.index("// ---- main loop"):src.index("// ---- epilogue")])


def test_the_study_presets_keep_their_named_kernels():
    assert _jobs("l4_run2_int8") == [[f"variant={v}"] for v in ("int8_wmma", "int8_dp4a", "int8_ptx_mma_k32",
                                                                "int8_ptx_mma_k16", "int8_ptx_manual_pack",
                                                                "int8_ptx_3stage")]
    # the named study kernels keep their files; every other point is listed by its preset
    files = {p.stem for p in (ROOT / "conf" / "variant").glob("*.yaml")}
    assert all(f.startswith(("fp16_", "int8_", "int4_")) for f in files) and len(files) == 23
    assert {n: p.name for n, (p, _) in listed().items()} == {
        **{f"gen_{p}": "generations.yaml" for p in GENERATIONS}, **{f"h200_perf_{p}": "h200_performance.yaml" for p in H200},
        **{f"meth_{p}": "methodology.yaml" for p in ("mma_sync", "wgmma_best", "cublas")},
        **{f"pred_{p}": "predictors.yaml" for p in PREDICTORS}}


# variants as a preset lists them, beside the file of conf/variant/ each stood for
AS_FILES = {
    "gen_wgmma_stages_2": ({"family": "wgmma", "family.stages": 2, "problem.sizes": [2048, 8192]},
                           "defaults:\n  - override /family: wgmma\nfamily:\n  stages: 2\nproblem:\n  sizes: [2048, 8192]\n"),
    "gen_wgmma_auto": ({"family": "wgmma", "tile": "auto", "problem.sizes": [512, 1024, 2048]},
                       "defaults:\n  - override /family: wgmma\n  - override /tile: auto\nproblem:\n  sizes: [512, 1024, 2048]\n"),
    "h200_perf_best_bk128": ({"problem.sizes": [8192], "ktile": 128}, "problem:\n  sizes: [8192]\nktile: 128\n"),
    "nested": ({"loader": {"a": "x2", "b": "manual"}, "b_layout": "row", "tile.block": [128, 64]},
               "loader: {a: x2, b: manual}\nb_layout: row\ntile:\n  block: [128, 64]\n"),
    "none": (None, ""),
}


@pytest.mark.parametrize("name", AS_FILES)
def test_a_listed_variant_composes_as_its_file(tmp_path, name):
    entry, text = AS_FILES[name]
    (tmp_path / "variant").mkdir()
    (tmp_path / "variant" / "as_file.yaml").write_text("# @package _global_\n" + text)
    register()
    register_variants({"listed": entry}, "test")
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        searchpath = f"hydra.searchpath=[file://{tmp_path}]"
        as_file = compose("config", overrides=[searchpath, "experiment=h200_performance", "variant=as_file"])
        as_listed = compose("config", overrides=[searchpath, "experiment=h200_performance", "variant=listed"])
    assert OmegaConf.to_container(as_listed) == OmegaConf.to_container(as_file)


VALID_KEYS = ("acc, b_layout, backend, cache, data, family, ktile, launch, loader, mma, pipeline, precision, problem, smem_layout, "
              "study_kernel, target, tile, timing, verify")


@pytest.mark.parametrize("entry, message", [
    ({"famly": "wgmma"}, f"unknown key 'famly'; valid: {VALID_KEYS}"),
    ({"family": "wgmma", "family.stage": 2}, "family=wgmma has no option 'stage' (family.stage); valid: family.bn, "
     "family.consumers, family.producer, family.stages, family.swizzle, family.persistent, family.order, "
     "family.group, family.epilogue, family.cluster, family.schedule"),
    ({"family.stages": 2}, "family=mma_sync has no option 'stages' (family.stages); valid: none (family=mma_sync is "
                           "set by the root keys)"),
    ({"family.name": "wgmma"}, "family.name: choose the family by its name (family: wgmma), then set its options "
                               "(family.KEY)"),
    ({"tile": "99x99"}, "tile: 99x99 is not a preset of conf/tile/; valid: 128x128, 128x128_w2x2, 128x256, "
                        "128x256_w4x4, 256x128, 256x128_w4x4, 64x64, auto, l4_32x64"),
    ({"tile": [128, 128]}, "tile: give a preset of conf/tile/ by its name, or its keys (tile.KEY: VALUE); valid: "
                           "tile.block, tile.warps, tile.group_m, tile.auto, tile.sms"),
    ({"pipeline": {"stage": 3}}, "pipeline has no key 'stage' (pipeline.stage); valid: pipeline.stages"),
    ({"ktile.x": 1}, "ktile takes a value, not keys (ktile.x); give ktile: VALUE"),
    ({"tracking.experiment": "x"}, "tracking.experiment: a sweep is tracked in one store and experiment, set once "
                                   "for all its jobs: give tracking.* on the command line instead"),
    ({"family": "wgmma", "family.stages": "abc"}, "family.stages: Value 'abc' of type 'str' could not be converted "
                                                  "to Integer"),
    ({"loader.a": "x9"}, "loader.a: Invalid value 'x9', expected one of [x1, x2, x4, manual]"),
    (["family=wgmma"], "['family=wgmma'] is not a mapping of overrides; give one, e.g. p: {family: wgmma, "
                       "problem.sizes: [2048, 8192]} ({} for none)"),
])
def test_a_bad_entry_names_its_preset_variant_key_and_the_valid_keys(entry, message):
    with pytest.raises(VariantError) as err:
        variant_node("p", entry, "experiment/x.yaml", typed=True)
    assert str(err.value) == f"experiment/x.yaml: variant p: {message}"


def _preset(tmp_path, variants: str, params: str = "precision: int8") -> list:
    """A preset ``tiny`` in a --config-dir of ``tmp_path`` that sweeps ``params`` times ``variants``
    (YAML lines); returns the command-line arguments that choose it."""
    (tmp_path / "extra" / "experiment").mkdir(parents=True, exist_ok=True)
    (tmp_path / "extra" / "experiment" / "tiny.yaml").write_text(
        "# @package _global_\nhydra:\n  sweeper:\n    params:\n      " + params + "\n  callbacks:\n    tracking:\n"
        "      variants:\n" + textwrap.indent(variants, " " * 8))
    return [f"--config-dir={tmp_path / 'extra'}", "experiment=tiny"]


def test_a_bad_entry_stops_the_command_before_hydra(tmp_path, run_checks):
    rc, out = run_checks(tmp_path, "-m", *_preset(tmp_path, "a: {famly: wgmma}\n"),
                         *store_args(tmp_path, new_store=True))
    assert rc == 2 and out.strip() == f"Invalid preset: experiment/tiny.yaml: variant a: unknown key 'famly'; valid: " \
                                      f"{VALID_KEYS}", out
    # one name, one option: a listed variant may not shadow a file of conf/variant/
    rc, out = run_checks(tmp_path, "-m", *_preset(tmp_path, "int8_wmma: {ktile: 64}\n"))
    assert rc == 2 and out.strip() == ("Invalid preset: experiment/tiny.yaml: variant int8_wmma is also "
                                       "variant/int8_wmma.yaml; give it another name"), out
    assert list(tmp_path.iterdir()) == [tmp_path / "extra"]


def test_a_value_of_the_wrong_type_stops_the_sweep_before_its_parent_run(tmp_path):
    rc, out = run_cli(tmp_path, "-m", *_preset(tmp_path, "a: {family: wgmma, family.stages: abc}\n"),
                      *store_args(tmp_path, new_store=True))
    assert rc == 2 and "Traceback" not in out, out
    assert ("Invalid preset: experiment=tiny: variant a: family.stages: Value 'abc' of type 'str' could not be "
            "converted to Integer") in out
    assert not (tmp_path / "mlflow.db").exists()


def test_a_preset_that_also_sweeps_variant_says_to_list_them_in_one_place():
    cfg = _compose("experiment=generations", hydra=True)
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.sweeper.params["variant"] = "gen_peak"
    with pytest.raises(SystemExit) as err:
        sweep_variants(cfg, {"gen_peak": {"family": "peak"}})
    assert str(err.value) == ("Invalid preset: experiment=generations both lists variants (gen_peak) and sweeps "
                              "variant=gen_peak in hydra.sweeper.params: list them in one place")


def test_a_listed_sweep_run_again_reuses_every_run(tmp_path):
    """Its jobs are the listed points; the same command again continues the same parent and measures
    nothing: the points' runs have the run keys they had."""
    args = ["-m", *_preset(tmp_path, "peak: {family: peak}\nfed: {family: peak, family.feed: ldmatrix}\n"),
            *store_args(tmp_path)]
    rc, out = run_cli(tmp_path, *args)
    assert rc == 0 and "Tracking 2 job(s)" in out, out
    parents, children = all_runs(tmp_path)
    assert [p.info.run_name for p in parents] == ["sweep precision=int8 variant=peak,fed experiment=tiny"]
    assert sorted((r.data.params["family.feed"], r.data.tags["outcome"]) for r in children) == [
        ("ldmatrix", "static"), ("registers", "static")]
    rc, again = run_cli(tmp_path, *args)
    assert rc == 0 and again.count("already tracked") == 2 and "Nothing new was tracked" in again, again
    parents_after, children_after = all_runs(tmp_path)
    assert [p.info.run_id for p in parents_after] == [p.info.run_id for p in parents]
    assert {r.info.run_id for r in children_after} == {r.info.run_id for r in children}


def test_a_config_stored_after_hydra_copied_its_repository_is_composed():
    """Hydra copies its config repository for every composition and every group it lists; the copy
    refers to the one ConfigStore (not a deep copy of it, which cost --help 1.3 CPU-s), so a variant
    stored after a copy was made is found through that copy."""
    import copy

    from hydra._internal.config_repository import CachingConfigRepository, ConfigRepository
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_store import ConfigStore
    register()
    assert copy.deepcopy(ConfigStore.instance()) is ConfigStore.instance()
    repo = CachingConfigRepository(ConfigRepository(create_config_search_path(str(ROOT / "conf"))))
    register_variants({"stored_after_the_copy": {"precision": "int8", "ktile": 64}}, where="a test")
    try:
        assert "stored_after_the_copy" in repo.get_group_options("variant")
        assert repo.load_config("variant/stored_after_the_copy").config.ktile == 64
    finally:                    # the store is this process's: later tests list the variants it holds
        del ConfigStore.instance().repo["variant"]["stored_after_the_copy.yaml"]
