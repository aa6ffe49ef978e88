#pragma once
// Host launcher of early_exit_topk (csrc/early_exit.cu): final norm + LM head +
// top-k without writing [B, V] logits. Two (SIMT) or three (tensor-core) kernel launches on `stream`, no sync, no
// allocation (CUDA-graph capturable). Bad arguments throw std::invalid_argument; CUDA
// errors throw std::runtime_error.

#include <cstdint>

#include <cuda_runtime_api.h>

namespace specdec {

// Zeroed bytes of workspace early_exit_topk needs on the current device (the
// candidate keys of every (row, split)); the kernels hand it back zeroed.
// dtype: the weights' code (fp16/bf16 with H % 8 == 0 and `aligned` take the tensor-core
// path: lm_head 16-byte aligned and lm_head_stride % 8 == 0, the rule the launcher applies).
uint64_t early_exit_topk_workspace_bytes(int64_t B, int64_t H, int64_t V, int64_t k, int dtype = 0,
                                         bool aligned = true);

// hidden: [B, H] of `dtype` (0 fp32, 1 fp16, 2 bf16), row stride hidden_stride elements,
//         last dim contiguous. norm_weight / norm_bias: [H] of norm_dtype or null.
// lm_head: [V, H] of `dtype`, row stride lm_head_stride, last dim contiguous.
// norm: 0 none, 1 rms, 2 layer. 1 <= k <= min(16, V).
// values: float32 [B, k], indices: int64 [B, k], both contiguous.
void launch_early_exit_topk(const void* hidden, int64_t hidden_stride, const void* norm_weight,
                            const void* norm_bias, int norm_dtype, const void* lm_head,
                            int64_t lm_head_stride, float* values, int64_t* indices, void* workspace,
                            uint64_t workspace_bytes, int64_t B, int64_t H, int64_t V, int64_t k,
                            int dtype, int norm, double eps, cudaStream_t stream);

}  // namespace specdec
