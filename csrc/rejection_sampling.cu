// Speculative sampling on chain drafts (Leviathan et al., Algorithm 1): the CUDA backend of
// ops.rejection_sample, bit-identical to specdec_kernels.reference.rejection_sample.
//
// One launch, grid (B, splits), because B can be 1 with V ~ 150k and one block per row would leave
// almost every SM idle. Every block of row b recomputes the accept walk itself (G is small: 2
// gathered scalars and one Philox draw per draft), so it knows the final row without cross-block
// traffic, then stores its V-chunk's int64 fixed-point totals of the residual and of p (the
// fallback). The row's last block (ticket, __threadfence on both sides) draws floor(u * total),
// rescans only the chunk holding it, writes the outputs and re-zeroes what it used. Integer sums
// make any split give the reference bit for bit.
//
// Chunks hold 2048..8192 ids (plans::plan_rejection_sample: B = 1, V = 151936 gives 74 blocks);
// __launch_bounds__(256, 4) gives the ~4 CTAs per SM the plan assumes. Limit: V < 2^23.
// rejection_sample_logits: softmax_stats.cu's statistics launch, then the same body on softmax
// rows (the second kernel in this file).

#include <algorithm>
#include <stdexcept>
#include <string>

#include "chain_rows.cuh"
#include "common.cuh"
#include "dtype_dispatch.cuh"
#include "launch_utils.h"
#include "philox.cuh"
#include "rejection_sampling.h"
#include "softmax_stats.h"
#include "split_v_sampling.cuh"

namespace specdec {
namespace {

using namespace split_v;  // split_v_sampling.cuh: kThreads, block sums / scans, weights, draws

// Each weight is <= 2^40, so a row total stays below 2^63 for V < 2^23.
constexpr int64_t kMaxVocab = int64_t{1} << 23;
// Four resident CTAs per SM (at most 64 registers a thread): the split plan spreads ~4 CTAs per
// SM over the rows, and at 80 registers only 3 fit, which left a partial wave at B = 64.
constexpr int kBlocksPerSM = 4;
static_assert(kBlocksPerSM == plans::kRejectionBlocksPerSM, "launch_plan.h plans this residency");
static_assert(kThreads == plans::kRejectionThreads && kMaxVocab == plans::kRejectionMaxVocab,
              "launch_plan.h mirrors the block size and the vocabulary limit");

// ---------------------------------------------------------------------------------------
// Randomness (common/draws.py + common/rng.py)
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

// Leviathan's residual weight of one id: to_weight(P - Q), an fp32 subtraction as the reference.
struct Difference {
  __device__ __forceinline__ int64_t operator()(float p, float q) const { return to_weight(p - q); }
};

// The first draft that fails the acceptance test, or n when all pass, to every thread.
// pq(j, token, p, q) loads the target / draft probabilities of `token` at draft position j.
// row_passes: null, or row b's [G] bools, which get every draft's own test (false for j >= n).
template <typename PQ>
__device__ __forceinline__ int first_rejection(const int64_t* draft_tokens, const Randomness& rnd, int64_t b, int G,
                                               int n, int V, const PQ& pq, bool* row_passes, int* s_first) {
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
    if (row_passes != nullptr) row_passes[j] = accept;  // tested past the first rejection too
  }
  if (row_passes != nullptr) {
    for (int j = n + threadIdx.x; j < G; j += kThreads) row_passes[j] = false;  // slots a ragged row lacks
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

// ---------------------------------------------------------------------------------------
// The body of both kernels, grid (B, splits): Rows (chain_rows.cuh) says where P and Q come from
// ---------------------------------------------------------------------------------------
template <typename T, typename Rows>
__device__ __forceinline__ void rejection_body(const Rows& rows, const int64_t* __restrict__ draft_tokens,
                                               const int64_t* __restrict__ num_draft_tokens, const Randomness& rnd,
                                               int64_t* __restrict__ out_tokens, int64_t* __restrict__ num_accepted,
                                               bool* __restrict__ draft_passes, longlong2* totals,
                                               unsigned int* counters, int64_t ws_stride, int G, int V,
                                               int64_t chunk) {
  using Prob = typename Rows::Prob;
  __shared__ reduce::I64Pair sum_scratch[kWarps];
  __shared__ long long scan_scratch[kWarps];
  __shared__ int s_first;
  __shared__ bool s_is_last;
  __shared__ long long s_chunk, s_base, s_found;

  const int64_t b = blockIdx.x;
  const int64_t split = blockIdx.y;
  const int splits = static_cast<int>(gridDim.y);
  const int n = drafts_in_row(num_draft_tokens, b, G);
  // every block of the row runs the same tests; split 0 alone writes them (when asked)
  bool* row_passes = draft_passes != nullptr && split == 0 ? draft_passes + b * G : nullptr;

  // ---- 1. num_accepted, recomputed by every block of the row --------------------------
  const int a = first_rejection(
      draft_tokens, rnd, b, G, n, V,
      [&](int j, int64_t token, float& p, float& q) {
        p = rows.target_prob(b, j)(to_float(rows.target_row(b, j)[token]));
        q = rows.draft_prob(b, j)(to_float(rows.draft_row(b, j)[token]));
      },
      row_passes, &s_first);
  const bool rejected = a < n;  // a < n <= G: draft row a exists
  const T* p_row = rows.target_row(b, a);
  const T* q_row = rejected ? rows.draft_row(b, a) : nullptr;  // bonus row: plain p
  const Prob prob_p = rows.target_prob(b, a);
  const Prob prob_q = rejected ? rows.draft_prob(b, a) : prob_p;
  const bool vec = aligned16(p_row) && (q_row == nullptr || aligned16(q_row));

  // ---- 2. this chunk's weight totals ---------------------------------------------------
  long long sum_r, sum_p;
  chunk_weight_sums(p_row, q_row, split, chunk, V, vec, prob_p, prob_q, Difference{}, sum_scratch, sum_r, sum_p);

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
  long long total_r, total_p;
  block_sum_chunk_totals(row_totals, splits, total_r, total_p, sum_scratch);
  const bool use_r = total_r > 0;  // empty residual: draw from p with the same uniform
  const long long total = use_r ? total_r : total_p;

  long long token = 0;  // no mass at all: the argmax of all-zero weights
  if (total > 0) {      // uniform
    const double u = row_uniform(rnd, b, G, G, a, kSaltFinal);
    // In [0, total) for u in [0, 1); the clamp only keeps invalid uniforms (and float64
    // rounding of totals beyond 2^53, which normalised rows never reach) in range.
    const long long threshold = draw_threshold(u, total);  // kept in [0, total - 1] (philox.cuh)

    // ---- 5. the chunk whose cumulative range holds the threshold ----------------------
    long long base;
    const long long c = block_find_chunk(row_totals, splits, use_r, threshold, scan_scratch, &s_chunk, &s_base, base);

    // ---- 6. rescan that chunk in index order -----------------------------------------
    if (c >= 0) {  // always true: threshold < total; uniform
      const int64_t c_start = c * chunk;
      const int64_t c_end = min(static_cast<int64_t>(V), c_start + chunk);
      const T* q_search = use_r ? q_row : nullptr;  // the fallback searches p's weights
      token = block_find_crossing(p_row, q_search, c_start, c_end, vec, prob_p, prob_q, Difference{}, threshold,
                                  base, scan_scratch, &s_found);
      if (token < 0) token = c_end - 1;  // unreachable: the chunk total exceeds threshold - base
    } else {
      token = V - 1;
    }
  }

  // ---- 7. re-zero the workspace, write the outputs ------------------------------------
  __syncthreads();  // every read of row_totals above is done
  for (int k = threadIdx.x; k < splits; k += kThreads) __stcg(&row_totals[k], make_longlong2(0, 0));
  rows.release(b, n);
  if (threadIdx.x == 0) counters[b] = 0;  // all `splits` blocks of row b have counted
  write_row(draft_tokens, out_tokens, num_accepted, b, G, a, clamp_token(token, V));
}

// rejection_sample: p and q are the probability rows.
template <typename T>
__global__ void __launch_bounds__(kThreads, kBlocksPerSM)
rejection_sample_kernel(ProbRows<T> rows, const int64_t* __restrict__ draft_tokens,
                        const int64_t* __restrict__ num_draft_tokens, Randomness rnd,
                        int64_t* __restrict__ out_tokens, int64_t* __restrict__ num_accepted,
                        bool* __restrict__ draft_passes, longlong2* totals, unsigned int* counters, int64_t ws_stride,
                        int G, int V, int64_t chunk) {
  rejection_body<T>(rows, draft_tokens, num_draft_tokens, rnd, out_tokens, num_accepted, draft_passes, totals,
                    counters, ws_stride, G, V, chunk);
}

// ---------------------------------------------------------------------------------------
// rejection_sample_logits: two launches, grid (B, 2G+1, stats splits) then (B, splits)
//
// p = softmax(target / T) and q = softmax(draft / T) in fp32 are never written to memory.
// Acceptance needs the softmax statistics (max m, sum s of exp(x/T - m)) of every target
// row 0..n_b and draft row 0..n_b-1, so softmax_stats_kernel (softmax_stats.cu) reduces every
// used row per V-chunk and merges each row's partials in a fixed order first. Then this kernel
// is rejection_sample_kernel on P(x) = expf(x/T - m)/s read on the fly (LogitRows): every
// block of a row decides the drafts itself, sums its chunk of the final row pair, and the
// row's last block draws from the chunk totals and rescans one chunk. So each logits row is
// read once for its statistics and the final pair once more: no block walks all of V alone.
// Each probability is exp(x/T - m) / s as torch computes it, but m and s come from a
// different reduction order, so p and q can differ from the reference's in the last ulps:
// results equal the reference's except when a decision sits within ~1e-6 (relative) of a
// boundary (u*q vs p for a draft, or the threshold vs a cumulative weight for the draw).
// Rows whose softmax is NaN in torch (a NaN or +inf in x/T, or x/T all -inf) are NaN
// everywhere here too (m = s = NaN): no draft is accepted on them and their weights are 0.
// ---------------------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(kThreads, kBlocksPerSM)
rejection_sample_logits_kernel(LogitRows<T> rows, const int64_t* __restrict__ draft_tokens,
                               const int64_t* __restrict__ num_draft_tokens, Randomness rnd,
                               int64_t* __restrict__ out_tokens, int64_t* __restrict__ num_accepted,
                               longlong2* totals, unsigned int* counters, int64_t ws_stride, int G, int V,
                               int64_t chunk) {
  rejection_body<T>(rows, draft_tokens, num_draft_tokens, rnd, out_tokens, num_accepted, nullptr, totals, counters,
                    ws_stride, G, V, chunk);
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

dim3 grid_of(const plans::Launch& l) {
  return dim3(static_cast<unsigned>(l.grid[0]), static_cast<unsigned>(l.grid[1]), static_cast<unsigned>(l.grid[2]));
}

template <typename T>
void launch_probs_typed(const void* target, int64_t t_sb, int64_t t_sg, const void* draft, int64_t q_sb,
                        int64_t q_sg, const int64_t* draft_tokens, const int64_t* num_draft_tokens,
                        const Randomness& rnd, int64_t* out_tokens, int64_t* num_accepted, bool* draft_passes,
                        longlong2* totals, unsigned int* counters, int64_t ws_stride, int64_t G, int64_t V,
                        const plans::Plan& plan, cudaStream_t stream) {
  const plans::Launch& l = plan.launches.at(0);
  const ProbRows<T> rows{static_cast<const T*>(target), t_sb, t_sg, static_cast<const T*>(draft), q_sb, q_sg};
  rejection_sample_kernel<T><<<grid_of(l), l.block, l.dynamic_smem, stream>>>(
      rows, draft_tokens, num_draft_tokens, rnd, out_tokens, num_accepted, draft_passes, totals, counters, ws_stride,
      static_cast<int>(G), static_cast<int>(V), plan.at("chunk"));
}

template <typename T>
void launch_logits_typed(const void* target, int64_t t_sb, int64_t t_sg, const void* draft, int64_t q_sb,
                         int64_t q_sg, const int64_t* draft_tokens, const int64_t* num_draft_tokens,
                         float temperature, const float* temperatures, const Randomness& rnd, int64_t* out_tokens,
                         int64_t* num_accepted, void* workspace, int64_t G, int64_t V, const plans::Plan& plan,
                         cudaStream_t stream) {
  auto* base = static_cast<unsigned char*>(workspace);
  const SoftmaxStatsBuffers stats{reinterpret_cast<float2*>(base + plan.at("partials_offset")),
                                  reinterpret_cast<float2*>(base + plan.at("merged_offset")),
                                  reinterpret_cast<unsigned int*>(base + plan.at("stats_counters_offset")),
                                  plan.at("stats_stride")};
  launch_softmax_stats(target, t_sb, t_sg, draft, q_sb, q_sg, RowCounts{num_draft_tokens, true, 1}, temperature,
                       temperatures, 1, stats, G, V, plan.at("stats_chunk"), dtype_of<T>(), plan.launches.at(0),
                       stream);
  const plans::Launch& l = plan.launches.at(1);
  const LogitRows<T> rows{static_cast<const T*>(target), t_sb, t_sg, static_cast<const T*>(draft), q_sb, q_sg,
                          stats.merged, static_cast<int>(G), temperature, temperatures, 1};
  rejection_sample_logits_kernel<T><<<grid_of(l), l.block, l.dynamic_smem, stream>>>(
      rows, draft_tokens, num_draft_tokens, rnd, out_tokens, num_accepted, reinterpret_cast<longlong2*>(base),
      reinterpret_cast<unsigned int*>(base + plan.at("counters_offset")), plan.at("ws_stride"), static_cast<int>(G),
      static_cast<int>(V), plan.at("chunk"));
}

}  // namespace

// [B][max_splits] longlong2 chunk totals (.x residual, .y p), then [B] uint32 counters.
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
                             bool* draft_passes, void* workspace, int64_t B, int64_t G, int64_t V, int dtype,
                             cudaStream_t stream) {
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

  dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_probs_typed<T>(target_probs, target_stride_b, target_stride_g, draft_probs, draft_stride_b, draft_stride_g,
                          draft_tokens, num_draft_tokens, rnd, out_tokens, num_accepted, draft_passes, totals,
                          counters, ws_stride, G, V, plan, stream);
  });
  SPECDEC_CUDA_CHECK(cudaGetLastError());
}

}  // namespace specdec

namespace specdec {

uint64_t rejection_sample_logits_workspace_bytes(int64_t B, int64_t G, int64_t V) {
  check_arg(B >= 0 && G >= 0 && V >= 1 && V < kMaxVocab, "rejection_sample_logits",
            "need B >= 0, G >= 0 and V in [1, 2^23)");
  return static_cast<uint64_t>(plans::rejection_logits_layout(B, G, V).bytes);
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
  if (plan.at("splits") > plan.at("ws_stride") || plan.at("stats_splits") > plan.at("stats_stride")) {
    throw std::logic_error("rejection_sample_logits: bad split plan");
  }
  const Randomness rnd{uniforms, uniforms_float64, seed, seeds, offsets};
  dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_logits_typed<T>(target_logits, target_stride_b, target_stride_g, draft_logits, draft_stride_b,
                           draft_stride_g, draft_tokens, num_draft_tokens, temperature, temperatures, rnd, out_tokens,
                           num_accepted, workspace, G, V, plan, stream);
  });
  SPECDEC_CUDA_CHECK(cudaGetLastError());
}

}  // namespace specdec
