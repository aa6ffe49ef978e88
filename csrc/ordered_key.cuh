#pragma once
// Packed argmax keys, host- and device-compilable (nvcc: __host__ __device__;
// the C++ compiler: inline), so the CPU emulation in bind_logit_verify.cpp runs
// the same integer logic as the kernels.

#include <cstdint>

#include "host_device.cuh"

namespace specdec {

// ---------------------------------------------------------------------------
// Order-preserving float -> uint32 map, so an argmax can be packed into one
// integer and combined with atomicMax. Pure integer logic, so --use_fast_math
// cannot change it.
//  * NaN ranks like -inf (contract: NaN is treated as -inf).
//  * -0.0 maps like +0.0: they compare equal in torch, so they must tie and
//    let the lower index win.
//  * Every real value maps to >= 0x007FFFFF (-inf), so 0 means "no element".
// ---------------------------------------------------------------------------
SPECDEC_HD uint32_t order_preserving_bits_from_raw(uint32_t u) {
  const uint32_t mag = u & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) u = 0xFF800000u;  // any NaN -> -inf
  if (mag == 0u) return 0x80000000u;       // +-0 -> +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Inverse on the image of the map: the raw float bits an ordered value stands
// for (NaN comes back as -inf and -0.0 as +0.0, which compare the same).
SPECDEC_HD uint32_t raw_bits_from_order_preserving(uint32_t ord) {
  return (ord & 0x80000000u) ? (ord & 0x7FFFFFFFu) : ~ord;
}

// key = (value bits << 32) | (0xFFFFFFFF - index): the max key is the max
// value, and among equal values the lowest index. Key 0 = empty slot.
SPECDEC_HD unsigned long long make_argmax_key(uint32_t ord, uint32_t idx) {
  return (static_cast<unsigned long long>(ord) << 32) |
         static_cast<unsigned long long>(0xFFFFFFFFu - idx);
}

SPECDEC_HD uint32_t argmax_key_index(unsigned long long key) {
  return 0xFFFFFFFFu - static_cast<uint32_t>(key);
}

SPECDEC_HD uint32_t argmax_key_order(unsigned long long key) {
  return static_cast<uint32_t>(key >> 32);
}

}  // namespace specdec
