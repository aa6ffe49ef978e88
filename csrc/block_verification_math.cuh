#pragma once
// Scalar arithmetic of block verification (Sun et al. 2025, Algorithm 2; csrc/block_verification.cu),
// bit-identical to specdec_kernels/reference/block_verification.py. `SPECDEC_HD` like
// philox.cuh: nvcc compiles it into the kernels, the host compiler into the host builds of
// bind_block_verification.cpp, so CPU-only CI checks the very functions the kernels call.
//
//   prefix ratio  p_i = float32(clamp(nan_to_num(float64(p_{i-1}) * float64(P(X_i)) / float64(Q(X_i))), 0, 1)),
//                 0 for an invalid or missing draft (NaN -> 0, +inf -> 1)
//   weight        floor(clamp(float64(p_j) * float64(P(x)) - float64(Q(x)), 0, 1) * 2^40) (NaN -> 0, +inf -> 1)
//   mass          Z(j) = (sum of the int64 weights) * 2^-40, float64 (the int64 -> float64 conversion
//                 rounds to nearest like torch's .double())
//   threshold     h_i = Z(i) / (Z(i) + (1 - p_i)) (zero denominator -> 1) for i < n, h_n = p_n, 0 past n
//   test          eta_i < h_i (strict), tau = the largest passing i (0 if none)

#include <cstdint>

#include "philox.cuh"

namespace specdec {
namespace block {

constexpr double kWeightScale = 1099511627776.0;  // 2^40

// One step of the prefix-ratio scan: p_i from p_{i-1} and the draft's target / draft
// probabilities. `valid`: X_i exists in the row and lies in [0, V).
SPECDEC_HD float prefix_ratio_step(float prev, float p, float q, bool valid) {
  if (!valid) return 0.0f;
  const double r = static_cast<double>(prev) * static_cast<double>(p) / static_cast<double>(q);
  if (!(r > 0.0)) return 0.0f;  // NaN, negatives, zeros (-inf too)
  if (r >= 1.0) return 1.0f;    // +inf and >= 1
  return static_cast<float>(r);  // round to nearest (r < 1 stays <= 1)
}

// Fixed-point residual weight of one id: floor(clamp(scale * p - q, 0, 1) * 2^40) in float64.
// No FMA can change it: float64(scale) * float64(p) is exact (two float32 significands fit in 53 bits).
SPECDEC_HD int64_t residual_weight(float scale, float p, float q) {
  const double r = static_cast<double>(scale) * static_cast<double>(p) - static_cast<double>(q);
  if (!(r > 0.0)) return 0;                   // NaN, -inf, negatives, zeros
  if (r >= 1.0) return int64_t{1} << 40;      // +inf and >= 1
  return static_cast<int64_t>(r * kWeightScale);  // exact scaling; the cast floors (r > 0)
}

// Z as float64 from the exact int64 sum of the weights.
SPECDEC_HD double residual_mass(int64_t total) { return static_cast<double>(total) / kWeightScale; }

// h_i of Algorithm 2 for draft i (1-based) of a row with n drafts: `total` is the int64
// weight sum of Z(i) (ignored for i >= n), p_i the stored float32 prefix ratio.
SPECDEC_HD double acceptance_threshold(int i, int n, int64_t total, float p_i) {
  if (i > n) return 0.0;
  if (i == n) return static_cast<double>(p_i);
  const double z = residual_mass(total);
  const double denom = z + (1.0 - static_cast<double>(p_i));
  return denom > 0.0 ? z / denom : 1.0;
}

// The strict acceptance test (h = 0 never passes, h = 1 always does for eta in [0, 1)).
// p_i > 0 too (the same law: p_i = 0 gives h_i = 0): a caller's coin below 0 never keeps a slot past
// n_b, an invalid draft or a zero-probability prefix.
SPECDEC_HD bool block_passes(double eta, double h, float p_i) { return eta < h && p_i > 0.0f; }

}  // namespace block
}  // namespace specdec
