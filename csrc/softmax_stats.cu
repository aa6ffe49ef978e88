// The softmax statistics of every row a batch row of a logits sampling op uses (target rows
// 0..n, draft rows 0..n-1), reduced per V-chunk and merged per row in a fixed order: what
// rejection_sample_logits and block_verify_logits read before they sample (softmax_stats.h).
// The per-chunk partials come from split_v_sampling.cuh's thread_softmax_partial /
// block_softmax_stats, the merge from warp_merge_softmax: a row's (M, S) depends only on its
// data and the chunk plan, so both ops see the same statistics for the same rows.

#include "softmax_stats.h"

#include "common.cuh"
#include "dtype_dispatch.cuh"
#include "launch_utils.h"
#include "split_v_sampling.cuh"

namespace specdec {
namespace {

using namespace split_v;
static_assert(kThreads == plans::kBlockVerifyThreads && kThreads == plans::kRejectionThreads,
              "launch_plan.h plans this kernel with the sampling kernels' block size");

__device__ __forceinline__ int drafts_in_row(const RowCounts& counts, int64_t b, int G) {
  if (counts.data == nullptr) return G;
  const int64_t n = counts.is_int64 ? static_cast<const int64_t*>(counts.data)[b * counts.stride]
                                    : static_cast<int64_t>(static_cast<const int32_t*>(counts.data)[b * counts.stride]);
  return n < 0 ? 0 : (n > G ? G : static_cast<int>(n));
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
softmax_stats_kernel(const T* __restrict__ target, int64_t t_sb, int64_t t_sg, const T* __restrict__ draft,
                     int64_t q_sb, int64_t q_sg, RowCounts counts, float temperature,
                     const float* __restrict__ temperatures, int64_t temp_stride, SoftmaxStatsBuffers buf, int G,
                     int V, int64_t chunk) {
  __shared__ float scratch_m[kWarps], scratch_s[kWarps];
  __shared__ bool s_is_last;

  const int64_t b = blockIdx.x;
  const int r = static_cast<int>(blockIdx.y);
  const int64_t split = blockIdx.z;
  const int R = 2 * G + 1;
  const int splits = static_cast<int>(gridDim.z);
  const int n = drafts_in_row(counts, b, G);
  if (!logits_row_needed(r, n, G)) return;  // leaves before any barrier, not counted
  const float t = temperatures != nullptr ? temperatures[b * temp_stride] : temperature;

  // ---- partial statistics of this chunk of row r -----------------------------------------
  const T* row = r <= G ? target + b * t_sb + r * t_sg : draft + b * q_sb + (r - G - 1) * q_sg;
  const int64_t start = split * chunk;
  const int64_t end = min(static_cast<int64_t>(V), start + chunk);
  const bool vec = aligned16(row);
  float m, s;  // online max / rescaled sum over this thread's finite x / t
  bool bad;    // a NaN or +inf: torch's whole softmax row is NaN
  thread_softmax_partial(row, start, end, vec, t, m, s, bad);
  const float2 part = block_softmax_stats(m, s, bad, scratch_m, scratch_s);
  if (threadIdx.x == 0) {
    __stcg(&buf.partials[(b * R + r) * buf.stride + split], part);
    __threadfence();  // visible device-wide before we count ourselves done
    const unsigned int blocks_in_row = static_cast<unsigned int>(splits) * static_cast<unsigned int>(2 * n + 1);
    s_is_last = atomicAdd(&buf.counters[b], 1u) == blocks_in_row - 1u;
  }
  __syncthreads();
  if (!s_is_last) return;  // uniform across the block
  __threadfence();         // pairs with the writers' fences

  // ---- last block: merge each used row's partials (one warp per row, fixed order) -------
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int rr = warp; rr < R; rr += kWarps) {
    if (!logits_row_needed(rr, n, G)) continue;  // warp-uniform
    const float2 ms = warp_merge_softmax(buf.partials + (b * R + rr) * buf.stride, splits, lane);
    if (lane == 0) __stcg(&buf.merged[b * R + rr], ms);
  }
  __syncthreads();  // every read of the partials is done
  for (int idx = threadIdx.x; idx < R * splits; idx += kThreads) {
    if (logits_row_needed(idx / splits, n, G)) {
      __stcg(&buf.partials[(b * R + idx / splits) * buf.stride + idx % splits], make_float2(0.0f, 0.0f));
    }
  }
  if (threadIdx.x == 0) buf.counters[b] = 0;
}

template <typename T>
void launch_typed(const void* target, int64_t t_sb, int64_t t_sg, const void* draft, int64_t q_sb, int64_t q_sg,
                  RowCounts counts, float temperature, const float* temperatures, int64_t temp_stride,
                  const SoftmaxStatsBuffers& buffers, int64_t G, int64_t V, int64_t chunk, const plans::Launch& l,
                  cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(l.grid[0]), static_cast<unsigned>(l.grid[1]), static_cast<unsigned>(l.grid[2]));
  softmax_stats_kernel<T><<<grid, l.block, l.dynamic_smem, stream>>>(
      static_cast<const T*>(target), t_sb, t_sg, static_cast<const T*>(draft), q_sb, q_sg, counts, temperature,
      temperatures, temp_stride, buffers, static_cast<int>(G), static_cast<int>(V), chunk);
}

}  // namespace

void launch_softmax_stats(const void* target, int64_t t_sb, int64_t t_sg, const void* draft, int64_t q_sb,
                          int64_t q_sg, RowCounts counts, float temperature, const float* temperatures,
                          int64_t temp_stride, const SoftmaxStatsBuffers& buffers, int64_t G, int64_t V,
                          int64_t chunk, int dtype, const plans::Launch& launch, cudaStream_t stream) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_typed<T>(target, t_sb, t_sg, draft, q_sb, q_sg, counts, temperature, temperatures, temp_stride, buffers, G,
                    V, chunk, launch, stream);
  });
  SPECDEC_CUDA_CHECK(cudaGetLastError());
}

}  // namespace specdec
