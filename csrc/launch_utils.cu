#include <algorithm>
#include <atomic>
#include <mutex>

#include "common.cuh"
#include "launch_utils.h"

namespace specdec {

namespace {
constexpr int kMaxCachedDevices = 64;

int attribute(cudaDeviceAttr what, int dev) {
  int value = 0;
  SPECDEC_CUDA_CHECK(cudaDeviceGetAttribute(&value, what, dev));
  return value;
}

plans::DeviceLimits query_limits(int dev) {
  plans::DeviceLimits lim{};
  lim.arch = attribute(cudaDevAttrComputeCapabilityMajor, dev) * 10 + attribute(cudaDevAttrComputeCapabilityMinor, dev);
  lim.sms = std::max(attribute(cudaDevAttrMultiProcessorCount, dev), 1);
  lim.smem_per_block = attribute(cudaDevAttrMaxSharedMemoryPerBlock, dev);
  lim.smem_per_block_optin = std::max(attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), lim.smem_per_block);
  lim.smem_per_sm = attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
  lim.reserved_smem_per_block = attribute(cudaDevAttrReservedSharedMemoryPerBlock, dev);
  lim.regs_per_sm = attribute(cudaDevAttrMaxRegistersPerMultiprocessor, dev);
  lim.regs_per_block = attribute(cudaDevAttrMaxRegistersPerBlock, dev);
  lim.threads_per_block = attribute(cudaDevAttrMaxThreadsPerBlock, dev);
  lim.threads_per_sm = attribute(cudaDevAttrMaxThreadsPerMultiProcessor, dev);
  lim.grid_x = attribute(cudaDevAttrMaxGridDimX, dev);
  lim.grid_yz = std::min(attribute(cudaDevAttrMaxGridDimY, dev), attribute(cudaDevAttrMaxGridDimZ, dev));
  return lim;
}
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
  const int sms = attribute(cudaDevAttrMultiProcessorCount, dev);
  if (cacheable) cache[dev].store(std::max(sms, 1), std::memory_order_relaxed);
  return std::max(sms, 1);
}

plans::DeviceLimits current_device_limits() {
  // Attribute queries only (no sync): legal during stream capture; cached so a
  // captured call makes none beyond cudaGetDevice.
  static std::mutex mutex;
  static plans::DeviceLimits cache[kMaxCachedDevices];
  static bool known[kMaxCachedDevices];
  int dev = 0;
  SPECDEC_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= kMaxCachedDevices) return query_limits(dev);
  std::lock_guard<std::mutex> lock(mutex);
  if (!known[dev]) {
    cache[dev] = query_limits(dev);
    known[dev] = true;
  }
  return cache[dev];
}

}  // namespace specdec
