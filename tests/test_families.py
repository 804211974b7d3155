"""Kernel families (experiments.families) on the CPU: spaces, validation messages, entry names, work
counts, exact peak results, and every source of every space compiled for sm_80, sm_89 and sm_90.

Compilation covers the whole space, not a subset: the CUDA C++ kernels of one arch (wmma and dp4a,
22 per arch) are rendered with literals only and extern "C" names, so they are compiled as one
translation unit (``nvcc -arch=sm_XX -ptx``, then ``ptxas -v`` on the result), one nvcc per arch;
the mma.sync peak PTX (10-12 per arch) is assembled file by file, and so is every wgmma peak
(``instruction=wgmma``, sm_90a: one per precision and the loop structures the GPU test compares),
through experiments.build.assemble (the build fails on the C75xx infos: wgmma serialized, a wait or fence
injected), with its SASS. All calls run in a thread pool; the file takes about 10 s on 2 cores. Tests
that need nvcc or ptxas skip with the reason where they are absent.
"""
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from experiments import families
from experiments.build.assemble import parse_ptxas_report
from experiments.families.base import FamilySpec
from experiments.families.peak import (CLOCK_RECORD, INSTRUCTIONS, WGMMA_WORK, expected_accumulators,
                                       expected_fed, expected_wgmma, kernel_clock, mma_per_warp, operand_words,
                                       wgmma_smem_bytes)
from experiments.families.wgmma import TYPES as WGMMA_TYPES
from experiments.spec import SpecError

ARCHS = ("sm_80", "sm_89", "sm_90")
COUNTS = {"wmma": 20, "dp4a": 2}                   # per arch; mma.sync peak: 12, 10 without fp8 (sm_80:
NO_FP8_PEAK = ("sm_80", "sm_90")                    # no fp8 mma.sync; sm_90: emulated, folded into FADDs)
WGMMA_PEAKS = {"sm_90": 5}                          # instruction=wgmma: one per wgmma type, built for sm_90a
FED_PEAKS = {"sm_80": 4, "sm_89": 6, "sm_90": 3}    # feed=ldmatrix: one per native mma.sync type
CUBLAS = {"sm_80": 3, "sm_89": 4, "sm_90": 4}       # fp16, bf16, int8; fp8_e4m3 (cuBLASLt) from sm_89


def _spec(family, precision, arch="sm_90", **opts):
    return families.get(family).spec(precision, opts, arch)


# wgmma peak loop structures besides the default (2 warpgroups per block, 4 wgmma per commit group,
# wait_group 1), each value alone: assembled here; tests/test_families_gpu.py times a grid of them
WGMMA_STRUCTURES = [{"warpgroups": 1}, {"warpgroups": 3}, {"group": 1}, {"group": 8}, {"wait": 0},
                    {"wait": 2}]


def wgmma_variant(precision, **params):
    """The wgmma peak of ``precision`` with some resolved params replaced (loop structure, work)."""
    s = _spec("peak", precision, instruction="wgmma")
    return FamilySpec("peak", precision, s.arch, {**s.p, **params})


# ------------------------------------------------------------------ registry and spaces
def test_registry_names_and_unknown_family():
    assert families.names() == ("mma_sync", "wmma", "dp4a", "cublas", "peak", "wgmma")
    assert families.DEFAULT == "mma_sync"
    assert all(families.get(n).name == n for n in families.names())
    with pytest.raises(SpecError, match=r"family='mma' is not valid; valid: mma_sync, wmma, dp4a, cublas, peak, "
                                        r"wgmma"):
        families.get("mma")


@pytest.mark.parametrize("arch", ARCHS)
def test_space_sizes_and_unique_entries(arch):
    entries = []
    # wgmma: sm_90a only, tests/test_wgmma.py; the default family's space: tests/test_spec.py
    for name in (n for n in families.names() if n not in ("wgmma", families.DEFAULT)):
        specs = list(families.get(name).space(arch))
        wg = WGMMA_PEAKS.get(arch, 0) if name == "peak" else 0
        want = CUBLAS[arch] if name == "cublas" else COUNTS.get(
            name, (10 if arch in NO_FP8_PEAK else 12) + wg + FED_PEAKS[arch])
        assert len(specs) == want, name
        # a wgmma peak asked for sm_90 is built for sm_90a, as family=wgmma is
        assert all(s.family == name and s.arch == ("sm_90a" if s.p.get("instruction") == "wgmma" else arch)
                   for s in specs)
        assert sum(s.p.get("instruction") == "wgmma" for s in specs) == wg
        entries += [s.entry for s in specs]
    assert len(entries) == len(set(entries)) == 32 + CUBLAS[arch] + 2 * (arch not in NO_FP8_PEAK) \
        + WGMMA_PEAKS.get(arch, 0) + FED_PEAKS[arch]
    assert all(re.fullmatch(r"[A-Za-z_][0-9A-Za-z_]*", e) for e in entries)


@pytest.mark.parametrize("arch", ["sm_89", "sm_90"])
@pytest.mark.parametrize("name", ["wmma", "dp4a", "cublas", "peak"])
def test_every_spec_validates_again_from_its_own_values(name, arch):
    fam = families.get(name)
    for s in fam.space(arch):
        opts = {k: v for k, v in s.params if k in fam.axes}
        assert fam.spec(s.precision, opts, s.arch) == s


def test_space_contents():
    wmma = {(s.precision, s.p["acc"]) for s in families.get("wmma").space("sm_90")}
    assert wmma == {("fp16", "f32"), ("fp16", "f16"), ("bf16", "f32"), ("int8", "s32"), ("int4", "s32")}
    space = list(families.get("peak").space("sm_89"))
    fed = [(s.precision, s.p["mma"]) for s in space if s.p.get("feed")]
    assert fed == [("fp16", "m16n8k16"), ("bf16", "m16n8k16"), ("int8", "m16n8k32"), ("int4", "m16n8k64"),
                   ("fp8_e4m3", "m16n8k32"), ("fp8_e5m2", "m16n8k32")]
    peak = [(s.precision, s.p.get("mma", s.p.get("copy"))) for s in space if not s.p.get("feed")]
    assert peak == [("fp16", "m16n8k16"), ("fp16", "m16n8k8"), ("bf16", "m16n8k16"), ("bf16", "m16n8k8"),
                    ("int8", "m16n8k32"), ("int8", "m16n8k16"), ("int4", "m16n8k64"), ("int4", "m16n8k32"),
                    ("fp8_e4m3", "m16n8k32"), ("fp8_e5m2", "m16n8k32"), ("copy", "kernel"), ("copy", "memcpy")]
    wg = [(s.precision, s.p["mma"]) for s in families.get("peak").space("sm_90") if s.p.get("instruction")]
    assert wg == [("fp16", "m64n256k16"), ("bf16", "m64n256k16"), ("int8", "m64n256k32"),
                  ("fp8_e4m3", "m64n256k32"), ("fp8_e5m2", "m64n256k32")]


def test_defaults_resolve():
    s = _spec("wmma", "int8")
    assert s.p == {"acc": "s32", "bk": 64, "block": "128x128", "warps": "2x4"}
    assert s.entry == "wmma_int8_accs32_bk64_block128x128_warps2x4"
    assert _spec("wmma", "int4").p["bk"] == 128 and _spec("wmma", "fp16").p["bk"] == 32
    assert _spec("peak", "fp16").p == {"mma": "m16n8k16", "chains": 8, "iters": 16, "units": 2 ** 20}
    assert _spec("peak", "int4", "sm_89").p["iters"] == 16          # native s4: the native work size
    assert _spec("peak", "int4", "sm_90").p == {"mma": "m16n8k64", "chains": 8, "iters": 1, "units": 2 ** 18}
    assert _spec("peak", "copy").p == {"copy": "kernel", "bytes": 2 ** 30}
    # instruction=mma_sync (the default) adds nothing to the spec: entries and run keys stay as they were
    assert _spec("peak", "int8", instruction="mma_sync") == _spec("peak", "int8")
    assert _spec("peak", "int8").entry == "peak_int8_chains8_iters16_mmam16n8k32_units1048576"
    wg = _spec("peak", "fp16", instruction="wgmma")         # target.arch sm_90 resolves to sm_90a
    assert wg.arch == "sm_90a" and _spec("peak", "fp16", "auto", instruction="wgmma") == wg
    assert wg.p == {"instruction": "wgmma", "mma": "m64n256k16", "warpgroups": 2, "group": 4, "wait": 1,
                    "iters": 32, "units": 2 ** 16}
    assert wg.entry == "peak_fp16_group4_instructionwgmma_iters32_mmam64n256k16_units65536_wait1_warpgroups2"
    assert _spec("peak", "int8", instruction="wgmma", mma="m64n256k32").p["mma"] == "m64n256k32"
    peak = families.get("peak")
    assert peak.threads(wg) == 256 and peak.dyn_smem(wg) == wgmma_smem_bytes(wg) == 1024 + (128 + 256) * 128
    assert peak.dyn_smem(_spec("peak", "fp16")) == 0 and INSTRUCTIONS == ("mma_sync", "wgmma")
    # feed=registers (the default) adds nothing either; feed=ldmatrix: the largest K, its own work size
    assert _spec("peak", "int8", feed="registers") == _spec("peak", "int8")
    fed = _spec("peak", "int8", feed="ldmatrix")
    assert fed.p == {"mma": "m16n8k32", "feed": "ldmatrix", "iters": 32, "units": 2 ** 17}
    assert fed.entry == "peak_int8_feedldmatrix_iters32_mmam16n8k32_units131072"
    assert peak.threads(fed) == 256 and peak.dyn_smem(fed) == 0
    assert peak.flops(fed) == 2 ** 17 * 32 * 32 * 2 * 16 * 8 * 32
    assert _spec("cublas", "bf16").entry == "cublas_bf16"


def test_family_spec_entry_is_derived_and_flat():
    s = FamilySpec("wmma", "fp16", "sm_90", {"warps": "2x4", "acc": "f32"})
    assert s.params == (("acc", "f32"), ("warps", "2x4"))
    assert s.entry == "wmma_fp16_accf32_warps2x4"
    assert s.flat() == {"family": "wmma", "precision": "fp16", "arch": "sm_90",
                        "entry": "wmma_fp16_accf32_warps2x4", "acc": "f32", "warps": "2x4"}
    assert FamilySpec("wmma", "fp16", "sm_90", {"warps": "2x2", "acc": "f32"}).entry != s.entry


# ------------------------------------------------------------------ validation messages
@pytest.mark.parametrize("call, message", [
    (lambda: _spec("cublas", "int4"), "family=cublas: no cuBLAS GEMM for precision=int4; valid: fp16, bf16, int8, fp8_e4m3"),
    (lambda: _spec("wmma", "fp8_e4m3"), "no WMMA GEMM for precision=fp8_e4m3; valid: fp16, bf16, int8, int4"),
    (lambda: _spec("dp4a", "fp16"), "no DP4A GEMM for precision=fp16; valid: int8"),
    (lambda: _spec("wmma", "fp16", block="96x96"), "family=wmma block='96x96' is not valid; valid: 128x128, 64x64"),
    (lambda: _spec("wmma", "fp16", warps="4x4"), "warps='4x4' is not valid; valid: 2x4, 2x2"),
    (lambda: _spec("wmma", "int8", acc="f16"), "acc=f16 is not valid with precision=int8; valid: s32"),
    (lambda: _spec("wmma", "bf16", acc="f16"), "acc=f16 is not valid with precision=bf16; valid: f32"),
    (lambda: _spec("wmma", "fp16", tile="128x128"), "family=wmma has no option 'tile'; valid options: acc, block, warps"),
    (lambda: _spec("cublas", "fp16", block="64x64"), "family=cublas has no option 'block'; valid options: (none)"),
    (lambda: _spec("wmma", "fp16", arch="sm_75"), "target.arch='sm_75' is not valid for family=wmma; valid: sm_80"),
    (lambda: _spec("peak", "fp8_e4m3", arch="sm_80"), "mma.sync with fp8_e4m3 needs sm_89 or later, not sm_80"),
    (lambda: _spec("cublas", "fp8_e4m3", arch="sm_80"), "cuBLASLt's FP8 matmul needs sm_89 or later, not sm_80"),
    (lambda: _spec("peak", "fp16", mma="m16n8k64"), "mma=m16n8k64 is not valid with precision=fp16; valid: auto, m16n8k8, m16n8k16"),
    (lambda: _spec("peak", "copy", mma="m16n8k16"), "family=peak mma=m16n8k16 applies to the mma types only"),
    (lambda: _spec("peak", "int8", copy="memcpy"), "family=peak copy=memcpy applies to precision=copy only"),
    (lambda: _spec("peak", "fp8_e5m2", arch="sm_80"), "mma.sync with fp8_e5m2 needs sm_89 or later, not sm_80"),
    (lambda: _spec("peak", "fp16", mma="m64n256k16"), "mma=m64n256k16 is not valid with precision=fp16; "
                                                      "valid: auto, m16n8k8, m16n8k16"),
    (lambda: _spec("peak", "fp16", arch="sm_89", instruction="wgmma"),
     "family=peak precision=fp16 sm_89: instruction=wgmma needs target.arch=sm_90a, not sm_89: wgmma.mma_async "
     "exists only for the arch-specific target sm_90a (sm_89 and earlier have no warpgroup MMA, sm_100 and "
     "later replace it with tcgen05); target.arch auto and sm_90 resolve to sm_90a"),
    (lambda: _spec("peak", "int8", arch="sm_100", instruction="wgmma"), "instruction=wgmma needs "
                                                                        "target.arch=sm_90a, not sm_100"),
    (lambda: _spec("peak", "int4", instruction="wgmma"), "family=peak instruction=wgmma has no precision=int4; "
                                                         "valid: fp16, bf16, fp8_e4m3, fp8_e5m2, int8"),
    (lambda: _spec("peak", "copy", instruction="wgmma"), "instruction=wgmma has no precision=copy"),
    (lambda: _spec("peak", "fp16", instruction="wgmma", mma="m16n8k16"),
     "family=peak mma=m16n8k16 is not valid with instruction=wgmma precision=fp16; valid: auto, m64n256k16"),
    (lambda: _spec("peak", "int8", instruction="wgmma", mma="m64n256k16"), "valid: auto, m64n256k32"),
    (lambda: _spec("peak", "fp16", instruction="wgmma", copy="kernel"), "copy=kernel applies to precision=copy"),
    (lambda: _spec("peak", "fp16", instruction="tcgen05"), "instruction='tcgen05' is not valid; "
                                                           "valid: mma_sync, wgmma"),
    (lambda: _spec("peak", "fp16", mma="m16n8k8", feed="ldmatrix"),
     "family=peak precision=fp16 sm_90: feed=ldmatrix uses the shape of the largest K, as the mma_sync GEMMs do: "
     "mma=m16n8k16 (or auto), not m16n8k8"),
    (lambda: _spec("peak", "int4", feed="ldmatrix"), "sm_90 emulates s4 mma.sync with integer code"),
    (lambda: _spec("peak", "fp16", instruction="wgmma", feed="ldmatrix"),
     "family=peak feed=ldmatrix applies to the mma.sync loop only: instruction=wgmma reads shared memory "
     "itself; valid here: registers"),
    (lambda: _spec("peak", "copy", feed="ldmatrix"), "family=peak feed=ldmatrix applies to the mma.sync loop only: "
                                                     "precision=copy has no operands to feed; valid here: registers"),
    (lambda: _spec("peak", "fp8_e4m3", feed="ldmatrix"),
     "family=peak precision=fp8_e4m3 sm_90: sm_90 has no tensor-core instruction for mma.sync on fp8 (ptxas "
     "converts to f16 for HMMA): no ceiling to measure; the fp16 peak bounds these kernels"),
    (lambda: _spec("peak", "fp16", feed="lds"), "family=peak feed='lds' is not valid; valid: registers, ldmatrix"),
])
def test_validation_messages(call, message):
    with pytest.raises(SpecError) as err:
        call()
    assert message in str(err.value)


def test_wmma_int4_is_valid_on_sm_90():
    """nvcc 13.0 compiles the sub-byte WMMA API for sm_90 too (test_cuda_sources_compile), so int4 is
    not rejected there; prepare notes that ptxas emulates s4 on sm_90."""
    s = _spec("wmma", "int4", "sm_90")
    assert "experimental::precision::s4" in families.get("wmma").build(s).source
    assert s.p["acc"] == "s32"


@pytest.mark.parametrize("family, precision, opts, mnk, message", [
    ("wmma", "int4", {}, (512, 512, 96), "K=96 is not a multiple of BK=128"),
    ("wmma", "fp16", {}, (100, 512, 512), "M=100 is not a multiple of BM=128"),
    ("wmma", "fp16", {"block": "64x64"}, (64, 96, 32), "N=96 is not a multiple of BN=64"),
    ("dp4a", "int8", {"block": "64x64"}, (64, 64, 48), "K=48 is not a multiple of BK=32"),
    ("cublas", "int8", {}, (512, 512, 6), "needs K and N multiples of 4 (leading dimensions of A, B and C), got K=6, N=512"),
    ("cublas", "fp16", {}, (0, 8, 8), "problem 0x8x8 must have sizes in [1, 2**31)"),
])
def test_check_problem_rejects_with_numbers(family, precision, opts, mnk, message):
    fam = families.get(family)
    with pytest.raises(SpecError, match=re.escape(message)):
        fam.check_problem(fam.spec(precision, opts, "sm_90"), *mnk)


def test_check_problem_accepts_multiples():
    for fam, prec, mnk in (("wmma", "int4", (128, 128, 128)), ("wmma", "fp16", (256, 384, 96)),
                           ("dp4a", "int8", (128, 256, 32)), ("cublas", "fp16", (7, 9, 11)),
                           ("cublas", "int8", (7, 8, 12))):
        f = families.get(fam)
        assert f.check_problem(f.spec(prec, {}, "sm_90"), *mnk) is None


# ------------------------------------------------------------------ work counts and units
def test_flops_units_and_rates():
    wmma, peak, cublas = families.get("wmma"), families.get("peak"), families.get("cublas")
    assert wmma.flops(_spec("wmma", "fp16"), 512, 1024, 2048) == 2_147_483_648
    assert wmma.unit(_spec("wmma", "fp16")) == "TFLOP/s" and wmma.unit(_spec("wmma", "int4")) == "TOP/s"
    assert cublas.unit(_spec("cublas", "int8")) == "TOP/s"
    fp16 = _spec("peak", "fp16")
    assert peak.flops(fp16, 1, 2, 3) == peak.flops(fp16, 4096, 4096, 4096) == 2 ** 39   # 2^20 * 16 * 8 * 4096
    assert peak.flops(_spec("peak", "int4", "sm_90"), 0, 0, 0) == 2 ** 35           # 2^18 * 1 * 8 * 16384
    assert peak.flops(_spec("peak", "fp16", mma="m16n8k8"), 0, 0, 0) == 2 ** 38
    copy = _spec("peak", "copy")
    assert peak.flops(copy, 0, 0, 0) == 2 ** 31 and peak.unit(copy) == "GB/s"
    assert peak.unit(_spec("peak", "int8")) == "TOP/s" and peak.unit(fp16) == "TFLOP/s"
    assert peak.rate(fp16, 0, 0, 0, 1000.0) == pytest.approx(549.755813888, rel=1e-12)
    assert peak.rate(copy, 0, 0, 0, 500.0) == pytest.approx(4294.967296, rel=1e-12)
    assert wmma.rate(_spec("wmma", "fp16"), 4096, 4096, 4096, 1000.0) == pytest.approx(137.438953472, rel=1e-12)
    # wgmma: 2^16 units x 32 wgmma x 2 x 64 x 256 x K, the same work on every GPU: ~1.1 ms at the H200's
    # ~990 TFLOP/s fp16 (K = 16) and ~1980 fp8 / int8 (K = 32)
    wg16, wg8 = _spec("peak", "fp16", instruction="wgmma"), _spec("peak", "int8", instruction="wgmma")
    assert peak.flops(wg16, 8, 8, 8) == peak.flops(_spec("peak", "bf16", instruction="wgmma")) == 2 ** 40
    assert peak.flops(wg8) == peak.flops(_spec("peak", "fp8_e5m2", instruction="wgmma")) == 2 ** 41
    assert peak.unit(wg8) == "TOP/s" and peak.unit(_spec("peak", "fp8_e4m3", instruction="wgmma")) == "TFLOP/s"
    assert 2 ** 40 / 990e12 == pytest.approx(1.11e-3, rel=1e-2)
    assert peak.rate(wg16, 0, 0, 0, 1000.0) == pytest.approx(1099.511627776, rel=1e-12)


@pytest.mark.parametrize("precision, k, words", [
    ("fp16", 16, (0x3C003C00, 0x2C002C00, 1.0)),
    ("fp16", 8, (0x3C003C00, 0x30003000, 1.0)),
    ("bf16", 16, (0x3F803F80, 0x3D803D80, 1.0)),
    ("fp8_e4m3", 32, (0x38383838, 0x10101010, 1.0)),
    ("fp8_e5m2", 32, (0x3C3C3C3C, 0x28282828, 1.0)),
    ("int8", 32, (0x01010101, 0x01010101, 32.0)),
    ("int4", 64, (0x11111111, 0x11111111, 64.0)),
])
def test_peak_operand_words(precision, k, words):
    assert operand_words(precision, k) == words


def test_peak_operand_values_give_the_increment():
    """Decoded independently: K products of A and B elements sum to the stated increment."""
    for prec, k in (("fp16", 16), ("fp16", 8)):
        a, b, inc = operand_words(prec, k)
        av, bv = (float(np.array([w & 0xFFFF], np.uint16).view(np.float16)[0]) for w in (a, b))
        assert av * bv * k == inc == 1.0
    a, b, inc = operand_words("bf16", 16)
    av, bv = (float(np.array([(w & 0xFFFF) << 16], np.uint32).view(np.float32)[0]) for w in (a, b))
    assert av * bv * 16 == inc == 1.0
    a, b, inc = operand_words("fp8_e4m3", 32)      # e4m3: exponent bias 7, 3 mantissa bits
    e4m3 = lambda byte: 2.0 ** (((byte >> 3) & 0xF) - 7) * (1 + (byte & 7) / 8)  # noqa: E731
    assert e4m3(a & 0xFF) * e4m3(b & 0xFF) * 32 == inc == 1.0
    a, b, inc = operand_words("fp8_e5m2", 32)      # e5m2: exponent bias 15, 2 mantissa bits
    e5m2 = lambda byte: 2.0 ** (((byte >> 2) & 0x1F) - 15) * (1 + (byte & 3) / 4)  # noqa: E731
    assert e5m2(a & 0xFF) * e5m2(b & 0xFF) * 32 == inc == 1.0


def test_peak_expected_accumulators_exact():
    s = _spec("peak", "fp16")                       # 2^20 units of 16 iterations, +1.0 per mma
    out = expected_accumulators(s, warps=3)
    assert out.shape == (96, 32) and out.dtype == np.float32
    assert 2 ** 20 == 3 * 349_525 + 1               # warp 0 does one unit more
    assert out[0, 0] == 349_526 * 16 and out[31, 3] == 349_526 * 16
    assert out[32, 0] == out[95, 0] == 349_525 * 16
    assert out[0, 4] == 349_526 * 16 + 1 and out[40, 31] == 349_525 * 16 + 7   # chain c starts at c
    assert (out[::32, 0] // 16).sum() == 2 ** 20
    i8 = expected_accumulators(_spec("peak", "int8"), warps=5)
    assert i8.dtype == np.int32 and i8[0, 0] == (2 ** 20 // 5 + 1) * 16 * 32 and i8[32 * 4, 8] == 2 ** 20 // 5 * 512 + 2


def test_fed_peak_expected_accumulators_exact():
    """feed=ldmatrix: 2^17 units of 32 K steps over 1056 warps (132 SMs x 8): 124 units each, the first
    128 one more; tile i (4 registers) starts at i; every K step adds 1.0 (fp16) or 32 (int8) to each."""
    assert 2 ** 17 == 1056 * 124 + 128
    out = expected_fed(_spec("peak", "fp16", feed="ldmatrix"), 1056)
    assert out.shape == (1056 * 32, 128) and out.dtype == np.float32
    assert out[0, 0] == 125 * 32 and out[31, 127] == 125 * 32 + 31 and out[0, 4] == 125 * 32 + 1
    assert out[127 * 32, 8] == 125 * 32 + 2 and out[128 * 32, 8] == 124 * 32 + 2 and out[-1, 0] == 124 * 32
    assert (out[::32, 0] // 32).sum() == 2 ** 17
    i8 = expected_fed(_spec("peak", "int8", feed="ldmatrix"), 1056)
    assert i8.dtype == np.int32 and i8[0, 0] == 125 * 32 * 32 and i8[-1, 127] == 124 * 32 * 32 + 31


def test_wgmma_peak_expected_accumulators_exact():
    """2^16 units of 32 wgmma over 264 warpgroups (132 SMs x 2): 248 units each, the first 64 one more;
    register i starts at i; every wgmma adds 1.0 (floats) or 32 (int8); fp8 restarts every unit."""
    assert WGMMA_WORK == (32, 2 ** 16) and 2 ** 16 == 264 * 248 + 64
    s = _spec("peak", "fp16", instruction="wgmma")
    out = expected_wgmma(s, 264)
    assert out.shape == (264 * 128, 128) and out.dtype == np.float32
    assert out[0, 0] == 249 * 32 and out[127, 127] == 249 * 32 + 127          # warpgroup 0: one unit more
    assert out[63 * 128, 5] == 249 * 32 + 5 and out[64 * 128, 5] == 248 * 32 + 5
    assert out[-1, 0] == 248 * 32 and float(out.max()) == 249 * 32 + 127 < 2 ** 24       # exact in f32
    assert ((out[::128, 0] // 32).sum()) == 2 ** 16
    i8 = expected_wgmma(_spec("peak", "int8", instruction="wgmma"), 264)
    assert i8.dtype == np.int32 and i8[0, 0] == 249 * 32 * 32 and i8[-1, 9] == 248 * 32 * 32 + 9
    # fp8: one unit's sum (32 x 1.0) in every register of a warpgroup with work, the start value elsewhere
    f8 = wgmma_variant("fp8_e4m3", units=3)
    got = expected_wgmma(f8, 4)
    assert got.dtype == np.float32 and set(np.unique(got[:3 * 128])) == {32.0}
    assert (got[3 * 128:] == np.arange(128)).all()
    assert (expected_wgmma(wgmma_variant("bf16", units=3), 4)[3 * 128:] == np.arange(128)).all()
    # the operands each wgmma multiplies: K = 16 (32) elements of A = 1 and B = 1/K (1 for int8)
    for prec in WGMMA_TYPES:
        k = WGMMA_TYPES[prec].wgmma_k
        assert operand_words(prec, k)[2] == (float(k) if prec == "int8" else 1.0)


def test_mma_per_warp_sums_to_the_work():
    """The MMA instructions each warp issues add up to the launch's work (flops / flops of one MMA), in
    the kernels' own split: 2^20 units over 4224 warps (132 SMs x 4 blocks x 8): 248 each, the first
    1024 one more; wgmma: a warpgroup's count on its first warp."""
    peak = families.get("peak")
    for spec, warps, per_unit in ((_spec("peak", "fp16"), 4224, 16 * 8), (_spec("peak", "int8", feed="ldmatrix"), 1056, 32 * 32),
                                  (_spec("peak", "fp16", instruction="wgmma"), 264 * 4, 32)):
        got = mma_per_warp(spec, warps)
        k = int(spec.p["mma"].split("k")[1])
        one = 2 * 64 * 256 * k if spec.p.get("instruction") else 2 * 16 * 8 * k
        assert got.dtype == np.int64 and got.sum() * one == peak.flops(spec), spec.entry
        assert set(got[got > 0].tolist()) <= {got.max(), got.max() - per_unit}, spec.entry
    reg = mma_per_warp(_spec("peak", "fp16"), 4224)
    assert 2 ** 20 == 4224 * 248 + 1024 and (reg[1023], reg[1024]) == (249 * 128, 248 * 128)
    wg = mma_per_warp(_spec("peak", "fp16", instruction="wgmma"), 264 * 4)
    assert wg[:8].tolist() == [249 * 32, 0, 0, 0, 249 * 32, 0, 0, 0] and wg[-4] == 248 * 32


def _clock_record(warps):
    """A clock record as a kernel writes it: rows (clock_start, clock_end, ns_start, ns_end, smid)."""
    return np.array(warps, dtype=np.uint64)


def test_kernel_clock_is_exact_per_sm():
    """Two SMs with their own cycle counters (10**9 apart) and clocks: SM 7 runs 3 warps (600 MMAs in
    its 1000 cycles from the first start to the last end, 500 ns: 2000 MHz), SM 2 one warp (100 MMAs in
    400 cycles, 250 ns: 1600 MHz). Per SM-cycle: 700 / 1400; the clock: 1400 cycles / 750 ns."""
    assert CLOCK_RECORD == ("clock_start", "clock_end", "ns_start", "ns_end", "smid")
    t = 5 * 10 ** 17                                 # %globaltimer: ns since the epoch
    rec = _clock_record([(1000, 1900, t, t + 450, 7), (1100, 2000, t + 50, t + 500, 7), (1050, 1800, t, t + 400, 7),
                         (10 ** 9, 10 ** 9 + 400, t + 10, t + 260, 2)])
    got = kernel_clock(rec, np.array([200, 300, 100, 100]))
    assert got == {"mma_per_sm_cycle": 0.5, "mma_per_sm_cycle_min": 0.25, "mma_per_sm_cycle_max": 0.6,
                   "kernel_cycles": 1000, "kernel_sms": 2, "sm_clock_mhz_kernel": 1000 * 1400 / 750}
    # the figure of a launch whose clock halves: twice the cycles per ns, the same MMAs per cycle
    slow = rec.copy()
    slow[:, 2:4] = t + (rec[:, 2:4] - t) * 2
    assert kernel_clock(slow, np.array([200, 300, 100, 100]))["mma_per_sm_cycle"] == 0.5
    assert kernel_clock(slow, np.array([200, 300, 100, 100]))["sm_clock_mhz_kernel"] == 1000 * 1400 / 1500
    # a warp that did not write its record (the buffer is zeroed before the first launch)
    rec[2, 1] = 0
    with pytest.raises(ValueError, match=r"1 of 4 warps have no clock record \(first: warp 2, \{'clock_start': 1050, "
                                         r"'clock_end': 0, .*the launch did not finish or its kernel does not record"):
        kernel_clock(rec, np.array([200, 300, 100, 100]))
    with pytest.raises(ValueError, match=r"clock record of shape \(4, 5\) for 3 warps; expected \(3, 5\): clock_start"):
        kernel_clock(rec, np.array([1, 2, 3]))


def _assert_records_clocks(src):
    """The peak kernel's PTX reads %clock64 and %globaltimer at its start and after its last store, and
    lane 0 of each warp stores them and %smid at clocks + 40 x the grid's warp."""
    assert ".param .u64 clocks\n)" in src
    body = src[src.index("{", src.index(".entry")):]
    reads = [m.start() for m in re.finditer(r"mov\.u64 +%clk_d0, %clock64;", body)]
    assert len(reads) == 2 and body.count("%globaltimer;") == 2 and body.count("%smid;") == 1
    assert reads[0] < body.index("ld.param.u32") and reads[1] > body.rindex("st.global.v4")
    assert body.count("mad.wide.u32    %clk_d2, %clk_w0, 40, %clk_d2;") == 2
    stores = re.findall(r"@%clk_p st\.global\.u64 \[%clk_d2(?:\+(\d+))?\], %clk_d(\d)", body)
    assert [(int(off or 0), int(reg)) for off, reg in stores] == [(0, 0), (16, 1), (32, 3), (8, 0), (24, 1)]


def test_describe_lists_axes_and_rules():
    text = families.get("wmma").describe()
    assert "block      128x128, 64x64" in text and "rule acc:" in text


# ------------------------------------------------------------------ compilation
def _run(cmd, cwd):
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)


def _compile_cuda(arch, tmp):
    fams = [families.get(n) for n in ("wmma", "dp4a")]
    specs = [(f, s) for f in fams for s in f.space(arch)]
    builds = [f.build(s) for f, s in specs]
    assert {b.kind for b in builds} == {"cuda"}
    (tmp / f"all_{arch}.cu").write_text("\n".join(b.source for b in builds))
    r = _run(["nvcc", f"-arch={arch}", "-ptx", f"all_{arch}.cu", "-o", f"all_{arch}.ptx"], tmp)
    if r.returncode:
        return r, None, builds
    return r, _run(["ptxas", f"-arch={arch}", "-v", f"all_{arch}.ptx", "-o", f"all_{arch}.cubin"], tmp), builds


def test_cuda_sources_compile(tmp_path, need_ptxas):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not found (CUDA toolkit): the CUDA C++ families are compiled by NVRTC on the GPU only")
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda a: (a, *_compile_cuda(a, tmp_path)), ARCHS))
    for arch, nv, px, builds in results:
        assert nv.returncode == 0, f"nvcc {arch}:\n{nv.stderr[-3000:]}"
        assert px.returncode == 0, f"ptxas {arch}:\n{px.stderr[-3000:]}"
        ptx = (tmp_path / f"all_{arch}.ptx").read_text()
        for b in builds:
            assert f".entry {b.entry}(" in ptx
            rep = parse_ptxas_report(px.stderr, b.entry)
            assert rep["spill_stores"] == rep["spill_loads"] == 0, (arch, b.entry, rep)
            assert 0 < rep["registers"] <= 255
            if b.entry.startswith("wmma"):
                want = 2 * (int(re.search(r"block(\d+)x", b.entry).group(1)) * 2) * 64
                assert rep["static_smem"] == want, (b.entry, rep)      # 2 stages of (BM + BN) x 64 bytes
        assert ptx.count("wmma.mma.sync.aligned") > 0 and "dp4a.s32.s32" in ptx


def test_peak_ptx_assembles(tmp_path, need_ptxas):
    fam = families.get("peak")
    jobs = []
    for arch in ARCHS:
        for s in fam.space(arch):
            if s.p.get("instruction") == "wgmma":
                continue                    # sm_90a, with SASS: test_wgmma_peak_assembles
            b = fam.build(s)
            if b.kind == "none":
                assert s.p["copy"] == "memcpy"
                continue
            assert f".target {arch}" in b.source and f".entry {b.entry}(" in b.source
            if s.precision == "copy":
                assert "%clock64" not in b.source
            else:
                _assert_records_clocks(b.source)
            path = tmp_path / f"{b.entry}_{arch}.ptx"
            path.write_text(b.source)
            jobs.append((arch, b, path))
    assert len(jobs) == 9 + 11 + 9 + sum(FED_PEAKS.values())      # sm_80, sm_89, sm_90 (see NO_FP8_PEAK)

    def assemble(job):
        arch, b, path = job
        return job, _run([need_ptxas, f"-arch={arch}", "-v", str(path), "-o", str(path.with_suffix(".cubin"))],
                         tmp_path)
    with ThreadPoolExecutor(4) as pool:
        for (arch, b, _), r in pool.map(assemble, jobs):
            assert r.returncode == 0, f"{b.entry} {arch}:\n{r.stderr[-2000:]}"
            rep = parse_ptxas_report(r.stderr, b.entry)
            if "feedldmatrix" in b.entry:
                # one block of 8 warps per SM, 4 KB of shared memory each; 128 accumulators and two sets of
                # 24 fragment registers per thread, as the GEMM's 64 x 64 warp tile
                assert rep["spill_stores"] == 0 and rep["static_smem"] == 8 * 4096
                assert 192 <= rep["registers"] <= 255, (b.entry, arch, rep)
                assert len(re.findall(r"^ +mma\.sync\.aligned", b.source, re.M)) == 2 * 32
                assert len(re.findall(r"^ +ldmatrix\.sync\.aligned\.m8n8\.x4", b.source, re.M)) == 3 * 8
                continue
            assert rep["spill_stores"] == 0 and rep["static_smem"] == 0
            # 4 blocks of 256 threads per SM fit the 64 Ki registers: at most 64 per thread
            assert rep["registers"] <= 64, (b.entry, arch, rep)
            if "copy" not in b.entry:
                # one per chain and iteration of a trip: 8 chains, 16 iterations written out (1 emulated)
                unroll = 1 if "int4" in b.entry and arch >= "sm_90" else 16
                assert len(re.findall(r"^ +mma\.sync\.aligned", b.source, re.M)) == 8 * unroll


def test_wgmma_peak_assembles(tmp_path, need_ptxas):
    """Every wgmma peak (one per precision) and every structure of WGMMA_STRUCTURES (fp16) assembles for
    sm_90a without spills and without a C75xx info; its SASS holds the precision's warpgroup MMA once
    per wgmma of a unit and one warpgroup wait per commit group (ptxas kept the structure)."""
    from experiments.build.assemble import assemble, fatal_infos, sass_summary
    from experiments.families.runner import sass_subject
    fam = families.get("peak")
    specs = [s for s in fam.space("sm_90") if s.p.get("instruction") == "wgmma"]
    specs += [wgmma_variant("fp16", **v) for v in WGMMA_STRUCTURES]
    assert len({s.entry for s in specs}) == 5 + len(WGMMA_STRUCTURES)

    def one(s):
        return s, assemble(fam.build(s).source, s.entry, s.arch, threads=fam.threads(s), dyn_smem=fam.dyn_smem(s),
                           workdir=tmp_path, with_sass=True)
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(one, specs))
    for s, a in results:
        p, src = s.p, fam.build(s).source
        assert ".target sm_90a" in src and f".maxntid {128 * p['warpgroups']}, 1, 1" in src
        _assert_records_clocks(src)
        assert len(re.findall(rf"^ +wgmma\.mma_async\.sync\.aligned\.{p['mma']}\.", src, re.M)) == p["iters"] == 32
        assert src.count("wgmma.commit_group.sync.aligned;") == 32 // p["group"]
        assert src.count(f"wgmma.wait_group.sync.aligned {p['wait']};") == 32 // p["group"] + (p["wait"] == 0)
        # fp8 restarts the accumulators at the first wgmma of a unit (scale-d = false)
        assert len(re.findall(r"%db\d+, %pfalse", src)) == s.precision.startswith("fp8")
        assert "0x4000004000010000" in src                  # 128B swizzle, SBO 1024 B, LBO 1
        assert a.spill_stores == a.spill_loads == a.stack_frame == 0 and not fatal_infos(a.report), s.entry
        assert 0 < a.registers <= {1: 255, 2: 255, 3: 168}[p["warpgroups"]], (s.entry, a.registers)
        assert a.static_smem == 0 and fam.dyn_smem(s) == 1024 + (64 * p["warpgroups"] + 256) * 128
        if not a.sass:
            continue                                        # no cuobjdump / nvdisasm
        op = "IGMMA" if s.precision == "int8" else "QGMMA" if s.precision.startswith("fp8") else "HGMMA"
        assert a.sass_counts.get(op) == 32 and not a.sass_counts.get("HMMA"), (s.entry, a.sass_counts)
        waits = a.sass.count(f"WARPGROUP.DEPBAR.LE gsb0, 0x{p['wait']:x} ")
        assert waits == 32 // p["group"] + (p["wait"] == 0), (s.entry, waits)
        assert sass_summary(a, sass_subject(fam, s))[1]["mma_native"] == "true"
        _assert_sass_clocks_around(a.sass, op, s.entry)


def _assert_sass_clocks_around(sass, mma_op, entry):
    """In the SASS the cycle counter is read twice, before the first MMA (``mma_op``) and after the last
    accumulator store, so a warp's record spans all of its MMAs."""
    lines = [ln for ln in sass.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", ln)]
    at = lambda pattern: [i for i, ln in enumerate(lines) if re.search(pattern, ln)]  # noqa: E731
    clock, mma, stores = at(r"SR_CLOCKLO"), at(rf"\b{mma_op}\b"), at(r"STG\.E\.128")
    assert len(clock) == 2 and len(at(r"SR_GLOBALTIMERLO")) == 2 and mma and stores, (entry, clock, len(mma), len(stores))
    assert clock[0] < mma[0] and clock[1] > max(mma[-1], stores[-1]), (entry, clock, mma[0], mma[-1], stores[-1])


def test_peak_sass_reads_the_clock_around_the_loop(tmp_path, need_ptxas):
    """The register-only and the ldmatrix-fed mma.sync loops (fp16) on sm_80, sm_89 and sm_90: ptxas keeps
    the clock reads outside the loop, the first before the first HMMA, the last after the stores."""
    from experiments.build.assemble import assemble
    fam = families.get("peak")
    specs = [_spec("peak", "fp16", arch, **opts) for arch in ARCHS for opts in ({}, {"feed": "ldmatrix"})]

    def one(s):
        return s, assemble(fam.build(s).source, s.entry, s.arch, threads=fam.threads(s), dyn_smem=0,
                           workdir=tmp_path / s.arch, with_sass=True)
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(one, specs))
    if not results[0][1].sass:
        pytest.skip("no cuobjdump / nvdisasm: the SASS order is not checked")
    for s, a in results:
        _assert_sass_clocks_around(a.sass, "HMMA", f"{s.entry} {s.arch}")


def _column_major_gemm_ex(bufs, transa, transb, m, n, k, alpha, a, atype, lda, b, btype, ldb, beta, c,
                          ctype, ldc, compute, algo):
    """cublasGemmEx as the cuBLAS guide defines it (column-major, op = N or T), on NumPy buffers
    looked up by address."""
    def mat(ptr, rows, cols, ld):           # element (i, j) at flat[i + j * ld]
        return bufs[ptr][:ld * cols].reshape(cols, ld).T[:rows]
    op_a = mat(a, k, m, lda).T if transa == 1 else mat(a, m, k, lda)
    op_b = mat(b, n, k, ldb).T if transb == 1 else mat(b, k, n, ldb)
    out = bufs[alpha][0] * (op_a @ op_b)
    if bufs[beta][0] != 0:                  # beta = 0: C is not read (it may hold NaN)
        out = out + bufs[beta][0] * mat(c, m, n, ldc)
    bufs[c][:ldc * n].reshape(n, ldc).T[:m] = out


@pytest.mark.parametrize("precision", ["fp16", "bf16", "int8"])
def test_cublas_arguments_give_row_major_a_times_b_transposed(precision):
    from experiments.families.cublas import gemm_args
    m, n, k = 3, 5, 8
    rs = np.random.RandomState(0)
    a, b = rs.randint(-9, 9, (m, k)), rs.randint(-9, 9, (n, k))
    bufs = {1: a.ravel().astype(float), 2: b.ravel().astype(float), 3: np.full(m * n, np.nan),
            4: np.ones(1), 5: np.zeros(1)}
    args = gemm_args(precision, m, n, k, 1, 2, 3, 4, 5)
    _column_major_gemm_ex(bufs, *args)
    np.testing.assert_array_equal(bufs[3].reshape(m, n), a @ b.T)
    # cudaDataType_t of A/B and C, cublasComputeType_t (library_types.h, cublas_api.h)
    want = {"fp16": (2, 0, 68), "bf16": (14, 0, 68), "int8": (3, 10, 72)}[precision]
    assert (args[7], args[10], args[14], args[16]) == (want[0], want[0], want[1], want[2])
