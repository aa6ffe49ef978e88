#pragma once
// Where the split-V chain sampling kernels (rejection_sampling.cu, block_verification.cu) find P and Q
// of a position: a probability row read as it is (ProbRows), or a logits row turned into
// softmax(x / T) on the fly from the row's merged statistics (LogitRows; the statistics come
// from softmax_stats.cu's launch, which runs first). The kernels are templates over these, so
// one body serves the probability op and its logits twin.

#include <cstdint>

#include "common.cuh"
#include "split_v_sampling.cuh"

namespace specdec {

template <typename T>
struct ProbRows {
  using Prob = split_v::Identity;
  const T* target;
  int64_t t_sb, t_sg;
  const T* draft;
  int64_t q_sb, q_sg;
  __device__ __forceinline__ const T* target_row(int64_t b, int j) const { return target + b * t_sb + j * t_sg; }
  __device__ __forceinline__ const T* draft_row(int64_t b, int j) const { return draft + b * q_sb + j * q_sg; }
  __device__ __forceinline__ split_v::Identity target_prob(int64_t, int) const { return {}; }
  __device__ __forceinline__ split_v::Identity draft_prob(int64_t, int) const { return {}; }
  __device__ __forceinline__ void release(int64_t, int) const {}
};

template <typename T>
struct LogitRows {
  using Prob = split_v::SoftmaxProb;
  const T* target;
  int64_t t_sb, t_sg;
  const T* draft;
  int64_t q_sb, q_sg;
  float2* merged;  // [B][2G+1] (m, s): target rows 0..G, then draft rows 0..G-1
  int G;
  float temperature;
  const float* temperatures;  // [B] with `temp_stride`, or null
  int64_t temp_stride;
  __device__ __forceinline__ const T* target_row(int64_t b, int j) const { return target + b * t_sb + j * t_sg; }
  __device__ __forceinline__ const T* draft_row(int64_t b, int j) const { return draft + b * q_sb + j * q_sg; }
  __device__ __forceinline__ float temp(int64_t b) const {
    return temperatures != nullptr ? temperatures[b * temp_stride] : temperature;
  }
  __device__ __forceinline__ split_v::SoftmaxProb prob_of(int64_t b, int r) const {
    const float2 st = __ldcg(&merged[b * (2 * G + 1) + r]);  // written by the statistics kernel
    return split_v::SoftmaxProb{temp(b), st.x, st.y};
  }
  __device__ __forceinline__ split_v::SoftmaxProb target_prob(int64_t b, int j) const { return prob_of(b, j); }
  __device__ __forceinline__ split_v::SoftmaxProb draft_prob(int64_t b, int j) const { return prob_of(b, G + 1 + j); }
  // The last block of row b returns the merged statistics of the rows it used to zero.
  __device__ __forceinline__ void release(int64_t b, int n) const {
    for (int r = threadIdx.x; r < 2 * G + 1; r += split_v::kThreads) {
      if (split_v::logits_row_needed(r, n, G)) __stcg(&merged[b * (2 * G + 1) + r], make_float2(0.0f, 0.0f));
    }
  }
};

}  // namespace specdec
