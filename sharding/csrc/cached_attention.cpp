// fastmode::cached_attention: a step's attention over the KV cache, read where it lies.
//
//   out[b, s, h] = softmax_j(q[b, s, h] . k[slot_b, j, g] * scale) @ v[slot_b, j, g]
//
// over the cache positions j a query at position p = positions[b, s] may see: j <= p, j < span,
// and, with window > 0 (a sliding layer), j > p - window. g = h / (H / KV) is the query head's
// key/value head (grouped-query attention). The step's own keys and values are already in the
// cache (the model writes them first), so this is every step's attention: decode, verify, prefill.
//
// Why: the model's other path gathers each row's cache span into new tensors (index_select),
// builds an additive [B, 1, S, span] mask and calls SDPA, a handful of small kernels per layer.
// A decode step's attention is a few thousand multiply-adds per head, so those kernels' fixed
// costs, not the arithmetic, were its time on CPU. Here it is one call that reads each key and
// value once from the cache and skips the masked positions instead of adding -inf to them.
//
// Arithmetic is float32 (AVX2 FMA): scores, a max-subtracted exp (a Cephes-style polynomial,
// relative error ~1e-7) and the weighted sum of values. Work is split over (row, query, head)
// triples with at::parallel_for; a step too small to gain from threads runs on the calling one.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}

inline float dot(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  float s = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline void axpy(float w, const float* x, float* y, int64_t n) {  // y += w * x
  const __m256 vw = _mm256_set1_ps(w);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(vw, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += w * x[i];
}

// e^x for x <= 0 (scores minus their max): Cephes' expf, range-reduced by powers of two.
inline __m256 exp_nonpositive(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));  // below: 0 to float precision
  __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// p[i] = e^(p[i] - max) for i < n; returns their sum.
inline float exp_shifted(float* p, int64_t n, float max) {
  const __m256 vm = _mm256_set1_ps(max);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(p + i), vm));
    _mm256_storeu_ps(p + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = hsum(acc);
  if (i < n) {  // the tail through the same polynomial, so every position is computed alike
    alignas(32) float tail[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t t = i; t < n; ++t) tail[t - i] = p[t] - max;
    __m256 e = exp_nonpositive(_mm256_load_ps(tail));
    _mm256_store_ps(tail, e);
    for (int64_t t = i; t < n; ++t) {
      p[t] = tail[t - i];
      sum += tail[t - i];
    }
  }
  return sum;
}

at::Tensor cached_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                            const at::Tensor& slots, const at::Tensor& positions, c10::SymInt span_, int64_t window,
                            double scale) {
  const int64_t span = span_.expect_int();  // symbolic only while torch.compile traces (the fake kernel)
  TORCH_CHECK(q.device().is_cpu() && k_cache.device().is_cpu() && v_cache.device().is_cpu(),
              "cached_attention: CPU tensors only");
  TORCH_CHECK(q.dim() == 4, "cached_attention: q must be [B, S, H, D], got ", q.sizes());
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes(),
              "cached_attention: caches must be [slots, max_len, KV, D] of one shape, got ", k_cache.sizes(),
              " and ", v_cache.sizes());
  TORCH_CHECK(q.scalar_type() == at::kFloat && k_cache.scalar_type() == at::kFloat &&
                  v_cache.scalar_type() == at::kFloat,
              "cached_attention: float32 only");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "cached_attention: caches must be contiguous");
  const int64_t B = q.size(0), S = q.size(1), H = q.size(2), D = q.size(3);
  const int64_t max_len = k_cache.size(1), KV = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == D, "cached_attention: head_dim ", D, " != the cache's ", k_cache.size(3));
  TORCH_CHECK(KV > 0 && H % KV == 0, "cached_attention: ", H, " query heads do not group over ", KV, " kv heads");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.dim() == 1 && slots.size(0) == B,
              "cached_attention: slots must be int64 [B]");
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.dim() == 2 && positions.size(0) == B &&
                  positions.size(1) == S,
              "cached_attention: positions must be int64 [B, S]");
  TORCH_CHECK(span >= 1 && span <= max_len, "cached_attention: span ", span, " not in [1, ", max_len, "]");

  const at::Tensor qc = q.contiguous(), sc = slots.contiguous(), pc = positions.contiguous();
  at::Tensor out = at::empty({B, S, H, D}, qc.options());
  const float* qp = qc.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  const int64_t* slot = sc.data_ptr<int64_t>();
  const int64_t* pos = pc.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const int64_t group = H / KV, tasks = B * S * H, num_slots = k_cache.size(0);
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(slot[b] >= 0 && slot[b] < num_slots, "cached_attention: slot ", slot[b], " out of range");
  const float fscale = static_cast<float>(scale);
  // About 64k multiply-adds per chunk: a decode step's few heads stay on one thread, a prefill spreads.
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, span * D * 2));

  at::parallel_for(0, tasks, grain, [&](int64_t t0, int64_t t1) {
    std::vector<float> p(span);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t h = t % H, bs = t / H, b = bs / S;
      const int64_t query_pos = pos[bs];
      const int64_t hi = std::min(query_pos, span - 1);
      const int64_t lo = window > 0 ? std::max<int64_t>(0, query_pos - window + 1) : 0;
      float* o = op + t * D;
      std::fill(o, o + D, 0.0f);
      if (hi < lo) continue;  // nothing visible (a position past the span): zeros, not NaN
      const float* qv = qp + t * D;
      const int64_t stride = KV * D, base = (slot[b] * max_len * KV + h / group) * D;
      const float* kb = kp + base;
      const float* vb = vp + base;
      const int64_t n = hi - lo + 1;
      float max = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        p[j] = dot(qv, kb + (lo + j) * stride, D) * fscale;
        max = std::max(max, p[j]);
      }
      const float inv = 1.0f / exp_shifted(p.data(), n, max);
      for (int64_t j = 0; j < n; ++j) axpy(p[j] * inv, vb + (lo + j) * stride, o, D);
    }
  });
  return out;
}
}  // namespace

TORCH_LIBRARY_FRAGMENT(fastmode, m) {
  m.def("cached_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor slots, Tensor positions, "
        "SymInt span, int window, float scale) -> Tensor");
}
TORCH_LIBRARY_IMPL(fastmode, CPU, m) { m.impl("cached_attention", &cached_attention); }
