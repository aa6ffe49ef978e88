#pragma once
// Pieces shared by the split-V verification kernels (logit_verify_greedy.cu,
// logit_verify.cu, tree_verify.cu): the split plan, ragged draft counts and the packed argmax.
//
// Grid layout of those kernels: (B, G+1, splits), B in grid x so that it may exceed
// 65535 (splits <= 4 per SM stays far below grid z's limit). Block (b, pos, s) reduces the
// V-chunk [s*chunk, min(V, (s+1)*chunk)) of logits[b, pos]; the last block of
// batch row b (per-row atomic counter) applies the accept rule.

#include <algorithm>
#include <cstdint>

#include "common.cuh"
#include "launch_utils.h"

namespace specdec {
namespace chain {

// The split plan (V-chunk per CTA) is plans::chain_splits (launch_plan.h), shared
// with the CPU tests.

// Drafts that exist in batch row b: num_draft_tokens[b] clamped to [0, G]
// (all G when num_draft_tokens is null).
__device__ __forceinline__ int drafts_in_row(const int64_t* num_draft_tokens, int b, int G) {
  if (num_draft_tokens == nullptr) return G;
  const int64_t n = num_draft_tokens[b];
  return n < 0 ? 0 : (n > G ? G : static_cast<int>(n));
}

// Each thread visits its indices in increasing order, so a strict '>' keeps
// the lowest index among equal values.
__device__ __forceinline__ void consider(float v, int64_t idx, uint32_t& best_ord,
                                         uint32_t& best_idx) {
  const uint32_t ord = order_preserving_bits(v);
  if (ord > best_ord) {
    best_ord = ord;
    best_idx = static_cast<uint32_t>(idx);
  }
}

// Packed argmax key of row[start, end) over the whole block (valid in thread 0;
// contains __syncthreads(): every thread must call it). 16-byte vector loads when
// the chunk start is aligned (uniform per block), scalar loads for the tail.
template <typename T, int kThreads>
__device__ __forceinline__ unsigned long long chunk_argmax_key(const T* row, int64_t start, int64_t end,
                                                               unsigned long long* warp_scratch) {
  uint32_t best_ord = 0;            // below every real element, even -inf/NaN
  uint32_t best_idx = 0xFFFFFFFFu;  // -> key 0 for threads with no element
  int64_t scalar_from = start;
  if (reinterpret_cast<uintptr_t>(row + start) % 16 == 0) {
    constexpr int kVec = Vec16<T>::kElems;
    const int64_t num_vec = (end - start) / kVec;
    const T* base = row + start;
#pragma unroll 4
    for (int64_t v = threadIdx.x; v < num_vec; v += kThreads) {
      float vals[kVec];
      load_vec16(base + v * kVec, vals);
#pragma unroll
      for (int k = 0; k < kVec; ++k) consider(vals[k], start + v * kVec + k, best_ord, best_idx);
    }
    scalar_from = start + num_vec * kVec;  // tail indices exceed all vector ones
  }
  for (int64_t idx = scalar_from + threadIdx.x; idx < end; idx += kThreads) {
    consider(to_float(row[idx]), idx, best_ord, best_idx);
  }
  return block_max_u64<kThreads>(make_argmax_key(best_ord, best_idx), warp_scratch);
}

// Keys always come from a real element, so the index is < V; the clamp only
// guarantees a valid token id even if that invariant were ever broken.
__device__ __forceinline__ int64_t key_to_token(unsigned long long key, int V) {
  const uint32_t idx = argmax_key_index(key);
  return idx < static_cast<uint32_t>(V) ? static_cast<int64_t>(idx) : 0;
}

}  // namespace chain
}  // namespace specdec
