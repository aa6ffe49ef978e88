#pragma once
// Device pieces shared by the split-V sampling kernels (rejection_sampling.cu, block_verification.cu):
// block-wide int64 sums and scans, fixed-point weights of 16-byte slots, the inverse-CDF
// search over one V-chunk, and the partial / merged softmax statistics of the logits
// variants. Every kernel that uses them runs kThreads threads per block.
//
// Weights: w_p = to_weight(P(x)) and, where a draft row q_row is given, the residual weight
// w_r = resid(P(x), Q(x)) (a functor of the caller: rejection sampling's to_weight(P - Q),
// block verification's scaled residual). Without q_row, w_r is 0 and a search walks w_p.
// All sums are exact int64, so any split of V gives the same totals and the same draw.

#include <cstdint>

#include "common.cuh"
#include "logit_math.cuh"
#include "philox.cuh"

namespace specdec {
namespace split_v {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Token ids stay in [0, V) whatever happened upstream.
__device__ __forceinline__ int64_t clamp_token(long long token, int V) {
  return token < 0 ? 0 : (token >= V ? V - 1 : token);
}

// ---------------------------------------------------------------------------------------
// Block primitives (kThreads threads; every thread must call them; they end with a barrier
// so their shared scratch can be reused immediately)
// ---------------------------------------------------------------------------------------

// Sums of a and b over the block, returned to every thread.
__device__ __forceinline__ void block_sum2(long long& a, long long& b, reduce::I64Pair* scratch) {
  const reduce::I64Pair sum = reduce::block_all<kWarps>(reduce::I64Pair{a, b}, scratch, reduce::I64Pair{0, 0},
                                                        reduce::Sum{});
  a = sum.a;
  b = sum.b;
  __syncthreads();
}

// Sums of the `splits` chunk totals of one row (.x residual, .y plain) to every thread; L2
// reads: other blocks wrote them.
__device__ __forceinline__ void block_sum_chunk_totals(const longlong2* chunk_totals, int splits, long long& total_r,
                                                       long long& total_p, reduce::I64Pair* scratch) {
  total_r = 0;
  total_p = 0;
  for (int k = threadIdx.x; k < splits; k += kThreads) {
    const longlong2 t = __ldcg(&chunk_totals[k]);
    total_r += t.x;
    total_p += t.y;
  }
  block_sum2(total_r, total_p, scratch);
}

// Exclusive prefix sum of v in thread order; `total` gets the block sum (every thread).
__device__ __forceinline__ long long block_exclusive_scan(long long v, long long* scratch, long long& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  long long x = v;  // inclusive scan within the warp
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const long long y = __shfl_up_sync(0xFFFFFFFFu, x, off);
    if (lane >= off) x += y;
  }
  if (lane == 31) scratch[warp] = x;
  __syncthreads();
  long long before = 0, sum = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const long long t = scratch[w];
    if (w < warp) before += t;
    sum += t;
  }
  __syncthreads();
  total = sum;
  return before + x - v;
}

// One tile of an inverse-CDF block scan. w: this thread's K weights, at ids i, i + 1, ... (slots are dealt
// tile-major, then by thread, then by element, so the scan walks ids in order). The one thread whose range
// holds `threshold` (cumulative weights never decrease) writes the crossing id to *s_found. Returns carry plus
// the tile's weight, the same in every thread. The caller loads w and loops over the tiles: a load taken as a
// lambda made nvcc keep more of the bfloat16 tree-rejection kernels on the stack.
template <int K>
__device__ __forceinline__ long long scan_tile_crossing(const int64_t (&w)[K], int64_t i, long long threshold,
                                                        long long carry, long long* scan_scratch,
                                                        long long* s_found) {
  long long local = 0;
#pragma unroll
  for (int k = 0; k < K; ++k) local += w[k];
  long long tile_total;
  long long cum = carry + block_exclusive_scan(local, scan_scratch, tile_total);
  if (cum <= threshold && threshold < cum + local) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      cum += w[k];
      if (cum > threshold) {
        *s_found = i + k;
        break;
      }
    }
  }
  return carry + tile_total;
}

// ---------------------------------------------------------------------------------------
// Probability transforms: what a loaded element x means as a probability
// ---------------------------------------------------------------------------------------

// The probability kernels: the loaded value itself. kSlotsInFlight: the 16-byte slots a
// thread's weight-sum loop keeps loading at once (its unroll).
struct Identity {
  static constexpr int kSlotsInFlight = 4;
  __device__ __forceinline__ float operator()(float x) const { return x; }
};

// One softmax row: P(x) = exp(x / T - m) / s, fp32, as torch.softmax(x.float() / T), by
// logit_math.cuh's softmax_prob: per element one multiply and two fmas for the correctly
// rounded x / T (no division), an fma for x / T - m, one ex2.approx and a multiply by 1 / s
// (ts and inv_s are made once per row). Two slots in flight: at 64 registers a thread
// (rejection_sample's four CTAs per SM) four 16-bit slots of a row pair spill.
struct SoftmaxProb {
  static constexpr int kSlotsInFlight = 2;
  logit::TempScale ts;
  float m, inv_s;
  __device__ __forceinline__ SoftmaxProb(float temperature, float m_, float s)
      : ts(logit::temp_scale(temperature)), m(m_), inv_s(1.0f / s) {}
  __device__ __forceinline__ float operator()(float x) const { return logit::softmax_prob(x, ts, m, inv_s); }
};

// ---------------------------------------------------------------------------------------
// Fixed-point weights of K = 16 / sizeof(T) consecutive elements
// ---------------------------------------------------------------------------------------

// The K elements [i, i + K) of `row` widened to fp32; elements at or past `end` are not read
// (0). `vec`: row + i is 16-byte aligned (uniform per row: slot starts are multiples of 8
// elements from a chunk start that is one too).
template <typename T>
__device__ __forceinline__ void load_values(const T* row, int64_t i, int64_t end, bool vec,
                                            float (&x)[Vec16<T>::kElems]) {
  constexpr int K = Vec16<T>::kElems;
  if (vec && i + K <= end) {
    load_vec16(row + i, x);
  } else {
#pragma unroll
    for (int k = 0; k < K; ++k) x[k] = i + k < end ? to_float(row[i + k]) : 0.0f;
  }
}

// For the elements [i, i + K) of a row: w_p = to_weight(P) and w_r = resid(P, Q) when q_row
// is not null (else 0), with P = prob_p(p_row[i]), Q = prob_q(q_row[i]). Elements at or past
// `end` are not read and weigh 0. `vec`: p_row + i and q_row + i are 16-byte aligned.
template <typename T, typename Prob, typename Resid>
__device__ __forceinline__ void load_weights(const T* p_row, const T* q_row, int64_t i, int64_t end, bool vec,
                                             const Prob& prob_p, const Prob& prob_q, const Resid& resid,
                                             int64_t (&w_r)[Vec16<T>::kElems], int64_t (&w_p)[Vec16<T>::kElems]) {
  constexpr int K = Vec16<T>::kElems;
  float p[K], q[K] = {};
  load_values(p_row, i, end, vec, p);
  if (q_row != nullptr) load_values(q_row, i, end, vec, q);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const bool in = i + k < end;
    const float pp = prob_p(p[k]);
    w_p[k] = in ? to_weight(pp) : 0;
    w_r[k] = in && q_row != nullptr ? resid(pp, prob_q(q[k])) : 0;
  }
}

// The weights a search walks for the elements [i, i + K): w_r when q_row is not null, else w_p
// (load_weights' values; one array, so a search keeps K weights live across its block scan, not 2K).
template <typename T, typename Prob, typename Resid>
__device__ __forceinline__ void load_search_weights(const T* p_row, const T* q_row, int64_t i, int64_t end, bool vec,
                                                    const Prob& prob_p, const Prob& prob_q, const Resid& resid,
                                                    int64_t (&w)[Vec16<T>::kElems]) {
  constexpr int K = Vec16<T>::kElems;
  float p[K], q[K] = {};
  load_values(p_row, i, end, vec, p);
  if (q_row != nullptr) load_values(q_row, i, end, vec, q);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const float pp = prob_p(p[k]);
    w[k] = i + k >= end ? 0 : (q_row != nullptr ? resid(pp, prob_q(q[k])) : to_weight(pp));
  }
}

// Per-thread sums of w_r and w_p over [start, end); slots of K elements are dealt to the
// threads round-robin (the order does not matter: integer sums).
template <typename T, typename Prob, typename Resid>
__device__ __forceinline__ void thread_weight_sums(const T* p_row, const T* q_row, int64_t start, int64_t end,
                                                   bool vec, const Prob& prob_p, const Prob& prob_q,
                                                   const Resid& resid, long long& sum_r, long long& sum_p) {
  constexpr int K = Vec16<T>::kElems;
  const int64_t slots = (end - start + K - 1) / K;
#pragma unroll(Prob::kSlotsInFlight)  // independent iterations: the loads of several slots in flight at once
  for (int64_t s = threadIdx.x; s < slots; s += kThreads) {
    int64_t w_r[K], w_p[K];
    load_weights(p_row, q_row, start + s * K, end, vec, prob_p, prob_q, resid, w_r, w_p);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      sum_r += w_r[k];
      sum_p += w_p[k];
    }
  }
}

// The weight sums of V-chunk `split` of a row ([split * chunk, min(V, (split + 1) * chunk))), to every thread:
// what each block of a split-V launch publishes for its row's draw.
template <typename T, typename Prob, typename Resid>
__device__ __forceinline__ void chunk_weight_sums(const T* p_row, const T* q_row, int64_t split, int64_t chunk, int V,
                                                  bool vec, const Prob& prob_p, const Prob& prob_q, const Resid& resid,
                                                  reduce::I64Pair* scratch, long long& sum_r, long long& sum_p) {
  const int64_t start = split * chunk;
  const int64_t end = min(static_cast<int64_t>(V), start + chunk);
  sum_r = 0;
  sum_p = 0;
  thread_weight_sums(p_row, q_row, start, end, vec, prob_p, prob_q, resid, sum_r, sum_p);
  block_sum2(sum_r, sum_p, scratch);
}

// Inverse-CDF search in [start, end): the first index whose cumulative weight carry +
// sum(w[start..index]) exceeds `threshold`, w = the residual weights when q_row is not null,
// else P's plain weights. Requires carry <= threshold. Returns that index to every thread, or
// -1 when the cumulative weight of the range never exceeds threshold. Slots are dealt in
// index order (tile-major, then thread, then element), so the block scan walks the row in
// index order; it stops after the tile that crosses the threshold.
template <typename T, typename Prob, typename Resid>
__device__ __forceinline__ int64_t block_find_crossing(const T* p_row, const T* q_row, int64_t start, int64_t end,
                                                       bool vec, const Prob& prob_p, const Prob& prob_q,
                                                       const Resid& resid, int64_t threshold, long long carry,
                                                       long long* scan_scratch, long long* s_found) {
  constexpr int K = Vec16<T>::kElems;
  if (threadIdx.x == 0) *s_found = -1;  // ordered before any owner's write by the scan's barriers
  const int64_t slots = (end - start + K - 1) / K;
  for (int64_t tile = 0; tile < slots; tile += kThreads) {  // uniform trip count
    const int64_t i = start + (tile + threadIdx.x) * K;     // >= end for idle threads: weights 0
    int64_t w[K];
    load_search_weights(p_row, q_row, i, end, vec, prob_p, prob_q, resid, w);
    carry = scan_tile_crossing(w, i, threshold, carry, scan_scratch, s_found);
    if (carry > threshold) break;
  }
  __syncthreads();
  const long long found = *s_found;
  __syncthreads();  // nobody resets *s_found before everyone has read it
  return found;
}

// The V-chunk whose cumulative range of chunk totals (.x residual when use_r, else .y) holds
// `threshold` (in [0, total)), scanned in chunk order; returns it to every thread (-1 when
// none) with `base` = the cumulative weight of the chunks before it.
__device__ __forceinline__ long long block_find_chunk(const longlong2* chunk_totals, int splits, bool use_r,
                                                      long long threshold, long long* scan_scratch,
                                                      long long* s_chunk, long long* s_base, long long& base) {
  if (threadIdx.x == 0) *s_chunk = -1;
  long long carry = 0;
  for (int k0 = 0; k0 < splits; k0 += kThreads) {  // uniform trip count
    const int k = k0 + static_cast<int>(threadIdx.x);
    long long v = 0;
    if (k < splits) {
      const longlong2 t = __ldcg(&chunk_totals[k]);  // written by other blocks: L2
      v = use_r ? t.x : t.y;
    }
    long long tile_total;
    const long long cum = carry + block_exclusive_scan(v, scan_scratch, tile_total);
    if (cum <= threshold && threshold < cum + v) {  // exactly one owner
      *s_chunk = k;
      *s_base = cum;
    }
    carry += tile_total;
    if (carry > threshold) break;
  }
  __syncthreads();
  base = *s_base;
  return *s_chunk;
}

// ---------------------------------------------------------------------------------------
// Softmax statistics of the logits variants: (max m, sum s of exp(x/t - m)) per V-chunk,
// then merged per row in a fixed order, so the result depends only on the data
// ---------------------------------------------------------------------------------------

// Rows of a (B, 2G+1) statistics layout a batch row with n drafts uses: target rows 0..n
// (r <= G), draft rows 0..n-1 (r = G + 1 + j).
__device__ __forceinline__ bool logits_row_needed(int r, int n, int G) { return r <= G ? r <= n : r - G - 1 < n; }

// This thread's online (m, s) over its slots of row[start, end) / t; `bad` on a NaN or +inf
// (torch's whole softmax row is NaN then). The arithmetic is logit_math.cuh's (the quotient
// x / t and the exp as the SoftmaxProb functor computes them); one max and at most one
// rescale per slot, and no NaN/inf test per element (they poison s or m, tested once here).
template <typename T>
__device__ __forceinline__ void thread_softmax_partial(const T* row, int64_t start, int64_t end, bool vec, float t,
                                                       float& m, float& s, bool& bad) {
  constexpr int K = Vec16<T>::kElems;
  const logit::TempScale ts = logit::temp_scale(t);
  m = -INFINITY;
  s = 0.0f;
  const int64_t slots = (end - start + K - 1) / K;
  for (int64_t slot = threadIdx.x; slot < slots; slot += kThreads) {
    const int64_t i = start + slot * K;
    float x[K], z[K];
    load_values(row, i, end, vec, x);
#pragma unroll
    for (int k = 0; k < K; ++k) z[k] = logit::div_mantissa(x[k], ts);
    if (i + K > end) {  // the row's last slot: elements past the end weigh nothing
#pragma unroll
      for (int k = 0; k < K; ++k) z[k] = i + k < end ? z[k] : -INFINITY;
    }
    logit::softmax_partial_add(m, s, z, ts.scale);
  }
  bad = logit::softmax_partial_bad(m, s);
  if (bad) s = 0.0f;  // block_softmax_stats reads m and s of good threads only
}

// Block reduction of per-thread softmax partials (m, s, bad) to the chunk's (m, s); every
// thread gets the result; bad -> m = NaN.
__device__ __forceinline__ float2 block_softmax_stats(float m, float s, bool bad, float* scratch_m,
                                                      float* scratch_s) {
  bad = __syncthreads_or(bad) != 0;
  // m is never NaN: NaN/+inf inputs only set `bad`
  const float M = reduce::block_all<kWarps>(m, scratch_m, -INFINITY, reduce::MaxF32{});
  const float c = m == -INFINITY ? 0.0f : s * logit::exp_diff(m, M);  // M >= m; a thread with no finite x adds 0
  const float S = reduce::block_all<kWarps>(c, scratch_s, 0.0f, reduce::Sum{});
  __syncthreads();
  return make_float2(bad ? NAN : M, S);
}

// One warp merges the `splits` chunk partials of a row (L2 reads: other blocks wrote them);
// every lane gets (M, S), or (NaN, NaN) when any chunk was bad or the row has no finite logit
// (torch's softmax row is all NaN then).
__device__ __forceinline__ float2 warp_merge_softmax(const float2* partials, int splits, int lane) {
  bool bad = false;
  float M = -INFINITY;
  for (int k = lane; k < splits; k += 32) {
    const float2 v = __ldcg(&partials[k]);
    if (isnan(v.x)) bad = true; else M = fmaxf(M, v.x);
  }
  bad = __any_sync(0xFFFFFFFFu, bad);
  M = reduce::warp_all(M, reduce::MaxF32{});
  float S = 0.0f;
  if (!bad && M > -INFINITY) {  // warp-uniform
    for (int k = lane; k < splits; k += 32) {
      const float2 v = __ldcg(&partials[k]);
      if (v.x > -INFINITY) S += v.y * logit::exp_diff(v.x, M);  // an all -inf chunk adds 0
    }
    S = reduce::warp_all(S, reduce::Sum{});
  }
  return (bad || M == -INFINITY) ? make_float2(NAN, NAN) : make_float2(M, S);
}

}  // namespace split_v
}  // namespace specdec
