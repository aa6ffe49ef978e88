#pragma once
// The one switch from a dtype code (common.cuh's DType) to the element type a launcher is instantiated for.
// Host code.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common.cuh"

namespace specdec {

// An element type passed as a value, for the generic lambdas dispatch_dtype calls.
template <typename T>
struct TypeTag {
  using type = T;
};

// Calls launch(TypeTag<T>{}) with T the element type of `dtype`: float, __half, and __nv_bfloat16 for any other
// code (the launchers have validated dtype before they dispatch).
template <typename Launch>
void dispatch_dtype(int dtype, Launch&& launch) {
  switch (dtype) {
    case kFloat32:
      launch(TypeTag<float>{});
      break;
    case kFloat16:
      launch(TypeTag<__half>{});
      break;
    default:
      launch(TypeTag<__nv_bfloat16>{});
      break;
  }
}

}  // namespace specdec
