#pragma once
// Host launcher of tree / chain verification attention (csrc/attention.cu;
// specification: specdec_kernels/reference/attention.py). Plain C++ types only,
// so bind_attention.cpp builds with the host compiler.
//
// One launch per call, no host synchronisation, no allocation: CUDA-graph
// capturable. Bad arguments throw std::invalid_argument; CUDA errors throw
// std::runtime_error.
//
// Shapes (element strides everywhere, unit stride on the head dim D):
//   q    [B, N, Hq, D]  float32 / float16 / bfloat16 (dtype code as in common.cuh)
//   out  [B, N, Hq, D]  q's dtype, written through its own strides
//   lse  [B, N, Hq]     float32, contiguous
//   K/V  contiguous:    [B, Hkv, S_max, D]              (outer index = b, slot = position)
//        paged:         [num_pages, page_size, Hkv, D]  (outer index = page, slot = position % page_size)
//   seq_lens [B], parents [B, N] (or absent: causal chain), block_table [B, max_pages]: int32 or int64.

#include <cstdint>

#include <cuda_runtime_api.h>

namespace specdec {

// An int32 or int64 index tensor addressed with element strides (stride1 is
// unused for 1-D tensors). data == nullptr means "absent".
struct IndexTensor {
  const void* data;
  int is_int64;
  int64_t stride0;
  int64_t stride1;
};

// One K or V cache: element strides of its outer dim (b or page), its slot
// dim (position or slot in page) and its head dim.
struct KvTensor {
  const void* data;
  int64_t stride_outer;
  int64_t stride_slot;
  int64_t stride_head;
};

struct TreeAttentionArgs {
  const void* q;
  int64_t q_stride_b, q_stride_n, q_stride_h;
  KvTensor k, v;
  IndexTensor seq_lens;     // [B]
  IndexTensor parents;      // [B, N] or absent (chain)
  IndexTensor block_table;  // [B, max_pages] or absent (contiguous K/V)
  int64_t page_size;        // paged only
  int64_t num_pages;        // paged only: page ids outside [0, num_pages) read as zeros
  int64_t max_pages;        // paged only
  int64_t s_max;            // contiguous only
  void* out;
  int64_t out_stride_b, out_stride_n, out_stride_h;
  float* lse;
  int64_t B, N, Hq, Hkv, D;
  float sm_scale;
  int dtype;
};

// How a call is cut into CTAs, and the buffers that takes.
//  path:      0 SIMT (float32, or a head dim without an MMA kernel), 1 tensor cores.
//  block_m:   packed query rows (node x query head of one KV head) per CTA.
//  m_tiles:   ceil(N * Hq / Hkv / block_m).
//  splits:    most prefix splits per row (rows split evenly by their own length).
//  counter_bytes: zeroed uint32 tickets, one per (b, KV head, m_tile); left zeroed.
//  partial_bytes: scratch for the splits' partial states; need not be zeroed.
// Both sizes are 0 when splits == 1 (every CTA writes its rows directly).
struct TreeAttentionPlan {
  int path;
  int block_m;
  int m_tiles;
  int splits;
  uint64_t counter_bytes;
  uint64_t partial_bytes;
};

// The plan as a pure function of the shapes, the SM count and how many CTAs
// of the chosen kernel fit on one SM (host-testable).
TreeAttentionPlan plan_tree_attention(int64_t B, int64_t N, int64_t Hq, int64_t Hkv, int64_t D,
                                      int64_t kv_capacity, int dtype, int sms, int ctas_per_sm);

// The plan on the current device (SM count and occupancy of the kernel it picks).
TreeAttentionPlan tree_attention_plan_for_device(int64_t B, int64_t N, int64_t Hq, int64_t Hkv,
                                                 int64_t D, int64_t kv_capacity, int dtype);

// counters: >= plan.counter_bytes zeroed bytes (4-byte aligned), handed back zeroed.
// partials: >= plan.partial_bytes bytes (16-byte aligned). Either may be null when
// the plan needs 0 bytes.
void launch_tree_attention(const TreeAttentionArgs& args, void* counters, uint64_t counter_bytes,
                           void* partials, uint64_t partial_bytes, cudaStream_t stream);

}  // namespace specdec
