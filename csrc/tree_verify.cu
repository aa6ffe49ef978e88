// Verification of token trees (reference/tree_verify.py is the specification).
//
// tree_greedy_verify: grid (B, N, splits). Each block reduces one V-chunk of one
// node's logits to a packed (value, index) argmax key (common.cuh) and
// atomicMax-es it into the zeroed workspace, exactly like logit_verify_greedy.cu. The
// last block to finish a batch row (per-row atomic counter) walks the tree from
// the root in one thread, writes the outputs and re-zeroes the row's keys and
// counter, so the workspace is handed back zeroed.
//
// tree_rejection_sample: one block per batch row walks the tree sequentially.
// Every decision (which child, accept or not) is taken by thread 0 and
// broadcast through shared memory, so all control flow around barriers is
// block-uniform by construction. Passes over V (residual totals and the
// inverse-CDF draw) use the whole block; all weights are int64 fixed point,
// so every sum is exact and the result does not depend on the reduction order.
// The residual after rejected siblings is never stored: each pass recomputes
// it from p and the rejected siblings' q rows (tree_residual.cuh), so the only
// buffer is a rank table of B * N * 2 int64 (the rejected child and the total
// after it, per sibling rank), whatever V. The k-th rejection at a node reads
// k + 1 rows; see specdec_kernels/triton/tree_verify_sampling.py for the traffic
// trade-off against a stored residual row.
// siblings = without replacement (tree_rejection_sampled_kernel): the same walk,
// plan and rank table, but a node's children share the node's own draft row and
// the table holds per rank the rejected token and the float64 scale S / T' (bits),
// so each rejection's pass reads p and one q row (plus one q pass for T at the
// first rejection of a node) whatever the rank.
// Small B leaves most SMs idle (one block per row). Splitting a row over V
// would need a grid-wide handshake per rejected sibling (its total gates the
// next test and every later residual value), i.e. blocks waiting for each other
// inside one launch, which is only safe with guaranteed co-residency
// (cooperative launch, or an sm_90 cluster per row) or with per-row work
// stealing over the V-chunks of each stage, which the Triton kernel does
// (specdec_kernels/triton/tree_verify_sampling.py): its CUDA twin is a later step.

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "chain_common.cuh"
#include "common.cuh"
#include "launch_utils.h"
#include "philox.cuh"
#include "tree_residual.cuh"
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

  // ---- 1. argmax of this block's chunk (as in logit_verify_greedy.cu) ------------
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
// Two resident walks per SM (64 registers a thread): without the hint ptxas for
// sm_90 squeezed the walk into 40 registers and spilled.
constexpr int kWalkBlocksPerSM = 2;
constexpr int kItems = 4;  // consecutive elements per thread in a scan tile
constexpr int64_t kTile = static_cast<int64_t>(kWalkThreads) * kItems;
// A row's rank table: the rejected child of each sibling rank, then the total after it.
constexpr int64_t kRankTableColumns = 2;

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
  // The weights of ids first + k * step, k < kItems (0 at ids >= V). Ids fit in
  // int: V < 2^23 (the launcher checks), one tile past it at most.
  __device__ __forceinline__ void tile(int first, int step, int V, int64_t (&w)[kItems]) const {
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int v = first + k * step;
      w[k] = v < V ? to_weight(to_float(row[v])) : 0;
    }
  }
};

// The residual after the first `count` (>= 1) children of the current node were
// rejected (tree_residual.cuh), recomputed from p and their q rows rather than
// stored: a stored row would cost B * V * 8 bytes (311 MB at B = 256, V = 151936).
// table: the batch row's rank table, [rank] = the rejected child of that sibling
// rank, [N + rank] = the total S after it. Thread 0 writes an entry before a
// barrier that every reader passes, and the table is a plain (coherent) pointer.
template <typename T>
struct ResidualWeights {
  const T* p_row;
  const T* q_base;  // draft row of node 0 of this batch row
  int64_t q_stride;
  const int64_t* table;
  int N;
  int count;

  // Rank by rank over kItems ids at once, so each table entry is read once per tile.
  __device__ __forceinline__ void tile(int first, int step, int V, int64_t (&w)[kItems]) const {
    const T* q_row = q_base + table[0] * q_stride;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int v = first + k * step;
      w[k] = v < V ? residual_first(to_float(p_row[v]), to_float(q_row[v])) : 0;
    }
    for (int i = 1; i < count; ++i) {
      q_row = q_base + table[i] * q_stride;
      const double total = static_cast<double>(table[N + i - 1]);
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        const int v = first + k * step;
        if (v < V) w[k] = residual_update(w[k], total, to_float(q_row[v]));
      }
    }
  }

  // R(x) at one id x in [0, V) (the later-sibling test).
  __device__ __forceinline__ int64_t at(int64_t x) const {
    int64_t r = residual_first(to_float(p_row[x]), to_float(q_base[table[0] * q_stride + x]));
    for (int i = 1; i < count; ++i) {
      r = residual_update(r, static_cast<double>(table[N + i - 1]), to_float(q_base[table[i] * q_stride + x]));
    }
    return r;
  }
};

// The uniforms of batch row b's walk: the caller's (one per node; the final draw reads
// node 0's) or Philox draws at sequence position offset + level, keyed by the row's seed
// (row key 0 with per-request seeds, else b), with the rejection rank as the draw index.
struct WalkUniforms {
  const void* uniforms;  // null: seeded
  bool uniforms_double;
  int64_t row_base, stride_n;  // uniforms[row_base + node * stride_n]
  int64_t seed, row_key, offset;

  __device__ __forceinline__ WalkUniforms(const TreeRandomness& r, int64_t b)
      : uniforms(r.uniforms),
        uniforms_double(r.uniforms_double != 0),
        row_base(b * r.uniforms_stride_b),
        stride_n(r.uniforms_stride_n),
        seed(r.seeds != nullptr ? r.seeds[b * r.seeds_stride] : r.seed),
        row_key(r.seeds != nullptr ? 0 : b),
        offset(r.offsets != nullptr ? r.offsets[b * r.offsets_stride] : 0) {}

  __device__ __forceinline__ double at(int64_t node) const {
    const int64_t i = row_base + node * stride_n;
    return uniforms_double ? static_cast<const double*>(uniforms)[i]
                           : static_cast<double>(static_cast<const float*>(uniforms)[i]);
  }
  // The coin of `child`, the sibling of rejection rank `rank` at depth `level`.
  __device__ __forceinline__ double accept(int64_t child, int64_t level, int rank) const {
    return uniforms != nullptr ? at(child) : philox_uniform(seed, offset + level, row_key, kSaltAccept, rank);
  }
  // The uniform of the final draw at depth `level`.
  __device__ __forceinline__ double final_draw(int64_t level) const {
    return uniforms != nullptr ? at(0) : philox_uniform(seed, offset + level, row_key, kSaltFinal, 0);
  }
};

// The first child of `cur` after index `prev` (children in index order), or -1.
__device__ __forceinline__ int next_child(IndexMatrix parents, int64_t b, int64_t cur, int prev, int N) {
  for (int c = prev + 1; c < N; ++c) {
    if (load_index(parents, b, c) == cur) return c;
  }
  return -1;
}

// Sum of a row's weights over the block, to every thread (coalesced: consecutive
// threads take consecutive ids). Every thread must call it.
template <typename Weights>
__device__ __forceinline__ int64_t block_total(const Weights& weights, int V, int64_t* scratch) {
  int64_t local = 0;
  for (int64_t tile = 0; tile < V; tile += kTile) {
    int64_t w[kItems];
    weights.tile(static_cast<int>(tile) + static_cast<int>(threadIdx.x), kWalkThreads, V, w);
#pragma unroll
    for (int k = 0; k < kItems; ++k) local += w[k];
  }
  return block_sum_i64(local, scratch);
}

// reference sample_weights: the number of v whose inclusive cumulative weight
// is <= threshold (= searchsorted(cdf, threshold, right=True)), in [0, V].
// Weights are >= 0 and sum to < 2^63 (V < 2^23), so every prefix is exact.
// Each thread owns kItems consecutive ids of a tile, so the scan runs in id order.
template <typename Weights>
__device__ int64_t inverse_cdf(const Weights& weights, int V, int64_t threshold, int64_t* scratch) {
  int64_t count = 0;  // this thread's share
  int64_t carry = 0;  // total weight of the earlier tiles (block-uniform)
  for (int64_t tile = 0; tile < V; tile += kTile) {
    if (carry > threshold) break;  // uniform; every later cdf exceeds the threshold
    const int64_t first = tile + static_cast<int64_t>(threadIdx.x) * kItems;
    int64_t w[kItems];
    weights.tile(static_cast<int>(first), 1, V, w);
    int64_t local = 0;
#pragma unroll
    for (int k = 0; k < kItems; ++k) local += w[k];
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

// The final draw from the target row p itself (no residual, or an empty one), to every
// thread; a row with no mass at all gives 0. Every thread must call it.
template <typename T>
__device__ __forceinline__ int64_t draw_from_target(const T* p_row, int V, double u, int64_t* scratch) {
  const TargetWeights<T> p_weights{p_row};
  const int64_t p_total = block_total(p_weights, V, scratch);
  return p_total > 0 ? inverse_cdf(p_weights, V, draw_threshold(u, p_total), scratch) : 0;
}

// Thread 0 records the child `accepted` at depth `level` (its token is in [0, V): it was accepted).
__device__ __forceinline__ void record_accepted(IndexMatrix tree_tokens, int64_t b, int64_t accepted, int64_t level,
                                                int64_t* row_out, int64_t* row_nodes) {
  if (threadIdx.x == 0) {
    row_out[level] = load_index(tree_tokens, b, accepted);
    row_nodes[level + 1] = accepted;
  }
}

// The padding of a walk that stopped at depth `level`: node 0 first, -1 past the end.
__device__ __forceinline__ void pad_walk(int64_t* row_out, int64_t* row_nodes, int64_t width, int64_t level) {
  for (int64_t j = threadIdx.x; j < width; j += kWalkThreads) {
    if (j == 0) row_nodes[0] = 0;
    if (j > level) {
      row_out[j] = -1;
      row_nodes[j] = -1;
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kWalkThreads, kWalkBlocksPerSM)
tree_rejection_sample_kernel(const T* __restrict__ target, int64_t target_stride_b,
                             int64_t target_stride_n, const T* __restrict__ draft,
                             int64_t draft_stride_b, int64_t draft_stride_n,
                             IndexMatrix tree_tokens, IndexMatrix parents, TreeRandomness rnd,
                             int64_t* __restrict__ out_tokens, int64_t* __restrict__ num_accepted,
                             int64_t* __restrict__ accepted_nodes, int64_t* rank_tables, int N, int V,
                             int64_t max_depth) {
  __shared__ int64_t s_reduce[kWalkWarps];
  __shared__ int s_child;   // the child just tried, or -1 when none is left
  __shared__ int s_accept;  // whether it was accepted

  const int64_t b = blockIdx.x;
  const int64_t width = max_depth + 1;
  int64_t* row_out = out_tokens + b * width;
  int64_t* row_nodes = accepted_nodes + b * width;
  int64_t* table = rank_tables + b * (kRankTableColumns * static_cast<int64_t>(N));
  const T* q_base = draft + b * draft_stride_b;

  const WalkUniforms coins(rnd, b);

  // Block-uniform walk state: level, cur, rank, total only change through values
  // every thread reads from shared memory or gets from block_sum_i64.
  int64_t cur = 0;
  int64_t level = 0;
  while (true) {
    const T* p_row = target + b * target_stride_b + cur * target_stride_n;
    int rank = 0;       // children of cur rejected so far (= sibling rank of the next one)
    int64_t total = 0;  // S after the last rejection (meaningful once rank > 0)
    int64_t accepted = -1;
    if (level < max_depth) {
      int prev = 0;  // children are searched after this index
      while (true) {
        // ---- thread 0 finds the next child and decides; the block follows --
        if (threadIdx.x == 0) {
          const int child = next_child(parents, b, cur, prev, N);
          int accept = 0;
          if (child >= 0) {
            const int64_t x = load_index(tree_tokens, b, child);
            // Out-of-range tokens are rejected without reading p/q (the
            // residual below is still updated with q_c, as in the reference).
            if (x >= 0 && x < V) {
              const double u = coins.accept(child, level, rank);
              const float q_x = to_float(q_base[static_cast<int64_t>(child) * draft_stride_n + x]);
              if (rank == 0) {
                accept = accept_draft(u, q_x, to_float(p_row[x]));
              } else {
                // reference: (u * q_x) * S < R(x), R(x) read exactly (int64 -> float64).
                const ResidualWeights<T> residual{p_row, q_base, draft_stride_n, table, N, rank};
                const double r_x = static_cast<double>(residual.at(x));  // <= 2^40: exact
                accept = (u * static_cast<double>(q_x)) * static_cast<double>(total) < r_x;
              }
            }
            // Every thread passed the barriers after its last read of this entry
            // (the previous node's passes end in block_sum_i64); the barrier below
            // publishes it before the pass reads it.
            if (!accept) table[rank] = child;
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
        // ---- child rejected: the new residual's total, recomputed over the row --
        const ResidualWeights<T> residual{p_row, q_base, draft_stride_n, table, N, rank + 1};
        total = block_total(residual, V, s_reduce);
        // Read by the passes after the next rejection, behind its barriers (the
        // next test and the draw use `total` for this rank).
        if (threadIdx.x == 0) table[N + rank] = total;
        ++rank;
        prev = child;
      }
    }

    if (accepted >= 0) {
      record_accepted(tree_tokens, b, accepted, level, row_out, row_nodes);
      cur = accepted;
      ++level;
      continue;
    }

    // ---- no child accepted (or a leaf, or max_depth): the final draw --------
    // Every thread computes the same u (a pure function / one address).
    const double u = coins.final_draw(level);
    int64_t token;
    if (rank > 0 && total > 0) {
      const ResidualWeights<T> residual{p_row, q_base, draft_stride_n, table, N, rank};
      token = inverse_cdf(residual, V, draw_threshold(u, total), s_reduce);
    } else {  // no residual, or an empty one: draw from p
      token = draw_from_target(p_row, V, u, s_reduce);
    }
    if (threadIdx.x == 0) {
      row_out[level] = token;
      num_accepted[b] = level;
    }
    break;
  }

  pad_walk(row_out, row_nodes, width, level);
}

// ---------------------------------------------------------------------------
// siblings = without replacement (reference `_without_replacement`): every child
// of node v was drawn from the one row q = draft[b, v]. The rank table holds per
// rejected rank i: [i] the rejected token, [N + i] the bits of the float64 scale
// c_i = S / T' used at that rank (none at rank 0). One q row for every rank, so a
// rejection's pass reads p and q once whatever the rank.
// ---------------------------------------------------------------------------
template <typename T>
struct SampledResidualWeights {
  const T* p_row;
  const T* q_row;
  const int64_t* table;
  int N;
  int count;  // rejected siblings so far (>= 1)

  __device__ __forceinline__ void tile(int first, int step, int V, int64_t (&w)[kItems]) const {
    int64_t q_weight[kItems];
    bool removed[kItems];
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int v = first + k * step;
      const float q = v < V ? to_float(q_row[v]) : 0.0f;
      q_weight[k] = to_weight(q);
      w[k] = v < V ? residual_first(to_float(p_row[v]), q) : 0;
      removed[k] = false;
    }
    for (int i = 1; i < count; ++i) {
      const int64_t token = table[i - 1];  // q_i is 0 on the tokens rejected before rank i
      const double scale = __longlong_as_double(static_cast<long long>(table[N + i]));
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        removed[k] = removed[k] || first + k * step == token;
        if (!removed[k]) w[k] = sampled_residual_update(w[k], scale, q_weight[k]);
      }
    }
  }

  // R(x) at a real sibling's token x in [0, V) (rejected by no earlier rank).
  __device__ __forceinline__ int64_t at(int64_t x) const {
    const float q = to_float(q_row[x]);
    const int64_t q_weight = to_weight(q);
    int64_t r = residual_first(to_float(p_row[x]), q);
    for (int i = 1; i < count; ++i) {
      r = sampled_residual_update(r, __longlong_as_double(static_cast<long long>(table[N + i])), q_weight);
    }
    return r;
  }
};

template <typename T>
__global__ void __launch_bounds__(kWalkThreads, kWalkBlocksPerSM)
tree_rejection_sampled_kernel(const T* __restrict__ target, int64_t target_stride_b,
                              int64_t target_stride_n, const T* __restrict__ draft,
                              int64_t draft_stride_b, int64_t draft_stride_n,
                              IndexMatrix tree_tokens, IndexMatrix parents, TreeRandomness rnd,
                              int64_t* __restrict__ out_tokens, int64_t* __restrict__ num_accepted,
                              int64_t* __restrict__ accepted_nodes, int64_t* rank_tables, int N,
                              int V, int64_t max_depth) {
  __shared__ int64_t s_reduce[kWalkWarps];
  __shared__ int64_t s_q_weight;  // Q(x) of the sibling just rejected
  __shared__ int s_child;         // the child just tried, or -1 when none is left
  __shared__ int s_verdict;       // 0 skipped (q_j cannot draw it), 1 rejected, 2 accepted

  const int64_t b = blockIdx.x;
  const int64_t width = max_depth + 1;
  int64_t* row_out = out_tokens + b * width;
  int64_t* row_nodes = accepted_nodes + b * width;
  int64_t* table = rank_tables + b * (kRankTableColumns * static_cast<int64_t>(N));

  const WalkUniforms coins(rnd, b);

  // Block-uniform walk state (as in tree_rejection_sample_kernel).
  int64_t cur = 0;
  int64_t level = 0;
  while (true) {
    const T* p_row = target + b * target_stride_b + cur * target_stride_n;
    const T* q_row = draft + b * draft_stride_b + cur * draft_stride_n;  // all of cur's children
    int rank = 0;        // real siblings rejected so far
    int64_t total = 0;   // S after the last rejection (meaningful once rank > 0)
    int64_t q_left = 0;  // T': the Q mass off the rejected tokens (meaningful once rank > 0)
    int64_t accepted = -1;
    if (level < max_depth) {
      int prev = 0;
      while (true) {
        if (threadIdx.x == 0) {
          const int child = next_child(parents, b, cur, prev, N);
          int verdict = 0;
          if (child >= 0) {
            const int64_t x = load_index(tree_tokens, b, child);
            if (x >= 0 && x < V) {
              const float q_x = to_float(q_row[x]);
              const int64_t q_weight = to_weight(q_x);
              bool repeated = false;
              for (int i = 0; i < rank; ++i) repeated = repeated || table[i] == x;
              if (q_weight > 0 && !repeated) {  // else q_j could not have drawn x: skipped
                const double u = coins.accept(child, level, rank);
                double scale = 0.0;
                bool accept;
                if (rank == 0) {
                  accept = accept_draft(u, q_x, to_float(p_row[x]));
                } else {
                  scale = sampled_scale(total, q_left);
                  const SampledResidualWeights<T> residual{p_row, q_row, table, N, rank};
                  accept = sampled_accept(u, scale, q_weight, residual.at(x));
                }
                verdict = accept ? 2 : 1;
                if (!accept) {  // published to the pass by the barrier below
                  table[rank] = x;
                  table[N + rank] = static_cast<int64_t>(__double_as_longlong(scale));
                  s_q_weight = q_weight;
                }
              }
            }
          }
          s_child = child;
          s_verdict = verdict;
        }
        __syncthreads();
        const int child = s_child;
        const int verdict = s_verdict;
        const int64_t q_weight = s_q_weight;
        __syncthreads();  // everyone has read the shared words before thread 0 rewrites them
        if (child < 0) break;
        prev = child;
        if (verdict == 0) continue;
        if (verdict == 2) {
          accepted = child;
          break;
        }
        const SampledResidualWeights<T> residual{p_row, q_row, table, N, rank + 1};
        total = block_total(residual, V, s_reduce);
        if (rank == 0) {  // T, once per node: the q mass every later scale divides by
          const TargetWeights<T> q_weights{q_row};
          q_left = block_total(q_weights, V, s_reduce);
        }
        q_left -= q_weight;
        ++rank;
      }
    }

    if (accepted >= 0) {
      record_accepted(tree_tokens, b, accepted, level, row_out, row_nodes);
      cur = accepted;
      ++level;
      continue;
    }

    const double u = coins.final_draw(level);
    int64_t token;
    if (rank > 0 && total > 0) {
      const SampledResidualWeights<T> residual{p_row, q_row, table, N, rank};
      token = inverse_cdf(residual, V, draw_threshold(u, total), s_reduce);
    } else {
      token = draw_from_target(p_row, V, u, s_reduce);
    }
    if (threadIdx.x == 0) {
      row_out[level] = token < V ? token : V - 1;  // threshold < total: only guards the id range
      num_accepted[b] = level;
    }
    break;
  }

  pad_walk(row_out, row_nodes, width, level);
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
                            int64_t* rank_tables, const TreeRejectionPlan& plan, int64_t N, int64_t V,
                            int64_t max_depth, bool without_replacement, cudaStream_t stream) {
  auto kernel = without_replacement ? tree_rejection_sampled_kernel<T> : tree_rejection_sample_kernel<T>;
  kernel<<<static_cast<unsigned>(plan.blocks), plan.threads, 0, stream>>>(
      static_cast<const T*>(target), target_stride_b, target_stride_n,
      static_cast<const T*>(draft), draft_stride_b, draft_stride_n, tree_tokens, parents, rnd,
      out_tokens, num_accepted, accepted_nodes, rank_tables, static_cast<int>(N), static_cast<int>(V),
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

TreeRejectionPlan tree_rejection_sample_plan(int64_t B, int64_t N, int64_t V) {
  check_arg(B >= 0 && N >= 0 && V >= 0, "tree_rejection_sample", "B, N and V must be >= 0");
  TreeRejectionPlan plan;
  plan.blocks = B;
  plan.threads = kWalkThreads;
  // Independent of V: the residual rows are recomputed, not stored.
  plan.workspace_bytes = static_cast<uint64_t>(B) * static_cast<uint64_t>(N) *
                         static_cast<uint64_t>(kRankTableColumns) * sizeof(int64_t);
  return plan;
}

void launch_tree_rejection_sample(const void* target_probs, int64_t target_stride_b,
                                  int64_t target_stride_n, const void* draft_probs,
                                  int64_t draft_stride_b, int64_t draft_stride_n,
                                  IndexMatrix tree_tokens, IndexMatrix parents,
                                  TreeRandomness randomness, int64_t* out_tokens,
                                  int64_t* num_accepted, int64_t* accepted_nodes, void* workspace,
                                  int64_t B, int64_t N, int64_t V, int64_t max_depth, int dtype,
                                  cudaStream_t stream, bool without_replacement) {
  const char* op = "tree_rejection_sample";
  check_common(op, B, N, max_depth, dtype);
  check_arg(B <= 0x7FFFFFFF && N <= 0x7FFFFFFF, op, "B and N must be < 2^31");
  // Fixed-point totals stay exact in int64 only for V < 2^23 (weights <= 2^40).
  check_arg(V >= 1 && V < (int64_t{1} << 23), op, "V must be in [1, 2^23)");
  if (B == 0) return;
  check_arg(target_probs && draft_probs && tree_tokens.data && parents.data && out_tokens &&
                num_accepted && accepted_nodes && workspace,
            op, "null device pointer");
  check_arg(reinterpret_cast<uintptr_t>(workspace) % 8 == 0, op, "workspace must be 8-byte aligned");
  const TreeRejectionPlan plan = tree_rejection_sample_plan(B, N, V);
  auto* rank_tables = static_cast<int64_t*>(workspace);
  switch (dtype) {
    case kFloat32:
      launch_rejection_typed<float>(target_probs, target_stride_b, target_stride_n, draft_probs,
                                    draft_stride_b, draft_stride_n, tree_tokens, parents,
                                    randomness, out_tokens, num_accepted, accepted_nodes,
                                    rank_tables, plan, N, V, max_depth, without_replacement, stream);
      break;
    case kFloat16:
      launch_rejection_typed<__half>(target_probs, target_stride_b, target_stride_n, draft_probs,
                                     draft_stride_b, draft_stride_n, tree_tokens, parents,
                                     randomness, out_tokens, num_accepted, accepted_nodes,
                                     rank_tables, plan, N, V, max_depth, without_replacement, stream);
      break;
    default:
      launch_rejection_typed<__nv_bfloat16>(target_probs, target_stride_b, target_stride_n,
                                            draft_probs, draft_stride_b, draft_stride_n,
                                            tree_tokens, parents, randomness, out_tokens,
                                            num_accepted, accepted_nodes, rank_tables, plan, N, V,
                                            max_depth, without_replacement, stream);
      break;
  }
  SPECDEC_CUDA_CHECK(cudaGetLastError());
}

}  // namespace specdec
