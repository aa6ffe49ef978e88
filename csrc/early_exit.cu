// early_exit_topk: final norm + LM head + top-k for early-exit heads (PPD), never
// writing the [B, V] logits. See early_exit.h and the reference in
// specdec_kernels/reference/early_exit.py.
//
// 1. early_exit_split_kernel, grid (row_groups, splits), 8 warps. CTA (g, s) owns up to
//    8 batch rows (group g) and the vocabulary slice s. Prologue: warp r computes row
//    r's norm statistics and writes norm(hidden) in float32 to shared memory (H is
//    small; every CTA recomputing it costs less than a launch). Main loop: each warp
//    takes one weight row at a time (16-byte loads, coalesced), multiplies it with all
//    of the CTA's rows from shared memory (fp32 FMA), reduces over the warp and offers
//    each row's logit key to that warp's running kept set of k keys per row (shared
//    memory, one owner lane per row, early-out on the set's minimum). The row groups
//    of one slice are adjacent in the grid, so the weight slice is read from DRAM
//    about once and the other groups hit L2. Then warp r merges the 8 warps' sets of
//    row r (k rounds of a warp max) and stores k keys per (row, split).
// 2. early_exit_merge_kernel, grid (B,): each thread keeps a sorted top-16 of its
//    strided share of the row's splits * k keys in registers, then k rounds of a block
//    max pop the winners; writes values (decoded from the keys) and ids, and re-zeroes
//    the row's workspace.
//
// Precision: logits are fp32 dot products of norm(hidden) (fp32) with the widened
// weights, summed in another order than torch's matmul: equal within float rounding.
// Ties go to the lower id (the key), NaN logits rank as -inf.
//
// Speed: a CUDA-core GEMV. Memory-bound for small B; at B = 64 it is bound by the
// FMA units (a tensor-core path for large B is future work).

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

#include "common.cuh"
#include "early_exit_math.cuh"
#include "early_exit.h"
#include "launch_utils.h"

namespace specdec {
namespace {

using early_exit::kMaxK;
using early_exit::kRowsPerCta;
using early_exit::kWarps;
constexpr int kThreads = kWarps * 32;
constexpr int kMergeThreads = 256;
static_assert(kWarps == plans::kEarlyExitWarps && kRowsPerCta == plans::kEarlyExitRowsPerCta &&
                  kMaxK == plans::kEarlyExitMaxK && kMergeThreads == plans::kEarlyExitMergeThreads,
              "launch_plan.h mirrors the kernels' shapes");
constexpr unsigned kFull = 0xFFFFFFFFu;

enum Norm : int { kNone = 0, kRms = 1, kLayer = 2 };

__device__ __forceinline__ float load_any(const void* p, int dtype, int64_t i) {
  if (dtype == kFloat16) return __half2float(static_cast<const __half*>(p)[i]);
  if (dtype == kBFloat16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFull, v, offset);
  return v;
}

struct SplitArgs {
  const void* hidden;
  int64_t hidden_stride;
  const void* norm_weight;
  const void* norm_bias;
  int norm_dtype;
  const void* lm_head;
  int64_t lm_head_stride;
  unsigned long long* cand;  // [B, splits, k]
  int64_t B, H, V, per_split;
  int k, norm, rows_per_cta;
  float eps;
  bool vec;  // 16-byte weight loads: aligned base, H and the row stride multiples of a vector
};

// Warp `r` writes norm(hidden[row]) into hs[r * H ...] (zeros for rows past B).
template <typename T>
__device__ void normalize_rows(const SplitArgs& a, int64_t row0, float* hs) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int r = warp; r < a.rows_per_cta; r += kWarps) {
    const int64_t row = row0 + r;
    float* out = hs + static_cast<int64_t>(r) * a.H;
    if (row >= a.B) {
      for (int64_t h = lane; h < a.H; h += 32) out[h] = 0.0f;
      continue;
    }
    const T* x = static_cast<const T*>(a.hidden) + row * a.hidden_stride;
    float mean = 0.0f, rstd = 1.0f;
    if (a.norm == kLayer) {
      float s = 0.0f;
      for (int64_t h = lane; h < a.H; h += 32) s += to_float(x[h]);
      mean = warp_sum(s) / static_cast<float>(a.H);
    }
    if (a.norm != kNone) {
      float s = 0.0f;
      for (int64_t h = lane; h < a.H; h += 32) {
        const float d = to_float(x[h]) - mean;
        s += d * d;
      }
      rstd = rsqrtf(warp_sum(s) / static_cast<float>(a.H) + a.eps);
    }
    for (int64_t h = lane; h < a.H; h += 32) {
      float v = to_float(x[h]);
      if (a.norm != kNone) {
        v = (v - mean) * rstd;
        if (a.norm_weight) v *= load_any(a.norm_weight, a.norm_dtype, h);
        if (a.norm_bias) v += load_any(a.norm_bias, a.norm_dtype, h);
      }
      out[h] = v;
    }
  }
}

// acc[r] += sum over this lane's share of h of w[h] * hs[r][h].
template <typename T>
__device__ __forceinline__ void dot_rows(const SplitArgs& a, const T* w, const float* hs, float (&acc)[kRowsPerCta]) {
  const int lane = threadIdx.x & 31;
  if (a.vec) {
    constexpr int kVec = Vec16<T>::kElems;
    for (int64_t h = static_cast<int64_t>(lane) * kVec; h < a.H; h += 32 * kVec) {
      float wv[kVec];
      load_vec16(w + h, wv);
#pragma unroll
      for (int r = 0; r < kRowsPerCta; ++r) {
        if (r < a.rows_per_cta) {
          const float* x = hs + r * a.H + h;
#pragma unroll
          for (int i = 0; i < kVec; ++i) acc[r] = fmaf(wv[i], x[i], acc[r]);
        }
      }
    }
  } else {
    for (int64_t h = lane; h < a.H; h += 32) {
      const float wv = to_float(w[h]);
#pragma unroll
      for (int r = 0; r < kRowsPerCta; ++r) {
        if (r < a.rows_per_cta) acc[r] = fmaf(wv, hs[r * a.H + h], acc[r]);
      }
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) early_exit_split_kernel(const SplitArgs a) {
  extern __shared__ float hs[];  // [rows_per_cta, H]
  __shared__ unsigned long long kept[kWarps][kRowsPerCta][kMaxK];
  const int group = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row0 = static_cast<int64_t>(group) * a.rows_per_cta;  // the plan's rows (<= kRowsPerCta)
  normalize_rows<T>(a, row0, hs);

  // lane r < rows_per_cta owns row r's kept set of this warp; thresh is its minimum
  unsigned long long thresh = 0ull;
  if (lane < a.rows_per_cta) early_exit::kept_init(kept[warp][lane], a.k, thresh);
  const bool owner = lane < a.rows_per_cta && row0 + lane < a.B;
  __syncthreads();

  const int64_t v0 = static_cast<int64_t>(split) * a.per_split;
  const int64_t v1 = min(a.V, v0 + a.per_split);
  const T* weight = static_cast<const T*>(a.lm_head);
  for (int64_t v = v0 + warp; v < v1; v += kWarps) {
    float acc[kRowsPerCta];
#pragma unroll
    for (int r = 0; r < kRowsPerCta; ++r) acc[r] = 0.0f;
    dot_rows<T>(a, weight + v * a.lm_head_stride, hs, acc);
    float mine = 0.0f;  // lane r keeps row r's logit
#pragma unroll
    for (int r = 0; r < kRowsPerCta; ++r) {
      const float total = warp_sum(acc[r]);
      if (lane == r) mine = total;
    }
    if (owner) {
      const unsigned long long key = early_exit::logit_key(mine, static_cast<uint32_t>(v));
      early_exit::kept_offer(kept[warp][lane], a.k, key, thresh);
    }
  }
  __syncthreads();

  // warp r merges the kWarps kept sets of row r: k rounds of a warp max, strictly decreasing
  for (int r = warp; r < a.rows_per_cta; r += kWarps) {
    const int64_t row = row0 + r;
    if (row >= a.B) continue;
    unsigned long long* out = a.cand + (row * splits + split) * a.k;
    unsigned long long prev = ~0ull;
    for (int j = 0; j < a.k; ++j) {
      unsigned long long best = 0ull;
      for (int i = lane; i < kWarps * a.k; i += 32) {
        const unsigned long long key = kept[i / a.k][r][i % a.k];
        if (key < prev && key > best) best = key;
      }
      best = warp_max_u64(best);
      if (lane == 0) out[j] = best;
      prev = best;
    }
  }
}

__global__ void __launch_bounds__(kMergeThreads)
early_exit_merge_kernel(unsigned long long* cand, int64_t per_row, int k, float* values, int64_t* indices) {
  __shared__ unsigned long long scratch[kMergeThreads / 32];
  __shared__ unsigned long long winner;
  const int64_t row = blockIdx.x;
  unsigned long long* keys = cand + row * per_row;
  unsigned long long list[kMaxK];
#pragma unroll
  for (int j = 0; j < kMaxK; ++j) list[j] = 0ull;
  for (int64_t i = threadIdx.x; i < per_row; i += kMergeThreads) {
    const unsigned long long key = keys[i];
    keys[i] = 0ull;  // hand the workspace back zeroed
    early_exit::sorted_insert(list, key);
  }
  for (int j = 0; j < k; ++j) {
    const unsigned long long best = block_max_u64<kMergeThreads>(list[0], scratch);
    if (threadIdx.x == 0) winner = best;
    __syncthreads();
    const unsigned long long w = winner;
    if (list[0] == w) early_exit::sorted_pop(list);  // real keys are distinct: one owner
    if (threadIdx.x == 0) {
      values[row * k + j] = early_exit::key_logit(w);
      indices[row * k + j] = static_cast<int64_t>(argmax_key_index(w));
    }
    __syncthreads();  // scratch and winner are reused next round
  }
}

void check_arg(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("specdec_kernels.early_exit_topk: " + what);
}

// The plan on the current device; a shape the kernels cannot serve throws its refusal.
plans::Plan plan_on_device(int64_t B, int64_t H, int64_t V, int64_t k) {
  const plans::Plan p = plans::plan_early_exit_topk(B, H, V, k, current_device_limits());
  check_arg(p.ok(), p.refusal + "; use backend='triton'");
  return p;
}

dim3 grid_of(const plans::Launch& l) {
  return dim3(static_cast<unsigned>(l.grid[0]), static_cast<unsigned>(l.grid[1]), static_cast<unsigned>(l.grid[2]));
}

template <typename T>
void launch_typed(const SplitArgs& a, const plans::Plan& p, float* values, int64_t* indices, cudaStream_t stream) {
  const plans::Launch& split = p.launches.at(0);
  const plans::Launch& merge = p.launches.at(1);
  if (split.opt_in) {  // static kept sets + dynamic rows > 48 KiB (an attribute, not a stream op)
    SPECDEC_CUDA_CHECK(cudaFuncSetAttribute(early_exit_split_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(split.dynamic_smem)));
  }
  early_exit_split_kernel<T><<<grid_of(split), split.block, split.dynamic_smem, stream>>>(a);
  SPECDEC_CUDA_CHECK(cudaGetLastError());
  early_exit_merge_kernel<<<grid_of(merge), merge.block, merge.dynamic_smem, stream>>>(
      a.cand, p.at("splits") * a.k, a.k, values, indices);
  SPECDEC_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

uint64_t early_exit_topk_workspace_bytes(int64_t B, int64_t H, int64_t V, int64_t k) {
  if (B <= 0) return 0;
  return static_cast<uint64_t>(plan_on_device(B, H, V, k).at("workspace_bytes"));
}

void launch_early_exit_topk(const void* hidden, int64_t hidden_stride, const void* norm_weight,
                            const void* norm_bias, int norm_dtype, const void* lm_head,
                            int64_t lm_head_stride, float* values, int64_t* indices, void* workspace,
                            uint64_t workspace_bytes, int64_t B, int64_t H, int64_t V, int64_t k,
                            int dtype, int norm, double eps, cudaStream_t stream) {
  check_arg(dtype == kFloat32 || dtype == kFloat16 || dtype == kBFloat16, "dtype must be 0, 1 or 2");
  check_arg(norm_dtype == kFloat32 || norm_dtype == kFloat16 || norm_dtype == kBFloat16, "bad norm dtype");
  check_arg(norm == kNone || norm == kRms || norm == kLayer, "norm must be 0 (none), 1 (rms) or 2 (layer)");
  const plans::Plan p = plan_on_device(B, H, V, k);
  check_arg(hidden_stride >= H && lm_head_stride >= H, "row strides must be >= H");
  if (B == 0) return;
  check_arg(workspace_bytes >= static_cast<uint64_t>(p.at("workspace_bytes")), "workspace too small");
  const int elem = dtype == kFloat32 ? 4 : 2;
  const int vec_elems = 16 / elem;
  SplitArgs a{};
  a.hidden = hidden;
  a.hidden_stride = hidden_stride;
  a.norm_weight = norm == kNone ? nullptr : norm_weight;
  a.norm_bias = norm == kLayer ? norm_bias : nullptr;
  a.norm_dtype = norm_dtype;
  a.lm_head = lm_head;
  a.lm_head_stride = lm_head_stride;
  a.cand = static_cast<unsigned long long*>(workspace);
  a.B = B;
  a.H = H;
  a.V = V;
  a.per_split = p.at("per_split");
  a.k = static_cast<int>(k);
  a.norm = norm;
  a.rows_per_cta = static_cast<int>(p.at("rows_per_cta"));
  a.eps = static_cast<float>(eps);
  a.vec = reinterpret_cast<uintptr_t>(lm_head) % 16 == 0 && H % vec_elems == 0 && lm_head_stride % vec_elems == 0;
  if (dtype == kFloat16) {
    launch_typed<__half>(a, p, values, indices, stream);
  } else if (dtype == kBFloat16) {
    launch_typed<__nv_bfloat16>(a, p, values, indices, stream);
  } else {
    launch_typed<float>(a, p, values, indices, stream);
  }
}

}  // namespace specdec
