// Verification of token trees (reference/tree_verify.py is the specification).
//
// tree_greedy_verify: grid (B, N, splits). Each block reduces one V-chunk of one
// node's logits to a packed (value, index) argmax key (common.cuh) and
// atomicMax-es it into the zeroed workspace, exactly like greedy_verify.cu. The
// last block to finish a batch row (per-row atomic counter) walks the tree from
// the root in one thread, writes the outputs and re-zeroes the row's keys and
// counter, so the workspace is handed back zeroed.
//
// tree_rejection_sample: one block per batch row walks the tree sequentially.
// Every decision (which child, accept or not) is taken by thread 0 and
// broadcast through shared memory, so all control flow around barriers is
// block-uniform by construction. Passes over V (residual updates, totals and
// the inverse-CDF draw) use the whole block; all weights are int64 fixed point,
// so every sum is exact and the result does not depend on the reduction order.
// Small-B performance (one block per row) is a later step: a split-V version
// would need a cross-block handshake per rejected child.

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "chain_common.cuh"
#include "common.cuh"
#include "launch_utils.h"
#include "philox.cuh"
#include "tree_verify.h"

namespace specdec {
namespace {

// ---------------------------------------------------------------------------
// Shared tree helpers (device).
// ---------------------------------------------------------------------------
__device__ __forceinline__ int64_t load_index(IndexMatrix m, int64_t b, int64_t i) {
  return m.data[b * m.stride_b + i * m.stride_n];
}

// A node the walk can ever reach: the root, or a node whose parent is a node.
// (Reachable nodes are a subset: a reached child has parents[b, c] == cur.)
__device__ __forceinline__ bool node_is_used(IndexMatrix parents, int64_t b, int node, int N) {
  if (node == 0) return true;
  const int64_t p = load_index(parents, b, node);
  return p >= 0 && p < N;
}

// ===========================================================================
// tree_greedy_verify
// ===========================================================================
constexpr int kArgmaxThreads = 256;
using chain::chunk_argmax_key;
using chain::key_to_token;
static_assert(kArgmaxThreads == plans::kVerifyThreads, "launch_plan.h mirrors the block size");

template <typename T>
__global__ void __launch_bounds__(kArgmaxThreads)
tree_greedy_verify_kernel(const T* __restrict__ logits, int64_t stride_b, int64_t stride_n,
                          IndexMatrix tree_tokens, IndexMatrix parents,
                          int64_t* __restrict__ out_tokens, int64_t* __restrict__ num_accepted,
                          int64_t* __restrict__ accepted_nodes, unsigned long long* keys,
                          unsigned int* counters, int N, int V, int chunk, int64_t max_depth) {
  __shared__ unsigned long long warp_scratch[kArgmaxThreads / 32];
  __shared__ bool is_last_block;
  __shared__ int64_t s_level;

  const int64_t b = blockIdx.x;
  const int node = blockIdx.y;
  const int split = blockIdx.z;
  // Unused slots are never looked at: the whole block leaves together, before
  // any barrier, and is not counted below (every block of the row computes the
  // same used-node count from the same parents).
  if (!node_is_used(parents, b, node, N)) return;

  // ---- 1. argmax of this block's chunk (as in greedy_verify.cu) ------------
  const int64_t start = static_cast<int64_t>(split) * chunk;
  const int64_t end = min(static_cast<int64_t>(V), start + chunk);
  const T* row = logits + b * stride_b + static_cast<int64_t>(node) * stride_n;

  const unsigned long long key = chunk_argmax_key<T, kArgmaxThreads>(row, start, end, warp_scratch);

  // ---- 2. merge into the node's key; elect the last block of batch row b ---
  unsigned long long* row_keys = keys + b * N;
  if (threadIdx.x == 0) {
    atomicMax(&row_keys[node], key);
    __threadfence();  // our key must be visible before we count ourselves done
    unsigned int used = 0;
    for (int i = 0; i < N; ++i) used += node_is_used(parents, b, i, N) ? 1u : 0u;
    is_last_block = atomicAdd(&counters[b], 1u) == used * gridDim.z - 1u;
  }
  __syncthreads();
  if (!is_last_block) return;  // uniform: is_last_block is shared
  __threadfence();             // pairs with the writers' fences before reading their keys

  // ---- 3. last block: walk the tree in one thread --------------------------
  const int64_t width = max_depth + 1;
  int64_t* row_out = out_tokens + b * width;
  int64_t* row_nodes = accepted_nodes + b * width;
  if (threadIdx.x == 0) {
    int64_t cur = 0;
    int64_t level = 0;
    while (true) {
      // An atomic read comes from L2, where every block's atomicMax landed.
      // cur is the root or an accepted child, both used nodes: its key is set.
      const int64_t want = key_to_token(atomicAdd(&row_keys[cur], 0ull), V);
      int64_t next = -1;
      if (level < max_depth) {
        for (int c = 1; c < N; ++c) {  // children in increasing index
          // want is in [0, V): out-of-range tokens (-1 padding, >= V) never match.
          if (load_index(parents, b, c) == cur && load_index(tree_tokens, b, c) == want) {
            next = c;
            break;
          }
        }
      }
      if (next < 0) {
        row_out[level] = want;  // the correction, or the bonus at a leaf / at max_depth
        break;
      }
      row_out[level] = want;  // == tree_tokens[b, next]
      row_nodes[level + 1] = next;
      cur = next;
      ++level;
    }
    num_accepted[b] = level;
    counters[b] = 0;  // every block of row b has already incremented it
    s_level = level;
  }
  __syncthreads();  // thread 0's atomic reads of the keys are done before they are zeroed

  const int64_t level = s_level;
  for (int i = threadIdx.x; i < N; i += kArgmaxThreads) row_keys[i] = 0ull;  // hand back zeroed
  for (int64_t j = threadIdx.x; j < width; j += kArgmaxThreads) {
    if (j == 0) row_nodes[0] = 0;
    if (j > level) {
      row_out[j] = -1;
      row_nodes[j] = -1;
    }
  }
}

// ===========================================================================
// tree_rejection_sample
// ===========================================================================
constexpr int kWalkThreads = 512;
constexpr int kWalkWarps = kWalkThreads / 32;
constexpr int kItems = 4;  // consecutive elements per thread in a scan tile
constexpr int64_t kTile = static_cast<int64_t>(kWalkThreads) * kItems;

// Sum over the block, returned to every thread. Two barriers: the second one
// lets the caller reuse `scratch` right away. Every thread must call it.
__device__ __forceinline__ int64_t block_sum_i64(int64_t v, int64_t* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  int64_t total = 0;
  for (int w = 0; w < kWalkWarps; ++w) total += scratch[w];
  __syncthreads();
  return total;
}

// Exclusive prefix sum over the threads of the block (thread order) and the
// block total, both to every thread. Every thread must call it.
__device__ __forceinline__ void block_exclusive_scan_i64(int64_t v, int64_t& exclusive,
                                                         int64_t& total, int64_t* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  int64_t inclusive = v;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int64_t other = __shfl_up_sync(0xFFFFFFFFu, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  if (lane == 31) scratch[warp] = inclusive;
  __syncthreads();
  int64_t before = 0, sum = 0;
  for (int w = 0; w < kWalkWarps; ++w) {
    const int64_t t = scratch[w];
    if (w < warp) before += t;
    sum += t;
  }
  __syncthreads();
  exclusive = before + inclusive - v;
  total = sum;
}

// Fixed-point weights of the target row p (reference to_weights(p)).
template <typename T>
struct TargetWeights {
  const T* row;
  __device__ __forceinline__ int64_t operator()(int64_t v) const { return to_weight(to_float(row[v])); }
};

// Residual weights R kept in the global scratch row.
struct ResidualWeights {
  const int64_t* row;
  __device__ __forceinline__ int64_t operator()(int64_t v) const { return row[v]; }
};

template <typename Weights>
__device__ __forceinline__ int64_t block_total(Weights weights, int V, int64_t* scratch) {
  int64_t local = 0;
  for (int64_t v = threadIdx.x; v < V; v += kWalkThreads) local += weights(v);
  return block_sum_i64(local, scratch);
}

// reference sample_weights: the number of v whose inclusive cumulative weight
// is <= threshold (= searchsorted(cdf, threshold, right=True)), in [0, V].
// Weights are >= 0 and sum to < 2^63 (V < 2^23), so every prefix is exact.
template <typename Weights>
__device__ int64_t inverse_cdf(Weights weights, int V, int64_t threshold, int64_t* scratch) {
  int64_t count = 0;  // this thread's share
  int64_t carry = 0;  // total weight of the earlier tiles (block-uniform)
  for (int64_t tile = 0; tile < V; tile += kTile) {
    if (carry > threshold) break;  // uniform; every later cdf exceeds the threshold
    const int64_t first = tile + static_cast<int64_t>(threadIdx.x) * kItems;
    int64_t w[kItems];
    int64_t local = 0;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      w[k] = first + k < V ? weights(first + k) : 0;
      local += w[k];
    }
    int64_t exclusive, tile_total;
    block_exclusive_scan_i64(local, exclusive, tile_total, scratch);
    int64_t cdf = carry + exclusive;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      cdf += w[k];
      if (first + k < V && cdf <= threshold) ++count;
    }
    carry += tile_total;
  }
  return block_sum_i64(count, scratch);
}

// reference to_weights after nan_to_num(q, nan=1, posinf=1, neginf=0).clamp(0, 1).
__device__ __forceinline__ double clean_prob(float q) {
  float c = q;
  if (c != c) c = 1.0f;       // NaN -> 1
  if (c > 1.0f) c = 1.0f;     // +inf and > 1 -> 1
  if (!(c > 0.0f)) c = 0.0f;  // -inf, negatives, -0 -> 0
  return static_cast<double>(c);
}

template <typename T>
__global__ void __launch_bounds__(kWalkThreads)
tree_rejection_sample_kernel(const T* __restrict__ target, int64_t target_stride_b,
                             int64_t target_stride_n, const T* __restrict__ draft,
                             int64_t draft_stride_b, int64_t draft_stride_n,
                             IndexMatrix tree_tokens, IndexMatrix parents, TreeRandomness rnd,
                             int64_t* __restrict__ out_tokens, int64_t* __restrict__ num_accepted,
                             int64_t* __restrict__ accepted_nodes, int64_t* __restrict__ scratch,
                             int N, int V, int64_t max_depth) {
  __shared__ int64_t s_reduce[kWalkWarps];
  __shared__ int s_child;   // the child just tried, or -1 when none is left
  __shared__ int s_accept;  // whether it was accepted

  const int64_t b = blockIdx.x;
  const int64_t width = max_depth + 1;
  int64_t* row_out = out_tokens + b * width;
  int64_t* row_nodes = accepted_nodes + b * width;
  int64_t* residual = scratch + b * V;  // written at the first rejection of a level, before any read

  const bool have_uniforms = rnd.uniforms != nullptr;
  const int64_t seed = rnd.seeds != nullptr ? rnd.seeds[b * rnd.seeds_stride] : rnd.seed;
  const int64_t row_key = rnd.seeds != nullptr ? 0 : b;
  const int64_t offset = rnd.offsets != nullptr ? rnd.offsets[b * rnd.offsets_stride] : 0;
  auto uniform_at = [&](int64_t node) -> double {
    const int64_t i = b * rnd.uniforms_stride_b + node * rnd.uniforms_stride_n;
    return rnd.uniforms_double ? static_cast<const double*>(rnd.uniforms)[i]
                               : static_cast<double>(static_cast<const float*>(rnd.uniforms)[i]);
  };

  // Block-uniform walk state: level, cur, rejected, total only change through
  // values every thread reads from shared memory or gets from block_sum_i64.
  int64_t cur = 0;
  int64_t level = 0;
  while (true) {
    const T* p_row = target + b * target_stride_b + cur * target_stride_n;
    bool rejected = false;  // any child of cur rejected: R and total hold the residual
    int64_t total = 0;      // S = sum(R)
    int64_t accepted = -1;
    if (level < max_depth) {
      int prev = 0;  // children are searched after this index
      int rank = 0;  // sibling rank of the next child
      while (true) {
        // ---- thread 0 finds the next child and decides; the block follows --
        if (threadIdx.x == 0) {
          int child = -1;
          for (int c = prev + 1; c < N; ++c) {
            if (load_index(parents, b, c) == cur) {
              child = c;
              break;
            }
          }
          int accept = 0;
          if (child >= 0) {
            const int64_t x = load_index(tree_tokens, b, child);
            // Out-of-range tokens are rejected without reading p/q (the
            // residual below is still updated with q_c, as in the reference).
            if (x >= 0 && x < V) {
              const double u = have_uniforms
                                   ? uniform_at(child)
                                   : philox_uniform(seed, offset + level, row_key, kSaltAccept, rank);
              const T* q_row = draft + b * draft_stride_b + static_cast<int64_t>(child) * draft_stride_n;
              const float q_x = to_float(q_row[x]);
              if (!rejected) {
                accept = accept_draft(u, q_x, to_float(p_row[x]));
              } else {
                // reference: (u * q_x) * S < R(x), R(x) read exactly (int64 -> float64).
                const double r_x = static_cast<double>(residual[x]);  // <= 2^40: exact
                accept = (u * static_cast<double>(q_x)) * static_cast<double>(total) < r_x;
              }
            }
          }
          s_child = child;
          s_accept = accept;
        }
        __syncthreads();
        const int child = s_child;
        const bool accept = s_accept != 0;
        __syncthreads();  // everyone has read s_child / s_accept before thread 0 rewrites them
        if (child < 0) break;
        if (accept) {
          accepted = child;
          break;
        }
        // ---- child rejected: update the residual over the whole row --------
        const T* q_row = draft + b * draft_stride_b + static_cast<int64_t>(child) * draft_stride_n;
        int64_t local = 0;
        if (!rejected) {  // R = to_weights(p - q) (float32 difference)
          for (int64_t v = threadIdx.x; v < V; v += kWalkThreads) {
            const int64_t w = to_weight(to_float(p_row[v]) - to_float(q_row[v]));
            residual[v] = w;
            local += w;
          }
        } else {  // R = max(0, R - floor(S * clean(q)))
          const double s = static_cast<double>(total);
          for (int64_t v = threadIdx.x; v < V; v += kWalkThreads) {
            const int64_t cut = static_cast<int64_t>(floor(s * clean_prob(to_float(q_row[v]))));
            const int64_t diff = residual[v] - cut;
            const int64_t w = diff > 0 ? diff : 0;
            residual[v] = w;
            local += w;
          }
        }
        // The barriers inside also make the residual writes visible to the
        // whole block (thread 0's next test, the final draw).
        total = block_sum_i64(local, s_reduce);
        rejected = true;
        prev = child;
        ++rank;
      }
    }

    if (accepted >= 0) {
      if (threadIdx.x == 0) {
        row_out[level] = load_index(tree_tokens, b, accepted);  // in [0, V): it was accepted
        row_nodes[level + 1] = accepted;
      }
      cur = accepted;
      ++level;
      continue;
    }

    // ---- no child accepted (or a leaf, or max_depth): the final draw --------
    // Every thread computes the same u (a pure function / one address).
    const double u = have_uniforms ? uniform_at(0)
                                   : philox_uniform(seed, offset + level, row_key, kSaltFinal, 0);
    int64_t token;
    if (rejected && total > 0) {
      token = inverse_cdf(ResidualWeights{residual}, V, draw_threshold(u, total), s_reduce);
    } else {  // no residual, or an empty one: draw from p; no mass at all -> 0
      const TargetWeights<T> p_weights{p_row};
      const int64_t p_total = block_total(p_weights, V, s_reduce);
      token = p_total > 0 ? inverse_cdf(p_weights, V, draw_threshold(u, p_total), s_reduce) : 0;
    }
    if (threadIdx.x == 0) {
      row_out[level] = token;
      num_accepted[b] = level;
    }
    break;
  }

  for (int64_t j = threadIdx.x; j < width; j += kWalkThreads) {
    if (j == 0) row_nodes[0] = 0;
    if (j > level) {
      row_out[j] = -1;
      row_nodes[j] = -1;
    }
  }
}

// ===========================================================================
// Launchers
// ===========================================================================
void check_arg(bool ok, const char* op, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("specdec_kernels.") + op + ": " + what);
}

void check_common(const char* op, int64_t B, int64_t N, int64_t max_depth, int dtype) {
  check_arg(dtype == kFloat32 || dtype == kFloat16 || dtype == kBFloat16, op,
            "dtype must be 0 (float32), 1 (float16) or 2 (bfloat16)");
  check_arg(B >= 0 && N >= 1, op, "need B >= 0 and N >= 1");
  check_arg(max_depth >= 0 && max_depth < 0x7FFFFFFF, op, "max_depth must be in [0, 2^31 - 1)");
}

template <typename T>
void launch_greedy_typed(const void* logits, int64_t stride_b, int64_t stride_n,
                         IndexMatrix tree_tokens, IndexMatrix parents, int64_t* out_tokens,
                         int64_t* num_accepted, int64_t* accepted_nodes,
                         unsigned long long* keys, unsigned int* counters, int64_t N, int64_t V,
                         int64_t max_depth, const plans::Plan& plan, cudaStream_t stream) {
  const plans::Launch& l = plan.launches.at(0);
  const dim3 grid(static_cast<unsigned>(l.grid[0]), static_cast<unsigned>(l.grid[1]),
                  static_cast<unsigned>(l.grid[2]));
  tree_greedy_verify_kernel<T><<<grid, l.block, l.dynamic_smem, stream>>>(
      static_cast<const T*>(logits), stride_b, stride_n, tree_tokens, parents, out_tokens,
      num_accepted, accepted_nodes, keys, counters, static_cast<int>(N), static_cast<int>(V),
      static_cast<int>(plan.at("chunk")), max_depth);
}

template <typename T>
void launch_rejection_typed(const void* target, int64_t target_stride_b, int64_t target_stride_n,
                            const void* draft, int64_t draft_stride_b, int64_t draft_stride_n,
                            IndexMatrix tree_tokens, IndexMatrix parents, TreeRandomness rnd,
                            int64_t* out_tokens, int64_t* num_accepted, int64_t* accepted_nodes,
                            int64_t* scratch, int64_t B, int64_t N, int64_t V, int64_t max_depth,
                            cudaStream_t stream) {
  tree_rejection_sample_kernel<T><<<static_cast<unsigned>(B), kWalkThreads, 0, stream>>>(
      static_cast<const T*>(target), target_stride_b, target_stride_n,
      static_cast<const T*>(draft), draft_stride_b, draft_stride_n, tree_tokens, parents, rnd,
      out_tokens, num_accepted, accepted_nodes, scratch, static_cast<int>(N), static_cast<int>(V),
      max_depth);
}

}  // namespace

uint64_t tree_greedy_verify_workspace_bytes(int64_t B, int64_t N) {
  check_arg(B >= 0 && N >= 0, "tree_greedy_verify", "B and N must be >= 0");
  return static_cast<uint64_t>(B) * static_cast<uint64_t>(N) * sizeof(unsigned long long) +
         static_cast<uint64_t>(B) * sizeof(unsigned int);
}

void launch_tree_greedy_verify(const void* logits, int64_t stride_b, int64_t stride_n,
                               IndexMatrix tree_tokens, IndexMatrix parents, int64_t* out_tokens,
                               int64_t* num_accepted, int64_t* accepted_nodes, void* workspace,
                               int64_t B, int64_t N, int64_t V, int64_t max_depth, int dtype,
                               cudaStream_t stream) {
  const char* op = "tree_greedy_verify";
  check_common(op, B, N, max_depth, dtype);
  const plans::Plan plan = plans::plan_tree_greedy_verify(B, N, V, current_device_limits());
  check_arg(plan.ok(), op, plan.refusal.c_str());
  if (B == 0) return;  // launching an empty grid is an error
  check_arg(logits && tree_tokens.data && parents.data && out_tokens && num_accepted &&
                accepted_nodes && workspace,
            op, "null device pointer");
  check_arg(reinterpret_cast<uintptr_t>(workspace) % 8 == 0, op, "workspace must be 8-byte aligned");

  auto* keys = static_cast<unsigned long long*>(workspace);
  auto* counters = reinterpret_cast<unsigned int*>(keys + B * N);
  switch (dtype) {
    case kFloat32:
      launch_greedy_typed<float>(logits, stride_b, stride_n, tree_tokens, parents, out_tokens,
                                 num_accepted, accepted_nodes, keys, counters, N, V, max_depth, plan,
                                 stream);
      break;
    case kFloat16:
      launch_greedy_typed<__half>(logits, stride_b, stride_n, tree_tokens, parents, out_tokens,
                                  num_accepted, accepted_nodes, keys, counters, N, V, max_depth, plan,
                                  stream);
      break;
    default:
      launch_greedy_typed<__nv_bfloat16>(logits, stride_b, stride_n, tree_tokens, parents,
                                         out_tokens, num_accepted, accepted_nodes, keys, counters,
                                         N, V, max_depth, plan, stream);
      break;
  }
  SPECDEC_CUDA_CHECK(cudaGetLastError());
}

uint64_t tree_rejection_sample_scratch_bytes(int64_t B, int64_t V) {
  check_arg(B >= 0 && V >= 0, "tree_rejection_sample", "B and V must be >= 0");
  return static_cast<uint64_t>(B) * static_cast<uint64_t>(V) * sizeof(int64_t);
}

void launch_tree_rejection_sample(const void* target_probs, int64_t target_stride_b,
                                  int64_t target_stride_n, const void* draft_probs,
                                  int64_t draft_stride_b, int64_t draft_stride_n,
                                  IndexMatrix tree_tokens, IndexMatrix parents,
                                  TreeRandomness randomness, int64_t* out_tokens,
                                  int64_t* num_accepted, int64_t* accepted_nodes, void* scratch,
                                  int64_t B, int64_t N, int64_t V, int64_t max_depth, int dtype,
                                  cudaStream_t stream) {
  const char* op = "tree_rejection_sample";
  check_common(op, B, N, max_depth, dtype);
  check_arg(B <= 0x7FFFFFFF && N <= 0x7FFFFFFF, op, "B and N must be < 2^31");
  // Fixed-point totals stay exact in int64 only for V < 2^23 (weights <= 2^40).
  check_arg(V >= 1 && V < (int64_t{1} << 23), op, "V must be in [1, 2^23)");
  if (B == 0) return;
  check_arg(target_probs && draft_probs && tree_tokens.data && parents.data && out_tokens &&
                num_accepted && accepted_nodes && scratch,
            op, "null device pointer");
  check_arg(reinterpret_cast<uintptr_t>(scratch) % 8 == 0, op, "scratch must be 8-byte aligned");
  auto* residual = static_cast<int64_t*>(scratch);
  switch (dtype) {
    case kFloat32:
      launch_rejection_typed<float>(target_probs, target_stride_b, target_stride_n, draft_probs,
                                    draft_stride_b, draft_stride_n, tree_tokens, parents,
                                    randomness, out_tokens, num_accepted, accepted_nodes,
                                    residual, B, N, V, max_depth, stream);
      break;
    case kFloat16:
      launch_rejection_typed<__half>(target_probs, target_stride_b, target_stride_n, draft_probs,
                                     draft_stride_b, draft_stride_n, tree_tokens, parents,
                                     randomness, out_tokens, num_accepted, accepted_nodes,
                                     residual, B, N, V, max_depth, stream);
      break;
    default:
      launch_rejection_typed<__nv_bfloat16>(target_probs, target_stride_b, target_stride_n,
                                            draft_probs, draft_stride_b, draft_stride_n,
                                            tree_tokens, parents, randomness, out_tokens,
                                            num_accepted, accepted_nodes, residual, B, N, V,
                                            max_depth, stream);
      break;
  }
  SPECDEC_CUDA_CHECK(cudaGetLastError());
}

}  // namespace specdec
