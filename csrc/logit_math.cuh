#pragma once
// Scalar arithmetic of the logits verification kernels (logit_verify.cu):
// relaxed_verify's rank test, the (max, sum-exp) pairs behind bild_verify's
// log-sum-exp and max_prob, and the accept rules. Written once, compiled for the
// device by nvcc and for the host by the C++ compiler (bind_logit_verify.cpp
// exposes a host emulation for CPU-only tests), like philox.cuh.
//
// Every value reaching these functions is an fp32 logit (fp16/bf16 widen
// exactly). NaN is treated as -inf everywhere (reference: nan_to_neg_inf). The
// NaN/inf tests look at the bits, so no compiler flag can fold them away.

#include <cmath>
#include <cstdint>
#include <cstring>

#ifndef SPECDEC_HD
#if defined(__CUDACC__)
#define SPECDEC_HD __host__ __device__ __forceinline__
#else
#define SPECDEC_HD inline
#endif
#endif

namespace specdec {
namespace logit {

SPECDEC_HD uint32_t bits_of(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}

SPECDEC_HD bool is_nan(float x) { return (bits_of(x) & 0x7FFFFFFFu) > 0x7F800000u; }
SPECDEC_HD bool is_finite(float x) { return (bits_of(x) & 0x7F800000u) != 0x7F800000u; }
SPECDEC_HD float nan_to_neg_inf(float x) { return is_nan(x) ? -INFINITY : x; }

// relaxed_verify: does id v (logit x) rank ahead of the draft d (logit lx) in
// (logit desc, id asc) order? The draft's rank is the number of ids ahead of
// it. x and lx are NaN-free; +0 == -0 like torch.
SPECDEC_HD bool ranks_ahead(float x, int64_t v, float lx, int64_t d) {
  return x > lx || (x == lx && v < d);
}

// SpecDec Eq. 8 and 9: rank < top_beta, and the draft is the argmax or its
// logit is less than tau below the top logit. (top - lx) is NaN for
// inf - inf, and NaN < tau is false, as in the reference.
SPECDEC_HD bool relaxed_accepts(uint32_t ahead, int64_t top_beta, bool is_top1, float top,
                                float lx, float tau) {
  return static_cast<int64_t>(ahead) < top_beta && (is_top1 || (top - lx) < tau);
}

// BiLD rollback: keep the draft while -log p(draft) = lse - lx <= threshold
// (NaN, from inf - inf, rejects).
SPECDEC_HD bool bild_accepts(float lse, float lx, float threshold) {
  return lse - lx <= threshold;
}

// ---------------------------------------------------------------------------
// (max, sum-exp) of a set of NaN-free logits: m = max, s = sum exp(x - m).
// Invariant: s == 0 whenever m is infinite (m = -inf: nothing but -inf seen;
// m = +inf: the log-sum-exp is +inf whatever s is). When m is finite, s >= 1
// (the max contributes exp(0)). Combining in a fixed order is deterministic.
// ---------------------------------------------------------------------------
struct MaxSum {
  float m;
  float s;
};

SPECDEC_HD MaxSum max_sum_empty() { return MaxSum{-INFINITY, 0.0f}; }

// Add N values (one vector load) to `a`: one rescale per vector at most.
template <int N>
SPECDEC_HD void max_sum_add(MaxSum& a, const float (&x)[N]) {
  float top = x[0];
  for (int k = 1; k < N; ++k) top = x[k] > top ? x[k] : top;
  if (top > a.m) {
    // a.m = -inf: a.s is 0 and exp(-inf) = 0; top = +inf: the new s is 0.
    a.s = is_finite(top) ? a.s * expf(a.m - top) : 0.0f;
    a.m = top;
  }
  if (is_finite(a.m)) {
    for (int k = 0; k < N; ++k) a.s += expf(x[k] - a.m);  // x <= m; exp(-inf) = 0
  }
}

// a.s rescaled to a larger finite max m: sum exp(x - m) over a's values. A
// side with a.m = -inf has a.s = 0 and exp(-inf) = 0: it adds exactly 0.
SPECDEC_HD float max_sum_term(MaxSum a, float m) { return a.s * expf(a.m - m); }

SPECDEC_HD MaxSum max_sum_merge(MaxSum a, MaxSum b) {
  const float m = a.m > b.m ? a.m : b.m;
  if (!is_finite(m)) return MaxSum{m, 0.0f};
  return MaxSum{m, max_sum_term(a, m) + max_sum_term(b, m)};
}

// log(sum exp(x)) = m + log(s); m itself when m is +-inf (like torch.logsumexp).
SPECDEC_HD float logsumexp_of(MaxSum a) { return is_finite(a.m) ? a.m + logf(a.s) : a.m; }

// Largest softmax probability exp(max - lse) as the reference computes it;
// 1 when a logit is +inf, 0 when no logit is finite.
SPECDEC_HD float max_prob_of(MaxSum a) {
  if (!is_finite(a.m)) return a.m > 0.0f ? 1.0f : 0.0f;
  return expf(a.m - logsumexp_of(a));
}

}  // namespace logit
}  // namespace specdec
