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

}  // namespace specdec
