#pragma once
// Host launchers of block verification of chain drafts (Sun et al. 2025, Algorithm 2;
// csrc/block_verification.cu; specification: specdec_kernels/reference/block_verification.py).
// Plain C++ types only, so the bindings build with the host compiler.
//
// No synchronisation, no allocation (CUDA-graph capturable): block_verify enqueues one
// kernel on `stream`, block_verify_logits two (softmax statistics, then the verification).
// Bad arguments throw std::invalid_argument; CUDA errors throw std::runtime_error.

#include <cstdint>

#include <cuda_runtime_api.h>

namespace specdec {

// An int32 or int64 index tensor with element strides (stride1 unused for 1-D);
// data == nullptr means absent.
struct BlockIndex {
  const void* data;
  bool is_int64;
  int64_t stride0;
  int64_t stride1;
};

// Where eta_1..eta_g and the final uniform come from.
struct BlockRandomness {
  const void* uniforms;   // [B, G+1] or null
  bool uniforms_float64;
  int64_t u_stride_b, u_stride_g;
  int64_t seed;           // the int seed (rows keyed by batch index)
  BlockIndex seeds;       // [B] per-request seeds, or absent
  BlockIndex offsets;     // [B] or absent
};

// Arguments of every launcher below:
//   dtype:            0 float32, 1 float16, 2 bfloat16 (target and draft share it).
//   *_stride_b/_g:    element strides of dims 0 and 1; the last dim must be contiguous.
//   index tensors:    int32 or int64, any element strides, read as they are:
//                     draft_tokens [B, G] (ids outside [0, V) are never accepted, never read);
//                     num_draft_tokens [B] or absent (= G; clamped to [0, G]);
//                     seeds [B] (one per request, row key 0) or absent (the int `seed`, row key b);
//                     offsets [B] or absent (= 0), seeded modes only.
//   uniforms:         [B, G+1] float32 / float64 with element strides, or null (seeded).
//   temperatures:     float32 [B] with an element stride, or null (the scalar `temperature`).
//   out_tokens:       int64 [B, G+1] contiguous; num_accepted: int64 [B].
//   workspace:        block_verify*_workspace_bytes(B, G, V) zeroed bytes, 16-byte aligned; the
//                     kernels return every byte they used to zero (one buffer per stream serves
//                     every call and graph replay, as for the other ticketed kernels).
//   V:                1 <= V < 2^23 (the fixed-point totals V * 2^40 must fit int64).

// Zeroed workspace block_verify needs: independent of V (the split count per row is
// capped by a constant), linear in B * (G + 1).
uint64_t block_verify_workspace_bytes(int64_t B, int64_t G, int64_t V);

// target_probs [B, G+1, V], draft_probs [B, G, V] (may be null when G == 0).
void launch_block_verify(const void* target_probs, int64_t target_stride_b, int64_t target_stride_g,
                         const void* draft_probs, int64_t draft_stride_b, int64_t draft_stride_g,
                         BlockIndex draft_tokens, BlockIndex num_draft_tokens, const BlockRandomness& rnd,
                         int64_t* out_tokens, int64_t* num_accepted, void* workspace, int64_t B, int64_t G,
                         int64_t V, int dtype, cudaStream_t stream);

// Zeroed workspace block_verify_logits needs (depends on V through the statistics kernel's
// per-chunk partials, as rejection_sample_logits).
uint64_t block_verify_logits_workspace_bytes(int64_t B, int64_t G, int64_t V);

// target_logits [B, G+1, V], draft_logits [B, G, V]: block_verify on p = softmax(target / T),
// q = softmax(draft / T) in float32, never written to memory.
void launch_block_verify_logits(const void* target_logits, int64_t target_stride_b, int64_t target_stride_g,
                                const void* draft_logits, int64_t draft_stride_b, int64_t draft_stride_g,
                                BlockIndex draft_tokens, BlockIndex num_draft_tokens, float temperature,
                                const float* temperatures, int64_t temperatures_stride,
                                const BlockRandomness& rnd, int64_t* out_tokens, int64_t* num_accepted,
                                void* workspace, int64_t B, int64_t G, int64_t V, int dtype, cudaStream_t stream);

}  // namespace specdec
