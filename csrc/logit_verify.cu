// Logits verification of speculative-decoding drafts: relaxed_verify (SpecDec), bild_verify (BiLD
// rollback) and max_prob. See logit_verify.h and reference/logit_verify.py.
//
// relaxed_verify / bild_verify: one launch, grid (B, G+1, splits) as in logit_verify_greedy.cu.
// Block (b, pos, s) streams chunk s of logits[b, pos] once: the packed argmax key, the count of ids
// ranking ahead of the draft (relaxed; integer atomicAdd, exact) and the chunk's (max, sum exp)
// in its own slot (bild; merged in a fixed order, no float atomics). Drafts past n_b or outside
// [0, V) are never read. The row's last block merges, applies the rule, writes the outputs and
// re-zeroes the row's workspace for the next call or graph replay.
// max_prob: grid (R * splits); with more than one split the row's last block merges in split order.
//
// Rounding: relaxed_verify is comparisons and counts only (bit-exact). bild_verify and max_prob
// form lse = M + log(sum_s S_s exp(m_s - M)) in another order than torch.logsumexp, so bild_verify
// can differ only where lse - l_x is within ~1e-5 of the threshold.

#include <cstdint>
#include <limits>
#include <string>

#include "chain_common.cuh"
#include "common.cuh"
#include "dtype_dispatch.cuh"
#include "launch_utils.h"
#include "logit_math.cuh"
#include "logit_verify.h"

namespace specdec {
namespace logit {

// A MaxSum crosses lanes field by field (block_reduce.cuh's trees find this by argument lookup).
__device__ __forceinline__ MaxSum shfl_xor(MaxSum v, int offset) {
  return MaxSum{reduce::shfl_xor(v.m, offset), reduce::shfl_xor(v.s, offset)};
}

}  // namespace logit

namespace {

using logit::MaxSum;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
static_assert(kThreads == plans::kVerifyThreads, "launch_plan.h mirrors the block size");

// What a block accumulates over its chunk (bit flags).
constexpr int kArgmax = 1;  // packed (value, -index) key
constexpr int kRank = 2;    // ids ranking ahead of the draft (relaxed_verify)
constexpr int kSumExp = 4;  // (max, sum exp(x - max)) (bild_verify, max_prob)

// ---------------------------------------------------------------------------
// Block reductions. Each contains __syncthreads(): every thread of the block
// must call it; the result is valid in thread 0. Each uses its own scratch
// array, so several can run back to back without a barrier in between.
// ---------------------------------------------------------------------------
__device__ __forceinline__ unsigned block_sum_u32(unsigned v, unsigned* scratch) {
  return reduce::block_to_warp0<kWarps>(v, scratch, 0u, reduce::Sum{});
}

struct MaxSumMerge {
  __device__ __forceinline__ MaxSum operator()(MaxSum mine, MaxSum other) const {
    return logit::max_sum_merge(mine, other);
  }
};

// A fixed shuffle tree: the same inputs always give the same bits.
__device__ __forceinline__ MaxSum block_max_sum(MaxSum v, MaxSum* scratch) {
  return reduce::block_to_warp0<kWarps>(v, scratch, logit::max_sum_empty(), MaxSumMerge{});
}

struct BlockScratch {
  unsigned long long key[kWarps];
  unsigned ahead[kWarps];
  MaxSum max_sum[kWarps];
};

struct BlockStats {
  unsigned long long key;  // kArgmax
  unsigned ahead;          // kRank
  MaxSum max_sum;          // kSumExp
};

struct ThreadStats {
  uint32_t best_ord;
  uint32_t best_idx;
  unsigned ahead;
  MaxSum max_sum;
};

// Fold N consecutive elements (ids idx0, idx0+1, ...) into a thread's stats.
// Every thread visits its ids in increasing order (argmax ties -> lowest id).
template <int kWhat, int N>
__device__ __forceinline__ void visit(const float (&raw)[N], int64_t idx0, float lx, int64_t d,
                                      ThreadStats& t) {
  float x[N];
#pragma unroll
  for (int k = 0; k < N; ++k) x[k] = logit::nan_to_neg_inf(raw[k]);
  if constexpr ((kWhat & kArgmax) != 0) {
#pragma unroll
    for (int k = 0; k < N; ++k) chain::consider(x[k], idx0 + k, t.best_ord, t.best_idx);
  }
  if constexpr ((kWhat & kRank) != 0) {
#pragma unroll
    for (int k = 0; k < N; ++k) t.ahead += logit::ranks_ahead(x[k], idx0 + k, lx, d) ? 1u : 0u;
  }
  if constexpr ((kWhat & kSumExp) != 0) logit::max_sum_add(t.max_sum, x);
}

// The statistics `kWhat` of row[start, end) (end > start), valid in thread 0.
// lx, d: the draft's NaN-free logit and id (kRank only).
template <typename T, int kWhat>
__device__ __forceinline__ BlockStats scan_chunk(const T* __restrict__ row, int64_t start,
                                                 int64_t end, float lx, int64_t d,
                                                 BlockScratch& scratch) {
  // best_idx 0xFFFFFFFF -> key 0 for a thread that sees no element
  ThreadStats t{0u, 0xFFFFFFFFu, 0u, logit::max_sum_empty()};
  int64_t scalar_from = start;
  if (reinterpret_cast<uintptr_t>(row + start) % 16 == 0) {  // uniform per block
    constexpr int kVec = Vec16<T>::kElems;
    const int64_t num_vec = (end - start) / kVec;
    const T* base = row + start;
#pragma unroll 2
    for (int64_t v = threadIdx.x; v < num_vec; v += kThreads) {
      float vals[kVec];
      load_vec16(base + v * kVec, vals);
      visit<kWhat>(vals, start + v * kVec, lx, d, t);
    }
    scalar_from = start + num_vec * kVec;  // tail ids exceed all vector ones
  }
  for (int64_t idx = scalar_from + threadIdx.x; idx < end; idx += kThreads) {
    const float vals[1] = {to_float(row[idx])};
    visit<kWhat>(vals, idx, lx, d, t);
  }

  BlockStats out{0ull, 0u, logit::max_sum_empty()};
  if constexpr ((kWhat & kArgmax) != 0) {
    out.key = block_max_u64<kThreads>(make_argmax_key(t.best_ord, t.best_idx), scratch.key);
  }
  if constexpr ((kWhat & kRank) != 0) out.ahead = block_sum_u32(t.ahead, scratch.ahead);
  if constexpr ((kWhat & kSumExp) != 0) out.max_sum = block_max_sum(t.max_sum, scratch.max_sum);
  return out;
}

__device__ __forceinline__ void store_partial(float2* slot, MaxSum v) {
  __stcg(slot, make_float2(v.m, v.s));  // to L2: read by another block
}

// log-sum-exp of a row from its chunks' partials, merged in split order:
// M = max_s m_s, then S = sum_s S_s exp(m_s - M). Bypasses L1 (__ldcg): the
// partials were written by other blocks during this launch.
__device__ __forceinline__ MaxSum merge_partials(const float2* partials, int splits) {
  float m = -INFINITY;
  for (int s = 0; s < splits; ++s) {
    const float ms = __ldcg(&partials[s]).x;
    m = ms > m ? ms : m;
  }
  float sum = 0.0f;
  if (logit::is_finite(m)) {
    for (int s = 0; s < splits; ++s) {
      const float2 p = __ldcg(&partials[s]);
      sum += logit::max_sum_term(MaxSum{p.x, p.y}, m);
    }
  }
  return MaxSum{m, sum};
}

// ---------------------------------------------------------------------------
// relaxed_verify (kMode = kRank) / bild_verify (kMode = kSumExp)
// ---------------------------------------------------------------------------
template <typename T, int kMode>
__global__ void __launch_bounds__(kThreads)
logit_verify_kernel(const T* __restrict__ logits, int64_t stride_b, int64_t stride_g,
                    const int64_t* __restrict__ draft_tokens,
                    const int64_t* __restrict__ num_draft_tokens,
                    int64_t* __restrict__ out_tokens, int64_t* __restrict__ num_accepted,
                    unsigned long long* keys, float2* partials, unsigned* ranks,
                    unsigned* counters, int G, int V, int chunk, int64_t top_beta, float tau,
                    float threshold) {
  static_assert(kMode == kRank || kMode == kSumExp, "mode");
  __shared__ BlockScratch scratch;
  __shared__ bool is_last_block;
  __shared__ int s_first_reject;
  __shared__ int64_t s_final_token;

  const int b = blockIdx.x;
  const int pos = blockIdx.y;
  const int split = blockIdx.z;
  const int splits = gridDim.z;
  const int n = chain::drafts_in_row(num_draft_tokens, b, G);
  // Positions past n_b are never looked at; the whole block leaves together
  // (before any barrier) and is not counted below.
  if (pos > n) return;

  const int64_t row0 = static_cast<int64_t>(b) * (G + 1);  // slot of (b, 0)
  const int64_t slot = row0 + pos;
  const T* row = logits + static_cast<int64_t>(b) * stride_b + static_cast<int64_t>(pos) * stride_g;
  const int64_t start = static_cast<int64_t>(split) * chunk;
  const int64_t end = min(static_cast<int64_t>(V), start + chunk);  // > start (plan)

  // ---- 1. this chunk's statistics -----------------------------------------
  // Draft statistics only at a draft slot holding an id in [0, V); anything
  // else is rejected by the last block without reading them. Uniform per block.
  const int64_t d = pos < n ? draft_tokens[static_cast<int64_t>(b) * G + pos] : int64_t{-1};
  const bool draft_stats = pos < n && d >= 0 && d < V;
  BlockStats st;
  if (draft_stats) {
    float lx = 0.0f;
    if constexpr (kMode == kRank) lx = logit::nan_to_neg_inf(to_float(row[d]));
    st = scan_chunk<T, kArgmax | kMode>(row, start, end, lx, d, scratch);
  } else {
    st = scan_chunk<T, kArgmax>(row, start, end, 0.0f, -1, scratch);
  }

  // ---- 2. publish; elect the last block of batch row b ----------------------
  if (threadIdx.x == 0) {
    atomicMax(&keys[slot], st.key);
    if (draft_stats) {
      if constexpr (kMode == kRank) {
        atomicAdd(&ranks[slot], st.ahead);
      } else {
        store_partial(&partials[slot * splits + split], st.max_sum);
      }
    }
    __threadfence();  // our results must be visible before we count ourselves done
    // (n + 1) * splits < 2^32: the plan gives splits > 1 only when B*(G+1) < 4*SMs
    const unsigned blocks_in_row = static_cast<unsigned>(n + 1) * static_cast<unsigned>(splits);
    is_last_block = atomicAdd(&counters[b], 1u) == blocks_in_row - 1;
  }
  __syncthreads();
  if (!is_last_block) return;
  __threadfence();  // pairs with the writers' fences before reading their results

  // ---- 3. last block: accept flags of drafts 0..n-1 in parallel -------------
  // Workspace reads use __ldcg (L2): L1 is not coherent across blocks.
  if (threadIdx.x == 0) s_first_reject = n;  // no rejection: the bonus position
  __syncthreads();
  for (int j = threadIdx.x; j < n; j += kThreads) {
    const int64_t dj = draft_tokens[static_cast<int64_t>(b) * G + j];
    bool ok = dj >= 0 && dj < V;
    if (ok) {
      const T* row_j =
          logits + static_cast<int64_t>(b) * stride_b + static_cast<int64_t>(j) * stride_g;
      const float lx = logit::nan_to_neg_inf(to_float(row_j[dj]));
      if constexpr (kMode == kRank) {
        const unsigned long long key = __ldcg(&keys[row0 + j]);
        const float top = float_from_order_preserving(argmax_key_order(key));  // row max
        ok = logit::relaxed_accepts(__ldcg(&ranks[row0 + j]), top_beta,
                                    dj == chain::key_to_token(key, V), top, lx, tau);
      } else {
        const MaxSum row_stats = merge_partials(partials + (row0 + j) * splits, splits);
        ok = logit::bild_accepts(logit::logsumexp_of(row_stats), lx, threshold);
      }
    }
    if (!ok) atomicMin(&s_first_reject, j);
  }
  __syncthreads();
  const int accepted = s_first_reject;  // first rejection, or n
  if (threadIdx.x == 0) {
    // the argmax at the first rejection (correction) or at n (bonus)
    s_final_token = chain::key_to_token(__ldcg(&keys[row0 + accepted]), V);
    num_accepted[b] = accepted;
    counters[b] = 0;  // every block of row b has already counted itself
  }
  __syncthreads();  // every workspace read of this row is done

  // ---- 4. re-zero what row b used; write the outputs ------------------------
  for (int j = threadIdx.x; j <= n; j += kThreads) {
    keys[row0 + j] = 0ull;
    if constexpr (kMode == kRank) {
      if (j < n) ranks[row0 + j] = 0u;
    }
  }
  if constexpr (kMode == kSumExp) {
    const int64_t used = static_cast<int64_t>(n) * splits;  // slots of positions 0..n-1
    for (int64_t i = threadIdx.x; i < used; i += kThreads) {
      partials[row0 * splits + i] = make_float2(0.0f, 0.0f);
    }
  }
  int64_t* row_out = out_tokens + row0;
  for (int j = threadIdx.x; j <= G; j += kThreads) {
    row_out[j] = j < accepted ? draft_tokens[static_cast<int64_t>(b) * G + j]
                              : (j == accepted ? s_final_token : int64_t{-1});
  }
}

// ---------------------------------------------------------------------------
// max_prob
// ---------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(kThreads)
max_prob_kernel(const T* __restrict__ logits, int64_t row_stride, float* __restrict__ out,
                float2* partials, unsigned* counters, int V, int chunk, int splits) {
  __shared__ BlockScratch scratch;
  __shared__ bool is_last_block;

  const int64_t r = static_cast<int64_t>(blockIdx.x) / splits;
  const int split = static_cast<int>(blockIdx.x % static_cast<unsigned>(splits));
  const T* row = logits + r * row_stride;
  const int64_t start = static_cast<int64_t>(split) * chunk;
  const int64_t end = min(static_cast<int64_t>(V), start + chunk);  // > start (plan)
  const MaxSum chunk_stats = scan_chunk<T, kSumExp>(row, start, end, 0.0f, -1, scratch).max_sum;

  if (splits == 1) {  // uniform: the whole row was this block's chunk
    if (threadIdx.x == 0) out[r] = logit::max_prob_of(chunk_stats);
    return;
  }
  if (threadIdx.x == 0) {
    store_partial(&partials[r * splits + split], chunk_stats);
    __threadfence();
    is_last_block = atomicAdd(&counters[r], 1u) == static_cast<unsigned>(splits) - 1;
  }
  __syncthreads();
  if (!is_last_block) return;
  __threadfence();
  if (threadIdx.x == 0) {  // splits is small (< 2 * 4 * SMs / R): one thread
    out[r] = logit::max_prob_of(merge_partials(partials + r * splits, splits));
    for (int s = 0; s < splits; ++s) partials[r * splits + s] = make_float2(0.0f, 0.0f);
    counters[r] = 0;
  }
}

// ---------------------------------------------------------------------------
// Host side
// ---------------------------------------------------------------------------
void check_arg(bool ok, const char* op, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("specdec_kernels.") + op + ": " + what);
}

// The launch plan on the current device; a shape the kernels cannot serve throws its refusal.
plans::Plan chain_plan(const char* op, int64_t B, int64_t G, int64_t V) {
  const plans::Plan plan = plans::plan_logit_verify(B, G, V, current_device_limits());
  check_arg(plan.ok(), op, plan.refusal.c_str());
  return plan;
}

void check_strides(const char* op, int64_t stride_b, int64_t stride_g) {
  check_arg(stride_b >= 0 && stride_g >= 0, op, "logits strides must be >= 0");
}

struct ChainLayout {
  plans::Plan plan;
  uint64_t partials_offset;
  uint64_t ranks_offset;
  uint64_t counters_offset;
  uint64_t bytes;
};

// Requires B >= 1.
ChainLayout chain_layout(const char* op, int64_t B, int64_t G, int64_t V) {
  const uint64_t slots = static_cast<uint64_t>(B) * static_cast<uint64_t>(G + 1);
  ChainLayout layout{};
  layout.plan = chain_plan(op, B, G, V);
  layout.partials_offset = slots * sizeof(unsigned long long);
  layout.ranks_offset =
      layout.partials_offset + slots * static_cast<uint64_t>(layout.plan.at("splits")) * sizeof(float2);
  layout.counters_offset = layout.ranks_offset + slots * sizeof(unsigned);
  layout.bytes = layout.counters_offset + static_cast<uint64_t>(B) * sizeof(unsigned);
  return layout;
}

template <int kMode, typename T>
void launch_chain_typed(const void* logits, int64_t stride_b, int64_t stride_g,
                        const int64_t* draft_tokens, const int64_t* num_draft_tokens,
                        int64_t* out_tokens, int64_t* num_accepted, char* workspace,
                        const ChainLayout& layout, int64_t B, int64_t G, int64_t V,
                        int64_t top_beta, float tau, float threshold, cudaStream_t stream) {
  const plans::Launch& l = layout.plan.launches.at(0);
  const dim3 grid(static_cast<unsigned>(l.grid[0]), static_cast<unsigned>(l.grid[1]),
                  static_cast<unsigned>(l.grid[2]));
  logit_verify_kernel<T, kMode><<<grid, l.block, l.dynamic_smem, stream>>>(
      static_cast<const T*>(logits), stride_b, stride_g, draft_tokens, num_draft_tokens,
      out_tokens, num_accepted, reinterpret_cast<unsigned long long*>(workspace),
      reinterpret_cast<float2*>(workspace + layout.partials_offset),
      reinterpret_cast<unsigned*>(workspace + layout.ranks_offset),
      reinterpret_cast<unsigned*>(workspace + layout.counters_offset), static_cast<int>(G),
      static_cast<int>(V), static_cast<int>(layout.plan.at("chunk")), top_beta, tau, threshold);
}

template <int kMode>
void launch_chain(const char* op, const void* logits, int64_t stride_b, int64_t stride_g,
                  const int64_t* draft_tokens, const int64_t* num_draft_tokens,
                  int64_t* out_tokens, int64_t* num_accepted, void* workspace,
                  uint64_t workspace_bytes, int64_t B, int64_t G, int64_t V, int dtype,
                  int64_t top_beta, float tau, float threshold, cudaStream_t stream) {
  check_arg(dtype == kFloat32 || dtype == kFloat16 || dtype == kBFloat16, op,
            "dtype must be 0 (float32), 1 (float16) or 2 (bfloat16)");
  chain_plan(op, B, G, V);  // the shape checks and refusals, also for B == 0
  check_strides(op, stride_b, stride_g);
  if (B == 0) return;  // nothing to do; launching an empty grid is an error
  check_arg(logits && out_tokens && num_accepted && workspace, op, "null device pointer");
  check_arg(G == 0 || draft_tokens, op, "draft_tokens is null");
  check_arg(reinterpret_cast<uintptr_t>(workspace) % 8 == 0, op,
            "workspace must be 8-byte aligned");
  const ChainLayout layout = chain_layout(op, B, G, V);
  check_arg(workspace_bytes >= layout.bytes, op,
            "workspace too small: query logit_verify_workspace_bytes on the same device");
  char* ws = static_cast<char*>(workspace);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_chain_typed<kMode, T>(logits, stride_b, stride_g, draft_tokens, num_draft_tokens, out_tokens, num_accepted,
                                 ws, layout, B, G, V, top_beta, tau, threshold, stream);
  });
  SPECDEC_CUDA_CHECK(cudaGetLastError());
}

// A threshold >= 0 (or +inf) as the float32 the kernels compare with: round to
// nearest like torch does with a Python float against a float32 tensor. The
// Python wrapper already passes float32 values; this also keeps the cast defined
// for doubles beyond the float range.
float threshold_as_float32(const char* op, const char* what, double value) {
  check_arg(value >= 0.0, op, what);  // also rejects NaN
  constexpr double kRoundsToInf = 0x1.ffffffp127;  // FLT_MAX + half an ulp (ties to even: up)
  return value >= kRoundsToInf ? std::numeric_limits<float>::infinity()
                               : static_cast<float>(value);
}

}  // namespace

uint64_t logit_verify_workspace_bytes(int64_t B, int64_t G, int64_t V) {
  constexpr const char* op = "logit_verify_workspace_bytes";
  chain_plan(op, B, G, V);
  return B == 0 ? 0 : chain_layout(op, B, G, V).bytes;
}

void launch_relaxed_verify(const void* logits, int64_t stride_b, int64_t stride_g,
                           const int64_t* draft_tokens, const int64_t* num_draft_tokens,
                           int64_t* out_tokens, int64_t* num_accepted, void* workspace,
                           uint64_t workspace_bytes, int64_t B, int64_t G, int64_t V, int dtype,
                           int64_t top_beta, double tau, cudaStream_t stream) {
  constexpr const char* op = "relaxed_verify";
  check_arg(top_beta >= 1, op, "top_beta must be >= 1");
  const float tau32 = threshold_as_float32(op, "tau must be >= 0 (and not NaN)", tau);
  launch_chain<kRank>(op, logits, stride_b, stride_g, draft_tokens, num_draft_tokens, out_tokens,
                      num_accepted, workspace, workspace_bytes, B, G, V, dtype, top_beta, tau32,
                      0.0f, stream);
}

void launch_bild_verify(const void* logits, int64_t stride_b, int64_t stride_g,
                        const int64_t* draft_tokens, const int64_t* num_draft_tokens,
                        int64_t* out_tokens, int64_t* num_accepted, void* workspace,
                        uint64_t workspace_bytes, int64_t B, int64_t G, int64_t V, int dtype,
                        double rollback_threshold, cudaStream_t stream) {
  constexpr const char* op = "bild_verify";
  const float threshold = threshold_as_float32(
      op, "rollback_threshold must be >= 0 (and not NaN)", rollback_threshold);
  launch_chain<kSumExp>(op, logits, stride_b, stride_g, draft_tokens, num_draft_tokens,
                        out_tokens, num_accepted, workspace, workspace_bytes, B, G, V, dtype, 1,
                        0.0f, threshold, stream);
}

namespace {

struct MaxProbPlan {
  plans::Plan plan;
  uint64_t counters_offset;
  uint64_t bytes;  // 0 with one split per row
};

// The launch plan on the current device and its workspace; a shape the kernel cannot
// serve throws its refusal.
MaxProbPlan max_prob_plan(const char* op, int64_t R, int64_t V) {
  MaxProbPlan p{};
  p.plan = plans::plan_max_prob(R, V, current_device_limits());
  check_arg(p.plan.ok(), op, p.plan.refusal.c_str());
  if (R == 0) return p;
  const int64_t splits = p.plan.at("splits");
  if (splits > 1) {
    const uint64_t slots = static_cast<uint64_t>(R) * static_cast<uint64_t>(splits);
    p.counters_offset = slots * sizeof(float2);
    p.bytes = p.counters_offset + static_cast<uint64_t>(R) * sizeof(unsigned);
  }
  return p;
}

template <typename T>
void launch_max_prob_typed(const void* logits, int64_t row_stride, float* out, char* workspace,
                           const MaxProbPlan& p, int64_t R, int64_t V, cudaStream_t stream) {
  const plans::Launch& l = p.plan.launches.at(0);
  float2* partials = p.bytes ? reinterpret_cast<float2*>(workspace) : nullptr;
  unsigned* counters =
      p.bytes ? reinterpret_cast<unsigned*>(workspace + p.counters_offset) : nullptr;
  max_prob_kernel<T><<<static_cast<unsigned>(l.grid[0]), l.block, l.dynamic_smem, stream>>>(
      static_cast<const T*>(logits), row_stride, out, partials, counters, static_cast<int>(V),
      static_cast<int>(p.plan.at("chunk")), static_cast<int>(p.plan.at("splits")));
}

}  // namespace

uint64_t max_prob_workspace_bytes(int64_t R, int64_t V) {
  constexpr const char* op = "max_prob_workspace_bytes";
  return max_prob_plan(op, R, V).bytes;
}

void launch_max_prob(const void* logits, int64_t row_stride, float* out, void* workspace,
                     uint64_t workspace_bytes, int64_t R, int64_t V, int dtype,
                     cudaStream_t stream) {
  constexpr const char* op = "max_prob";
  check_arg(dtype == kFloat32 || dtype == kFloat16 || dtype == kBFloat16, op,
            "dtype must be 0 (float32), 1 (float16) or 2 (bfloat16)");
  const MaxProbPlan p = max_prob_plan(op, R, V);
  check_arg(row_stride >= 0, op, "row_stride must be >= 0");
  if (R == 0) return;
  check_arg(logits && out, op, "null device pointer");
  if (p.bytes) {
    check_arg(workspace != nullptr, op, "null workspace");
    check_arg(reinterpret_cast<uintptr_t>(workspace) % 8 == 0, op,
              "workspace must be 8-byte aligned");
    check_arg(workspace_bytes >= p.bytes, op,
              "workspace too small: query max_prob_workspace_bytes on the same device");
  }
  char* ws = static_cast<char*>(workspace);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_max_prob_typed<T>(logits, row_stride, out, ws, p, R, V, stream);
  });
  SPECDEC_CUDA_CHECK(cudaGetLastError());
}

}  // namespace specdec
