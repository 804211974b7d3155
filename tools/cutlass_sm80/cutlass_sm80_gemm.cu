/***************************************************************************************************
 * cutlass_sm80_gemm.cu -- standalone square-GEMM benchmark of CUTLASS's Ampere-style (SM80) kernels
 *
 * WHAT IT MEASURES
 *   Throughput of CUTLASS 2.x-API GEMMs (cutlass::gemm::device::Gemm, OpClassTensorOp, ArchTag
 *   Sm80, multistage mainloop: cp.async (LDGSTS) global->shared, ldmatrix (LDSM) shared->registers,
 *   mma.sync (HMMA.16816 / IMMA.16832)) for a square problem M = N = K, in the "TN" form:
 *     A : M x K, row-major    (K contiguous)
 *     B : K x N, column-major (i.e. stored N x K, K contiguous)
 *     D : M x N, row-major,   D = A * B   (alpha = 1, beta = 0, C is not read)
 *   Precisions:
 *     fp16 : cutlass::half_t     A/B, f32 accumulate, f32 D, mma 16x8x16
 *     bf16 : cutlass::bfloat16_t A/B, f32 accumulate, f32 D, mma 16x8x16
 *     int8 : int8_t              A/B, s32 accumulate, s32 D, mma 16x8x32 (exact epilogue)
 *   It is meant to be compiled for plain sm_90 (NOT sm_90a), so that on Hopper (H100/H200) it
 *   measures what the Ampere-generation instruction path (no TMA, no wgmma) can achieve.
 *
 *   Inputs are hash-generated on the device: fp16/bf16 uniform in [-1, 1], int8 uniform in [-8, 7].
 *   Every configuration is verified against a simple device reference GEMM (computed once per
 *   precision; f32 accumulation for fp16/bf16, int32 for int8): int8 must be bit-exact, fp16/bf16
 *   must have max |d - ref| / max(|ref|, 1) < 1e-3.  The output buffer is poisoned (NaN / 0xFFFFFFFF)
 *   before each configuration, so a kernel that writes nothing cannot pass.
 *
 *   Timing: 3 warm-up launches, then <reps> batches of 10 back-to-back launches, each batch between
 *   two cudaEvents; the median batch time / 10 is reported, and 2*N^3 / t as TFLOP/s (TOP/s for int8).
 *
 * USAGE
 *   cutlass_sm80_gemm [N] [reps] [only]   (defaults: N = 8192, reps = 20; N must be a multiple of 16;
 *                                          only: a label filter such as "fp16 128x256x32 s3")
 *
 * BUILD  (tools/cutlass_sm80/build.sh; needs only the CUTLASS headers, e.g. from the nvidia-cutlass 4.2.0 wheel,
 *         whose headers are in cutlass_library/source/include; about 1 minute on 2 cores)
 *   nvcc -O3 -std=c++17 -arch=sm_90 -cudart static --expt-relaxed-constexpr \
 *        -I<cutlass>/include -I<cutlass>/tools/util/include \
 *        -Xcompiler -static-libstdc++ -Xcompiler -static-libgcc \
 *        cutlass_sm80_gemm.cu -o cutlass_sm80_gemm
 *   The binary needs only the NVIDIA driver at run time (static cudart, no cuBLAS, no CUTLASS).
 *
 * CONFIGURATIONS (threadblock / warp / stages; instruction 16x8x16 for fp16/bf16, 16x8x32 for int8)
 *   fp16, bf16 : 128x256x32/64x64x32 s3,s4   128x256x64/64x64x64 s3,s4
 *                256x128x32/64x64x32 s3,s4   256x128x64/64x64x64 s3,s4
 *                128x128x32/64x64x32 s4,s5   128x128x64/64x64x64 s3,s4
 *   int8       : 128x256x64/64x64x64 s3,s4   128x256x128/64x64x128 s3,s4
 *                256x128x64/64x64x64 s3,s4   256x128x128/64x64x128 s3,s4
 *                128x128x128/64x64x128 s3,s4
 *   All use GemmIdentityThreadblockSwizzle<8>.  Shared memory ranges from 64 KiB to 192 KiB; the
 *   5-stage variants of the 128x256 / 256x128 tiles with 128-byte K slices (240 KiB) exceed the
 *   227 KiB per-block limit of sm_90 and are not built.  Every listed configuration compiles with
 *   CUTLASS 4.2.0 and nvcc 13.0.
 **************************************************************************************************/

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <cuda_runtime.h>

#include "cutlass/cutlass.h"
#include "cutlass/version.h"
#include "cutlass/numeric_types.h"
#include "cutlass/gemm/device/gemm.h"
#include "cutlass/epilogue/thread/linear_combination.h"

#define CUDA_CHECK(expr)                                                                        \
  do {                                                                                          \
    cudaError_t err__ = (expr);                                                                 \
    if (err__ != cudaSuccess) {                                                                 \
      std::printf("CUDA error %s (%d) at %s:%d: %s\n", cudaGetErrorName(err__), int(err__),     \
                  __FILE__, __LINE__, cudaGetErrorString(err__));                               \
      std::fflush(stdout);                                                                      \
      std::exit(2);                                                                             \
    }                                                                                           \
  } while (0)

// ------------------------------------------------------------------------------------------------
// Shared state handed to every configuration of one precision.
// ------------------------------------------------------------------------------------------------
struct Problem {
  int n = 8192;       // M = N = K
  int reps = 20;      // timed batches
  void *A = nullptr;  // M x K, row-major
  void *B = nullptr;  // N x K (= K x N column-major)
  void *D = nullptr;  // M x N, row-major, float or int32
  void *ref = nullptr;// reference result, same type as D
  const char *only = nullptr;  // run only configurations whose label contains this (e.g. "fp16 128x256x32 s3")
};

static const int kLaunchesPerBatch = 10;
static const int kWarmup = 3;
static const size_t kMaxSmemBytes = 227 * 1024;
static int g_ran = 0;    // configurations that passed the `only` filter
static int g_wrong = 0;  // configurations whose result failed verification (the exit status is then 1)

// ------------------------------------------------------------------------------------------------
// Device helpers: init, reference GEMM, comparison (templates; instantiated where used).
// ------------------------------------------------------------------------------------------------
__host__ __device__ inline uint32_t hash32(uint64_t x) {
  // splitmix64 finaliser, folded to 32 bits
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return uint32_t(x ^ (x >> 32));
}

template <typename T> __device__ inline T make_value(uint32_t h);
template <> __device__ inline cutlass::half_t make_value<cutlass::half_t>(uint32_t h) {
  return cutlass::half_t(float(h >> 8) * (2.0f / 16777216.0f) - 1.0f);   // uniform [-1, 1)
}
template <> __device__ inline cutlass::bfloat16_t make_value<cutlass::bfloat16_t>(uint32_t h) {
  return cutlass::bfloat16_t(float(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
}
template <> __device__ inline int8_t make_value<int8_t>(uint32_t h) {
  return int8_t(int(h >> 28) - 8);                                        // uniform [-8, 7]
}

template <typename T>
__global__ void init_kernel(T *p, size_t count, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count;
       i += size_t(gridDim.x) * blockDim.x) {
    p[i] = make_value<T>(hash32(seed * 0x100000001B3ull + i));
  }
}

template <typename T> __device__ inline float to_acc(T v, float) { return float(v); }
__device__ inline int32_t to_acc(int8_t v, int32_t) { return int32_t(v); }

// Reference D[m][n] = sum_k A[m*K + k] * B[n*K + k]: one thread per output, 32x32 shared-memory
// tiles so that it finishes in seconds at N = 8192; strictly sequential accumulation over k.
template <typename T, typename Acc>
__global__ void reference_gemm_tn(const T *A, const T *B, Acc *D, int M, int N, int K) {
  __shared__ Acc As[32][33];
  __shared__ Acc Bs[32][33];
  int tx = threadIdx.x, ty = threadIdx.y;
  int m = blockIdx.y * 32 + ty;
  int n = blockIdx.x * 32 + tx;
  int rowA = blockIdx.y * 32 + ty;  // row of A loaded by this thread
  int rowB = blockIdx.x * 32 + ty;  // row of B (= output column) loaded by this thread
  Acc acc = Acc(0);
  for (int k0 = 0; k0 < K; k0 += 32) {
    int k = k0 + tx;
    As[ty][tx] = (rowA < M && k < K) ? to_acc(A[size_t(rowA) * K + k], Acc()) : Acc(0);
    Bs[ty][tx] = (rowB < N && k < K) ? to_acc(B[size_t(rowB) * K + k], Acc()) : Acc(0);
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < 32; ++kk) acc += As[ty][kk] * Bs[tx][kk];
    __syncthreads();
  }
  if (m < M && n < N) D[size_t(m) * N + n] = acc;
}

// err[0]: max error (float bits for f32 = relative error; max |diff| for int32), err[1]: mismatches
__global__ void compare_f32(const float *d, const float *ref, size_t count, unsigned long long *err) {
  float local = 0.f;
  unsigned long long bad = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count;
       i += size_t(gridDim.x) * blockDim.x) {
    float r = ref[i], x = d[i];
    float e = fabsf(x - r) / fmaxf(fabsf(r), 1.0f);
    if (!(e == e)) e = INFINITY;  // NaN (e.g. unwritten output) counts as infinitely wrong
    if (e >= 1e-3f) ++bad;
    local = fmaxf(local, e);
  }
  atomicMax(&err[0], (unsigned long long)__float_as_uint(local));  // non-negative floats order as ints
  if (bad) atomicAdd(&err[1], bad);
}

__global__ void compare_s32(const int32_t *d, const int32_t *ref, size_t count, unsigned long long *err) {
  unsigned long long local = 0, bad = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count;
       i += size_t(gridDim.x) * blockDim.x) {
    long long diff = (long long)d[i] - (long long)ref[i];
    unsigned long long a = (unsigned long long)(diff < 0 ? -diff : diff);
    if (a) ++bad;
    local = a > local ? a : local;
  }
  atomicMax(&err[0], local);
  if (bad) atomicAdd(&err[1], bad);
}

// ------------------------------------------------------------------------------------------------
// Kernel definitions (CUTLASS 2.x device-level API)
// ------------------------------------------------------------------------------------------------
using RowMajor = cutlass::layout::RowMajor;
using ColumnMajor = cutlass::layout::ColumnMajor;
using Swizzle = cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<8>;

// fp16 / bf16: f32 accumulate, f32 output, 128-bit (8-element) aligned A/B accesses.
template <typename ElementAB, int TbM, int TbN, int TbK, int WM, int WN, int WK, int Stages>
using GemmF16Like = cutlass::gemm::device::Gemm<
    ElementAB, RowMajor,                          // A
    ElementAB, ColumnMajor,                       // B
    float, RowMajor,                              // C / D
    float,                                        // accumulator
    cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    cutlass::gemm::GemmShape<TbM, TbN, TbK>,
    cutlass::gemm::GemmShape<WM, WN, WK>,
    cutlass::gemm::GemmShape<16, 8, 16>,
    cutlass::epilogue::thread::LinearCombination<float, 128 / cutlass::sizeof_bits<float>::value,
                                                 float, float>,
    Swizzle, Stages,
    8, 8,                                         // alignment A, B (elements)
    false,                                        // no serial split-K
    cutlass::arch::OpMultiplyAdd>;

// int8: s32 accumulate, s32 output; LinearCombination computed in int32 (alpha = 1, beta = 0) is
// exact.  OpMultiplyAddSaturate is CUTLASS's standard int8 operator (mma ... .satfinite); with
// |a|,|b| <= 8 the accumulators can never saturate for any N up to 2^25.
template <int TbM, int TbN, int TbK, int WM, int WN, int WK, int Stages>
using GemmS8 = cutlass::gemm::device::Gemm<
    int8_t, RowMajor,
    int8_t, ColumnMajor,
    int32_t, RowMajor,
    int32_t,
    cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    cutlass::gemm::GemmShape<TbM, TbN, TbK>,
    cutlass::gemm::GemmShape<WM, WN, WK>,
    cutlass::gemm::GemmShape<16, 8, 32>,
    cutlass::epilogue::thread::LinearCombination<int32_t, 128 / cutlass::sizeof_bits<int32_t>::value,
                                                 int32_t, int32_t>,
    Swizzle, Stages,
    16, 16,
    false,
    cutlass::arch::OpMultiplyAddSaturate>;

// ------------------------------------------------------------------------------------------------
// Running one configuration
// ------------------------------------------------------------------------------------------------
template <typename T> struct OutputTraits;
template <> struct OutputTraits<float> {
  static void poison(void *p, size_t bytes) { CUDA_CHECK(cudaMemset(p, 0xFF, bytes)); }  // NaN
};
template <> struct OutputTraits<int32_t> {
  static void poison(void *p, size_t bytes) { CUDA_CHECK(cudaMemset(p, 0xFF, bytes)); }  // -1
};

static void print_row(const char *prec, const std::string &tb, const std::string &warp, int stages,
                      size_t smem, const char *us, const char *tflops, const char *err,
                      const std::string &status) {
  std::printf("| %s | %s | %s | %d | %zu | %s | %s | %s | %s |\n", prec, tb.c_str(), warp.c_str(),
              stages, smem, us, tflops, err, status.c_str());
  std::fflush(stdout);
}

template <typename Gemm>
static void run_config(const char *prec, const Problem &p) {
  using ElementA = typename Gemm::ElementA;
  using ElementB = typename Gemm::ElementB;
  using ElementC = typename Gemm::ElementC;
  using GemmKernel = typename Gemm::GemmKernel;
  using TB = typename Gemm::ThreadblockShape;
  using WS = typename Gemm::WarpShape;

  const std::string tb = std::to_string(TB::kM) + "x" + std::to_string(TB::kN) + "x" + std::to_string(TB::kK);
  const std::string ws = std::to_string(WS::kM) + "x" + std::to_string(WS::kN) + "x" + std::to_string(WS::kK);
  const int stages = Gemm::kStages;
  const size_t smem = sizeof(typename GemmKernel::SharedStorage);
  const std::string label = std::string(prec) + " " + tb + " s" + std::to_string(stages);
  if (p.only && label.find(p.only) == std::string::npos) return;
  ++g_ran;
  static_assert(sizeof(typename GemmKernel::SharedStorage) <= 227 * 1024,
                "configuration needs more than 227 KiB of shared memory");

  int dev = 0, optin = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (smem > size_t(optin) || smem > kMaxSmemBytes) {
    print_row(prec, tb, ws, stages, smem, "-", "-", "-",
              "SKIP: needs more shared memory than the device allows (" + std::to_string(optin) + " B)");
    return;
  }

  const int n = p.n;
  cutlass::gemm::GemmCoord problem(n, n, n);
  typename Gemm::Arguments args(
      problem,
      {static_cast<ElementA const *>(p.A), RowMajor(n)},      // A: lda = K
      {static_cast<ElementB const *>(p.B), ColumnMajor(n)},   // B: ldb = K
      {static_cast<ElementC const *>(p.D), RowMajor(n)},      // C (not read: beta = 0)
      {static_cast<ElementC *>(p.D), RowMajor(n)},            // D: ldd = N
      {ElementC(1), ElementC(0)},                             // alpha, beta
      1);                                                     // split-K slices

  Gemm gemm;
  cutlass::Status st = Gemm::can_implement(args);
  if (st != cutlass::Status::kSuccess) {
    print_row(prec, tb, ws, stages, smem, "-", "-", "-",
              std::string("SKIP: can_implement: ") + cutlassGetStatusString(st));
    return;
  }
  st = gemm.initialize(args, nullptr);
  if (st != cutlass::Status::kSuccess) {
    print_row(prec, tb, ws, stages, smem, "-", "-", "-",
              std::string("SKIP: initialize: ") + cutlassGetStatusString(st));
    return;
  }
  // Opt in to > 48 KiB of dynamic shared memory once, here, so that a failure is reported clearly
  // (Gemm::run() repeats this call on every launch and only returns kErrorInternal).
  if (smem >= (48 << 10)) {
    cudaError_t e = cudaFuncSetAttribute(cutlass::Kernel<GemmKernel>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) {
      cudaGetLastError();
      print_row(prec, tb, ws, stages, smem, "-", "-", "-",
                std::string("SKIP: cudaFuncSetAttribute(MaxDynamicSharedMemorySize): ") + cudaGetErrorString(e));
      return;
    }
  }

  // --- verification run ---
  const size_t count = size_t(n) * n;
  OutputTraits<ElementC>::poison(p.D, count * sizeof(ElementC));
  st = gemm.run();
  if (st != cutlass::Status::kSuccess) {
    cudaError_t e = cudaGetLastError();
    print_row(prec, tb, ws, stages, smem, "-", "-", "-",
              std::string("SKIP: run: ") + cutlassGetStatusString(st) + " / " + cudaGetErrorString(e));
    return;
  }
  CUDA_CHECK(cudaDeviceSynchronize());

  unsigned long long *err_d = nullptr, err_h[2] = {0, 0};
  CUDA_CHECK(cudaMalloc(&err_d, 2 * sizeof(unsigned long long)));
  CUDA_CHECK(cudaMemset(err_d, 0, 2 * sizeof(unsigned long long)));
  char errbuf[64];
  bool ok;
  if (std::is_same<ElementC, float>::value) {
    compare_f32<<<1024, 256>>>(static_cast<const float *>(p.D), static_cast<const float *>(p.ref), count, err_d);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaMemcpy(err_h, err_d, sizeof(err_h), cudaMemcpyDeviceToHost));
    uint32_t bits = uint32_t(err_h[0]);
    float e;
    std::memcpy(&e, &bits, sizeof(e));
    std::snprintf(errbuf, sizeof(errbuf), "%.3e", double(e));
    ok = (e < 1e-3f) && err_h[1] == 0;
  } else {
    compare_s32<<<1024, 256>>>(static_cast<const int32_t *>(p.D), static_cast<const int32_t *>(p.ref), count, err_d);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaMemcpy(err_h, err_d, sizeof(err_h), cudaMemcpyDeviceToHost));
    std::snprintf(errbuf, sizeof(errbuf), "%llu (%llu mismatches)", err_h[0], err_h[1]);
    ok = (err_h[1] == 0);
  }
  CUDA_CHECK(cudaFree(err_d));

  // --- timing ---
  for (int i = 0; i < kWarmup; ++i) gemm.run();
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());

  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> batch_ms;
  for (int r = 0; r < p.reps; ++r) {
    CUDA_CHECK(cudaEventRecord(start));
    for (int i = 0; i < kLaunchesPerBatch; ++i) gemm.run();
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    CUDA_CHECK(cudaGetLastError());
    float ms = 0.f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    batch_ms.push_back(ms);
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(batch_ms.begin(), batch_ms.end());
  size_t h = batch_ms.size() / 2;
  double med_ms = (batch_ms.size() % 2) ? batch_ms[h] : 0.5 * (batch_ms[h - 1] + batch_ms[h]);
  double us = med_ms * 1000.0 / kLaunchesPerBatch;
  double tflops = 2.0 * double(n) * double(n) * double(n) / (us * 1e-6) / 1e12;

  char usbuf[32], tfbuf[32];
  std::snprintf(usbuf, sizeof(usbuf), "%.1f", us);
  std::snprintf(tfbuf, sizeof(tfbuf), "%.1f", tflops);
  g_wrong += !ok;
  print_row(prec, tb, ws, stages, smem, usbuf, tfbuf, errbuf, ok ? "verified" : "WRONG");
}

// ------------------------------------------------------------------------------------------------
// Configuration lists.  Shared memory of the mainloop = stages * (TbM + TbN) * TbK * sizeof(A/B);
// the epilogue reuses it.  Not included because they exceed the 227 KiB per-block limit of sm_90:
// 128x256x64 / 256x128x64 (fp16/bf16) and 128x256x128 / 256x128x128 (int8) with 5 stages (240 KiB).
// ------------------------------------------------------------------------------------------------
template <typename T>   // T = cutlass::half_t or cutlass::bfloat16_t
static void run_f16_like_configs(const char *prec, const Problem &p) {
  run_config<GemmF16Like<T, 128, 256, 32, 64, 64, 32, 3>>(prec, p);   //  72 KiB
  run_config<GemmF16Like<T, 128, 256, 32, 64, 64, 32, 4>>(prec, p);   //  96 KiB
  run_config<GemmF16Like<T, 128, 256, 64, 64, 64, 64, 3>>(prec, p);   // 144 KiB
  run_config<GemmF16Like<T, 128, 256, 64, 64, 64, 64, 4>>(prec, p);   // 192 KiB
  run_config<GemmF16Like<T, 256, 128, 32, 64, 64, 32, 3>>(prec, p);   //  72 KiB
  run_config<GemmF16Like<T, 256, 128, 32, 64, 64, 32, 4>>(prec, p);   //  96 KiB
  run_config<GemmF16Like<T, 256, 128, 64, 64, 64, 64, 3>>(prec, p);   // 144 KiB
  run_config<GemmF16Like<T, 256, 128, 64, 64, 64, 64, 4>>(prec, p);   // 192 KiB
  run_config<GemmF16Like<T, 128, 128, 32, 64, 64, 32, 4>>(prec, p);   //  64 KiB
  run_config<GemmF16Like<T, 128, 128, 32, 64, 64, 32, 5>>(prec, p);   //  80 KiB
  run_config<GemmF16Like<T, 128, 128, 64, 64, 64, 64, 3>>(prec, p);   //  96 KiB
  run_config<GemmF16Like<T, 128, 128, 64, 64, 64, 64, 4>>(prec, p);   // 128 KiB
}

static void run_int8_configs(const Problem &p) {
  run_config<GemmS8<128, 256,  64, 64, 64,  64, 3>>("int8", p);       //  72 KiB
  run_config<GemmS8<128, 256,  64, 64, 64,  64, 4>>("int8", p);       //  96 KiB
  run_config<GemmS8<128, 256, 128, 64, 64, 128, 3>>("int8", p);       // 144 KiB
  run_config<GemmS8<128, 256, 128, 64, 64, 128, 4>>("int8", p);       // 192 KiB
  run_config<GemmS8<256, 128,  64, 64, 64,  64, 3>>("int8", p);       //  72 KiB
  run_config<GemmS8<256, 128,  64, 64, 64,  64, 4>>("int8", p);       //  96 KiB
  run_config<GemmS8<256, 128, 128, 64, 64, 128, 3>>("int8", p);       // 144 KiB
  run_config<GemmS8<256, 128, 128, 64, 64, 128, 4>>("int8", p);       // 192 KiB
  run_config<GemmS8<128, 128, 128, 64, 64, 128, 3>>("int8", p);       //  96 KiB
  run_config<GemmS8<128, 128, 128, 64, 64, 128, 4>>("int8", p);       // 128 KiB
}

// ------------------------------------------------------------------------------------------------
// Inputs, reference and main
// ------------------------------------------------------------------------------------------------
enum { kFp16 = 0, kBf16 = 1, kInt8 = 2 };

template <typename T, typename Acc>
static void init_and_reference(Problem &p) {
  const int n = p.n;
  const size_t count = size_t(n) * n;
  init_kernel<T><<<2048, 256>>>(static_cast<T *>(p.A), count, 1);
  init_kernel<T><<<2048, 256>>>(static_cast<T *>(p.B), count, 2);
  CUDA_CHECK(cudaGetLastError());
  dim3 block(32, 32), grid((n + 31) / 32, (n + 31) / 32);
  reference_gemm_tn<T, Acc><<<grid, block>>>(static_cast<const T *>(p.A), static_cast<const T *>(p.B),
                                             static_cast<Acc *>(p.ref), n, n, n);
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());
}

static bool run_precision(int prec, Problem p) {
  const char *name = prec == kFp16 ? "fp16" : prec == kBf16 ? "bf16" : "int8";
  if (p.only) {  // a filter that names another precision: no reference GEMM for this one
    const std::string only(p.only);
    bool other = false;
    for (const char *x : {"fp16", "bf16", "int8"})
      other = other || (only.find(x) != std::string::npos && std::strcmp(x, name) != 0);
    if (other) return false;
  }
  const size_t count = size_t(p.n) * p.n;
  const size_t in_elem = (prec == kInt8) ? 1 : 2;
  const size_t out_elem = 4;
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  size_t need = 2 * count * in_elem + 2 * count * out_elem;
  if (need + (256u << 20) > free_b) {
    std::printf("| %s | - | - | - | - | - | - | - | SKIP: needs %zu MiB of device memory, %zu MiB free |\n",
                name, need >> 20, free_b >> 20);
    std::fflush(stdout);
    return false;
  }
  CUDA_CHECK(cudaMalloc(&p.A, count * in_elem));
  CUDA_CHECK(cudaMalloc(&p.B, count * in_elem));
  CUDA_CHECK(cudaMalloc(&p.D, count * out_elem));
  CUDA_CHECK(cudaMalloc(&p.ref, count * out_elem));

  if (prec == kFp16) {
    init_and_reference<cutlass::half_t, float>(p);
    run_f16_like_configs<cutlass::half_t>("fp16", p);
  } else if (prec == kBf16) {
    init_and_reference<cutlass::bfloat16_t, float>(p);
    run_f16_like_configs<cutlass::bfloat16_t>("bf16", p);
  } else {
    init_and_reference<int8_t, int32_t>(p);
    run_int8_configs(p);
  }

  CUDA_CHECK(cudaFree(p.A));
  CUDA_CHECK(cudaFree(p.B));
  CUDA_CHECK(cudaFree(p.D));
  CUDA_CHECK(cudaFree(p.ref));
  return true;
}

// A whole decimal number in [lo, hi] into *out; otherwise a message naming the argument and false.
static bool parse_int(const char *arg, long lo, long hi, const char *what, int *out) {
  char *end = nullptr;
  long v = std::strtol(arg, &end, 10);
  if (!end || *end || v < lo || v > hi) {
    std::printf("invalid %s '%s' (expected an integer in [%ld, %ld])\n", what, arg, lo, hi);
    return false;
  }
  *out = int(v);
  return true;
}

static void usage(const char *argv0) {
  std::printf(
      "usage: %s [N] [reps] [only]\n"
      "  Square GEMM M = N = K (default 8192, must be a multiple of 16), TN layout, with CUTLASS\n"
      "  2.x SM80 tensor-op kernels (fp16/bf16 -> f32, int8 -> int32); reps timed batches of %d\n"
      "  launches each (default 20). Prints a markdown table. only: run just the configurations whose\n"
      "  label \"precision MxNxK sS\" contains it, e.g. \"fp16 128x256x32 s3\" (to profile one).\n",
      argv0, kLaunchesPerBatch);
}

int main(int argc, char **argv) {
  Problem p;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "-h") || !std::strcmp(argv[i], "--help")) {
      usage(argv[0]);
      return 0;
    }
  }
  if (argc > 4) { usage(argv[0]); return 1; }
  if (argc > 3) p.only = argv[3];
  if ((argc > 1 && !parse_int(argv[1], 16, 65536, "N", &p.n)) ||
      (argc > 2 && !parse_int(argv[2], 1, 100000, "reps", &p.reps)))
    return 1;
  if (p.n % 16 != 0) {
    std::printf("N = %d is not a multiple of 16 (needed for 128-bit aligned int8 / fp16 accesses)\n", p.n);
    return 1;
  }

  int runtime_ver = 0, driver_ver = 0, ndev = 0;
  cudaRuntimeGetVersion(&runtime_ver);
  cudaDriverGetVersion(&driver_ver);  // 0 when no driver is installed
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev == 0) {
    std::printf("no CUDA device available: cudaGetDeviceCount returned %s (%s), count = %d "
                "[runtime %d, driver %d]\n",
                cudaGetErrorName(e), cudaGetErrorString(e), ndev, runtime_ver, driver_ver);
    return 1;
  }

  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  CUDA_CHECK(cudaSetDevice(0));
  int clock_khz = 0;  // cudaDeviceProp::clockRate no longer exists in CUDA 13
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  std::printf("# CUTLASS %d.%d.%d SM80-style GEMM (mma.sync + cp.async + ldmatrix), TN, M=N=K=%d, "
              "%d reps x %d launches | device: %s (sm_%d%d, %d SMs, %.0f MHz max clock) | "
              "CUDA runtime %d.%d, driver %d.%d | TFLOP/s column = TOP/s for int8\n",
              CUTLASS_MAJOR, CUTLASS_MINOR, CUTLASS_PATCH, p.n, p.reps, kLaunchesPerBatch, prop.name,
              prop.major, prop.minor, prop.multiProcessorCount, clock_khz / 1000.0,
              runtime_ver / 1000, (runtime_ver % 1000) / 10, driver_ver / 1000, (driver_ver % 1000) / 10);
  std::printf("| precision | threadblock | warp | stages | smem bytes | median us | TFLOP/s | max error | status |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);

  run_precision(kFp16, p);
  run_precision(kBf16, p);
  run_precision(kInt8, p);
  if (p.only && g_ran == 0) {
    std::fprintf(stderr, "no configuration matches '%s' (labels are \"precision MxNxK sS\", e.g. "
                         "\"fp16 128x256x32 s3\")\n", p.only);
    return 1;
  }
  if (g_wrong) std::fprintf(stderr, "%d configuration(s) computed a wrong result\n", g_wrong);
  return g_wrong ? 1 : 0;
}
