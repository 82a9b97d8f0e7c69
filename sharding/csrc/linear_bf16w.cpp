// fastmode::linear_bf16w: y[M, N] = x[M, K] @ W[N, K]^T with x float32 and W stored as bfloat16,
// packed [N/16, K, 16] (sharding/packed.py packs it); a step of more than MAX_ROWS (64) rows runs
// at::linear on the weights unpacked to float32 for the call (N x K conversions against M x N x K
// multiply-adds). The packed tensor is the op's only weight input: a compiled step passes each
// graph input through Python, so the float32 copy is not one of them. Arithmetic is float32
// (FMA); only the weights are narrow, so a weight that is exactly a bfloat16 value (every
// checkpoint fastmode ships) gives the same products as float32 weights and half the bytes to
// stream per decode step.
//
// Why: a decode or verify step multiplies a few rows by every weight of the model once, so on
// CPU it is bound by memory bandwidth, not FMAs; the full model's float32 weights (30 MiB) do not
// fit the last-level cache, its bfloat16 ones stream in half the time. The packed layout makes
// each 16-wide block of output columns one contiguous run of K x 32 bytes.
//
// Microkernel: for each 16-column block (two AVX2 registers) take up to 4 rows of x at a time;
// each k broadcasts x[m, k] and FMAs it into that row's two accumulators. With fewer rows, U
// independent accumulator phases over k hide the FMA latency. Blocks are split over threads
// with at::parallel_for (the caller's intra-op threads).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <immintrin.h>
#include <torch/library.h>

#include <cstdint>

namespace {
constexpr int NB = 16;        // output columns per packed block
// Steps of more rows run MKL's float32 GEMM. Up to here the kernel is faster on an AVX2 core even
// where a step is compute-bound: on this repo's 2-core VM (Zen 3, 1 thread, both shipped models'
// linears, weights out of cache) 0.55x MKL's time at 16 rows, 0.60x at 20, 0.80x at 64, 0.95x at
// 512 (python -m bench.packed_rows, bench/results/packed_rows.json). 64 covers a conversation
// turn's prefill (10-40 new tokens) and leaves long prompts to MKL, whose AVX-512 kernels may
// win on other CPUs. A build may set it (-DFASTMODE_MAX_ROWS=N; bench.packed_rows builds a copy
// without a limit).
#ifndef FASTMODE_MAX_ROWS
#define FASTMODE_MAX_ROWS 64
#endif
constexpr int64_t MAX_ROWS = FASTMODE_MAX_ROWS;
constexpr int64_t PREFETCH = 1024;  // bytes ahead of the stream

inline __m256 load8(const uint16_t* p) {  // 8 bfloat16 -> 8 float32 (shift into the high half)
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// MR rows of x against one 16-wide block of W; U accumulator phases over k.
template <int MR, int U>
inline void block(const float* x, int64_t ldx, const uint16_t* w, int64_t K, float* y, int64_t ldy) {
  __m256 acc[U][MR][2];
  for (int u = 0; u < U; ++u)
    for (int m = 0; m < MR; ++m) acc[u][m][0] = acc[u][m][1] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + U <= K; k += U) {
    // One core's own streaming is bound by how many cache lines it has in flight: asking for the
    // lines PREFETCH bytes ahead keeps more in flight than the hardware prefetcher alone does.
    for (int line = 0; line < U * NB * 2; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(w + k * NB) + PREFETCH + line, _MM_HINT_T0);
    for (int u = 0; u < U; ++u) {
      const uint16_t* wk = w + (k + u) * NB;
      __m256 w0 = load8(wk), w1 = load8(wk + 8);
      for (int m = 0; m < MR; ++m) {
        __m256 b = _mm256_broadcast_ss(x + m * ldx + k + u);
        acc[u][m][0] = _mm256_fmadd_ps(b, w0, acc[u][m][0]);
        acc[u][m][1] = _mm256_fmadd_ps(b, w1, acc[u][m][1]);
      }
    }
  }
  for (; k < K; ++k) {
    const uint16_t* wk = w + k * NB;
    __m256 w0 = load8(wk), w1 = load8(wk + 8);
    for (int m = 0; m < MR; ++m) {
      __m256 b = _mm256_broadcast_ss(x + m * ldx + k);
      acc[0][m][0] = _mm256_fmadd_ps(b, w0, acc[0][m][0]);
      acc[0][m][1] = _mm256_fmadd_ps(b, w1, acc[0][m][1]);
    }
  }
  for (int m = 0; m < MR; ++m) {
    __m256 s0 = acc[0][m][0], s1 = acc[0][m][1];
    for (int u = 1; u < U; ++u) {
      s0 = _mm256_add_ps(s0, acc[u][m][0]);
      s1 = _mm256_add_ps(s1, acc[u][m][1]);
    }
    _mm256_storeu_ps(y + m * ldy, s0);
    _mm256_storeu_ps(y + m * ldy + 8, s1);
  }
}

void blocks(const float* x, int64_t M, int64_t K, const uint16_t* w, int64_t b0, int64_t b1, float* y,
            int64_t N) {
  for (int64_t b = b0; b < b1; ++b) {
    const uint16_t* wb = w + b * K * NB;
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) block<4, 1>(x + m * K, K, wb, K, y + m * N + b * NB, N);
    switch (M - m) {
      case 3: block<3, 1>(x + m * K, K, wb, K, y + m * N + b * NB, N); break;
      case 2: block<2, 2>(x + m * K, K, wb, K, y + m * N + b * NB, N); break;
      case 1: block<1, 4>(x + m * K, K, wb, K, y + m * N + b * NB, N); break;
      default: break;
    }
  }
}

at::Tensor linear_bf16w(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "linear_bf16w: CPU tensors only");
  TORCH_CHECK(x.scalar_type() == at::kFloat, "linear_bf16w: x must be float32, got ", x.scalar_type());
  TORCH_CHECK(w.scalar_type() == at::kBFloat16 && w.dim() == 3 && w.size(2) == NB && w.is_contiguous(),
              "linear_bf16w: w must be contiguous bfloat16 packed [N/16, K, 16], got ", w.sizes());
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == w.size(1), "linear_bf16w: x's last dim ", x.size(-1),
              " != packed K ", w.size(1));
  const int64_t K = x.size(-1), nblocks = w.size(0), N = nblocks * NB;
  const int64_t M = K ? x.numel() / K : 0;
  // The choice is made here, not in Python: a branch on the row count there would make
  // torch.compile guard on it and compile every dynamic graph twice.
  if (M > MAX_ROWS) return at::linear(x, w.to(at::kFloat).transpose(1, 2).reshape({N, K}));
  const at::Tensor xc = x.contiguous();
  auto sizes = xc.sizes().vec();
  sizes.back() = N;
  at::Tensor y = at::empty(sizes, xc.options());
  if (K == 0) return y.zero_();
  const float* xp = xc.data_ptr<float>();
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(w.data_ptr());
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, nblocks, 4, [&](int64_t b0, int64_t b1) { blocks(xp, M, K, wp, b0, b1, yp, N); });
  return y;
}
}  // namespace

TORCH_LIBRARY(fastmode, m) { m.def("linear_bf16w(Tensor x, Tensor packed) -> Tensor"); }
TORCH_LIBRARY_IMPL(fastmode, CPU, m) { m.impl("linear_bf16w", &linear_bf16w); }
