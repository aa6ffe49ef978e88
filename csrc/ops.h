#pragma once
// Host launchers of the specdec_kernels CUDA ops. Plain C++ types only, so
// that bindings.cpp can be built by the host compiler without CUDA headers
// beyond the runtime API (for cudaStream_t).
//
// All launchers enqueue exactly one kernel on `stream`, never synchronise and
// never allocate, so they are CUDA-graph capturable. Bad arguments throw
// std::invalid_argument; CUDA errors throw std::runtime_error.

#include <cstdint>

#include <cuda_runtime_api.h>

namespace specdec {

// Bytes of zeroed device workspace greedy_verify needs: B*(G+1) uint64 argmax
// keys followed by B uint32 per-row counters. The kernel returns every byte it
// touched to zero, so one zeroed buffer can be reused across calls (and graph
// replays) on the same stream.
uint64_t greedy_verify_workspace_bytes(int64_t B, int64_t G);

// logits: [B, G+1, V] of `dtype` (0 fp32, 1 fp16, 2 bf16), last dim contiguous,
//         element strides stride_b / stride_g for the first two dims.
// draft_tokens: int64 [B, G] contiguous. num_draft_tokens: int64 [B] or null
//         (null = every row has G drafts; values are clamped to [0, G]).
// out_tokens: int64 [B, G+1] contiguous. num_accepted: int64 [B].
// workspace: greedy_verify_workspace_bytes(B, G) zeroed bytes, 8-byte aligned.
void launch_greedy_verify(const void* logits, int64_t stride_b, int64_t stride_g,
                          const int64_t* draft_tokens, const int64_t* num_draft_tokens,
                          int64_t* out_tokens, int64_t* num_accepted, void* workspace,
                          int64_t B, int64_t G, int64_t V, int dtype, cudaStream_t stream);

}  // namespace specdec
