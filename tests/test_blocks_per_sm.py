"""launch.blocks_per_sm: the resident blocks per SM capped by dynamic shared memory added to the launch
(the kernel's instructions unchanged): the padding's arithmetic, the refusals, the params, run keys and
metrics a run gets; on a GPU (``gpu`` marker) the padded launch verified and the driver's occupancy
calculator agreeing with the logged blocks_per_sm."""
import pytest
from omegaconf import OmegaConf
from test_cli import EXPERIMENT, all_runs, run_cli, store_args

from experiments import families
from experiments.build.assemble import smem_padding, theoretical_occupancy
from experiments.config import Config, family_schema
from experiments.families.runner import launch_padding
from experiments.spec import SpecError

# (arch, threads, registers per thread, shared memory per block): limited by smem, registers, warps
KERNELS = [("sm_90", 128, 80, 24576), ("sm_90", 128, 96, 49152), ("sm_90", 256, 128, 49152),
           ("sm_80", 128, 64, 0), ("sm_86", 256, 40, 4096), ("sm_120", 64, 32, 1000)]


@pytest.mark.parametrize("arch, threads, regs, smem", KERNELS)
def test_the_padding_gives_exactly_the_cap_with_the_least_bytes(arch, threads, regs, smem):
    reach = theoretical_occupancy(arch, threads, regs, smem)[1]
    assert reach >= 2
    for blocks in range(1, reach + 1):
        pad = smem_padding(arch, threads, regs, smem, blocks)
        occupancy, got, _ = theoretical_occupancy(arch, threads, regs, smem + pad)
        assert got == blocks and occupancy == blocks * threads // 32 / {"sm_86": 48, "sm_120": 48}.get(arch, 64)
        if blocks == reach:
            assert pad == 0
        else:       # one allocation unit (128 bytes) less would leave room for another block
            assert pad > 0 and theoretical_occupancy(arch, threads, regs, smem + pad - 128)[1] > blocks


def test_a_cap_above_what_the_kernel_reaches_is_refused_with_the_maximum():
    with pytest.raises(SpecError) as err:
        smem_padding("sm_90", 128, 80, 24576, 7)
    assert str(err.value) == (
        "launch.blocks_per_sm=7 is not valid for this kernel on sm_90: without padding it reaches 6 resident "
        "blocks per SM (limited by registers: 128 threads, 80 registers per thread, 24576 bytes of shared "
        "memory per block); valid: 0 (as many as fit) or 1 ... 6")


def test_a_negative_cap_stops_the_sweep_before_anything_is_tracked(tmp_path, run_checks):
    rc, out = run_checks(tmp_path, "-m", "precision=int8,fp16", "launch.blocks_per_sm=-1", "backend=static",
                         *store_args(tmp_path))
    assert (rc, out.strip()) == (2, "launch.blocks_per_sm=-1 is not valid; it must be a whole number >= 0"), out
    assert all_runs(tmp_path) == ([], [])


@pytest.mark.parametrize("family, precision, why", [
    ("cublas", "int8", "cuBLAS chooses and launches its own kernels"),
    ("peak", "int8", "a peak kernel's grid is the blocks that are resident at once")])
def test_families_whose_launch_cannot_be_padded_refuse_it(family, precision, why):
    fam = families.get(family)
    with pytest.raises(SpecError, match=f"launch.blocks_per_sm=2 is not valid for family={family}: {why}.*; valid: 0$"):
        launch_padding(fam, fam.spec(precision, {}, "sm_90"), None, 2)
    assert [n for n in families.names() if families.get(n).pads_launch] == ["mma_sync", "wmma", "dp4a", "wgmma"]


def test_without_ptxas_resources_the_padding_cannot_be_computed():
    fam = families.get("dp4a")
    with pytest.raises(RuntimeError, match="needs the registers and static shared memory of .* missing: nvcc not found"):
        launch_padding(fam, fam.spec("int8", {}, "sm_90"), None, 2, "nvcc not found")


def test_capped_runs_log_the_cap_their_occupancy_and_a_run_key_of_their_own(tmp_path, module_cli):
    """int8, 64x64 tile, BK 32 on sm_90: 8 blocks per SM without padding (64 registers); 0 and 2 are runs
    (2 with the padding's occupancy, a run key of its own), 9 a skipped run naming the maximum; the
    params name the cap on every run."""
    args = ["precision=int8", "tile=64x64", "backend=static", *store_args(tmp_path)]
    rc, out = run_cli(tmp_path, "-m", *args, "launch.blocks_per_sm=0,2,9")
    assert rc == 0, out
    _, runs = all_runs(tmp_path)
    by_cap = {r.data.params["launch.blocks_per_sm"]: r for r in runs}
    assert sorted(by_cap) == ["0", "2", "9"]
    free, capped, skipped = by_cap["0"], by_cap["2"], by_cap["9"]
    assert free.data.metrics["blocks_per_sm"] == 8 and free.data.metrics["theoretical_occupancy_pct"] == 50.0
    assert "smem_padding_bytes" not in free.data.metrics
    assert capped.data.metrics["blocks_per_sm"] == 2 and capped.data.metrics["theoretical_occupancy_pct"] == 12.5
    # 228 KiB per SM: 3 blocks must not fit, so 609 units of 128 bytes, less the 1 KiB reservation
    assert capped.data.metrics["smem_padding_bytes"] == 609 * 128 - 1024 - capped.data.metrics["smem_dynamic_bytes"]
    assert capped.data.tags["kernel"] == free.data.tags["kernel"]           # the same instructions
    assert capped.data.tags["run_key"] != free.data.tags["run_key"]
    assert skipped.data.tags["outcome"] == "skipped" and skipped.info.status == "FINISHED"
    # a skipped run holds the config's params (its run key is made of them), not the kernel's spec.*
    assert {k for k in free.data.params if k.startswith("spec.")} >= {"spec.arch", "spec.mma"}
    assert not [k for k in skipped.data.params if k.startswith("spec.")], skipped.data.params
    # the reason names the kernel (with tile=auto the user did not choose it)
    assert (f"launch.blocks_per_sm=9 is not valid for {free.data.tags['kernel']} on sm_90: without padding it "
            "reaches 8 resident blocks per SM") in skipped.data.tags["skip_reason"]
    assert skipped.data.tags["skip_reason"].endswith("valid: 0 (as many as fit) or 1 ... 8")
    # runs of one kernel at two caps had one name and one row of the static table
    assert capped.info.run_name == free.info.run_name + " blocks_per_sm=2"
    rc, table, _ = module_cli("experiments.report", "--static", "--uri", f"sqlite:///{tmp_path}/mlflow.db", "--experiment", EXPERIMENT)
    rows = [line for line in table.splitlines() if line.startswith(f"| {free.data.tags['kernel']}")]
    assert rc == 0 and [r.split(" | ")[5] for r in rows] == ["50%", "12%"], table
    assert rows[1].startswith(f"| {free.data.tags['kernel']} (blocks_per_sm=2) |")


def test_a_single_run_with_a_cap_the_kernel_cannot_take_exits_2(tmp_path):
    """launch.blocks_per_sm=99 without -m printed "Invalid configuration" with exit 1, while the other
    configuration errors exit 2: a script read it as a crash."""
    rc, out = run_cli(tmp_path, "precision=int8", "tile=64x64", "launch.blocks_per_sm=99", "backend=static",
                      *store_args(tmp_path, False))
    assert rc == 2 and out.strip().splitlines()[-1].startswith("Invalid configuration: launch.blocks_per_sm=99"), out


def test_the_run_key_names_a_cap_only_when_one_is_set(tmp_path):
    """The kernel's identity (the run key's part) is the one it had before the setting existed unless a
    cap is set; the worker gets the padding then, and only then."""
    from experiments.runner.kernel import make_kernel
    make = lambda *dotlist: make_kernel(_config("mma_sync", "int8", {}, ["tile.block=[64,64]",  # noqa: E731
                                                                          "tile.warps=[2,2]", *dotlist]),
                                        tmp_path, None, False, {}, print)
    free, zero, capped = make(), make("launch.blocks_per_sm=0"), make("launch.blocks_per_sm=2")
    assert free.identity == zero.identity and "smem_pad" not in zero.call[1]
    assert capped.identity == (*free.identity, ("launch.blocks_per_sm", 2))
    assert capped.call[1]["smem_pad"] == capped.static["smem_padding_bytes"] > 0


def _config(family: str, precision: str, options: dict, dotlist: list):
    node = {"family": OmegaConf.merge(OmegaConf.structured(family_schema(family)), options)} if options else {}
    return OmegaConf.merge(OmegaConf.structured(Config), node, OmegaConf.from_dotlist([f"precision={precision}",
                                                                                        *dotlist]))


@pytest.mark.gpu
@pytest.mark.parametrize("family, precision, options, dotlist, cap", [
    ("mma_sync", "int8", {}, ["tile.block=[64,64]", "tile.warps=[2,2]"], 1),
    ("mma_sync", "int8", {}, ["tile.block=[64,64]", "tile.warps=[2,2]"], 3),
    ("mma_sync", "fp16", {}, ["tile.block=[128,128]", "tile.warps=[2,2]", "ktile=64"], 1),
    ("wmma", "int8", {"name": "wmma", "block": "64x64", "warps": "2x2"}, [], 2),
    ("dp4a", "int8", {"name": "dp4a", "block": "64x64"}, [], 2)])
def test_the_padded_launch_verifies_and_the_driver_agrees_on_the_blocks(tmp_path, family, precision, options,
                                                                         dotlist, cap):
    """The worker's path (experiments.runner.kernel.make_kernel, then worker.measure_family) with the cap: C
    verified (integers exactly), and cuOccupancyMaxActiveBlocksPerMultiprocessor with the launch's
    shared memory gives the blocks_per_sm the run logs."""
    import shutil

    from experiments.families import Build, gpu
    from experiments.runner.kernel import make_kernel
    from experiments.gpu.worker import measure_family
    if family in ("wmma", "dp4a") and shutil.which("nvcc") is None:
        pytest.skip("the padding of a CUDA C++ kernel needs its registers from nvcc -ptx and ptxas")
    cc = gpu.device_sm()
    kern = make_kernel(_config(family, precision, options, [*dotlist, f"launch.blocks_per_sm={cap}"]),
                       tmp_path, cc, True, {}, print)
    assert kern.static["blocks_per_sm"] == cap
    _, kwargs = kern.call
    n = 1024
    res = measure_family(**kwargs, m=n, n=n, k=n, timing=dict(warmup=1, batches=2, min_batch_ms=1.0),
                         rtol=1e-3, seed=3)
    assert res["verified"], res.get("verify_message")
    if precision == "int8":
        assert res["verify_mismatches"] == 0 and res["verify_max_error"] == 0.0
    fam = families.get(family)
    spec = fam.respec(precision, kwargs["arch"], kwargs["params"])
    build = Build(**{**kwargs["build"], "options": tuple(kwargs["build"]["options"])})
    loaded = gpu.compile_cuda(build) if build.kind == "cuda" else gpu.load_ptx(build, fam.dyn_smem(spec))
    smem = gpu.allow_smem(loaded, fam.dyn_smem(spec) + kwargs["smem_pad"])
    assert gpu.max_active_blocks(loaded, fam.threads(spec), smem) == cap
    assert gpu.max_active_blocks(loaded, fam.threads(spec), fam.dyn_smem(spec)) >= cap


def test_the_profiler_launches_a_capped_run_with_its_padding(tmp_path):
    """Nsight Compute's launcher rebuilds a run's launch: a capped run's plan item carries the shared
    memory its launch added (metric smem_padding_bytes), an uncapped run's none."""
    from types import SimpleNamespace as NS

    from experiments.ncu.launch import plan_item
    fam = families.get("dp4a")
    spec = fam.spec("int8", {"block": "64x64"}, "sm_90")
    params = {"family": "dp4a", "precision": "int8", "family.block": "64x64", "spec.arch": "sm_90",
              "problem.m": "1024", "problem.n": "1024", "problem.k": "1024", "verify.seed_used": "5"}
    for metrics, pad in (({"smem_padding_bytes": 38016.0}, 38016), ({}, 0)):
        run = NS(info=NS(run_id="r1"), data=NS(params=params, tags={"kernel": spec.entry}, metrics=metrics))
        item = plan_item(None, run, tmp_path)
        assert (item["entry"], item["m"], item["seed"], item["smem_pad"]) == (spec.entry, 1024, 5, pad)
