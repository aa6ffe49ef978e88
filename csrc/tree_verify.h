#pragma once
// Host launchers of the token-tree verification ops (csrc/tree_verify.cu).
// Plain C++ types only, so bind_tree_verify.cpp builds with the host compiler.
//
// Both launchers enqueue exactly one kernel on `stream`, never synchronise and
// never allocate, so they are CUDA-graph capturable. Bad arguments throw
// std::invalid_argument; CUDA errors throw std::runtime_error.

#include <cstdint>

#include <cuda_runtime_api.h>

namespace specdec {

// Tree format (reference/tree.py): parents [B, N] int64, node 0 the root, node
// i > 0 a child of parents[b, i] (the kernels treat any value outside [0, N)
// as "unused slot"); children are tried in increasing index. Every [B, N] int64
// input is addressed with explicit element strides (stride_b, stride_n), so
// non-contiguous views need no copy. Values are never trusted: any parents or
// tree_tokens value keeps every access in bounds (a token outside [0, V) is
// simply never accepted).
//
// Outputs (int64, contiguous, every element written): out_tokens [B, D+1],
// num_accepted [B], accepted_nodes [B, D+1], D = max_depth.

// A [B, N] int64 tensor with element strides.
struct IndexMatrix {
  const int64_t* data;
  int64_t stride_b;
  int64_t stride_n;
};

// Bytes of zeroed workspace tree_greedy_verify needs: B*N uint64 argmax keys
// then B uint32 per-row counters. The kernel leaves every byte zeroed, so one
// zeroed buffer is reused across calls and graph replays on one stream.
uint64_t tree_greedy_verify_workspace_bytes(int64_t B, int64_t N);

// logits: [B, N, V] of `dtype` (0 fp32, 1 fp16, 2 bf16), last dim contiguous,
// element strides stride_b / stride_n. workspace: the zeroed bytes above,
// 8-byte aligned.
void launch_tree_greedy_verify(const void* logits, int64_t stride_b, int64_t stride_n,
                               IndexMatrix tree_tokens, IndexMatrix parents, int64_t* out_tokens,
                               int64_t* num_accepted, int64_t* accepted_nodes, void* workspace,
                               int64_t B, int64_t N, int64_t V, int64_t max_depth, int dtype,
                               cudaStream_t stream);

// Randomness of tree_rejection_sample: either `uniforms` [B, N] (float64 when
// uniforms_double, else float32; element strides) or Philox keyed by `seeds`
// ([B] int64 with element stride seeds_stride, row key 0) or, when seeds is
// null, by the scalar `seed` (row key b). offsets: [B] int64 (stride) or null.
struct TreeRandomness {
  const void* uniforms;
  int uniforms_double;
  int64_t uniforms_stride_b;
  int64_t uniforms_stride_n;
  int64_t seed;
  const int64_t* seeds;
  int64_t seeds_stride;
  const int64_t* offsets;
  int64_t offsets_stride;
};

// Launch plan of tree_rejection_sample (plans::plan_tree_rejection_sample on the current device
// when arch == 0, else on the sm_80 / sm_90 table): grid (blocks = B, chunks), `threads` per CTA,
// `chunk` elements per V-chunk. Two buffers, neither growing with V: `workspace_bytes` of scratch
// (per row: the walk state, the rank table of 2N int64, the chunk sums of at most 128 chunks;
// every word is written before it is read, so it need not be zeroed and is left as garbage) and
// `zeroed_bytes` of ticket words (128 bytes per row) that must be zeroed and are left zeroed.
// The cluster form (sm_90): grid (blocks * cluster) in clusters of `cluster` CTAs, `chunks` == cluster
// slices of `chunk` ids; scratch of the state and rank table only, zeroed_bytes 0 (no tickets).
struct TreeRejectionPlan {
  int64_t blocks;
  int64_t chunks;
  int64_t chunk;
  int threads;
  uint64_t workspace_bytes;
  uint64_t zeroed_bytes;
  int cluster;  // CTAs per thread-block cluster (the cluster form: grid (blocks * cluster)), 0 for the split form
  int form;     // plans::kTreeFormSplit (1) or kTreeFormCluster (2)
};
// form: 0 auto (the cluster form on sm_90 where it fits), 1 split, 2 cluster (refused where it cannot run).
TreeRejectionPlan tree_rejection_sample_plan(int64_t B, int64_t N, int64_t V, int arch = 0, int form = 0);

// The current device's cluster facts as the plan reads them (plans::ClusterFacts, queried once per device):
// the virtual arch of the cluster kernel's code this device runs, and active[C] for C in 0..16.
void tree_cluster_facts(int* code_arch, int* active);

// target_probs / draft_probs: [B, N, V] of `dtype`, last dim contiguous, with
// their own element strides. workspace: plan.workspace_bytes, 8-byte aligned, any content;
// zeroed_workspace: plan.zeroed_bytes, zeroed and 8-byte aligned, left zeroed.
// without_replacement: siblings drawn from one q without replacement (draft row v
// is the q v's children came from; reference `_WithoutReplacement`), else each
// child c from its own q = draft row c. The plan and workspaces are the same.
void launch_tree_rejection_sample(const void* target_probs, int64_t target_stride_b,
                                  int64_t target_stride_n, const void* draft_probs,
                                  int64_t draft_stride_b, int64_t draft_stride_n,
                                  IndexMatrix tree_tokens, IndexMatrix parents,
                                  TreeRandomness randomness, int64_t* out_tokens,
                                  int64_t* num_accepted, int64_t* accepted_nodes, void* workspace,
                                  void* zeroed_workspace, int64_t B, int64_t N, int64_t V, int64_t max_depth,
                                  int dtype, cudaStream_t stream, bool without_replacement = false, int form = 0);

}  // namespace specdec
