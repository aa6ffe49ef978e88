#pragma once
// Scalar arithmetic of the logits verification kernels (logit_verify.cu):
// relaxed_verify's rank test, the (max, sum-exp) pairs behind bild_verify's
// log-sum-exp and max_prob, and the accept rules; and the per-element softmax(x / T)
// of the logits sampling ops (softmax_stats.cu, split_v_sampling.cuh). Written once, compiled for the
// device by nvcc and for the host by the C++ compiler (bind_logit_verify.cpp
// exposes a host emulation for CPU-only tests), like philox.cuh.
//
// Every value reaching these functions is an fp32 logit (fp16/bf16 widen
// exactly). NaN is treated as -inf everywhere (reference: nan_to_neg_inf). The
// NaN/inf tests look at the bits, so no compiler flag can fold them away.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "host_device.cuh"

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

// ---------------------------------------------------------------------------
// softmax(x / T) of the logits sampling ops (rejection_sample_logits,
// block_verify_logits): the statistics launch (softmax_stats.cu) and the
// probability functor of the sampling kernels (split_v_sampling.cuh SoftmaxProb)
// both evaluate p(x) = exp(z - M) / S, z = x / T, with this arithmetic:
//   - z is the correctly rounded x / T without a division per element: T = t 2^e
//     with |t| in [1, 2), r = 1 / t rounded, y = x r, and one Markstein step
//     z' = fma(fma(-y, t, x), r, y) is RN(x / t) (exact remainder, r within half an
//     ulp); z = z' 2^-e is exact, so fma(z', 2^-e, -M) is the reference's
//     RN(z - M) bit for bit. |t| >= 1 keeps y finite for finite x, so x / T
//     overflows exactly where the division does (through the power of two).
//   - exp(d) = 2^(d log2 e), on the device one ex2.approx.f32 (MUFU.EX2, relative
//     error ~2^-22; subnormal results kept), on the host std::exp2; d = z - M <= 0.
//   - 1 / S once per row: p = 2^(d log2 e) * (1 / S), multiplied without
//     contraction so a later p - q sees the same rounded p in every pass.
// p differs from torch's exp(z - M) / S by the exp approximation and the rounding
// of d log2 e (|d log2 e| * 2^-24 in log2 units): <= ~2e-6 relative for every p
// >= 2^-40 (a nonzero fixed-point weight), well inside the 1e-5 decision band.
// ---------------------------------------------------------------------------
constexpr float kLog2e = 1.4426950408889634f;

// fma / product rounded once, never contracted with a neighbouring add.
SPECDEC_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
SPECDEC_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// 2^a: ex2.approx.f32 on the device (-inf -> +0, +inf -> +inf, NaN -> NaN; not
// flushed to zero), std::exp2 on the host.
SPECDEC_HD float exp2_approx(float a) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("ex2.approx.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
#else
  return std::exp2(a);
#endif
}

SPECDEC_HD float float_of_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
#endif
}

// x / T = div_mantissa(x) * scale. Per row (or per thread), never per element.
struct TempScale {
  float t;      // T's significand, |t| in [1, 2) (T itself for 0 and NaN, 1 for +-inf)
  float r;      // 1 / t rounded to nearest (0 for T = +-inf)
  float scale;  // 2^-e, exact (1 for 0, NaN, +-inf)
};

SPECDEC_HD TempScale temp_scale(float T) {
  const uint32_t u = bits_of(T);
  const uint32_t field = (u >> 23) & 0xFFu;
  if (is_nan(T) || (u & 0x7FFFFFFFu) == 0u) return TempScale{T, 1.0f / T, 1.0f};  // x / T's own NaN / inf
  if (field == 0xFFu) return TempScale{1.0f, 0.0f, 1.0f};  // x / inf = 0, inf / inf = NaN
  if (field == 0u) {
    // Subnormal T (< 2^-126): treated as +-2^-126 (not exact; every |x| > 2^-100 overflows there).
    const float one = (u >> 31) ? -1.0f : 1.0f;
    return TempScale{one, one, 0x1.0p126f};
  }
  const float t = float_of_bits((u & 0x807FFFFFu) | 0x3F800000u);  // |t| in [1, 2)
  const int e = static_cast<int>(field) - 127;                       // T = t 2^e, e in [-126, 127]
  const float scale = e <= 126 ? float_of_bits(static_cast<uint32_t>(127 - e) << 23) : 0x1.0p-127f;
  return TempScale{t, 1.0f / t, scale};
}

// RN(x / ts.t) (one Markstein step from x * r), +-inf and NaN as the division gives
// them: an infinite x makes the remainder inf - inf = NaN, which the max turns into
// -FLT_MAX so that the last fma returns y (+-inf, or NaN for x NaN).
SPECDEC_HD float div_mantissa(float x, TempScale ts) {
  const float y = mul_rn(x, ts.r);
  const float rem = fmaxf(fma_rn(-y, ts.t, x), -3.40282347e38f);
  return fma_rn(rem, ts.r, y);
}

// p(x) = exp(x / T - m) / s with inv_s = 1 / s: the functor of the sampling kernels.
// m NaN (a row torch.softmax makes all NaN) gives NaN.
SPECDEC_HD float softmax_prob(float x, TempScale ts, float m, float inv_s) {
  const float d = fma_rn(div_mantissa(x, ts), ts.scale, -m);  // RN(x / T - m), as the reference
  return mul_rn(exp2_approx(d * kLog2e), inv_s);
}

// exp(a - b) for the statistics' rescaling (a <= b; -inf - finite = -inf -> 0).
SPECDEC_HD float exp_diff(float a, float b) { return exp2_approx((a - b) * kLog2e); }

// Online (m, s) of the statistics over N quotients zq = div_mantissa(x) (elements
// past the row end passed as -inf): m = max z, s = sum exp(z - m). One max and at
// most one rescale per N values; NaN and +inf are not tested per element: a NaN z
// makes s NaN, a +inf z makes m +inf (softmax_partial_bad).
template <int N>
SPECDEC_HD void softmax_partial_add(float& m, float& s, const float (&zq)[N], float scale) {
  float top = zq[0];
  for (int k = 1; k < N; ++k) top = fmaxf(top, zq[k]);  // ignores NaN
  top = mul_rn(top, scale);                             // z of the largest; overflows as x / T does
  if (top > m) {
    s = s * exp_diff(m, top);  // m = -inf: exp(-inf) = 0; top = +inf: 0
    m = top;
  }
  const float shift = is_finite(m) ? m : 0.0f;  // m = -inf: every z is -inf or NaN
  for (int k = 0; k < N; ++k) s += exp2_approx(fma_rn(zq[k], scale, -shift) * kLog2e);  // -inf -> 0
}

// The partial saw a NaN (s is NaN) or a +inf (m = +inf): torch's softmax row is all NaN.
SPECDEC_HD bool softmax_partial_bad(float m, float s) { return is_nan(s) || (is_nan(m) || m == INFINITY); }

}  // namespace logit
}  // namespace specdec
