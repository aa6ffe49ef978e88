#pragma once
// Warp and block reductions over fixed shuffle trees (no CUB in the minimal toolkit): the same inputs
// always combine in the same order, so a kernel's sums and maxima have the same bits on every run.
// Device code only. An Op combines as op(mine, other); a type of several words crosses lanes through a
// shfl_xor overload in its own namespace (argument lookup finds it, e.g. logit_verify.cu's MaxSum).

#include <cuda_runtime.h>

namespace specdec {
namespace reduce {

constexpr unsigned kFullMask = 0xFFFFFFFFu;

struct Sum {
  template <typename T>
  __device__ __forceinline__ T operator()(T mine, T other) const { return mine + other; }
};

struct MaxF32 {
  __device__ __forceinline__ float operator()(float mine, float other) const { return fmaxf(mine, other); }
};

struct MaxU64 {
  __device__ __forceinline__ unsigned long long operator()(unsigned long long mine,
                                                           unsigned long long other) const {
    return other > mine ? other : mine;
  }
};

// Two int64 sums carried together (the split-V weight totals: residual and plain), one shared slot a warp.
struct I64Pair {
  long long a, b;
};

__device__ __forceinline__ I64Pair operator+(I64Pair mine, I64Pair other) {
  return I64Pair{mine.a + other.a, mine.b + other.b};
}

template <typename T>
__device__ __forceinline__ T shfl_xor(T v, int offset) {
  return __shfl_xor_sync(kFullMask, v, offset);
}

__device__ __forceinline__ I64Pair shfl_xor(I64Pair v, int offset) {
  return I64Pair{shfl_xor(v.a, offset), shfl_xor(v.b, offset)};
}

// Butterfly over groups of kWidth lanes (offsets kWidth/2, ..., 2, 1): every lane of a group ends with the
// same value.
template <int kWidth = 32, typename T, typename Op>
__device__ __forceinline__ T warp_all(T v, Op op) {
  static_assert(kWidth >= 2 && kWidth <= 32 && (kWidth & (kWidth - 1)) == 0, "a power-of-two lane group");
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset >>= 1) v = op(v, shfl_xor(v, offset));
  return v;
}

// The first step of both block trees: each warp combines its lanes and lane 0 stores the warp's result in
// scratch[warp]; then a barrier. Returns the warp's result (every lane).
template <int kWarps, typename T, typename Op>
__device__ __forceinline__ T warp_results_to_scratch(T v, T* scratch, Op op) {
  static_assert(kWarps >= 1 && kWarps <= 32, "block size");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_all(v, op);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return v;
}

// The block's combination, valid in warp 0 (callers read it in thread 0): warp 0 combines the warps' results,
// lanes past kWarps holding `identity`. Contains __syncthreads(): every thread of the block must call it;
// scratch holds kWarps slots.
template <int kWarps, typename T, typename Op>
__device__ __forceinline__ T block_to_warp0(T v, T* scratch, T identity, Op op) {
  v = warp_results_to_scratch<kWarps>(v, scratch, op);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (warp == 0) v = warp_all(lane < kWarps ? scratch[lane] : identity, op);
  return v;
}

// The block's combination, to every thread: every thread folds the warps' results in warp order,
// op(...op(op(init, warp 0), warp 1)..., warp kWarps-1). Contains __syncthreads() but none after the fold: a
// caller that reuses scratch puts a barrier in between.
template <int kWarps, typename T, typename Op>
__device__ __forceinline__ T block_all(T v, T* scratch, T init, Op op) {
  warp_results_to_scratch<kWarps>(v, scratch, op);
  T total = init;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total = op(total, scratch[w]);
  return total;
}

}  // namespace reduce
}  // namespace specdec
