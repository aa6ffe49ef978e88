#pragma once
// The softmax-statistics launch of the logits sampling ops (rejection_sample_logits,
// block_verify_logits): the first of their two launches (csrc/softmax_stats.cu). Plain C++
// types only, so the launchers that call it build with any compiler that sees this header.
//
// Grid (B, 2G+1, splits): block (b, r, s) reduces chunk s of row r (r <= G: target row r;
// r > G: draft row r-G-1; rows a batch row with n drafts never uses exit at once) to the
// partial (max m, sum of exp(x/T - m)); the last block of batch row b (ticket) merges each
// used row's partials in a fixed order into merged[b][r] and hands its partials and its
// counter back zeroed. The second launch reads `merged` and zeroes it when done.

#include <cstdint>

#include <cuda_runtime_api.h>

#include "launch_plan.h"

namespace specdec {

// num_draft_tokens [B] (int32 or int64, element stride), or data == nullptr (= G for every row).
struct RowCounts {
  const void* data;
  bool is_int64;
  int64_t stride;
};

// The statistics buffers, inside the caller's zeroed workspace.
struct SoftmaxStatsBuffers {
  float2* partials;        // [B * (2G+1)][stride]
  float2* merged;          // [B * (2G+1)]
  unsigned int* counters;  // [B]
  int64_t stride;          // >= the launch's splits
};

// Enqueues softmax_stats_kernel with `launch` (its plan: grid (B, 2G+1, splits), kThreads) and
// V-chunks of `chunk` elements. dtype: 0 float32, 1 float16, 2 bfloat16. temperatures: float32
// [B] with `temp_stride`, or null (the scalar `temperature`).
void launch_softmax_stats(const void* target, int64_t t_sb, int64_t t_sg, const void* draft, int64_t q_sb,
                          int64_t q_sg, RowCounts counts, float temperature, const float* temperatures,
                          int64_t temp_stride, const SoftmaxStatsBuffers& buffers, int64_t G, int64_t V,
                          int64_t chunk, int dtype, const plans::Launch& launch, cudaStream_t stream);

}  // namespace specdec
