#pragma once
// Counter-based randomness and fixed-point sampling arithmetic, bit-identical to
// specdec_kernels/common/rng.py and common/sampling.py (the specification).
//
// Everything here is `SPECDEC_HD`: compiled for the device by nvcc and for the
// host by the C++ compiler, so CPU-only CI checks these exact functions against
// the torch reference through `_C.host_*` (bind_host_math.cpp) even where no GPU
// can run the kernels that use them.
//
// No fused multiply-add can change a result: every float64 expression below is a
// single rounding (one product, or a product compared with a value).

#include <cstdint>

#include "host_device.cuh"

namespace specdec {

// Salts of the counter's third word (common/rng.py).
constexpr uint32_t kSaltAccept = 0;  // the coin that accepts or rejects a drafted token
constexpr uint32_t kSaltFinal = 1;   // the draw of the correction / bonus token

SPECDEC_HD uint32_t mulhi32(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}

struct Philox4 {
  uint32_t x0, x1, x2, x3;
};

// Philox-4x32-10 (Salmon et al. 2011; Random123's constants).
SPECDEC_HD Philox4 philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                              uint32_t k1) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = mulhi32(c0, 0xD2511F53u), lo0 = c0 * 0xD2511F53u;
    const uint32_t hi1 = mulhi32(c2, 0xCD9E8D57u), lo1 = c2 * 0xCD9E8D57u;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {c0, c1, c2, c3};
}

// rng.philox_uniform(seed, position, row_key, salt, extra): a float64 in [0, 1)
// with 53 random bits. Only the low 32 bits of position/row_key/extra enter the
// counter; the 64-bit seed is the key (low word, high word).
SPECDEC_HD double philox_uniform(int64_t seed, int64_t position, int64_t row_key, uint32_t salt,
                                 int64_t extra) {
  const uint64_t s = static_cast<uint64_t>(seed);
  const Philox4 r = philox4x32(static_cast<uint32_t>(position), static_cast<uint32_t>(row_key), salt,
                               static_cast<uint32_t>(extra), static_cast<uint32_t>(s),
                               static_cast<uint32_t>(s >> 32));
  const uint64_t bits53 = (static_cast<uint64_t>(r.x0 >> 5) << 26) | static_cast<uint64_t>(r.x1 >> 6);
  return static_cast<double>(bits53) * 0x1.0p-53;
}

// sampling.to_weights for one element: floor(clamp(x, 0, 1) * 2^40) with NaN -> 0,
// +inf -> 1, -inf -> 0. x * 2^40 is exact in float32 and x >= 0, so the cast floors.
SPECDEC_HD int64_t to_weight(float x) {
  if (!(x > 0.0f)) return 0;  // NaN, -inf, negatives and zeros
  if (x >= 1.0f) return int64_t{1} << 40;
  return static_cast<int64_t>(x * 1099511627776.0f);
}

// floor(u * total), kept in [0, total - 1]: the inverse-CDF threshold for total >= 0.
// The drawn token is the first whose inclusive cumulative weight exceeds it. For u in
// [0, 1) the clamp never acts; it keeps the draw inside the row when a GPU caller's
// unvalidated uniform is 1.0 (a float64 near 1 rounded to float32), above 1, or NaN.
SPECDEC_HD int64_t draw_threshold(double u, int64_t total) {
  double x = u * static_cast<double>(total);
  x = x >= 0.0 ? (x < 0x1.0p62 ? x : 0x1.0p62) : 0.0;  // NaN and negatives -> 0; no overflow
  const int64_t t = static_cast<int64_t>(x);
  const int64_t last = total > 0 ? total - 1 : 0;
  return t < last ? t : last;
}

// The chain acceptance test u * q(x) < p(x) in float64 (q == 0 < p accepts; p == 0
// and NaN never accept).
SPECDEC_HD bool accept_draft(double u, float q, float p) {
  return u * static_cast<double>(q) < static_cast<double>(p);
}

}  // namespace specdec
