#pragma once
// Host launcher of kv_compact (csrc/kv_cache.cu): after tree verification, move
// every row's accepted nodes' K/V rows into place in all layers' caches, in place.
// Plain C++ types only, so bind_kv_cache.cpp builds with the host compiler.
//
// One kernel launch on `stream`, no synchronisation, no allocation: CUDA-graph
// capturable. Bad arguments throw std::invalid_argument; CUDA errors throw
// std::runtime_error.
//
// Contract (reference/kv_cache.py): row b's entry j (accepted[b, j] >= 0, increasing,
// padded with -1) moves cache row seq_lens[b] + accepted[b, j] to
// seq_lens[b] + j in every cache; new_lens[b] = seq_lens[b] + #entries >= 0.
// Values are never trusted: a row whose source or destination falls outside
// [0, S) is skipped, so no input makes the kernel touch memory outside the caches.

#include <cstdint>

#include <cuda_runtime_api.h>

namespace specdec {

// Where the 2L caches (K layers 0..L-1, then V layers) live. Strides and steps
// are in elements. Either `table` is null (fast path: K layer l starts at
// k_base + l * k_step elements with strides k_stride, V likewise) or it points
// to [2L][4] int64 on the device: (address in bytes, stride_b, stride_h,
// stride_s) per cache.
struct KvCacheSet {
  void* k_base;
  void* v_base;
  int64_t k_step;
  int64_t v_step;
  int64_t k_stride[3];  // b, h, s
  int64_t v_stride[3];
  const int64_t* table;
  int64_t num_layers;
  int64_t heads;         // Hkv
  int64_t seq_capacity;  // S_max
  int64_t head_dim;      // D, contiguous
  int64_t elem_size;     // 2 or 4 bytes
  // Widest access (16, 8, 4 or 2 bytes) that divides every cache address,
  // stride and step in bytes and D * elem_size: the caller computes it (for the
  // table path the addresses are on the device). The fast-path values are checked.
  int64_t vector_bytes;
};

// seq_lens: [B] int32 (seq_lens_int32) or int64 with element stride
// seq_lens_stride. accepted: [B, M] int64 with element strides. new_lens:
// [B] contiguous, seq_lens' dtype.
void launch_kv_compact(const KvCacheSet& caches, const void* seq_lens, bool seq_lens_int32,
                       int64_t seq_lens_stride, const int64_t* accepted, int64_t accepted_stride_b,
                       int64_t accepted_stride_m, void* new_lens, int64_t B, int64_t M,
                       cudaStream_t stream);

}  // namespace specdec
