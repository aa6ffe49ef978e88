// Block verification of chain drafts (Sun et al., ICLR 2025, Algorithm 2): the CUDA backend of
// ops.block_verify and ops.block_verify_logits, bit-identical to reference/block_verification.py
// (the logits op up to its softmax statistics, as rejection_sample_logits).
//
// One launch, block_verify_kernel, grid (B, G+1, splits): block (b, j, s) recomputes the prefix ratio
// p_j itself (no cross-block traffic), sums its V-chunk's int64 residual weights w_j and P_j's plain
// weights (the fallback), and takes a ticket; the row's last block forms Z(i), h_i, the coins and
// tau, draws the final token from the chunk totals with a rescan of ONE chunk, and re-zeroes the
// row's workspace. Integer sums make any V split give the reference bit for bit.
// block_verify_logits first runs softmax_stats_kernel (softmax_stats.cu), then the same body on
// P(x) = expf(x/T - m)/s read on the fly (LogitRows, chain_rows.cuh): decisions within ~1e-6
// (relative) of their boundary may differ from the reference.
//
// Grid: B in x, positions in y (G + 1 <= 65535), splits in z; a chunk holds <= 8192 ids, and the
// workspace is launch_plan.h's BlockVerifyLayout. Limit: V < 2^23 (int64 fixed-point totals).

#include <algorithm>
#include <stdexcept>
#include <string>

#include "block_verification.h"
#include "block_verification_math.cuh"
#include "chain_rows.cuh"
#include "common.cuh"
#include "dtype_dispatch.cuh"
#include "launch_utils.h"
#include "philox.cuh"
#include "softmax_stats.h"
#include "split_v_sampling.cuh"

namespace specdec {
namespace {

using namespace split_v;  // split_v_sampling.cuh: kThreads, block sums / scans, weights, draws
constexpr int64_t kMaxVocab = int64_t{1} << 23;  // each weight <= 2^40: a row total stays < 2^63
// Three resident CTAs per SM (at most 80 registers a thread; without the bound the 16-bit
// kernels took 100: two per SM; at 64 the logits kernel spills): the split plan fills one wave.
constexpr int kBlocksPerSM = 3;
static_assert(kBlocksPerSM == plans::kBlockVerifyBlocksPerSM, "launch_plan.h plans this residency");
static_assert(kThreads == plans::kBlockVerifyThreads && kMaxVocab == plans::kRejectionMaxVocab,
              "launch_plan.h mirrors the block size and the vocabulary limit");

// ---------------------------------------------------------------------------------------
// Index tensors and randomness
// ---------------------------------------------------------------------------------------
__device__ __forceinline__ int64_t load_index(const BlockIndex& t, int64_t i, int64_t j) {
  const int64_t off = i * t.stride0 + j * t.stride1;
  return t.is_int64 ? static_cast<const int64_t*>(t.data)[off]
                    : static_cast<int64_t>(static_cast<const int32_t*>(t.data)[off]);
}

__device__ __forceinline__ int drafts_in_row(const BlockIndex& counts, int64_t b, int G) {
  if (counts.data == nullptr) return G;
  const int64_t n = load_index(counts, b, 0);
  return n < 0 ? 0 : (n > G ? G : static_cast<int>(n));
}

// Column `col` of row b's caller uniforms, or the Philox draw at sequence position
// offsets[b] + `position` with `salt` (common/draws.py ChainCoins): eta_i is column /
// position i - 1 with kSaltAccept; the final draw column G, position tau, kSaltFinal.
__device__ __forceinline__ double row_uniform(const BlockRandomness& rnd, int64_t b, int col, int64_t position,
                                              uint32_t salt) {
  if (rnd.uniforms != nullptr) {
    const int64_t idx = b * rnd.u_stride_b + col * rnd.u_stride_g;
    return rnd.uniforms_float64 ? static_cast<const double*>(rnd.uniforms)[idx]
                                : static_cast<double>(static_cast<const float*>(rnd.uniforms)[idx]);
  }
  const bool per_row = rnd.seeds.data != nullptr;
  const int64_t seed = per_row ? load_index(rnd.seeds, b, 0) : rnd.seed;
  const int64_t row_key = per_row ? 0 : b;
  const int64_t offset = rnd.offsets.data != nullptr ? load_index(rnd.offsets, b, 0) : 0;
  // Wrapping add (only the low 32 bits enter the counter), without signed-overflow UB.
  const int64_t pos = static_cast<int64_t>(static_cast<uint64_t>(offset) + static_cast<uint64_t>(position));
  return philox_uniform(seed, pos, row_key, salt, 0);
}


// Block verification's residual weight of one id: floor(clamp(p_j P(x) - Q(x), 0, 1) 2^40).
struct ScaledResidual {
  float scale;  // the prefix ratio p_j
  __device__ __forceinline__ int64_t operator()(float p, float q) const { return block::residual_weight(scale, p, q); }
};

// ---------------------------------------------------------------------------------------
// The verification body, shared by block_verify_kernel and block_verify_logits_kernel
// ---------------------------------------------------------------------------------------
struct Workspace {
  longlong2* totals;       // [B][G+1][ws_stride] chunk totals (.x residual, .y plain P)
  float* ratios;           // [B][G+1] prefix ratios p_j
  unsigned int* counters;  // [B]
  int64_t ws_stride;
};

template <typename T, typename Rows>
__device__ __forceinline__ void block_verify_body(const Rows& rows, const BlockIndex& tokens,
                                                  const BlockIndex& counts, const BlockRandomness& rnd,
                                                  int64_t* __restrict__ out_tokens, int64_t* __restrict__ num_accepted,
                                                  const Workspace& ws, int G, int V, int64_t chunk) {
  using Prob = typename Rows::Prob;
  __shared__ reduce::I64Pair sum_scratch[kWarps];
  __shared__ long long scan_scratch[kWarps];
  __shared__ float s_p[kThreads], s_q[kThreads];
  __shared__ bool s_ok[kThreads];
  __shared__ float s_carry;
  __shared__ int s_tau;
  __shared__ bool s_is_last;
  __shared__ long long s_chunk, s_base, s_found;

  const int64_t b = blockIdx.x;
  const int j = static_cast<int>(blockIdx.y);
  const int64_t split = blockIdx.z;
  const int splits = static_cast<int>(gridDim.z);
  const int n = drafts_in_row(counts, b, G);
  if (j > n) return;  // a position the row does not have: leaves before any barrier, not counted
  const int64_t R1 = G + 1;

  // ---- 1. p_j: gather (P, Q) of drafts 1..j in parallel, scan them in order ------------
  float p_j = 1.0f;
  for (int base = 0; base < j; base += kThreads) {  // uniform trip count
    const int k = base + static_cast<int>(threadIdx.x);  // draft X_{k+1}, position k
    if (k < j) {
      bool ok = false;
      float p = 0.0f, q = 0.0f;
      const int64_t token = k < n ? load_index(tokens, b, k) : -1;
      if (token >= 0 && token < V) {  // out-of-range ids are never read: p_{k+1} = 0
        ok = true;
        p = rows.target_prob(b, k)(to_float(rows.target_row(b, k)[token]));
        q = rows.draft_prob(b, k)(to_float(rows.draft_row(b, k)[token]));
      }
      s_p[threadIdx.x] = p;
      s_q[threadIdx.x] = q;
      s_ok[threadIdx.x] = ok;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const int m = min(kThreads, j - base);
      float carry = p_j;
      for (int t = 0; t < m; ++t) carry = block::prefix_ratio_step(carry, s_p[t], s_q[t], s_ok[t]);
      s_carry = carry;
    }
    __syncthreads();
    p_j = s_carry;
    __syncthreads();  // s_p / s_carry are rewritten by the next round
  }

  // ---- 2. this chunk's weight totals ---------------------------------------------------
  const bool has_q = j < n;  // j == n: the bonus row, plain weights only
  const T* p_row = rows.target_row(b, j);
  const T* q_row = has_q ? rows.draft_row(b, j) : nullptr;
  const Prob prob_p = rows.target_prob(b, j);
  const Prob prob_q = has_q ? rows.draft_prob(b, j) : prob_p;
  const bool vec = aligned16(p_row) && (q_row == nullptr || aligned16(q_row));
  long long sum_r, sum_p;
  chunk_weight_sums(p_row, q_row, split, chunk, V, vec, prob_p, prob_q, ScaledResidual{p_j}, sum_scratch, sum_r, sum_p);

  // ---- 3. publish; elect the last block of row b ---------------------------------------
  longlong2* row_totals = ws.totals + b * R1 * ws.ws_stride;  // [G+1][ws_stride] of row b
  float* row_ratios = ws.ratios + b * R1;
  if (threadIdx.x == 0) {
    __stcg(&row_totals[j * ws.ws_stride + split], make_longlong2(sum_r, sum_p));
    if (split == 0) __stcg(&row_ratios[j], p_j);
    __threadfence();  // visible device-wide before we count ourselves done
    const unsigned int blocks_in_row = static_cast<unsigned int>(splits) * static_cast<unsigned int>(n + 1);
    s_is_last = atomicAdd(&ws.counters[b], 1u) == blocks_in_row - 1u;
  }
  __syncthreads();
  if (!s_is_last) return;  // uniform across the block
  __threadfence();         // pairs with the writers' fences

  // ---- 4. last block: h_i, eta_i, tau ----------------------------------------------------
  if (threadIdx.x == 0) s_tau = 0;
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x) + 1; i <= n; i += kThreads) {
    const float p_i = __ldcg(&row_ratios[i]);
    long long z = 0;
    if (i < n) {
      for (int s = 0; s < splits; ++s) z += __ldcg(&row_totals[i * ws.ws_stride + s]).x;
    }
    const double h = block::acceptance_threshold(i, n, z, p_i);
    const double eta = row_uniform(rnd, b, i - 1, i - 1, kSaltAccept);
    if (block::block_passes(eta, h, p_i)) atomicMax(&s_tau, i);
  }
  __syncthreads();
  const int tau = s_tau;
  const float p_tau = tau == 0 ? 1.0f : __ldcg(&row_ratios[tau]);

  // ---- 5. the final row: totals, threshold, chunk, rescan --------------------------------
  const bool residual = tau < n;  // else the bonus row P_n
  const longlong2* final_totals = row_totals + tau * ws.ws_stride;
  long long total_r, total_p;
  block_sum_chunk_totals(final_totals, splits, total_r, total_p, sum_scratch);
  const bool use_r = residual && total_r > 0;  // an empty residual: P_tau's weights, same uniform
  const long long total = use_r ? total_r : total_p;

  long long token = 0;  // no mass at all: the row's lowest index
  if (total > 0) {      // uniform
    const double u = row_uniform(rnd, b, G, tau, kSaltFinal);
    const long long threshold = draw_threshold(u, total);  // in [0, total - 1]
    long long base;
    const long long c = block_find_chunk(final_totals, splits, use_r, threshold, scan_scratch, &s_chunk, &s_base, base);
    if (c >= 0) {  // always: threshold < total
      const T* fp_row = rows.target_row(b, tau);
      const T* fq_row = use_r ? rows.draft_row(b, tau) : nullptr;
      const Prob fprob_p = rows.target_prob(b, tau);
      const Prob fprob_q = use_r ? rows.draft_prob(b, tau) : fprob_p;
      const bool fvec = aligned16(fp_row) && (fq_row == nullptr || aligned16(fq_row));
      const int64_t c_start = c * chunk;
      const int64_t c_end = min(static_cast<int64_t>(V), c_start + chunk);
      token = block_find_crossing(fp_row, fq_row, c_start, c_end, fvec, fprob_p, fprob_q, ScaledResidual{p_tau},
                                  threshold, base,
                                  scan_scratch, &s_found);
      if (token < 0) token = c_end - 1;  // unreachable: the chunk total exceeds threshold - base
    } else {
      token = V - 1;
    }
  }

  // ---- 6. re-zero the workspace of row b, write the outputs ------------------------------
  __syncthreads();  // every read of the workspace above is done
  for (int idx = threadIdx.x; idx < (n + 1) * splits; idx += kThreads) {
    __stcg(&row_totals[(idx / splits) * ws.ws_stride + idx % splits], make_longlong2(0, 0));
  }
  for (int i = threadIdx.x; i <= n; i += kThreads) __stcg(&row_ratios[i], 0.0f);
  rows.release(b, n);
  if (threadIdx.x == 0) ws.counters[b] = 0;  // every counted block of row b has counted
  int64_t* out = out_tokens + b * (G + 1);
  const int64_t final_token = clamp_token(token, V);
  for (int k = threadIdx.x; k <= G; k += kThreads) {
    out[k] = k < tau ? load_index(tokens, b, k) : (k == tau ? final_token : int64_t{-1});
  }
  if (threadIdx.x == 0) num_accepted[b] = tau;
}

template <typename T>
__global__ void __launch_bounds__(kThreads, kBlocksPerSM)
block_verify_kernel(ProbRows<T> rows, BlockIndex tokens, BlockIndex counts, BlockRandomness rnd,
                    int64_t* __restrict__ out_tokens, int64_t* __restrict__ num_accepted, Workspace ws, int G, int V,
                    int64_t chunk) {
  block_verify_body<T>(rows, tokens, counts, rnd, out_tokens, num_accepted, ws, G, V, chunk);
}

template <typename T>
__global__ void __launch_bounds__(kThreads, kBlocksPerSM)
block_verify_logits_kernel(LogitRows<T> rows, BlockIndex tokens, BlockIndex counts, BlockRandomness rnd,
                           int64_t* __restrict__ out_tokens, int64_t* __restrict__ num_accepted, Workspace ws, int G,
                           int V, int64_t chunk) {
  block_verify_body<T>(rows, tokens, counts, rnd, out_tokens, num_accepted, ws, G, V, chunk);
}

// ---------------------------------------------------------------------------------------
// Host side
// ---------------------------------------------------------------------------------------
void check_arg(bool ok, const char* op, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("specdec_kernels.") + op + ": " + what);
}

void check_common(const char* op, const void* target, const void* draft, const BlockIndex& tokens,
                  const BlockIndex& counts, const BlockRandomness& rnd, int64_t* out_tokens, int64_t* num_accepted,
                  void* workspace, int64_t B, int64_t G, int64_t V, int dtype) {
  check_arg(dtype == kFloat32 || dtype == kFloat16 || dtype == kBFloat16, op,
            "dtype must be 0 (float32), 1 (float16) or 2 (bfloat16)");
  check_arg(B >= 0 && G >= 0, op, "B and G must be >= 0");
  check_arg(V >= 1 && V < kMaxVocab, op, "V must be in [1, 2^23)");
  if (B == 0) return;
  check_arg(target && out_tokens && num_accepted && workspace, op, "null device pointer");
  check_arg(G == 0 || (draft && tokens.data), op, "draft probabilities / draft_tokens are null");
  check_arg(reinterpret_cast<uintptr_t>(workspace) % 16 == 0, op, "workspace must be 16-byte aligned");
  (void)counts;
  (void)rnd;
}

Workspace workspace_of(void* workspace, const plans::Plan& plan) {
  auto* base = static_cast<unsigned char*>(workspace);
  return Workspace{reinterpret_cast<longlong2*>(base), reinterpret_cast<float*>(base + plan.at("ratios_offset")),
                   reinterpret_cast<unsigned int*>(base + plan.at("counters_offset")), plan.at("ws_stride")};
}

dim3 grid_of(const plans::Launch& l) {
  return dim3(static_cast<unsigned>(l.grid[0]), static_cast<unsigned>(l.grid[1]), static_cast<unsigned>(l.grid[2]));
}

template <typename T>
void launch_probs_typed(const void* target, int64_t t_sb, int64_t t_sg, const void* draft, int64_t q_sb,
                        int64_t q_sg, const BlockIndex& tokens, const BlockIndex& counts, const BlockRandomness& rnd,
                        int64_t* out_tokens, int64_t* num_accepted, const Workspace& ws, int64_t G, int64_t V,
                        const plans::Plan& plan, cudaStream_t stream) {
  const plans::Launch& l = plan.launches.at(0);
  const ProbRows<T> rows{static_cast<const T*>(target), t_sb, t_sg, static_cast<const T*>(draft), q_sb, q_sg};
  block_verify_kernel<T><<<grid_of(l), l.block, l.dynamic_smem, stream>>>(
      rows, tokens, counts, rnd, out_tokens, num_accepted, ws, static_cast<int>(G), static_cast<int>(V),
      plan.at("chunk"));
}

template <typename T>
void launch_logits_typed(const void* target, int64_t t_sb, int64_t t_sg, const void* draft, int64_t q_sb,
                         int64_t q_sg, const BlockIndex& tokens, const BlockIndex& counts, float temperature,
                         const float* temperatures, int64_t temp_stride, const BlockRandomness& rnd,
                         int64_t* out_tokens, int64_t* num_accepted, void* workspace, int64_t G, int64_t V,
                         const plans::Plan& plan, cudaStream_t stream) {
  auto* base = static_cast<unsigned char*>(workspace);
  const SoftmaxStatsBuffers stats{reinterpret_cast<float2*>(base + plan.at("partials_offset")),
                                  reinterpret_cast<float2*>(base + plan.at("merged_offset")),
                                  reinterpret_cast<unsigned int*>(base + plan.at("stats_counters_offset")),
                                  plan.at("stats_stride")};
  launch_softmax_stats(target, t_sb, t_sg, draft, q_sb, q_sg, RowCounts{counts.data, counts.is_int64, counts.stride0},
                       temperature, temperatures, temp_stride, stats, G, V, plan.at("stats_chunk"), dtype_of<T>(),
                       plan.launches.at(0), stream);
  const plans::Launch& lv = plan.launches.at(1);
  const LogitRows<T> rows{static_cast<const T*>(target), t_sb, t_sg, static_cast<const T*>(draft), q_sb, q_sg,
                          stats.merged, static_cast<int>(G), temperature, temperatures, temp_stride};
  block_verify_logits_kernel<T><<<grid_of(lv), lv.block, lv.dynamic_smem, stream>>>(
      rows, tokens, counts, rnd, out_tokens, num_accepted, workspace_of(workspace, plan), static_cast<int>(G),
      static_cast<int>(V), plan.at("chunk"));
}

}  // namespace

uint64_t block_verify_workspace_bytes(int64_t B, int64_t G, int64_t V) {
  check_arg(B >= 0 && G >= 0 && V >= 1 && V < kMaxVocab, "block_verify", "need B >= 0, G >= 0 and V in [1, 2^23)");
  return static_cast<uint64_t>(plans::block_verify_layout(B, G, V, false).bytes);
}

uint64_t block_verify_logits_workspace_bytes(int64_t B, int64_t G, int64_t V) {
  check_arg(B >= 0 && G >= 0 && V >= 1 && V < kMaxVocab, "block_verify_logits",
            "need B >= 0, G >= 0 and V in [1, 2^23)");
  return static_cast<uint64_t>(plans::block_verify_layout(B, G, V, true).bytes);
}

void launch_block_verify(const void* target_probs, int64_t target_stride_b, int64_t target_stride_g,
                         const void* draft_probs, int64_t draft_stride_b, int64_t draft_stride_g,
                         BlockIndex draft_tokens, BlockIndex num_draft_tokens, const BlockRandomness& rnd,
                         int64_t* out_tokens, int64_t* num_accepted, void* workspace, int64_t B, int64_t G,
                         int64_t V, int dtype, cudaStream_t stream) {
  const char* op = "block_verify";
  check_common(op, target_probs, draft_probs, draft_tokens, num_draft_tokens, rnd, out_tokens, num_accepted,
               workspace, B, G, V, dtype);
  const plans::Plan plan = plans::plan_block_verify(B, G, V, current_device_limits());
  check_arg(plan.ok(), op, plan.refusal.c_str());
  if (B == 0) return;  // nothing to do; an empty grid is a launch error
  if (plan.at("splits") > plan.at("ws_stride")) throw std::logic_error("block_verify: bad split plan");
  const Workspace ws = workspace_of(workspace, plan);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_probs_typed<T>(target_probs, target_stride_b, target_stride_g, draft_probs, draft_stride_b, draft_stride_g,
                          draft_tokens, num_draft_tokens, rnd, out_tokens, num_accepted, ws, G, V, plan, stream);
  });
  SPECDEC_CUDA_CHECK(cudaGetLastError());
}

void launch_block_verify_logits(const void* target_logits, int64_t target_stride_b, int64_t target_stride_g,
                                const void* draft_logits, int64_t draft_stride_b, int64_t draft_stride_g,
                                BlockIndex draft_tokens, BlockIndex num_draft_tokens, float temperature,
                                const float* temperatures, int64_t temperatures_stride,
                                const BlockRandomness& rnd, int64_t* out_tokens, int64_t* num_accepted,
                                void* workspace, int64_t B, int64_t G, int64_t V, int dtype, cudaStream_t stream) {
  const char* op = "block_verify_logits";
  check_common(op, target_logits, draft_logits, draft_tokens, num_draft_tokens, rnd, out_tokens, num_accepted,
               workspace, B, G, V, dtype);
  const plans::Plan plan = plans::plan_block_verify_logits(B, G, V, current_device_limits());
  check_arg(plan.ok(), op, plan.refusal.c_str());
  if (B == 0) return;
  if (plan.at("splits") > plan.at("ws_stride") || plan.at("stats_splits") > plan.at("stats_stride")) {
    throw std::logic_error("block_verify_logits: bad split plan");
  }
  dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_logits_typed<T>(target_logits, target_stride_b, target_stride_g, draft_logits, draft_stride_b,
                           draft_stride_g, draft_tokens, num_draft_tokens, temperature, temperatures,
                           temperatures_stride, rnd, out_tokens, num_accepted, workspace, G, V, plan, stream);
  });
  SPECDEC_CUDA_CHECK(cudaGetLastError());
}

}  // namespace specdec
