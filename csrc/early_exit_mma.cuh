#pragma once
// Fragment arithmetic of the tensor-core early_exit_topk kernel (early_exit.cu,
// early_exit_mma_kernel), host- and device-compilable, so the CPU emulation in
// bind_early_exit.cpp (host_early_exit_mma) runs the kernel's own index math.
//
// One warp computes D[16 vocab rows x 8 batch columns] += A * B with
// mma.sync.m16n8k16.row.col: A = 16 rows x 16 hidden of the LM head (row-major, W's
// natural [V, H] layout), B = 16 hidden x 8 batch columns of norm(hidden) ("col":
// hn[b, h] contiguous in h), fp32 accumulators.

#include <cstdint>
#include <cstring>

#include "ordered_key.cuh"

namespace specdec {
namespace early_exit {

constexpr int kMmaWarps = 8;      // warps of early_exit_mma_kernel
constexpr int kChunk = 32;        // hidden columns per 16-byte-per-lane load step (two k-steps)
constexpr int kMmaMaxNTiles = 8;  // batch columns per CTA: 8 * n-tiles <= 64

// ---- dtype codes (csrc/common.cuh): 1 float16, 2 bfloat16 -------------------------
SPECDEC_HD float f32_from_bits(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof(x));
  return x;
}
SPECDEC_HD uint32_t bits_from_f32(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof(u));
  return u;
}

// Round-to-nearest-even float32 -> bfloat16 bits (NaN stays a quiet NaN).
SPECDEC_HD uint16_t bf16_bits(float x) {
  const uint32_t u = bits_from_f32(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  const uint32_t rounded = u + 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

// Round-to-nearest-even float32 -> float16 bits, subnormals and overflow to inf included.
SPECDEC_HD uint16_t f16_bits(float x) {
  const uint32_t u = bits_from_f32(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t mag = u & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);  // NaN
  if (mag >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to >= 65536: inf
  if (mag < 0x38800000u) {  // below 2^-14: subnormal half (or zero)
    if (mag < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25: rounds to 0 (ties to even 0)
    const uint32_t e = mag >> 23;                                // 102..112
    const uint32_t m = (mag & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126u - e;                             // value = m * 2^(e-150); half ulp 2^-24
    const uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    const uint32_t r = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
    return static_cast<uint16_t>(sign | r);
  }
  const uint32_t rounded = mag + 0xFFFu + ((mag >> 13) & 1u);  // RNE at bit 13
  return static_cast<uint16_t>(sign | (((rounded >> 13) - (112u << 10)) & 0x7FFFu));
}

SPECDEC_HD float f16_value(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1Fu) return f32_from_bits(sign | 0x7F800000u | (m << 13));
  if (e == 0) {  // subnormal: m * 2^-24, exact in float32
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

SPECDEC_HD float bf16_value(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

SPECDEC_HD uint16_t to_bits16(float x, int dtype) { return dtype == 2 ? bf16_bits(x) : f16_bits(x); }
SPECDEC_HD float from_bits16(uint16_t h, int dtype) { return dtype == 2 ? bf16_value(h) : f16_value(h); }

// The hi/lo split of one normalised value: hi = x rounded to the weight dtype, lo = (x - hi)
// rounded (0 where that is NaN: x = +-inf, carried by hi). Two MMAs per step (hi, lo) keep
// ~16 mantissa bits of the fp32 normalised hidden state (the Triton backend's DOT_SPLIT16).
SPECDEC_HD void split_hi_lo(float x, int dtype, uint16_t& hi, uint16_t& lo) {
  hi = to_bits16(x, dtype);
  const float rest = x - from_bits16(hi, dtype);
  lo = to_bits16(rest == rest ? rest : 0.0f, dtype);
}

// ---- the PTX m16n8k16 fragment layout (f16/bf16 inputs, f32 accumulators) ------------
// A (row-major 16x16): 4 regs x 2 halves, element e = 2 * reg + half.
SPECDEC_HD int mma_a_row(int lane, int e) { return (lane >> 2) + ((e >> 1) & 1) * 8; }
SPECDEC_HD int mma_a_col(int lane, int e) { return (lane & 3) * 2 + (e & 1) + (e >> 2) * 8; }
// B ("col" 16x8): 2 regs x 2 halves, element e = 2 * reg + half: (k, n).
SPECDEC_HD int mma_b_k(int lane, int e) { return (lane & 3) * 2 + (e & 1) + (e >> 1) * 8; }
SPECDEC_HD int mma_b_n(int lane, int e) { return lane >> 2; }
// C / D (16x8 fp32): 4 regs.
SPECDEC_HD int mma_c_row(int lane, int i) { return (lane >> 2) + (i >> 1) * 8; }
SPECDEC_HD int mma_c_col(int lane, int i) { return (lane & 3) * 2 + (i & 1); }

// ---- the kernel's loads: which 16 bytes a lane reads, which words feed which register -----
// The k order inside a 32-column chunk is permuted so that every operand comes from one
// 16-byte load per lane: lane (g = lane / 4, t = lane % 4) loads the 8 columns
// [32c + 8t, 32c + 8t + 8) of W rows g and g + 8 and of hn column g, i.e. four 32-bit
// words w0..w3. k-step s in {0, 1} of the chunk takes words 2s and 2s + 1: A regs
// {row g: w[2s], row g+8: w[2s], row g: w[2s+1], row g+8: w[2s+1]}, B regs {w[2s],
// w[2s+1]}. By the PTX layout (mma_a_*, mma_b_*) logical k 2t+e then sits at physical
// column 8t + 4s + e and logical k 2t+8+e at 8t + 4s + 2 + e in both operands, a
// bijection of the chunk's 32 columns: the dot product is unchanged.
//
// Row of the m-tile (A) or batch column of the n-tile (B) that lane's load `half` reads
// (A: half 0 -> row g, half 1 -> row g + 8; B: column g).
SPECDEC_HD int load_row(int lane, int half) { return (lane >> 2) + half * 8; }
// First of the 8 columns (inside the 32-column chunk) the lane's 16-byte load covers.
SPECDEC_HD int load_col(int lane) { return (lane & 3) * 8; }

// A registers of k-step s from the words of rows g (r0) and g + 8 (r8).
SPECDEC_HD void a_regs(const uint32_t (&r0)[4], const uint32_t (&r8)[4], int s, uint32_t (&a)[4]) {
  a[0] = r0[2 * s];
  a[1] = r8[2 * s];
  a[2] = r0[2 * s + 1];
  a[3] = r8[2 * s + 1];
}
// B registers of k-step s from the words of batch column g.
SPECDEC_HD void b_regs(const uint32_t (&col)[4], int s, uint32_t& b0, uint32_t& b1) {
  b0 = col[2 * s];
  b1 = col[2 * s + 1];
}

// Shared-memory row stride (elements) of the hn tiles: a multiple of 32 that is an odd
// multiple of 32, so rows g and g + 1 of one 8-lane phase of a 16-byte load fall in
// different halves of the 32 banks (conflict-free).
SPECDEC_HD int64_t smem_stride(int64_t k_block) { return k_block % 64 == 0 ? k_block + 32 : k_block; }

// The m-tiles per warp for an n-tile count: two when the batch is wide, so each B fragment
// read from shared memory serves 32 vocabulary rows.
SPECDEC_HD int m_tiles_for(int n_tiles) { return n_tiles >= 4 ? 2 : 1; }
// Vocabulary rows one CTA step covers.
SPECDEC_HD int vocab_tile(int n_tiles) { return kMmaWarps * 16 * m_tiles_for(n_tiles); }
// n-tiles per CTA for a batch of B: the fewest 8-column tiles that cover B, at most 8.
SPECDEC_HD int n_tiles_for(int64_t B) {
  const int64_t tiles = (B + 7) / 8;
  if (tiles <= 1) return 1;
  if (tiles <= 2) return 2;
  if (tiles <= 4) return 4;
  return kMmaMaxNTiles;
}

// The epilogue: vocabulary id and batch column of accumulator i of (m-tile mt, n-tile nt)
// of the warp whose tile starts at vocabulary row v_warp.
SPECDEC_HD int64_t epilogue_vocab(int64_t v_warp, int mt, int lane, int i) {
  return v_warp + mt * 16 + mma_c_row(lane, i);
}
SPECDEC_HD int epilogue_col(int nt, int lane, int i) { return nt * 8 + mma_c_col(lane, i); }

}  // namespace early_exit
}  // namespace specdec
