#pragma once
// Host launchers of the logits verification ops (csrc/logit_verify.cu):
// relaxed_verify (SpecDec), bild_verify (BiLD rollback) and max_prob.
//
// Like ops.h: each launcher enqueues exactly one kernel on `stream`, never
// synchronises and never allocates (CUDA-graph capturable). Bad arguments throw
// std::invalid_argument; CUDA errors throw std::runtime_error.
//
// Workspaces are zeroed device buffers that the kernels hand back zeroed. Their
// size depends on the split plan, i.e. on the SM count of the current device:
// query the size with the current device set to the one that will run the
// kernel (the launcher re-checks `workspace_bytes` and throws if too small).

#include <cstdint>

#include <cuda_runtime_api.h>

namespace specdec {

// Zeroed bytes relaxed_verify / bild_verify need for [B, G+1, V] logits on the
// current device (0 when B == 0).
uint64_t logit_verify_workspace_bytes(int64_t B, int64_t G, int64_t V);

// logits: [B, G+1, V] of `dtype` (0 fp32, 1 fp16, 2 bf16), last dim contiguous,
//         element strides stride_b / stride_g for the first two dims.
// draft_tokens: int64 [B, G] contiguous (any id; ids outside [0, V) reject).
// num_draft_tokens: int64 [B] or null (null = G drafts per row; clamped to [0, G]).
// out_tokens: int64 [B, G+1] contiguous. num_accepted: int64 [B].
// top_beta >= 1; tau >= 0 is compared in float32 (pass a float32-representable value).
void launch_relaxed_verify(const void* logits, int64_t stride_b, int64_t stride_g,
                           const int64_t* draft_tokens, const int64_t* num_draft_tokens,
                           int64_t* out_tokens, int64_t* num_accepted, void* workspace,
                           uint64_t workspace_bytes, int64_t B, int64_t G, int64_t V, int dtype,
                           int64_t top_beta, double tau, cudaStream_t stream);

// As launch_relaxed_verify; rollback_threshold >= 0 is compared in float32.
void launch_bild_verify(const void* logits, int64_t stride_b, int64_t stride_g,
                        const int64_t* draft_tokens, const int64_t* num_draft_tokens,
                        int64_t* out_tokens, int64_t* num_accepted, void* workspace,
                        uint64_t workspace_bytes, int64_t B, int64_t G, int64_t V, int dtype,
                        double rollback_threshold, cudaStream_t stream);

// Zeroed bytes max_prob needs for R rows of V logits on the current device
// (0 when one block per row suffices).
uint64_t max_prob_workspace_bytes(int64_t R, int64_t V);

// logits: R rows of V `dtype` values, row r at logits + r * row_stride elements,
// last dim contiguous. out: float32 [R] contiguous.
void launch_max_prob(const void* logits, int64_t row_stride, float* out, void* workspace,
                     uint64_t workspace_bytes, int64_t R, int64_t V, int dtype,
                     cudaStream_t stream);

}  // namespace specdec
