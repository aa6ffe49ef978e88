#pragma once
// tree_rejection_sample's residual for one vocabulary id (reference/tree_verify.py),
// `SPECDEC_HD` like philox.cuh so the host build in bind_tree_verify.cpp can test the
// exact arithmetic the kernel runs on a machine without a GPU.
//
// After the children c_1..c_k of a node were rejected, with p the node's target row:
//   R_1 = to_weights(p - q_c1)                       (float32 difference)
//   R_j = max(0, R_{j-1} - floor(S_{j-1} * clean(q_cj))),   S_j = sum_v R_j(v)
// R_j(v) depends on p(v), the q_ci(v) and the scalars S_1..S_{j-1} only, so the kernel
// recomputes it wherever it is needed instead of keeping a [V] row per batch row.

#include <cmath>
#include <cstdint>

#include "philox.cuh"

namespace specdec {

// reference nan_to_num(q, nan=1, posinf=1, neginf=0).clamp(0, 1), as float64.
SPECDEC_HD double clean_prob(float q) {
  float c = q;
  if (c != c) c = 1.0f;       // NaN -> 1
  if (c > 1.0f) c = 1.0f;     // +inf and > 1 -> 1
  if (!(c > 0.0f)) c = 0.0f;  // -inf, negatives, -0 -> 0
  return static_cast<double>(c);
}

// R_1 at one id.
SPECDEC_HD int64_t residual_first(float p, float q) { return to_weight(p - q); }

// R_j from R_{j-1} at one id; total = S_{j-1} as float64 (the reference's .double()).
// total * clean(q) is in [0, total] < 2^63, so the cast after floor is exact.
SPECDEC_HD int64_t residual_update(int64_t r, double total, float q) {
  const int64_t cut = static_cast<int64_t>(floor(total * clean_prob(q)));
  const int64_t d = r - cut;
  return d > 0 ? d : 0;
}

// ---- siblings drawn from one q without replacement (reference `_WithoutReplacement`) ----
// With Q = to_weight(q) and, per rejected rank i >= 1, the float64 scale c_i = S_i / T'_i
// (the residual's total over the q mass left off the tokens rejected before rank i):
//   R_1 = to_weight(p - q),  R_{i+1}(v) = max(0, R_i(v) - floor(c_i * Q(v)))  for v not rejected
// before rank i (q_i is 0 there). A cut is capped at kCutCap: R <= 2^40 < kCutCap, so a capped
// cut empties R exactly as the uncapped one would, and the cast can never overflow.
constexpr double kCutCap = 2199023255552.0;  // 2^41

SPECDEC_HD int64_t sampled_cut(double scale, int64_t q_weight) {
  const double x = scale * static_cast<double>(q_weight);
  return static_cast<int64_t>(floor(x < kCutCap ? x : kCutCap));
}

SPECDEC_HD int64_t sampled_residual_update(int64_t r, double scale, int64_t q_weight) {
  const int64_t d = r - sampled_cut(scale, q_weight);
  return d > 0 ? d : 0;
}

// The scale c = S / T' of a rank (both exact int64 totals, T' >= 1 for a real sibling).
SPECDEC_HD double sampled_scale(int64_t total, int64_t q_left) {
  return static_cast<double>(total) / static_cast<double>(q_left);
}

// The later-sibling test: accept iff u * (c * Q(x)) < R(x), in this float64 order.
SPECDEC_HD bool sampled_accept(double u, double scale, int64_t q_weight, int64_t r) {
  return u * (scale * static_cast<double>(q_weight)) < static_cast<double>(r);
}

}  // namespace specdec
