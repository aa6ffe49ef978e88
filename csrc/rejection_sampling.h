#pragma once
// Host launchers of speculative sampling on chain drafts (csrc/rejection_sampling.cu).
// Plain C++ types only, so the bindings build with the host compiler.
//
// Like every launcher here: kernels on `stream` only (rejection_sample one, rejection_sample_logits
// two: softmax statistics, then sampling), no synchronisation, no allocation (CUDA-graph
// capturable). Bad arguments throw std::invalid_argument; CUDA
// errors throw std::runtime_error.

#include <cstdint>

#include <cuda_runtime_api.h>

namespace specdec {

// Shared conventions (see specdec_kernels.reference.rejection_sampling for the semantics):
//   dtype:            0 float32, 1 float16, 2 bfloat16 (target and draft share it).
//   *_stride_b/_g:    element strides of dims 0 and 1; the last dim must be contiguous.
//   draft_tokens:     int64 [B, G] contiguous (ids outside [0, V) are rejected, never read).
//   num_draft_tokens: int64 [B] contiguous or null (null = G everywhere; clamped to [0, G]).
//   randomness:       uniforms != null -> caller uniforms [B, G+1] contiguous, float64 when
//                     uniforms_float64 else float32; otherwise seeds != null -> one int64
//                     seed per row (row key 0); otherwise the int `seed` (row key = b).
//                     offsets: int64 [B] contiguous or null (= 0), seeded modes only.
//   out_tokens:       int64 [B, G+1] contiguous; num_accepted: int64 [B].
//   draft_passes:     bool [B, G] contiguous or null (rejection_sample only): each draft's own
//                     acceptance test on the call's coins, also after the first rejection; false
//                     for j >= num_draft_tokens[b] and for ids outside [0, V).
//   workspace:        the *_workspace_bytes(...) zeroed bytes, 16-byte aligned. The kernel
//                     returns every byte it used to zero, so one buffer is reused across
//                     calls and graph replays on the same stream (never two streams at once).
//   V:                1 <= V < 2^23 (the fixed-point totals V * 2^40 must fit int64).

// Zeroed workspace rejection_sample needs (depends on B and V only; G is accepted so
// callers need not know that).
uint64_t rejection_sample_workspace_bytes(int64_t B, int64_t G, int64_t V);

// target_probs [B, G+1, V], draft_probs [B, G, V] (may be null when G == 0).
void launch_rejection_sample(const void* target_probs, int64_t target_stride_b, int64_t target_stride_g,
                             const void* draft_probs, int64_t draft_stride_b, int64_t draft_stride_g,
                             const int64_t* draft_tokens, const int64_t* num_draft_tokens,
                             const void* uniforms, bool uniforms_float64, int64_t seed, const int64_t* seeds,
                             const int64_t* offsets, int64_t* out_tokens, int64_t* num_accepted,
                             bool* draft_passes, void* workspace, int64_t B, int64_t G, int64_t V, int dtype,
                             cudaStream_t stream);

// Zeroed workspace rejection_sample_logits needs.
uint64_t rejection_sample_logits_workspace_bytes(int64_t B, int64_t G, int64_t V);

// target_logits [B, G+1, V], draft_logits [B, G, V]; p = softmax(target / T), q =
// softmax(draft / T) in float32 with T = temperatures[b] (float32 [B] contiguous) when
// temperatures != null, else `temperature`. 2G + 1 <= 65535 (the statistics launch's grid y).
void launch_rejection_sample_logits(const void* target_logits, int64_t target_stride_b, int64_t target_stride_g,
                                    const void* draft_logits, int64_t draft_stride_b, int64_t draft_stride_g,
                                    const int64_t* draft_tokens, const int64_t* num_draft_tokens,
                                    float temperature, const float* temperatures, const void* uniforms,
                                    bool uniforms_float64, int64_t seed, const int64_t* seeds,
                                    const int64_t* offsets, int64_t* out_tokens, int64_t* num_accepted,
                                    void* workspace, int64_t B, int64_t G, int64_t V, int dtype,
                                    cudaStream_t stream);

}  // namespace specdec
