#include <algorithm>
#include <atomic>

#include "common.cuh"
#include "launch_utils.h"

namespace specdec {

namespace {
constexpr int kMaxCachedDevices = 64;
}  // namespace

int sm_count_of_current_device() {
  static std::atomic<int> cache[kMaxCachedDevices];  // zero-initialised (static storage)
  int dev = 0;
  SPECDEC_CUDA_CHECK(cudaGetDevice(&dev));
  const bool cacheable = dev >= 0 && dev < kMaxCachedDevices;
  if (cacheable) {
    const int cached = cache[dev].load(std::memory_order_relaxed);
    if (cached > 0) return cached;
  }
  int sms = 0;
  SPECDEC_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  sms = std::max(sms, 1);
  if (cacheable) cache[dev].store(sms, std::memory_order_relaxed);
  return sms;
}

}  // namespace specdec
