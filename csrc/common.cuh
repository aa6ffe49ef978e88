#pragma once
// Device helpers shared by the specdec_kernels CUDA sources (nvcc only).
// Nothing here touches torch: callers hand us raw pointers and a dtype code.

#include <cstdint>
#include <stdexcept>
#include <string>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "block_reduce.cuh"
#include "ordered_key.cuh"

// Throws instead of aborting so that pybind11 surfaces a Python RuntimeError.
#define SPECDEC_CUDA_CHECK(expr)                                              \
  do {                                                                        \
    const cudaError_t specdec_err_ = (expr);                                  \
    if (specdec_err_ != cudaSuccess) {                                        \
      throw std::runtime_error(std::string("specdec_kernels: ") + #expr +     \
                               " failed: " + cudaGetErrorString(specdec_err_)); \
    }                                                                         \
  } while (0)

namespace specdec {

// Must match the codes the Python wrapper passes (torch dtype -> int).
enum DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// The code of an element type, for launchers that dispatch again inside a typed path.
template <typename T>
constexpr int dtype_of();
template <>
constexpr int dtype_of<float>() { return kFloat32; }
template <>
constexpr int dtype_of<__half>() { return kFloat16; }
template <>
constexpr int dtype_of<__nv_bfloat16>() { return kBFloat16; }

// ---------------------------------------------------------------------------
// Loads. Every element is widened to fp32 before comparing; fp16/bf16 -> fp32
// is exact, so the comparison matches torch's `.float()` reference bit for bit.
// ---------------------------------------------------------------------------
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// Elements per 16-byte vector load.
template <typename T>
struct Vec16 {
  static constexpr int kElems = 16 / static_cast<int>(sizeof(T));
};

// One 16-byte read-only load unpacked to fp32. `p` must be 16-byte aligned.
// Unpacking from the raw words avoids type-punning the half/bf16 classes.
__device__ __forceinline__ void load_vec16(const float* p, float (&out)[4]) {
  const uint4 r = __ldg(reinterpret_cast<const uint4*>(p));
  out[0] = __uint_as_float(r.x);
  out[1] = __uint_as_float(r.y);
  out[2] = __uint_as_float(r.z);
  out[3] = __uint_as_float(r.w);
}

__device__ __forceinline__ void load_vec16(const __half* p, float (&out)[8]) {
  const uint4 r = __ldg(reinterpret_cast<const uint4*>(p));
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {  // little endian: low half is the lower index
    out[2 * k] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[k] & 0xFFFFu)));
    out[2 * k + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[k] >> 16)));
  }
}

__device__ __forceinline__ void load_vec16(const __nv_bfloat16* p, float (&out)[8]) {
  const uint4 r = __ldg(reinterpret_cast<const uint4*>(p));
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {  // bf16 is the top half of an fp32: shifting is exact
    out[2 * k] = __uint_as_float(w[k] << 16);
    out[2 * k + 1] = __uint_as_float(w[k] & 0xFFFF0000u);
  }
}

// Packed argmax keys: csrc/ordered_key.cuh (host-compilable, shared with the
// CPU emulation in bind_logit_verify.cpp).
__device__ __forceinline__ uint32_t order_preserving_bits(float f) {
  return order_preserving_bits_from_raw(__float_as_uint(f));
}

__device__ __forceinline__ float float_from_order_preserving(uint32_t ord) {
  return __uint_as_float(raw_bits_from_order_preserving(ord));
}

// ---------------------------------------------------------------------------
// Packed-key maxima (the argmax kernels); the trees are block_reduce.cuh's.
// ---------------------------------------------------------------------------
__device__ __forceinline__ unsigned long long warp_max_u64(unsigned long long v) {
  return reduce::warp_all(v, reduce::MaxU64{});
}

// Max over the block; the result is valid in thread 0 (warp 0 in fact).
// kThreads must be a multiple of 32; `scratch` holds one slot per warp.
// Contains __syncthreads(): every thread of the block must call it.
template <int kThreads>
__device__ __forceinline__ unsigned long long block_max_u64(unsigned long long v,
                                                            unsigned long long* scratch) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "block size");
  return reduce::block_to_warp0<kThreads / 32>(v, scratch, 0ull, reduce::MaxU64{});
}

}  // namespace specdec
