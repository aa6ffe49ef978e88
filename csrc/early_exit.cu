// early_exit_topk: final norm + LM head + top-k for early-exit heads (PPD), never writing the
// [B, V] logits (early_exit.h; reference: specdec_kernels/reference/early_exit.py).
//
// Tensor-core path (fp16/bf16 weights, H % 8 == 0, 16-byte aligned LM head; plan "mma"), 3 launches:
// early_exit_normalize_kernel writes norm(hidden) once as hi + lo halves of the weight dtype;
// early_exit_mma_kernel runs mma.sync m16n8k16 with LM-head rows loaded straight into registers as A
// (early_exit_mma.cuh permutes k so each lane needs one 16-byte load) and the hi/lo tiles in shared
// memory as B, keeping a top-k per column; early_exit_merge_kernel merges the splits.
// SIMT path (everything else): early_exit_split_kernel, a CUDA-core GEMV whose row groups of one
// vocabulary slice are adjacent in the grid, so the slice is read from DRAM about once, then the
// same merge. The H100 measured 25.2 ms at B = 64, H = 4096, V = 128256: FMA-bound.
//
// Precision: fp32 sums in another order than torch's matmul (equal within rounding); ties go to
// the lower id and NaN ranks as -inf (the int64 key). The fragment arithmetic is emulated on the
// CPU (bind_early_exit.cpp, host_early_exit_mma) with the same index functions.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

#include "common.cuh"
#include "early_exit_math.cuh"
#include "early_exit_mma.cuh"
#include "early_exit.h"
#include "launch_utils.h"
#include "mma.cuh"

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
using early_exit::kMmaWarps;
constexpr int kNormThreads = 256;
static_assert(kMmaWarps == plans::kEarlyExitMmaWarps && kNormThreads == plans::kEarlyExitNormThreads,
              "launch_plan.h mirrors the tensor-core kernels' shapes");
constexpr unsigned kFull = 0xFFFFFFFFu;

enum Norm : int { kNone = 0, kRms = 1, kLayer = 2 };

__device__ __forceinline__ float load_any(const void* p, int dtype, int64_t i) {
  if (dtype == kFloat16) return __half2float(static_cast<const __half*>(p)[i]);
  if (dtype == kBFloat16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

__device__ __forceinline__ float warp_sum(float v) { return reduce::warp_all(v, reduce::Sum{}); }

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

// One warp merges `count` kept keys (key_at(i), i in [0, count): several warps' sorted sets) into
// the k largest, strictly decreasing, in `out`: k rounds of a warp max below the last one taken.
template <typename KeyAt>
__device__ __forceinline__ void warp_merge_kept(const KeyAt& key_at, int count, int k, unsigned long long* out,
                                                int lane) {
  unsigned long long prev = ~0ull;
  for (int j = 0; j < k; ++j) {
    unsigned long long best = 0ull;
    for (int i = lane; i < count; i += 32) {
      const unsigned long long key = key_at(i);
      if (key < prev && key > best) best = key;
    }
    best = warp_max_u64(best);
    if (lane == 0) out[j] = best;
    prev = best;
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
    warp_merge_kept([&](int i) { return kept[i / a.k][r][i % a.k]; }, kWarps * a.k, a.k,
                    a.cand + (row * splits + split) * a.k, lane);
  }
}

// ===========================================================================
// Tensor-core path (fp16 / bf16 weights): normalise once, then mma.sync m16n8k16
// ===========================================================================
// Launch 1: norm(hidden[row]) split into the weight dtype's hi and lo halves, one CTA per row,
// written to the workspace's hn arrays ([rows][hn_stride], 16-bit). Columns >= H and rows
// >= B are never written: the zeroed workspace holds zeros there, the merge kernel re-zeroes
// what this wrote.
struct NormArgs {
  const void* hidden;
  int64_t hidden_stride;
  const void* norm_weight;
  const void* norm_bias;
  int norm_dtype;
  uint16_t* hn_hi;
  uint16_t* hn_lo;
  int64_t hn_stride, H;
  int norm, dtype;
  float eps;
};

__device__ __forceinline__ float block_sum(float v, float* partial) {
  const float total = reduce::block_all<kNormThreads / 32>(v, partial, 0.0f, reduce::Sum{});
  __syncthreads();  // partial is reused by the next sum
  return total;
}

template <typename T>
__global__ void __launch_bounds__(kNormThreads) early_exit_normalize_kernel(const NormArgs a) {
  __shared__ float partial[kNormThreads / 32];
  const int64_t row = blockIdx.x;
  const T* x = static_cast<const T*>(a.hidden) + row * a.hidden_stride;
  float mean = 0.0f, rstd = 1.0f;
  if (a.norm == kLayer) {
    float s = 0.0f;
    for (int64_t h = threadIdx.x; h < a.H; h += kNormThreads) s += to_float(x[h]);
    mean = block_sum(s, partial) / static_cast<float>(a.H);
  }
  if (a.norm != kNone) {
    float s = 0.0f;
    for (int64_t h = threadIdx.x; h < a.H; h += kNormThreads) {
      const float d = to_float(x[h]) - mean;
      s += d * d;
    }
    rstd = rsqrtf(block_sum(s, partial) / static_cast<float>(a.H) + a.eps);
  }
  for (int64_t h = threadIdx.x; h < a.H; h += kNormThreads) {
    float v = to_float(x[h]);
    if (a.norm != kNone) {
      v = (v - mean) * rstd;
      if (a.norm_weight) v *= load_any(a.norm_weight, a.norm_dtype, h);
      if (a.norm_bias) v += load_any(a.norm_bias, a.norm_dtype, h);
    }
    uint16_t hi, lo;
    early_exit::split_hi_lo(v, a.dtype, hi, lo);
    a.hn_hi[row * a.hn_stride + h] = hi;
    a.hn_lo[row * a.hn_stride + h] = lo;
  }
}

// Launch 2, grid (column groups, splits), 8 warps. CTA (c, s) owns batch columns
// [8 NT c, 8 NT (c + 1)) and the vocabulary slice s, in steps of vocab_tile(NT) rows: warp w
// takes MT m-tiles of 16 rows. Per 32-column chunk of H each lane loads 16 bytes of each of
// its 2 MT weight rows straight into registers (a ring of U chunks in flight) and 16 bytes of
// hi and lo per n-tile from shared memory (early_exit_mma.cuh: the permuted k order), then
// 2 MMAs (hi, lo) per (m-tile, n-tile, k-step). hn is staged in shared memory k_block columns
// at a time: once per CTA when all of H fits (resident), else once per k-block per step.
// Epilogue: each accumulator's logit key is offered to its warp's kept set of that batch
// column (shared memory; lanes above the set's minimum take turns); the end merges the 8
// warps' sets per column into k candidates per (row, split), as the SIMT kernel does.
struct MmaArgs {
  const void* lm_head;
  int64_t lm_head_stride;
  const uint16_t* hn_hi;
  const uint16_t* hn_lo;
  int64_t hn_stride;  // elements, a multiple of 32
  unsigned long long* cand;  // [B, splits, k]
  int64_t B, H, V, per_split;
  int k, k_block;
};

template <int NT>
struct MmaShape {
  static constexpr int kMt = NT >= 4 ? 2 : 1;
  static constexpr int kBn = 8 * NT;
  static constexpr int kRing = kMt == 1 ? 4 : 2;  // chunks in flight per warp (4 KiB of weight)
};

template <typename T, int NT>
__global__ void __launch_bounds__(kMmaWarps * 32, 1) early_exit_mma_kernel(const MmaArgs a) {
  constexpr int MT = MmaShape<NT>::kMt, BN = MmaShape<NT>::kBn, U = MmaShape<NT>::kRing;
  namespace ee = early_exit;
  extern __shared__ __align__(16) unsigned char smem[];
  const int64_t stride = ee::smem_stride(a.k_block);
  uint16_t* s_hi = reinterpret_cast<uint16_t*>(smem);
  uint16_t* s_lo = s_hi + BN * stride;
  unsigned long long* kept = reinterpret_cast<unsigned long long*>(s_lo + BN * stride);  // [warps][BN][k]
  unsigned long long* thresh = kept + kMmaWarps * BN * a.k;                              // [warps][BN]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * BN;
  const int split = blockIdx.y, splits = gridDim.y;
  const int64_t v0 = static_cast<int64_t>(split) * a.per_split;
  const int64_t v1 = min(a.V, v0 + a.per_split);
  for (int i = threadIdx.x; i < kMmaWarps * BN; i += kMmaWarps * 32) {
    unsigned long long th;
    ee::kept_init(kept + static_cast<int64_t>(i) * a.k, a.k, th);
    thresh[i] = th;
  }
  const int64_t nchunks = (a.H + ee::kChunk - 1) / ee::kChunk;
  const int cpk = a.k_block / ee::kChunk;
  const bool resident = nchunks <= cpk;
  // hn columns [kb * k_block, +k_block) of the CTA's batch columns -> shared memory (zeros past the rows)
  auto stage = [&](int64_t kb) {
    const int pieces = a.k_block / 8;
    for (int i = threadIdx.x; i < BN * pieces; i += kMmaWarps * 32) {
      const int r = i / pieces, p = i % pieces;
      const int64_t col = kb * a.k_block + p * 8;
      uint4 hi = make_uint4(0, 0, 0, 0), lo = hi;
      if (col < a.hn_stride) {
        hi = *reinterpret_cast<const uint4*>(a.hn_hi + (col0 + r) * a.hn_stride + col);
        lo = *reinterpret_cast<const uint4*>(a.hn_lo + (col0 + r) * a.hn_stride + col);
      }
      *reinterpret_cast<uint4*>(s_hi + r * stride + p * 8) = hi;
      *reinterpret_cast<uint4*>(s_lo + r * stride + p * 8) = lo;
    }
  };
  __syncthreads();
  if (resident) {
    stage(0);
    __syncthreads();
  }
  const T* weight = static_cast<const T*>(a.lm_head);
  const int vt = ee::vocab_tile(NT);
  for (int64_t vbase = v0; vbase < v1; vbase += vt) {
    const int64_t vw = vbase + static_cast<int64_t>(warp) * 16 * MT;
    const T* rows[MT][2];
    bool row_ok[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t v = vw + mt * 16 + ee::load_row(lane, half);
        row_ok[mt][half] = v < v1;
        rows[mt][half] = weight + (row_ok[mt][half] ? v : 0) * a.lm_head_stride;
      }
    }
    float acc[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;
    uint4 ring[U][MT][2];
    auto load_chunk = [&](int64_t c, uint4 (&dst)[MT][2]) {
      const int64_t col = c * ee::kChunk + ee::load_col(lane);
      const bool col_ok = col < a.H;  // H % 8 == 0: a lane's 8 columns are all in or all out
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int half = 0; half < 2; ++half)
          dst[mt][half] = row_ok[mt][half] && col_ok ? __ldg(reinterpret_cast<const uint4*>(rows[mt][half] + col))
                                                     : make_uint4(0, 0, 0, 0);
    };
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (u < nchunks) load_chunk(u, ring[u]);
    for (int64_t c0 = 0; c0 < nchunks; c0 += U) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t c = c0 + u;
        if (c >= nchunks) break;  // the same c in every warp: barriers below stay uniform
        const int cc = static_cast<int>(c % cpk);
        if (!resident && cc == 0) {
          __syncthreads();  // every warp is done with the previous k-block
          stage(c / cpk);
          __syncthreads();
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const int64_t off = (nt * 8 + ee::load_row(lane, 0)) * stride + cc * ee::kChunk + ee::load_col(lane);
          const uint4 h4 = *reinterpret_cast<const uint4*>(s_hi + off);
          const uint4 l4 = *reinterpret_cast<const uint4*>(s_lo + off);
          const uint32_t hw[4] = {h4.x, h4.y, h4.z, h4.w}, lw[4] = {l4.x, l4.y, l4.z, l4.w};
#pragma unroll
          for (int s = 0; s < 2; ++s) {
            uint32_t bh0, bh1, bl0, bl1;
            ee::b_regs(hw, s, bh0, bh1);
            ee::b_regs(lw, s, bl0, bl1);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              const uint32_t r0[4] = {ring[u][mt][0].x, ring[u][mt][0].y, ring[u][mt][0].z, ring[u][mt][0].w};
              const uint32_t r8[4] = {ring[u][mt][1].x, ring[u][mt][1].y, ring[u][mt][1].z, ring[u][mt][1].w};
              uint32_t ar[4];
              ee::a_regs(r0, r8, s, ar);
              mma_16816<T>(acc[mt][nt], ar, bh0, bh1);
              mma_16816<T>(acc[mt][nt], ar, bl0, bl1);
            }
          }
        }
        if (c + U < nchunks) load_chunk(c + U, ring[u]);
      }
    }
    // epilogue: offer every accumulator above its column's minimum, one lane at a time
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int64_t v = ee::epilogue_vocab(vw, mt, lane, i);
          const int col = ee::epilogue_col(nt, lane, i);
          const bool valid = v < v1 && col0 + col < a.B;
          const unsigned long long key = valid ? ee::logit_key(acc[mt][nt][i], static_cast<uint32_t>(v)) : 0ull;
          volatile unsigned long long* th = thresh + warp * BN + col;
          bool want = valid && key > *th;
          unsigned m = __ballot_sync(kFull, want);
          while (m) {
            const int src = __ffs(m) - 1;
            if (lane == src) {
              unsigned long long t = *th;
              ee::kept_offer(kept + (static_cast<int64_t>(warp) * BN + col) * a.k, a.k, key, t);
              *th = t;
              want = false;
            }
            __syncwarp();
            want = want && key > *th;
            m = __ballot_sync(kFull, want);
          }
        }
      }
    }
  }
  __syncthreads();
  // warp w merges the 8 warps' kept sets of columns w, w + 8, ...: k rounds of a warp max
  for (int col = warp; col < BN; col += kMmaWarps) {
    const int64_t row = col0 + col;
    if (row >= a.B) continue;
    warp_merge_kept([&](int i) { return kept[(static_cast<int64_t>(i / a.k) * BN + col) * a.k + i % a.k]; },
                    kMmaWarps * a.k, a.k, a.cand + (row * splits + split) * a.k, lane);
  }
}

__global__ void __launch_bounds__(kMergeThreads)
early_exit_merge_kernel(unsigned long long* cand, int64_t per_row, int k, float* values, int64_t* indices,
                        uint4* hn_hi, uint4* hn_lo, int64_t hn_row_vecs) {
  __shared__ unsigned long long scratch[kMergeThreads / 32];
  __shared__ unsigned long long winner;
  const int64_t row = blockIdx.x;
  for (int64_t i = threadIdx.x; i < hn_row_vecs; i += kMergeThreads) {  // the tensor-core path's hn rows
    hn_hi[row * hn_row_vecs + i] = make_uint4(0, 0, 0, 0);
    hn_lo[row * hn_row_vecs + i] = make_uint4(0, 0, 0, 0);
  }
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
plans::Plan plan_on_device(int64_t B, int64_t H, int64_t V, int64_t k, int dtype, bool aligned) {
  const plans::Plan p = plans::plan_early_exit_topk(B, H, V, k, current_device_limits(), 0, dtype, aligned);
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
      a.cand, p.at("splits") * a.k, a.k, values, indices, nullptr, nullptr, 0);
  SPECDEC_CUDA_CHECK(cudaGetLastError());
}

template <typename T, int NT>
void launch_mma(const MmaArgs& m, const plans::Launch& l, cudaStream_t stream) {
  if (l.opt_in) {
    SPECDEC_CUDA_CHECK(cudaFuncSetAttribute(early_exit_mma_kernel<T, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(l.dynamic_smem)));
  }
  early_exit_mma_kernel<T, NT><<<grid_of(l), l.block, l.dynamic_smem, stream>>>(m);
}

// The tensor-core path: normalize -> mma -> merge (plan values "mma" = 1).
template <typename T>
void launch_mma_typed(const SplitArgs& a, const plans::Plan& p, float* values, int64_t* indices, void* workspace,
                      cudaStream_t stream) {
  const plans::Launch& norm = p.launches.at(0);
  const plans::Launch& mma = p.launches.at(1);
  const plans::Launch& merge = p.launches.at(2);
  const int64_t hs = p.at("hn_stride"), rows = p.at("hn_rows");
  uint16_t* hn_hi = reinterpret_cast<uint16_t*>(static_cast<unsigned char*>(workspace) + p.at("hn_offset"));
  uint16_t* hn_lo = hn_hi + rows * hs;
  NormArgs n{};
  n.hidden = a.hidden;
  n.hidden_stride = a.hidden_stride;
  n.norm_weight = a.norm_weight;
  n.norm_bias = a.norm_bias;
  n.norm_dtype = a.norm_dtype;
  n.hn_hi = hn_hi;
  n.hn_lo = hn_lo;
  n.hn_stride = hs;
  n.H = a.H;
  n.norm = a.norm;
  n.dtype = dtype_of<T>();
  n.eps = a.eps;
  early_exit_normalize_kernel<T><<<grid_of(norm), norm.block, norm.dynamic_smem, stream>>>(n);
  SPECDEC_CUDA_CHECK(cudaGetLastError());
  MmaArgs m{};
  m.lm_head = a.lm_head;
  m.lm_head_stride = a.lm_head_stride;
  m.hn_hi = hn_hi;
  m.hn_lo = hn_lo;
  m.hn_stride = hs;
  m.cand = a.cand;
  m.B = a.B;
  m.H = a.H;
  m.V = a.V;
  m.per_split = p.at("per_split");
  m.k = a.k;
  m.k_block = static_cast<int>(p.at("k_block"));
  switch (p.at("n_tiles")) {
    case 1: launch_mma<T, 1>(m, mma, stream); break;
    case 2: launch_mma<T, 2>(m, mma, stream); break;
    case 4: launch_mma<T, 4>(m, mma, stream); break;
    default: launch_mma<T, 8>(m, mma, stream); break;
  }
  SPECDEC_CUDA_CHECK(cudaGetLastError());
  early_exit_merge_kernel<<<grid_of(merge), merge.block, merge.dynamic_smem, stream>>>(
      a.cand, p.at("splits") * a.k, a.k, values, indices, reinterpret_cast<uint4*>(hn_hi),
      reinterpret_cast<uint4*>(hn_lo), hs / 8);
  SPECDEC_CUDA_CHECK(cudaGetLastError());
}

// The rule the plan's `aligned` stands for (the Python launcher applies the same one).
bool mma_aligned(const void* lm_head, int64_t lm_head_stride) {
  return reinterpret_cast<uintptr_t>(lm_head) % 16 == 0 && lm_head_stride % 8 == 0;
}

}  // namespace

uint64_t early_exit_topk_workspace_bytes(int64_t B, int64_t H, int64_t V, int64_t k, int dtype, bool aligned) {
  if (B <= 0) return 0;
  return static_cast<uint64_t>(plan_on_device(B, H, V, k, dtype, aligned).at("workspace_bytes"));
}

void launch_early_exit_topk(const void* hidden, int64_t hidden_stride, const void* norm_weight,
                            const void* norm_bias, int norm_dtype, const void* lm_head,
                            int64_t lm_head_stride, float* values, int64_t* indices, void* workspace,
                            uint64_t workspace_bytes, int64_t B, int64_t H, int64_t V, int64_t k,
                            int dtype, int norm, double eps, cudaStream_t stream) {
  check_arg(dtype == kFloat32 || dtype == kFloat16 || dtype == kBFloat16, "dtype must be 0, 1 or 2");
  check_arg(norm_dtype == kFloat32 || norm_dtype == kFloat16 || norm_dtype == kBFloat16, "bad norm dtype");
  check_arg(norm == kNone || norm == kRms || norm == kLayer, "norm must be 0 (none), 1 (rms) or 2 (layer)");
  const plans::Plan p = plan_on_device(B, H, V, k, dtype, mma_aligned(lm_head, lm_head_stride));
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
  const bool mma = p.values.count("mma") != 0;
  if (mma && dtype == kFloat16) {
    launch_mma_typed<__half>(a, p, values, indices, workspace, stream);
  } else if (mma && dtype == kBFloat16) {
    launch_mma_typed<__nv_bfloat16>(a, p, values, indices, workspace, stream);
  } else if (dtype == kFloat16) {
    launch_typed<__half>(a, p, values, indices, stream);
  } else if (dtype == kBFloat16) {
    launch_typed<__nv_bfloat16>(a, p, values, indices, stream);
  } else {
    launch_typed<float>(a, p, values, indices, stream);
  }
}

}  // namespace specdec
