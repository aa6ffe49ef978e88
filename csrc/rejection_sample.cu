// Speculative sampling on chain drafts (Leviathan et al., Algorithm 1): the CUDA backend of
// ops.rejection_sample, bit-identical to specdec_kernels.reference.rejection_sample.
//
// What a batch row b computes (reference/chain_verify.py):
//   1. num_accepted a: the first draft j < n_b (n_b = clamp(num_draft_tokens[b], 0, G))
//      that fails u_j * q_j(x_j) < p_j(x_j) (float64; ids outside [0, V) fail), else n_b.
//   2. the final token, drawn by inverse CDF over fixed-point weights
//      (weight = floor(clamp(x, 0, 1) * 2^40), reference/_sampling.py) of ONE row:
//      the residual max(0, p_a - q_a) when a < n_b, else the bonus row p_a; an empty
//      residual falls back to p_a with the same uniform, and no mass at all gives 0.
//   Everything is integer or a single float64 rounding (philox.cuh), so the result does not
//   depend on how the sums are split: any split of V gives the reference bit for bit.
//
// Why one launch. B can be 1 with V ~ 150k, and one block per row would leave almost every
// SM idle. So grid = (B, splits): every block of row b first recomputes a itself (G is small:
// 2 gathered scalars and one Philox draw per draft), which fixes the final row without any
// cross-block communication, then sums the two kinds of weights (residual, and p for the
// fallback) over its V-chunk and stores the two int64 chunk totals in the workspace. The
// last block of the row to finish (per-row atomic counter, __threadfence on both sides, as in
// greedy_verify.cu) adds the chunk totals, draws the threshold floor(u * total), finds the
// chunk whose cumulative range contains it, and rescans only that chunk with a block-wide
// int64 prefix sum in index order to find the first token whose cumulative weight exceeds
// the threshold. It then writes the outputs and re-zeroes the workspace slots and counter it
// used, so the zeroed buffer is reusable by the next call or graph replay on the stream.
// No host sync, no allocation, no second kernel.
//
// Chunks hold 2048..8192 elements (one chunk when V is smaller; plans::plan_rejection_sample): enough blocks for
// small B (B = 1, V = 151936: 74 blocks), and a rescan that re-reads only a small fraction
// of the row (usually from L2) for large B.
//
// Limits: V < 2^23 (the int64 fixed-point totals). Grid (B, splits): B in grid x.
// Out-of-contract inputs never produce ids outside [0, V): draw_threshold keeps the
// threshold in [0, total - 1] on every backend (uniforms of 1.0, above 1, or NaN).
//
// Workspace: [B][max_splits] longlong2 chunk totals (.x residual, .y p), max_splits =
// ceil(V / 2048) >= any plan's splits, then [B] uint32 counters.
//
// rejection_sample_logits (second kernel in this file, same structure): see its comment.

#include <algorithm>
#include <stdexcept>
#include <string>

#include "common.cuh"
#include "launch_utils.h"
#include "philox.cuh"
#include "rejection_sample.h"

namespace specdec {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Each weight is <= 2^40, so a row total stays below 2^63 for V < 2^23.
constexpr int64_t kMaxVocab = int64_t{1} << 23;
static_assert(kThreads == plans::kRejectionThreads && kMaxVocab == plans::kRejectionMaxVocab,
              "launch_plan.h mirrors the block size and the vocabulary limit");

// ---------------------------------------------------------------------------------------
// Randomness (reference/chain_verify.py + reference/rng.py)
// ---------------------------------------------------------------------------------------
struct Randomness {
  const void* uniforms;  // [B, G+1] contiguous, or null for the seeded modes
  bool uniforms_f64;
  int64_t seed;          // int seed (rows keyed by batch index)
  const int64_t* seeds;  // [B] per-request seeds (row key 0), or null
  const int64_t* offsets;  // [B] or null (= 0)
};

// The uniform in column `col` of row b (caller uniforms), or the Philox draw at sequence
// position offsets[b] + `position` with `salt`. Drafts: col = position = j, kSaltAccept.
// Final draw: col = G, position = num_accepted, kSaltFinal.
__device__ __forceinline__ double row_uniform(const Randomness& rnd, int64_t b, int G, int col, int64_t position,
                                              uint32_t salt) {
  if (rnd.uniforms != nullptr) {
    const int64_t idx = b * (G + 1) + col;
    return rnd.uniforms_f64 ? static_cast<const double*>(rnd.uniforms)[idx]
                            : static_cast<double>(static_cast<const float*>(rnd.uniforms)[idx]);
  }
  const int64_t seed = rnd.seeds != nullptr ? rnd.seeds[b] : rnd.seed;
  const int64_t row_key = rnd.seeds != nullptr ? 0 : b;
  const int64_t offset = rnd.offsets != nullptr ? rnd.offsets[b] : 0;
  // Wrapping add (only the low 32 bits enter the counter), without signed-overflow UB.
  const int64_t pos = static_cast<int64_t>(static_cast<uint64_t>(offset) + static_cast<uint64_t>(position));
  return philox_uniform(seed, pos, row_key, salt, 0);
}

__device__ __forceinline__ int drafts_in_row(const int64_t* num_draft_tokens, int64_t b, int G) {
  if (num_draft_tokens == nullptr) return G;
  const int64_t n = num_draft_tokens[b];
  return n < 0 ? 0 : (n > G ? G : static_cast<int>(n));
}

__device__ __forceinline__ bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// ---------------------------------------------------------------------------------------
// Block primitives (kThreads threads; every thread must call them; they end with a barrier
// so their shared scratch can be reused immediately)
// ---------------------------------------------------------------------------------------

// Sums of a and b over the block, returned to every thread.
__device__ __forceinline__ void block_sum2(long long& a, long long& b, long long (*scratch)[2]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    a += __shfl_xor_sync(0xFFFFFFFFu, a, off);
    b += __shfl_xor_sync(0xFFFFFFFFu, b, off);
  }
  if (lane == 0) {
    scratch[warp][0] = a;
    scratch[warp][1] = b;
  }
  __syncthreads();
  a = 0;
  b = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    a += scratch[w][0];
    b += scratch[w][1];
  }
  __syncthreads();
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

// ---------------------------------------------------------------------------------------
// Fixed-point weights of K = 16 / sizeof(T) consecutive elements
// ---------------------------------------------------------------------------------------

// Probability transform of the probability kernel: the loaded value itself.
struct Identity {
  __device__ __forceinline__ float operator()(float x) const { return x; }
};

// The K = 16 / sizeof(T) elements [i, i + K) of `row` widened to fp32; elements at or past
// `end` are not read (0). `vec`: row + i is 16-byte aligned (uniform per row: slot starts
// are multiples of 8 elements from a chunk start that is one too).
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

// For the elements [i, i + K) of a row: w_r = to_weight(P - Q) and w_p = to_weight(P), where
// P = prob_p(p_row[i]) and Q = prob_q(q_row[i]), or Q = 0 when q_row is null (then w_r == w_p
// bit for bit: P - 0 == P). Elements at or past `end` are not read and weigh 0. `vec` says
// that p_row + i and q_row + i are 16-byte aligned for every slot start i.
template <typename T, typename Prob>
__device__ __forceinline__ void load_weights(const T* p_row, const T* q_row, int64_t i, int64_t end, bool vec,
                                             const Prob& prob_p, const Prob& prob_q,
                                             int64_t (&w_r)[Vec16<T>::kElems], int64_t (&w_p)[Vec16<T>::kElems]) {
  constexpr int K = Vec16<T>::kElems;
  float p[K], q[K] = {};
  load_values(p_row, i, end, vec, p);
  if (q_row != nullptr) load_values(q_row, i, end, vec, q);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const bool in = i + k < end;
    const float pp = prob_p(p[k]);
    const float qq = q_row != nullptr ? prob_q(q[k]) : 0.0f;
    w_p[k] = in ? to_weight(pp) : 0;
    w_r[k] = in ? to_weight(pp - qq) : 0;  // fp32 subtraction, as the reference
  }
}

// Per-thread sums of w_r and w_p over [start, end); slots of K elements are dealt to the
// threads round-robin (the order does not matter: integer sums).
template <typename T, typename Prob>
__device__ __forceinline__ void thread_weight_sums(const T* p_row, const T* q_row, int64_t start, int64_t end,
                                                   bool vec, const Prob& prob_p, const Prob& prob_q,
                                                   long long& sum_r, long long& sum_p) {
  constexpr int K = Vec16<T>::kElems;
  const int64_t slots = (end - start + K - 1) / K;
#pragma unroll 4  // independent iterations: lets the loads of several slots be in flight at once
  for (int64_t s = threadIdx.x; s < slots; s += kThreads) {
    int64_t w_r[K], w_p[K];
    load_weights(p_row, q_row, start + s * K, end, vec, prob_p, prob_q, w_r, w_p);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      sum_r += w_r[k];
      sum_p += w_p[k];
    }
  }
}

// Inverse-CDF search in [start, end): the first index whose cumulative weight
// carry + sum(w_r[start..index]) exceeds `threshold` (w_r as in load_weights: pass
// q_row = null to search p's own weights). Requires carry <= threshold. Returns that index
// to every thread, or -1 when the cumulative weight of the range never exceeds threshold.
// Slots are dealt in index order (tile-major, then thread, then element), so the block scan
// walks the row in index order; it stops after the tile that crosses the threshold.
template <typename T, typename Prob>
__device__ __forceinline__ int64_t block_find_crossing(const T* p_row, const T* q_row, int64_t start, int64_t end,
                                                       bool vec, const Prob& prob_p, const Prob& prob_q,
                                                       int64_t threshold, long long carry, long long* scan_scratch,
                                                       long long* s_found) {
  constexpr int K = Vec16<T>::kElems;
  if (threadIdx.x == 0) *s_found = -1;  // ordered before any owner's write by the scan's barriers
  const int64_t slots = (end - start + K - 1) / K;
  for (int64_t tile = 0; tile < slots; tile += kThreads) {  // uniform trip count
    const int64_t i = start + (tile + threadIdx.x) * K;     // >= end for idle threads: weights 0
    int64_t w_r[K], w_p[K];
    load_weights(p_row, q_row, i, end, vec, prob_p, prob_q, w_r, w_p);
    long long local = 0;
#pragma unroll
    for (int k = 0; k < K; ++k) local += w_r[k];
    long long tile_total;
    long long cum = carry + block_exclusive_scan(local, scan_scratch, tile_total);
    // Cumulative weights never decrease, so exactly one thread owns the crossing (if any).
    if (cum <= threshold && threshold < cum + local) {
#pragma unroll
      for (int k = 0; k < K; ++k) {
        cum += w_r[k];
        if (cum > threshold) {
          *s_found = i + k;
          break;
        }
      }
    }
    carry += tile_total;  // identical in every thread
    if (carry > threshold) break;
  }
  __syncthreads();
  const long long found = *s_found;
  __syncthreads();  // nobody resets *s_found before everyone has read it
  return found;
}

// The first draft that fails the acceptance test, or n when all pass, to every thread.
// pq(j, token, p, q) loads the target / draft probabilities of `token` at draft position j.
template <typename PQ>
__device__ __forceinline__ int first_rejection(const int64_t* draft_tokens, const Randomness& rnd, int64_t b, int G,
                                               int n, int V, const PQ& pq, int* s_first) {
  if (threadIdx.x == 0) *s_first = n;
  __syncthreads();
  for (int j = threadIdx.x; j < n; j += kThreads) {
    const int64_t token = draft_tokens[b * G + j];
    bool accept = false;
    if (token >= 0 && token < V) {  // out-of-range ids are rejected without being read
      float p, q;
      pq(j, token, p, q);
      accept = accept_draft(row_uniform(rnd, b, G, j, j, kSaltAccept), q, p);
    }
    if (!accept) atomicMin(s_first, j);
  }
  __syncthreads();
  return *s_first;
}

// Outputs of row b: accepted drafts, the final token, then -1.
__device__ __forceinline__ void write_row(const int64_t* draft_tokens, int64_t* out_tokens, int64_t* num_accepted,
                                          int64_t b, int G, int a, int64_t token) {
  int64_t* out = out_tokens + b * (G + 1);
  for (int j = threadIdx.x; j <= G; j += kThreads) {
    out[j] = j < a ? draft_tokens[b * G + j] : (j == a ? token : int64_t{-1});
  }
  if (threadIdx.x == 0) num_accepted[b] = a;
}

// Token ids stay in [0, V) whatever happened upstream.
__device__ __forceinline__ int64_t clamp_token(long long token, int V) {
  return token < 0 ? 0 : (token >= V ? V - 1 : token);
}

// ---------------------------------------------------------------------------------------
// rejection_sample: grid (B, splits)
// ---------------------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(kThreads)
rejection_sample_kernel(const T* __restrict__ target, int64_t t_sb, int64_t t_sg, const T* __restrict__ draft,
                        int64_t q_sb, int64_t q_sg, const int64_t* __restrict__ draft_tokens,
                        const int64_t* __restrict__ num_draft_tokens, Randomness rnd,
                        int64_t* __restrict__ out_tokens, int64_t* __restrict__ num_accepted, longlong2* totals,
                        unsigned int* counters, int64_t ws_stride, int G, int V, int64_t chunk) {
  __shared__ long long sum_scratch[kWarps][2];
  __shared__ long long scan_scratch[kWarps];
  __shared__ int s_first;
  __shared__ bool s_is_last;
  __shared__ long long s_chunk, s_base, s_found;

  const int64_t b = blockIdx.x;
  const int64_t split = blockIdx.y;
  const int splits = static_cast<int>(gridDim.y);
  const int n = drafts_in_row(num_draft_tokens, b, G);

  // ---- 1. num_accepted, recomputed by every block of the row --------------------------
  const Identity id;
  const int a = first_rejection(
      draft_tokens, rnd, b, G, n, V,
      [&](int j, int64_t token, float& p, float& q) {
        p = to_float(target[b * t_sb + j * t_sg + token]);
        q = to_float(draft[b * q_sb + j * q_sg + token]);
      },
      &s_first);
  const bool rejected = a < n;  // a < n <= G: draft row a exists
  const T* p_row = target + b * t_sb + a * t_sg;
  const T* q_row = rejected ? draft + b * q_sb + a * q_sg : nullptr;  // bonus row: plain p
  const bool vec = aligned16(p_row) && (q_row == nullptr || aligned16(q_row));

  // ---- 2. this chunk's weight totals ---------------------------------------------------
  const int64_t start = split * chunk;
  const int64_t end = min(static_cast<int64_t>(V), start + chunk);
  long long sum_r = 0, sum_p = 0;
  thread_weight_sums(p_row, q_row, start, end, vec, id, id, sum_r, sum_p);
  block_sum2(sum_r, sum_p, sum_scratch);

  // ---- 3. publish them; elect the last block of row b ---------------------------------
  longlong2* row_totals = totals + b * ws_stride;
  if (threadIdx.x == 0) {
    __stcg(&row_totals[split], make_longlong2(sum_r, sum_p));
    __threadfence();  // the totals are visible device-wide before we count ourselves done
    s_is_last = atomicAdd(&counters[b], 1u) == static_cast<unsigned int>(splits) - 1u;
  }
  __syncthreads();
  if (!s_is_last) return;  // uniform across the block; no barrier follows for the others
  __threadfence();         // pairs with the writers' fences before reading their totals

  // ---- 4. last block: row totals (L2 reads: another SM wrote them) ---------------------
  long long total_r = 0, total_p = 0;
  for (int k = threadIdx.x; k < splits; k += kThreads) {
    const longlong2 t = __ldcg(&row_totals[k]);
    total_r += t.x;
    total_p += t.y;
  }
  block_sum2(total_r, total_p, sum_scratch);
  const bool use_r = total_r > 0;  // empty residual: draw from p with the same uniform
  const long long total = use_r ? total_r : total_p;

  long long token = 0;  // no mass at all: the argmax of all-zero weights
  if (total > 0) {      // uniform
    const double u = row_uniform(rnd, b, G, G, a, kSaltFinal);
    // In [0, total) for u in [0, 1); the clamp only keeps invalid uniforms (and float64
    // rounding of totals beyond 2^53, which normalised rows never reach) in range.
    const long long threshold = draw_threshold(u, total);  // kept in [0, total - 1] (philox.cuh)

    // ---- 5. the chunk whose cumulative range holds the threshold ----------------------
    if (threadIdx.x == 0) s_chunk = -1;
    long long carry = 0;
    for (int k0 = 0; k0 < splits; k0 += kThreads) {  // uniform trip count
      const int k = k0 + threadIdx.x;
      long long v = 0;
      if (k < splits) {
        const longlong2 t = __ldcg(&row_totals[k]);
        v = use_r ? t.x : t.y;
      }
      long long tile_total;
      const long long cum = carry + block_exclusive_scan(v, scan_scratch, tile_total);
      if (cum <= threshold && threshold < cum + v) {  // exactly one owner
        s_chunk = k;
        s_base = cum;
      }
      carry += tile_total;
      if (carry > threshold) break;
    }
    __syncthreads();
    const long long c = s_chunk;
    const long long base = s_base;

    // ---- 6. rescan that chunk in index order -----------------------------------------
    if (c >= 0) {  // always true: threshold < total; uniform
      const int64_t c_start = c * chunk;
      const int64_t c_end = min(static_cast<int64_t>(V), c_start + chunk);
      const T* q_search = use_r ? q_row : nullptr;  // the fallback searches p's weights
      token = block_find_crossing(p_row, q_search, c_start, c_end, vec, id, id, threshold, base, scan_scratch,
                                  &s_found);
      if (token < 0) token = c_end - 1;  // unreachable: the chunk total exceeds threshold - base
    } else {
      token = V - 1;
    }
  }

  // ---- 7. re-zero the workspace, write the outputs ------------------------------------
  __syncthreads();  // every read of row_totals above is done
  for (int k = threadIdx.x; k < splits; k += kThreads) __stcg(&row_totals[k], make_longlong2(0, 0));
  if (threadIdx.x == 0) counters[b] = 0;  // all `splits` blocks of row b have counted
  write_row(draft_tokens, out_tokens, num_accepted, b, G, a, clamp_token(token, V));
}

// ---------------------------------------------------------------------------------------
// rejection_sample_logits: grid (B, 2G+1, splits)
//
// p = softmax(target / T) and q = softmax(draft / T) in fp32 are never written to memory.
// Acceptance needs the softmax statistics (max m, sum s of exp(x/T - m)) of every target
// row 0..n_b and draft row 0..n_b-1 before anything else can happen, so, still in ONE launch:
//   * block (split, r, b) reduces chunk `split` of row r (r <= G: target row r; r > G: draft
//     row r-G-1; rows the batch row does not use exit at once and are not counted) to a
//     partial (m, s) in the workspace;
//   * the last of the row's splits * (2 n_b + 1) blocks (atomic counter, fences) merges the
//     partials of each row in a fixed order (one warp per row), decides the drafts, and
//     draws the final token itself over the one final row: a block-wide weight-sum pass
//     over V, then the inverse-CDF scan (block_find_crossing) over V.
// Each probability is exp(x/T - m) / s as torch computes it, but m and s come from a
// different reduction order, so p and q can differ from the reference's in the last ulps:
// results equal the reference's except when a decision sits within ~1e-6 (relative) of a
// boundary (u*q vs p for a draft, or the threshold vs a cumulative weight for the draw).
// Rows whose softmax is NaN in torch (a NaN or +inf in x/T, or x/T all -inf) are NaN
// everywhere here too (m = s = NaN): no draft is accepted on them and their weights are 0.
// ---------------------------------------------------------------------------------------

// One softmax row: P(x) = exp(x / t - m) / s, fp32, as torch.softmax(x.float() / t).
struct SoftmaxProb {
  float t, m, s;
  __device__ __forceinline__ float operator()(float x) const { return expf(x / t - m) / s; }
};

__device__ __forceinline__ bool logits_row_needed(int r, int n, int G) {
  return r <= G ? r <= n : r - G - 1 < n;
}

// Block reduction of per-thread softmax partials (m, s, bad) to the chunk's (m, s); every
// thread gets the result; bad -> m = NaN. Fixed order: the result depends only on the data.
__device__ __forceinline__ float2 block_softmax_stats(float m, float s, bool bad, float* scratch_m,
                                                      float* scratch_s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  bad = __syncthreads_or(bad) != 0;
  float mm = m;  // never NaN: NaN/+inf inputs only set `bad`
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) mm = fmaxf(mm, __shfl_xor_sync(0xFFFFFFFFu, mm, off));
  if (lane == 0) scratch_m[warp] = mm;
  __syncthreads();
  float M = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, scratch_m[w]);
  float c = m == -INFINITY ? 0.0f : s * expf(m - M);  // M >= m; a thread with no finite x adds 0
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) c += __shfl_xor_sync(0xFFFFFFFFu, c, off);
  if (lane == 0) scratch_s[warp] = c;
  __syncthreads();
  float S = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) S += scratch_s[w];
  __syncthreads();
  return make_float2(bad ? NAN : M, S);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
rejection_sample_logits_kernel(const T* __restrict__ target, int64_t t_sb, int64_t t_sg, const T* __restrict__ draft,
                               int64_t q_sb, int64_t q_sg, const int64_t* __restrict__ draft_tokens,
                               const int64_t* __restrict__ num_draft_tokens, float temperature,
                               const float* __restrict__ temperatures, Randomness rnd,
                               int64_t* __restrict__ out_tokens, int64_t* __restrict__ num_accepted, float2* stats,
                               unsigned int* counters, int64_t ws_stride, int G, int V, int64_t chunk) {
  extern __shared__ float2 merged[];  // [2G+1]: the row's merged (m, s), last block only
  __shared__ float scratch_m[kWarps], scratch_s[kWarps];
  __shared__ long long sum_scratch[kWarps][2];
  __shared__ long long scan_scratch[kWarps];
  __shared__ int s_first;
  __shared__ bool s_is_last;
  __shared__ long long s_found;

  constexpr int K = Vec16<T>::kElems;
  const int64_t b = blockIdx.x;
  const int r = static_cast<int>(blockIdx.y);
  const int64_t split = blockIdx.z;
  const int R = 2 * G + 1;
  const int splits = static_cast<int>(gridDim.z);
  const int n = drafts_in_row(num_draft_tokens, b, G);
  // Rows past the batch row's drafts are never looked at: the whole block leaves before any
  // barrier and is not counted below.
  if (!logits_row_needed(r, n, G)) return;
  const float t = temperatures != nullptr ? temperatures[b] : temperature;

  // ---- 1. partial softmax statistics of this chunk of row r ---------------------------
  {
    const T* row = r <= G ? target + b * t_sb + r * t_sg : draft + b * q_sb + (r - G - 1) * q_sg;
    const int64_t start = split * chunk;
    const int64_t end = min(static_cast<int64_t>(V), start + chunk);
    const bool vec = aligned16(row);
    float m = -INFINITY, s = 0.0f;  // online max / rescaled sum over this thread's finite x
    bool bad = false;               // a NaN or +inf: the whole softmax row is NaN
    const int64_t slots = (end - start + K - 1) / K;
    for (int64_t slot = threadIdx.x; slot < slots; slot += kThreads) {
      const int64_t i = start + slot * K;
      float x[K];
      load_values(row, i, end, vec, x);
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (i + k >= end) continue;
        const float y = x[k] / t;
        if (isnan(y) || y == INFINITY) {
          bad = true;
        } else if (y > m) {
          s = s * expf(m - y) + 1.0f;  // m == -inf: 0 * 0 + 1
          m = y;
        } else if (y > -INFINITY) {
          s += expf(y - m);
        }
      }
    }
    const float2 part = block_softmax_stats(m, s, bad, scratch_m, scratch_s);
    if (threadIdx.x == 0) {
      __stcg(&stats[(b * R + r) * ws_stride + split], part);
      __threadfence();  // visible device-wide before we count ourselves done
      const unsigned int blocks_in_row = static_cast<unsigned int>(splits) * static_cast<unsigned int>(2 * n + 1);
      s_is_last = atomicAdd(&counters[b], 1u) == blocks_in_row - 1u;
    }
    __syncthreads();
    if (!s_is_last) return;  // uniform across the block
    __threadfence();         // pairs with the writers' fences
  }

  // ---- 2. last block: merge each used row's partials (one warp per row) ----------------
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int rr = warp; rr < R; rr += kWarps) {
    if (!logits_row_needed(rr, n, G)) continue;  // warp-uniform
    const float2* slots = stats + (b * R + rr) * ws_stride;
    bool bad = false;
    float M = -INFINITY;
    for (int k = lane; k < splits; k += 32) {
      const float2 v = __ldcg(&slots[k]);
      if (isnan(v.x)) bad = true; else M = fmaxf(M, v.x);
    }
    bad = __any_sync(0xFFFFFFFFu, bad);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) M = fmaxf(M, __shfl_xor_sync(0xFFFFFFFFu, M, off));
    float S = 0.0f;
    if (!bad && M > -INFINITY) {  // warp-uniform
      for (int k = lane; k < splits; k += 32) {
        const float2 v = __ldcg(&slots[k]);
        if (v.x > -INFINITY) S += v.y * expf(v.x - M);  // an all -inf chunk adds 0
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) S += __shfl_xor_sync(0xFFFFFFFFu, S, off);
    }
    // NaN or +inf anywhere, or no finite logit: torch's softmax row is all NaN.
    if (lane == 0) merged[rr] = (bad || M == -INFINITY) ? make_float2(NAN, NAN) : make_float2(M, S);
  }
  __syncthreads();  // merged[] complete; every read of the partials is done
  for (int idx = threadIdx.x; idx < R * splits; idx += kThreads) {
    const int rr = idx / splits;
    if (logits_row_needed(rr, n, G)) {
      __stcg(&stats[(b * R + rr) * ws_stride + idx % splits], make_float2(0.0f, 0.0f));
    }
  }

  // ---- 3. the drafts ------------------------------------------------------------------
  const int a = first_rejection(
      draft_tokens, rnd, b, G, n, V,
      [&](int j, int64_t token, float& p, float& q) {
        const float2 mt = merged[j], mq = merged[G + 1 + j];
        p = SoftmaxProb{t, mt.x, mt.y}(to_float(target[b * t_sb + j * t_sg + token]));
        q = SoftmaxProb{t, mq.x, mq.y}(to_float(draft[b * q_sb + j * q_sg + token]));
      },
      &s_first);
  const bool rejected = a < n;
  const T* p_row = target + b * t_sb + a * t_sg;
  const T* q_row = rejected ? draft + b * q_sb + a * q_sg : nullptr;
  const float2 mp = merged[a];
  const float2 mq = rejected ? merged[G + 1 + a] : make_float2(0.0f, 1.0f);  // unused for a bonus row
  const SoftmaxProb prob_p{t, mp.x, mp.y}, prob_q{t, mq.x, mq.y};
  const bool vec = aligned16(p_row) && (q_row == nullptr || aligned16(q_row));

  // ---- 4. the final draw over the whole final row, by this block ----------------------
  long long total_r = 0, total_p = 0;
  thread_weight_sums(p_row, q_row, 0, V, vec, prob_p, prob_q, total_r, total_p);
  block_sum2(total_r, total_p, sum_scratch);
  const bool use_r = total_r > 0;
  const long long total = use_r ? total_r : total_p;
  long long token = 0;  // no mass at all
  if (total > 0) {      // uniform
    const double u = row_uniform(rnd, b, G, G, a, kSaltFinal);
    const long long threshold = draw_threshold(u, total);  // kept in [0, total - 1] (philox.cuh)
    token = block_find_crossing(p_row, use_r ? q_row : nullptr, 0, V, vec, prob_p, prob_q, threshold, 0LL,
                                scan_scratch, &s_found);
    if (token < 0) token = V - 1;  // unreachable: threshold < total
  }
  if (threadIdx.x == 0) counters[b] = 0;  // every counted block of row b has counted
  write_row(draft_tokens, out_tokens, num_accepted, b, G, a, clamp_token(token, V));
}

// ---------------------------------------------------------------------------------------
// Host side
// ---------------------------------------------------------------------------------------
void check_arg(bool ok, const char* op, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("specdec_kernels.") + op + ": " + what);
}

void check_common(const char* op, const void* target, const void* draft, const int64_t* draft_tokens,
                  int64_t* out_tokens, int64_t* num_accepted, void* workspace, int64_t B, int64_t G, int64_t V,
                  int dtype) {
  check_arg(dtype == kFloat32 || dtype == kFloat16 || dtype == kBFloat16, op,
            "dtype must be 0 (float32), 1 (float16) or 2 (bfloat16)");
  check_arg(B >= 0 && G >= 0, op, "B and G must be >= 0");
  check_arg(V >= 1 && V < kMaxVocab, op, "V must be in [1, 2^23)");
  if (B == 0) return;
  check_arg(target && out_tokens && num_accepted && workspace, op, "null device pointer");
  check_arg(G == 0 || (draft && draft_tokens), op, "draft probabilities / draft_tokens are null");
  check_arg(reinterpret_cast<uintptr_t>(workspace) % 16 == 0, op, "workspace must be 16-byte aligned");
}

template <typename T>
void launch_probs_typed(const void* target, int64_t t_sb, int64_t t_sg, const void* draft, int64_t q_sb,
                        int64_t q_sg, const int64_t* draft_tokens, const int64_t* num_draft_tokens,
                        const Randomness& rnd, int64_t* out_tokens, int64_t* num_accepted, longlong2* totals,
                        unsigned int* counters, int64_t ws_stride, int64_t G, int64_t V, const plans::Plan& plan,
                        cudaStream_t stream) {
  const plans::Launch& l = plan.launches.at(0);
  const dim3 grid(static_cast<unsigned>(l.grid[0]), static_cast<unsigned>(l.grid[1]), static_cast<unsigned>(l.grid[2]));
  rejection_sample_kernel<T><<<grid, l.block, l.dynamic_smem, stream>>>(
      static_cast<const T*>(target), t_sb, t_sg, static_cast<const T*>(draft), q_sb, q_sg, draft_tokens,
      num_draft_tokens, rnd, out_tokens, num_accepted, totals, counters, ws_stride, static_cast<int>(G),
      static_cast<int>(V), plan.at("chunk"));
}

template <typename T>
void launch_logits_typed(const void* target, int64_t t_sb, int64_t t_sg, const void* draft, int64_t q_sb,
                         int64_t q_sg, const int64_t* draft_tokens, const int64_t* num_draft_tokens,
                         float temperature, const float* temperatures, const Randomness& rnd, int64_t* out_tokens,
                         int64_t* num_accepted, float2* stats, unsigned int* counters, int64_t ws_stride,
                         int64_t G, int64_t V, const plans::Plan& plan, cudaStream_t stream) {
  const plans::Launch& l = plan.launches.at(0);
  const dim3 grid(static_cast<unsigned>(l.grid[0]), static_cast<unsigned>(l.grid[1]), static_cast<unsigned>(l.grid[2]));
  rejection_sample_logits_kernel<T><<<grid, l.block, l.dynamic_smem, stream>>>(
      static_cast<const T*>(target), t_sb, t_sg, static_cast<const T*>(draft), q_sb, q_sg, draft_tokens,
      num_draft_tokens, temperature, temperatures, rnd, out_tokens, num_accepted, stats, counters, ws_stride,
      static_cast<int>(G), static_cast<int>(V), plan.at("chunk"));
}

}  // namespace

uint64_t rejection_sample_workspace_bytes(int64_t B, int64_t G, int64_t V) {
  check_arg(B >= 0 && G >= 0 && V >= 1 && V < kMaxVocab, "rejection_sample",
            "need B >= 0, G >= 0 and V in [1, 2^23)");
  return static_cast<uint64_t>(B) * static_cast<uint64_t>(plans::rejection_max_splits(V)) * sizeof(longlong2) +
         static_cast<uint64_t>(B) * sizeof(unsigned int);
}

void launch_rejection_sample(const void* target_probs, int64_t target_stride_b, int64_t target_stride_g,
                             const void* draft_probs, int64_t draft_stride_b, int64_t draft_stride_g,
                             const int64_t* draft_tokens, const int64_t* num_draft_tokens,
                             const void* uniforms, bool uniforms_float64, int64_t seed, const int64_t* seeds,
                             const int64_t* offsets, int64_t* out_tokens, int64_t* num_accepted,
                             void* workspace, int64_t B, int64_t G, int64_t V, int dtype, cudaStream_t stream) {
  const char* op = "rejection_sample";
  const plans::Plan plan = plans::plan_rejection_sample(B, G, V, current_device_limits());
  check_arg(plan.ok(), op, plan.refusal.c_str());
  check_common(op, target_probs, draft_probs, draft_tokens, out_tokens, num_accepted, workspace, B, G, V, dtype);
  if (B == 0) return;  // nothing to do; an empty grid is a launch error

  const int64_t ws_stride = plan.at("ws_stride");
  auto* totals = static_cast<longlong2*>(workspace);
  auto* counters = reinterpret_cast<unsigned int*>(totals + B * ws_stride);
  if (plan.at("splits") > ws_stride) throw std::logic_error("rejection_sample: bad split plan");
  const Randomness rnd{uniforms, uniforms_float64, seed, seeds, offsets};

  switch (dtype) {
    case kFloat32:
      launch_probs_typed<float>(target_probs, target_stride_b, target_stride_g, draft_probs, draft_stride_b,
                                draft_stride_g, draft_tokens, num_draft_tokens, rnd, out_tokens, num_accepted,
                                totals, counters, ws_stride, G, V, plan, stream);
      break;
    case kFloat16:
      launch_probs_typed<__half>(target_probs, target_stride_b, target_stride_g, draft_probs, draft_stride_b,
                                 draft_stride_g, draft_tokens, num_draft_tokens, rnd, out_tokens, num_accepted,
                                 totals, counters, ws_stride, G, V, plan, stream);
      break;
    default:
      launch_probs_typed<__nv_bfloat16>(target_probs, target_stride_b, target_stride_g, draft_probs,
                                        draft_stride_b, draft_stride_g, draft_tokens, num_draft_tokens, rnd,
                                        out_tokens, num_accepted, totals, counters, ws_stride, G, V, plan,
                                        stream);
      break;
  }
  SPECDEC_CUDA_CHECK(cudaGetLastError());
}

}  // namespace specdec

namespace specdec {

namespace {
constexpr int64_t kMaxLogitsDrafts = 2047;  // 2G+1 merged (m, s) pairs in 48 KB of shared memory
static_assert(kMaxLogitsDrafts == plans::kRejectionMaxLogitsDrafts, "launch_plan.h mirrors the draft limit");
}  // namespace

uint64_t rejection_sample_logits_workspace_bytes(int64_t B, int64_t G, int64_t V) {
  check_arg(B >= 0 && G >= 0 && G <= kMaxLogitsDrafts && V >= 1 && V < kMaxVocab, "rejection_sample_logits",
            "need B >= 0, 0 <= G <= 2047 and V in [1, 2^23)");
  return static_cast<uint64_t>(B) * static_cast<uint64_t>(2 * G + 1) *
             static_cast<uint64_t>(plans::rejection_max_splits(V)) *
             sizeof(float2) +
         static_cast<uint64_t>(B) * sizeof(unsigned int);
}

void launch_rejection_sample_logits(const void* target_logits, int64_t target_stride_b, int64_t target_stride_g,
                                    const void* draft_logits, int64_t draft_stride_b, int64_t draft_stride_g,
                                    const int64_t* draft_tokens, const int64_t* num_draft_tokens,
                                    float temperature, const float* temperatures, const void* uniforms,
                                    bool uniforms_float64, int64_t seed, const int64_t* seeds,
                                    const int64_t* offsets, int64_t* out_tokens, int64_t* num_accepted,
                                    void* workspace, int64_t B, int64_t G, int64_t V, int dtype,
                                    cudaStream_t stream) {
  const char* op = "rejection_sample_logits";
  const plans::Plan plan = plans::plan_rejection_sample_logits(B, G, V, current_device_limits());
  check_arg(plan.ok(), op, plan.refusal.c_str());
  check_common(op, target_logits, draft_logits, draft_tokens, out_tokens, num_accepted, workspace, B, G, V, dtype);
  if (B == 0) return;

  const int64_t ws_stride = plan.at("ws_stride");
  auto* stats = static_cast<float2*>(workspace);
  auto* counters = reinterpret_cast<unsigned int*>(stats + B * (2 * G + 1) * ws_stride);
  if (plan.at("splits") > ws_stride) throw std::logic_error("rejection_sample_logits: bad split plan");
  const Randomness rnd{uniforms, uniforms_float64, seed, seeds, offsets};

  switch (dtype) {
    case kFloat32:
      launch_logits_typed<float>(target_logits, target_stride_b, target_stride_g, draft_logits, draft_stride_b,
                                 draft_stride_g, draft_tokens, num_draft_tokens, temperature, temperatures, rnd,
                                 out_tokens, num_accepted, stats, counters, ws_stride, G, V, plan, stream);
      break;
    case kFloat16:
      launch_logits_typed<__half>(target_logits, target_stride_b, target_stride_g, draft_logits, draft_stride_b,
                                  draft_stride_g, draft_tokens, num_draft_tokens, temperature, temperatures, rnd,
                                  out_tokens, num_accepted, stats, counters, ws_stride, G, V, plan, stream);
      break;
    default:
      launch_logits_typed<__nv_bfloat16>(target_logits, target_stride_b, target_stride_g, draft_logits,
                                         draft_stride_b, draft_stride_g, draft_tokens, num_draft_tokens,
                                         temperature, temperatures, rnd, out_tokens, num_accepted, stats, counters,
                                         ws_stride, G, V, plan, stream);
      break;
  }
  SPECDEC_CUDA_CHECK(cudaGetLastError());
}

}  // namespace specdec
