// Verification of token trees (reference/tree_verify.py is the specification).
//
// tree_greedy_verify: grid (B, N, splits); each block atomicMax-es its V-chunk's packed argmax key
// (as logit_verify_greedy.cu), and the row's last block walks the tree in one thread.
//
// tree_rejection_sample, the twin of triton/tree_verify_sampling.py, one kernel for both sibling
// rules (WR). Split form, grid (B, chunks): each full-V pass (a rejected sibling's residual total,
// the final cdf) is a stage whose chunks the row's CTAs claim from a claim word; the stage's
// completer runs the serial walk (tree_walk.cuh, SPECDEC_HD so bind_tree_verify.cpp emulates it on
// the host) and opens the next. A CTA only waits for chunks running CTAs hold: no co-residency needed.
// Cluster form (sm_90): C <= 16 co-resident CTAs per row hand a stage off through two cluster
// barriers and distributed shared memory instead of L2 tickets (~3-5 us a stage); the split form
// stays the fallback (sm_80, V > 16 * 16384, SPECDEC_TREE_FORM=split). The residual after rejected
// siblings is recomputed per pass from p and the rejected q rows (tree_residual.cuh), never stored;
// int64 fixed-point weights make every sum exact and split-independent.
#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "chain_common.cuh"
#include "common.cuh"
#include "dtype_dispatch.cuh"
#include "launch_utils.h"
#include "philox.cuh"
#include "split_v_sampling.cuh"
#include "tree_residual.cuh"
#include "tree_verify.h"
#include "tree_walk.cuh"

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
// tree_rejection_sample: one walk for both sibling rules, split over V
// ===========================================================================
// The staging protocol and the walk's serial part live in tree_walk.cuh (host-built too); here
// are the block-wide parts: a CTA's chunk of a pass, the completer's sums of the chunk sums, the
// chunk that holds the draw's threshold and the rescan of that chunk.
using tree_walk::Outcome;
using tree_walk::RowView;
using tree_walk::Sums;
constexpr int kSplitThreads = split_v::kThreads;
// Three resident CTAs per SM (<= 80 registers a thread: 4 would spill), the residency the plan's splits assume.
constexpr int kSplitBlocksPerSM = 3;
static_assert(kSplitThreads == plans::kTreeRejectionThreads && kSplitBlocksPerSM == plans::kTreeRejectionBlocksPerSM,
              "launch_plan.h mirrors the block size and the residency");
static_assert(tree_walk::kSyncWords == plans::kTreeRejectionSyncWords &&
                  tree_walk::kStateWords == plans::kTreeRejectionStateWords &&
                  tree_walk::kPartWords == plans::kTreeRejectionPartWords &&
                  tree_walk::kSharedTreeNodes == plans::kTreeRejectionSharedNodes,
              "launch_plan.h sizes the workspace and the shared tree with these");

// Element loads of the walk's serial part (tree_walk.cuh calls Load::at from SPECDEC_HD code;
// the host never instantiates this policy).
template <typename T>
struct DeviceLoad {
  __host__ __device__ static float at(const T* row, int64_t i) {
#if defined(__CUDA_ARCH__)
    return to_float(row[i]);
#else
    return 0.0f;
#endif
  }
};

// The q values of K = 16 / sizeof(T) consecutive ids [i, i + K) of a draft row (rank's row `row`
// of the row's draft block, or the node's own row without replacement); 0 at or past `end`.
template <typename T, bool WR>
struct SlotQ {
  const T* q_base;
  int64_t q_sn, i, end;
  bool vec;
  __host__ __device__ void operator()(int64_t row, float (&q)[Vec16<T>::kElems]) const {
#if defined(__CUDA_ARCH__)
    split_v::load_values(q_base + (WR ? 0 : row * q_sn), i, end, vec, q);
#endif
  }
};

// Everything a launch passes; the row's slices are taken by row_view.
struct SplitParams {
  const void* target;
  int64_t t_sb, t_sn;
  const void* draft;
  int64_t q_sb, q_sn;
  IndexMatrix tree_tokens, parents;
  TreeRandomness rnd;
  int64_t* out_tokens;
  int64_t* num_accepted;
  int64_t* accepted_nodes;
  int64_t* scratch;           // per row: state [8], rank table [2N], chunk sums [max chunks][3]
  unsigned long long* sync;   // per row: kSyncWords zeroed words, left zeroed
  int N, V;
  int64_t max_depth;
  int chunks;                 // V-chunks of a pass (= gridDim.y)
  int64_t chunk;              // elements per chunk, a multiple of 8 (16-byte slots stay aligned)
  int64_t scratch_stride;     // int64 words per row
  int tree_in_smem;           // the walk reads a copy of the row's tree in dynamic shared memory (N <= 256)
};

// The dynamic shared memory both forms copy the row's tree into (tree_walk::copy_tree): parents, then tokens.
extern __shared__ __align__(16) int64_t tree_smem[];

// The row view the walk's serial part reads: the tree copied into shared memory by the whole CTA (every
// thread must call this), or the row's own when the tree is too large for the copy.
template <typename T>
__device__ __forceinline__ RowView<T> walk_view(const RowView<T>& row, const SplitParams& s) {
  if (!s.tree_in_smem) return row;  // uniform
  tree_walk::copy_tree(row.tree, tree_smem, tree_smem + s.N, static_cast<int>(threadIdx.x), kSplitThreads);
  __syncthreads();
  return tree_walk::with_tree_copy(row, tree_smem, tree_smem + s.N);
}

template <typename T>
__device__ __forceinline__ RowView<T> row_view(const SplitParams& s, int64_t b) {
  const TreeRandomness& r = s.rnd;
  int64_t* scratch = s.scratch + b * s.scratch_stride;
  const int64_t width = s.max_depth + 1;
  return RowView<T>{static_cast<const T*>(s.target) + b * s.t_sb,
                    s.t_sn,
                    static_cast<const T*>(s.draft) + b * s.q_sb,
                    s.q_sn,
                    {s.parents.data + b * s.parents.stride_b, s.parents.stride_n,
                     s.tree_tokens.data + b * s.tree_tokens.stride_b, s.tree_tokens.stride_n, s.N},
                    {r.uniforms, r.uniforms_double != 0, b * r.uniforms_stride_b, r.uniforms_stride_n,
                     r.seeds != nullptr ? r.seeds[b * r.seeds_stride] : r.seed, r.seeds != nullptr ? 0 : b,
                     r.offsets != nullptr ? r.offsets[b * r.offsets_stride] : 0},
                    s.V,
                    s.max_depth,
                    scratch + tree_walk::kStateWords,
                    scratch,
                    scratch + tree_walk::kStateWords + tree_walk::kRankTableColumns * s.N,
                    s.out_tokens + b * width,
                    s.accepted_nodes + b * width,
                    s.num_accepted + b};
}

// Whether every row a pass of batch row b reads takes 16-byte loads: p's row and the whole draft
// block aligned, with a row stride of whole 16-byte words (uniform per row; chunk starts are
// multiples of 8 elements, so every slot start is aligned then).
template <typename T>
__device__ __forceinline__ bool rows_aligned16(const RowView<T>& row, int64_t cur) {
  return split_v::aligned16(row.p_row(cur)) && split_v::aligned16(row.draft) &&
         (row.q_sn * static_cast<int64_t>(sizeof(T))) % 16 == 0;
}

// This CTA's chunk c of the pass the walk state asks for: its sums, in thread 0.
template <typename T, bool WR>
__device__ Sums pass_chunk(const RowView<T>& row, const SplitParams& s, int64_t c, reduce::I64Pair* scratch) {
  constexpr int K = Vec16<T>::kElems;
  const int64_t cur = tree_walk::load_word(row.state + tree_walk::kCur);
  const int64_t count = tree_walk::load_word(row.state + tree_walk::kRank);
  const int64_t kind = tree_walk::load_word(row.state + tree_walk::kKind);
  const T* p_row = row.p_row(cur);
  const T* q_base = row.template q_base<WR>(cur);
  const bool vec = rows_aligned16(row, cur);
  const int64_t start = c * s.chunk;
  const int64_t end = min(static_cast<int64_t>(s.V), start + s.chunk);
  const int64_t slots = (end - start + K - 1) / K;
  long long sum_r = 0, sum_p = 0, sum_q = 0;
#pragma unroll 1  // one slot at a time: two in flight spill at 80 registers (16-bit rows, without replacement)
  for (int64_t slot = threadIdx.x; slot < slots; slot += kSplitThreads) {
    const int64_t i = start + slot * K;
    float p[K];
    split_v::load_values(p_row, i, end, vec, p);
    int64_t w_r[K], w_p[K], w_q[K];
    tree_walk::slot_pass_weights<WR, K>(p, SlotQ<T, WR>{q_base, row.q_sn, i, end, vec}, row.table, s.N, kind, count,
                                        i, w_r, w_p, w_q);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      sum_r += w_r[k];
      sum_p += w_p[k];
      sum_q += w_q[k];
    }
  }
  split_v::block_sum2(sum_r, sum_p, scratch);
  long long unused = 0;
  split_v::block_sum2(sum_q, unused, scratch);
  return {sum_r, sum_p, sum_q};
}

// The row's chunk sums added over its `chunks` chunks, to every thread (L2 reads: other CTAs wrote them).
__device__ __forceinline__ Sums block_row_sums(const int64_t* parts, int chunks, reduce::I64Pair* scratch) {
  long long r = 0, p = 0, q = 0, unused = 0;
  for (int k = threadIdx.x; k < chunks; k += kSplitThreads) {
    r += tree_walk::load_word(parts + k * tree_walk::kPartWords);
    p += tree_walk::load_word(parts + k * tree_walk::kPartWords + 1);
    q += tree_walk::load_word(parts + k * tree_walk::kPartWords + 2);
  }
  split_v::block_sum2(r, p, scratch);
  split_v::block_sum2(q, unused, scratch);
  return {r, p, q};
}

// The chunk whose cumulative range of column `column` of the chunk sums holds `threshold` (in
// [0, total)), scanned in chunk order, to every thread (-1 when none), with `base` the weight of
// the chunks before it.
__device__ __forceinline__ long long block_find_chunk(const int64_t* parts, int chunks, int column,
                                                      long long threshold, long long* scan_scratch, long long* s_chunk,
                                                      long long* s_base, long long& base) {
  if (threadIdx.x == 0) *s_chunk = -1;
  long long carry = 0;
  for (int k0 = 0; k0 < chunks; k0 += kSplitThreads) {  // uniform trip count
    const int k = k0 + static_cast<int>(threadIdx.x);
    const long long v = k < chunks ? tree_walk::load_word(parts + k * tree_walk::kPartWords + column) : 0;
    long long tile_total;
    const long long cum = carry + split_v::block_exclusive_scan(v, scan_scratch, tile_total);
    if (cum <= threshold && threshold < cum + v) {  // exactly one owner
      *s_chunk = k;
      *s_base = cum;
    }
    carry += tile_total;
    if (carry > threshold) break;
  }
  __syncthreads();
  base = *s_base;
  const long long found = *s_chunk;
  __syncthreads();  // nobody rewrites s_chunk / s_base before everyone has read them
  return found;
}

// The first id in [start, end) whose cumulative weight carry + sum(w[start..id]) exceeds
// `threshold` (carry <= threshold), w = the draw's weights (p's when `plain`, else the residual's
// after `count` rejections at `cur`), to every thread; -1 if none. Slots are dealt in id order
// (tile, then thread, then element), so the block scan walks the chunk in id order.
template <typename T, bool WR>
__device__ long long rescan_chunk(const RowView<T>& row, const Outcome& o, int64_t start, int64_t end,
                                  long long threshold, long long carry, long long* scan_scratch, long long* s_found) {
  constexpr int K = Vec16<T>::kElems;
  const T* p_row = row.p_row(o.cur);
  const T* q_base = row.template q_base<WR>(o.cur);
  const bool vec = rows_aligned16(row, o.cur);
  if (threadIdx.x == 0) *s_found = -1;  // ordered before any owner's write by the scan's barriers
  const int64_t slots = (end - start + K - 1) / K;
  for (int64_t tile = 0; tile < slots; tile += kSplitThreads) {  // uniform trip count
    const int64_t i = start + (tile + threadIdx.x) * K;           // >= end for idle threads: weights 0
    float p[K];
    split_v::load_values(p_row, i, end, vec, p);
    int64_t w[K];
    tree_walk::slot_draw_weights<WR, K>(p, SlotQ<T, WR>{q_base, row.q_sn, i, end, vec}, row.table, row.tree.N,
                                        o.plain, o.count, i, w);
    carry = split_v::scan_tile_crossing(w, i, threshold, carry, scan_scratch, s_found);
    if (carry > threshold) break;
  }
  __syncthreads();
  const long long found = *s_found;
  __syncthreads();
  return found;
}

// The completer of `stage` (the whole CTA): thread 0 runs the walk's serial part; if the walk
// ends, the CTA draws the token (the chunk holding the threshold, then its rescan) and thread 0
// writes the row's outputs. Returns the claim word that opens the next stage or marks the row done.
template <typename T, bool WR>
__device__ unsigned long long complete_stage(const RowView<T>& row, const SplitParams& s, uint64_t stage,
                                             reduce::I64Pair* sum_scratch, long long* scan_scratch, Outcome* s_outcome,
                                             long long* s_chunk, long long* s_base, long long* s_found) {
  const Sums sums = stage > 0 ? block_row_sums(row.parts, s.chunks, sum_scratch) : Sums{0, 0, 0};
  const RowView<T> walk = walk_view(row, s);
  if (threadIdx.x == 0) *s_outcome = tree_walk::walk_serial<WR, T, DeviceLoad<T>>(walk, stage, sums);
  __syncthreads();  // also publishes thread 0's table entries to the rescan below
  const Outcome o = *s_outcome;
  if (!o.draw) return (static_cast<unsigned long long>(stage) + 1) << 32;
  long long token = 0;  // no mass at all: id 0 (the reference's argmax of all-zero weights)
  if (o.total > 0) {    // uniform
    const long long threshold = draw_threshold(o.u, o.total);  // in [0, total - 1]
    long long base;
    const long long c = block_find_chunk(row.parts, s.chunks, o.plain ? 1 : 0, threshold, scan_scratch, s_chunk,
                                         s_base, base);
    token = s.V - 1;  // unreachable: threshold < total, so a chunk and an id in it hold it
    if (c >= 0) {
      const int64_t start = c * s.chunk;
      const int64_t end = min(static_cast<int64_t>(s.V), start + s.chunk);
      const long long found = rescan_chunk<T, WR>(row, o, start, end, threshold, base, scan_scratch, s_found);
      if (found >= 0) token = found;
    }
  }
  if (threadIdx.x == 0) tree_walk::finish_row(row, o.level, tree_walk::clamp_id(token, s.V));
  return static_cast<unsigned long long>(tree_walk::kDoneStage) << 32;
}

// grid (B, chunks). Every CTA of row b loops: claim a chunk of the current stage (claim word:
// stage << 32 | claimed), sum it, take a ticket; the ticket that completes the stage makes this CTA
// the completer. A claim past the stage's chunks waits for the next stage (every claimed chunk is
// held by a running CTA that waits on nothing: no co-residency needed). The row's last CTA to
// leave zeroes the row's words.
template <typename T, bool WR>
__global__ void __launch_bounds__(kSplitThreads, kSplitBlocksPerSM) tree_rejection_split_kernel(SplitParams s) {
  __shared__ reduce::I64Pair sum_scratch[split_v::kWarps];
  __shared__ long long scan_scratch[split_v::kWarps];
  __shared__ unsigned long long s_word;
  __shared__ Outcome s_outcome;
  __shared__ long long s_chunk, s_base, s_found;
  __shared__ bool s_last;

  const int64_t b = blockIdx.x;
  unsigned long long* sync = s.sync + b * tree_walk::kSyncWords;
  const RowView<T> row = row_view<T>(s, b);
  while (true) {
    if (threadIdx.x == 0) {
      s_word = atomicAdd(&sync[tree_walk::kClaim], 1ull);
      __threadfence();  // acquire: the state, table and sums the stage's opener stored
    }
    __syncthreads();
    const unsigned long long word = s_word;
    __syncthreads();  // everyone has read s_word before thread 0 may rewrite it
    const uint64_t stage = word >> 32;
    if (stage == tree_walk::kDoneStage) break;  // uniform
    const int64_t c = static_cast<int64_t>(word & 0xFFFFFFFFull);
    const int64_t chunks = stage == 0 ? 1 : s.chunks;  // stage 0: one empty chunk; its completer starts the walk
    if (c >= chunks) {  // every chunk of the stage is held by a running CTA: wait for the next stage
      if (threadIdx.x == 0) {  // one lane polls (its CTA waits at the barrier), backing off to ~0.5 us
        unsigned pause = 32;
        while ((*reinterpret_cast<volatile unsigned long long*>(&sync[tree_walk::kClaim]) >> 32) == stage) {
          __nanosleep(pause);
          pause = min(2 * pause, 512u);
        }
      }
      __syncthreads();
      continue;
    }
    Sums mine{0, 0, 0};
    if (stage > 0) mine = pass_chunk<T, WR>(row, s, c, sum_scratch);
    if (threadIdx.x == 0) {
      if (stage > 0) {
        int64_t* part = const_cast<int64_t*>(row.parts) + c * tree_walk::kPartWords;
        __stcg(reinterpret_cast<long long*>(part), static_cast<long long>(mine.r));
        __stcg(reinterpret_cast<long long*>(part + 1), static_cast<long long>(mine.p));
        __stcg(reinterpret_cast<long long*>(part + 2), static_cast<long long>(mine.q));
      }
      __threadfence();  // the chunk's sums are visible device-wide before the ticket
      s_last = atomicAdd(&sync[tree_walk::kFinished], 1ull) == static_cast<unsigned long long>(chunks) - 1;
      if (s_last) {
        sync[tree_walk::kFinished] = 0;  // every chunk of the stage is done: the next one counts from 0
        __threadfence();                 // acquire the other CTAs' sums
      }
    }
    __syncthreads();
    if (!s_last) continue;  // uniform
    const unsigned long long next = complete_stage<T, WR>(row, s, stage, sum_scratch, scan_scratch, &s_outcome,
                                                          &s_chunk, &s_base, &s_found);
    __syncthreads();  // every thread's reads of this stage's words are done
    if (threadIdx.x == 0) {
      __threadfence();  // the state, table and outputs come before the next stage opens
      atomicExch(&sync[tree_walk::kClaim], next);
    }
  }
  if (threadIdx.x == 0 && atomicAdd(&sync[tree_walk::kLeaving], 1ull) == gridDim.y - 1ull) {
    // the row's last CTA leaves: every CTA of the row has made its last access to these words, and the
    // fence orders those accesses (seen through the atomic) before the plain stores that zero them
    __threadfence();
    sync[tree_walk::kClaim] = 0;
    sync[tree_walk::kFinished] = 0;
    sync[tree_walk::kLeaving] = 0;
  }
}

// ===========================================================================
// tree_rejection_sample on sm_90: one thread-block cluster per batch row
// ===========================================================================
// grid (B * C), cluster dims (C, 1, 1): the row's C CTAs are co-resident by construction, so nothing is
// claimed or ticketed. CTA r sums its fixed slice [r * chunk, (r + 1) * chunk) of each pass (pass_chunk,
// 16-byte loads) into its own shared memory; after a cluster barrier rank 0 gathers the C partials
// through distributed shared memory and runs the same walk_serial (state and rank table in the global
// scratch, as in the split form), publishes its decision in its shared memory; after a second barrier
// every CTA reads the decision and runs the next pass or the final draw. The draw: every CTA gathers the
// partials' column, find_slice names the slice holding the threshold, its CTA rescans that slice
// (rescan_chunk) and writes the token. A CTA arrives at a last cluster barrier after its last remote
// read and waits on it before leaving, so no CTA's shared memory goes away while another reads it.
// Built for sm_90 only: compiled for an older arch the kernel is a stub that traps (the plan never launches it
// where the device runs such code: ClusterFacts::code_arch), so a mistake fails loudly instead of leaving
// the outputs unwritten.
static_assert(tree_walk::kMaxCluster == plans::kTreeRejectionMaxCluster, "launch_plan.h mirrors the cluster cap");

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr int kDecisionWords = 6;  // flags (1 draw, 2 plain), total, u's bits, cur, level, count
__device__ __forceinline__ unsigned cluster_ctarank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned cluster_id_x() {
  unsigned r;
  asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r));
  return r;
}
// Release the CTA's prior writes (global and shared) at cluster scope / acquire the others'.
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire;" ::: "memory"); }
__device__ __forceinline__ void cluster_sync() {
  cluster_arrive();
  cluster_wait();
}
// The int64 at `local` (an address of this CTA's shared memory) in CTA `rank`'s shared memory.
__device__ __forceinline__ long long dsmem_load(const void* local, unsigned rank) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(local));
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
  long long v;
  asm volatile("ld.shared::cluster.s64 %0, [%1];" : "=l"(v) : "r"(remote) : "memory");
  return v;
}
#endif

template <typename T, bool WR>
__global__ void __launch_bounds__(kSplitThreads, kSplitBlocksPerSM) tree_rejection_cluster_kernel(SplitParams s) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ reduce::I64Pair sum_scratch[split_v::kWarps];
  __shared__ long long scan_scratch[split_v::kWarps];
  __shared__ long long s_part[tree_walk::kPartWords];  // this CTA's slice sums of the last pass (read remotely)
  __shared__ long long s_decision[kDecisionWords];     // rank 0's decision (read remotely)
  __shared__ int64_t s_parts[tree_walk::kMaxCluster][tree_walk::kPartWords];  // gathered partials
  __shared__ long long s_local[kDecisionWords];        // this CTA's copy of the decision
  __shared__ long long s_found, s_base;
  __shared__ int s_owner;

  const unsigned rank = cluster_ctarank();
  const int C = s.chunks;  // = the cluster size
  const int64_t b = cluster_id_x();
  const RowView<T> row = row_view<T>(s, b);
  // rank 0 runs the serial part: it reads the tree from its shared copy (uniform per CTA)
  const RowView<T> walk = rank == 0 ? walk_view(row, s) : row;
  uint64_t stage = 0;
  Outcome o;
  while (true) {
    if (rank == 0) {  // uniform per CTA
      if (stage > 0 && threadIdx.x < C * tree_walk::kPartWords) {
        const int k = threadIdx.x / tree_walk::kPartWords, w = threadIdx.x % tree_walk::kPartWords;
        s_parts[k][w] = dsmem_load(&s_part[w], k);
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        const Sums sums = stage > 0 ? tree_walk::add_parts(&s_parts[0][0], C) : Sums{0, 0, 0};
        const Outcome d = tree_walk::walk_serial<WR, T, DeviceLoad<T>>(walk, stage, sums);
        s_decision[0] = (d.draw ? 1 : 0) | (d.plain ? 2 : 0);
        s_decision[1] = d.total;
        s_decision[2] = tree_walk::double_to_bits(d.u);
        s_decision[3] = d.cur;
        s_decision[4] = d.level;
        s_decision[5] = d.count;
      }
    }
    cluster_sync();  // A: rank 0's state and table (global) and decision (shared) are published
    if (threadIdx.x < kDecisionWords) s_local[threadIdx.x] = dsmem_load(&s_decision[threadIdx.x], 0);
    __syncthreads();
    o = Outcome{(s_local[0] & 1) != 0, (s_local[0] & 2) != 0, s_local[1], tree_walk::bits_to_double(s_local[2]),
                s_local[3], s_local[4], s_local[5]};
    if (o.draw) break;  // uniform across the cluster
    const Sums mine = pass_chunk<T, WR>(row, s, rank, sum_scratch);  // in thread 0
    if (threadIdx.x == 0) {
      s_part[0] = mine.r;
      s_part[1] = mine.p;
      s_part[2] = mine.q;
    }
    cluster_sync();  // B: every slice's sums are in, and every CTA has read the decision
    ++stage;
  }
  // The final draw from the last pass's partials (still in every CTA's s_part).
  if (o.total > 0) {  // uniform
    const long long threshold = draw_threshold(o.u, o.total);  // in [0, total - 1]
    const int column = o.plain ? 1 : 0;
    if (threadIdx.x < C) s_parts[threadIdx.x][column] = dsmem_load(&s_part[column], threadIdx.x);
    __syncthreads();
    cluster_arrive();  // this CTA's last remote read is done
    if (threadIdx.x == 0) {
      int64_t base = 0;
      s_owner = tree_walk::find_slice(&s_parts[0][0], C, column, threshold, base);
      s_base = base;
    }
    __syncthreads();
    const int owner = s_owner;
    if (owner == static_cast<int>(rank)) {
      const int64_t start = static_cast<int64_t>(rank) * s.chunk;
      const int64_t end = min(static_cast<int64_t>(s.V), start + s.chunk);
      const long long found = rescan_chunk<T, WR>(row, o, start, end, threshold, s_base, scan_scratch, &s_found);
      // unreachable: threshold < total, so a slice and an id in it hold it
      if (threadIdx.x == 0) tree_walk::finish_row(row, o.level, tree_walk::clamp_id(found >= 0 ? found : s.V - 1, s.V));
    } else if (owner < 0 && rank == 0 && threadIdx.x == 0) {
      tree_walk::finish_row(row, o.level, tree_walk::clamp_id(s.V - 1, s.V));  // unreachable, as above
    }
  } else {
    cluster_arrive();
    // no mass at all: id 0 (the reference's argmax of all-zero weights)
    if (rank == 0 && threadIdx.x == 0) tree_walk::finish_row(row, o.level, tree_walk::clamp_id(0, s.V));
  }
  cluster_wait();  // no CTA leaves while another may still read its shared memory
#elif defined(__CUDA_ARCH__)
  __trap();  // no clusters in this code: launched here it would leave every output unwritten
#endif
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


// ---------------------------------------------------------------------------
// The cluster form's facts on the current device (plans::ClusterFacts), queried once per device: every
// instance of the cluster kernel is asked for the virtual arch of the code this device runs
// (cudaFuncAttributes::ptxVersion) and, for each cluster size, how many such clusters fit at once
// (cudaOccupancyMaxActiveClusters with the non-portable size allowed and the largest dynamic shared memory
// a launch asks for); the least answer over the instances counts. A size the device refuses counts 0, so the
// plan falls back to a smaller cluster or to the split form instead of a launch error.
// ---------------------------------------------------------------------------
using ClusterKernel = void (*)(SplitParams);

// A launch configuration of thread-block clusters of `cluster` CTAs along x (the attribute lives with it:
// the configuration points at it, so the two are neither copied nor moved apart).
struct ClusterLaunch {
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute attribute[1];

  ClusterLaunch(dim3 grid, int block, size_t dynamic_smem, cudaStream_t stream, int cluster) {
    config.gridDim = grid;
    config.blockDim = dim3(static_cast<unsigned>(block), 1, 1);
    config.dynamicSmemBytes = dynamic_smem;
    config.stream = stream;
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = static_cast<unsigned>(cluster);
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

template <typename T>
void add_instances(std::vector<ClusterKernel>& kernels) {
  kernels.push_back(tree_rejection_cluster_kernel<T, false>);
  kernels.push_back(tree_rejection_cluster_kernel<T, true>);
}

plans::ClusterFacts query_cluster_facts(const plans::DeviceLimits& lim) {
  std::vector<ClusterKernel> kernels;
  add_instances<float>(kernels);
  add_instances<__half>(kernels);
  add_instances<__nv_bfloat16>(kernels);
  plans::ClusterFacts facts{};
  facts.code_arch = 1 << 20;
  for (ClusterKernel kernel : kernels) {
    cudaFuncAttributes attributes{};
    SPECDEC_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    facts.code_arch = std::min(facts.code_arch, attributes.ptxVersion);
  }
  if (lim.arch < 90 || facts.code_arch < 90) return facts;  // no clusters to ask about
  for (int c = 1; c <= plans::kTreeRejectionMaxCluster; ++c) {
    int fewest = 1 << 30;
    for (ClusterKernel kernel : kernels) {
      SPECDEC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
      const ClusterLaunch launch(dim3(static_cast<unsigned>(c), 1, 1), plans::kTreeRejectionThreads,
                                 16 * plans::kTreeRejectionSharedNodes, nullptr, c);
      int active = 0;
      if (cudaOccupancyMaxActiveClusters(&active, kernel, &launch.config) != cudaSuccess) {
        cudaGetLastError();  // a size this device refuses: not an error of the caller's
        active = 0;
      }
      fewest = std::min(fewest, active);
    }
    facts.active[c] = fewest;
  }
  return facts;
}

plans::ClusterFacts current_cluster_facts(const plans::DeviceLimits& lim) {
  static std::mutex mutex;
  static std::map<int, plans::ClusterFacts> cache;
  int device = 0;
  SPECDEC_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  auto found = cache.find(device);
  if (found == cache.end()) found = cache.emplace(device, query_cluster_facts(lim)).first;
  return found->second;
}

// The plan on the current device: its limits and its cluster facts (the launch and the buffers' sizes agree).
plans::Plan current_rejection_plan(int64_t B, int64_t N, int64_t V, int form) {
  const plans::DeviceLimits lim = current_device_limits();
  const plans::ClusterFacts facts = current_cluster_facts(lim);
  return plans::plan_tree_rejection_sample(B, N, V, lim, form, &facts);
}

template <typename T>
void launch_rejection_typed(const SplitParams& params, const plans::Plan& plan, bool without_replacement,
                            cudaStream_t stream) {
  const plans::Launch& l = plan.launches.at(0);
  const dim3 grid(static_cast<unsigned>(l.grid[0]), static_cast<unsigned>(l.grid[1]), static_cast<unsigned>(l.grid[2]));
  if (plan.at("form") == plans::kTreeFormCluster) {
    auto kernel = without_replacement ? tree_rejection_cluster_kernel<T, true> : tree_rejection_cluster_kernel<T, false>;
    const int cluster = static_cast<int>(plan.at("cluster"));
    if (!plan.at("portable")) {  // 9..16 CTAs: a non-portable cluster size (sm_90 allows 16)
      SPECDEC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    }
    const ClusterLaunch launch(grid, l.block, static_cast<size_t>(l.dynamic_smem), stream, cluster);
    SPECDEC_CUDA_CHECK(cudaLaunchKernelEx(&launch.config, kernel, params));
    return;
  }
  auto kernel = without_replacement ? tree_rejection_split_kernel<T, true> : tree_rejection_split_kernel<T, false>;
  kernel<<<grid, l.block, l.dynamic_smem, stream>>>(params);
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
  dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_greedy_typed<T>(logits, stride_b, stride_n, tree_tokens, parents, out_tokens, num_accepted, accepted_nodes,
                           keys, counters, N, V, max_depth, plan, stream);
  });
  SPECDEC_CUDA_CHECK(cudaGetLastError());
}

void tree_cluster_facts(int* code_arch, int* active) {
  const plans::ClusterFacts facts = current_cluster_facts(current_device_limits());
  *code_arch = facts.code_arch;
  for (int c = 0; c <= plans::kTreeRejectionMaxCluster; ++c) active[c] = facts.active[c];
}

TreeRejectionPlan tree_rejection_sample_plan(int64_t B, int64_t N, int64_t V, int arch, int form) {
  const plans::Plan plan = arch == 0 ? current_rejection_plan(B, N, V, form)
                                     : plans::plan_tree_rejection_sample(B, N, V, plans::arch_limits(arch), form);
  check_arg(plan.ok(), "tree_rejection_sample", plan.refusal.c_str());
  TreeRejectionPlan out{};
  out.blocks = B;
  out.chunks = B == 0 ? 0 : plan.at("chunks");
  out.chunk = B == 0 ? 0 : plan.at("chunk");
  out.threads = plans::kTreeRejectionThreads;
  out.workspace_bytes = static_cast<uint64_t>(plan.at("scratch_bytes"));
  out.zeroed_bytes = static_cast<uint64_t>(plan.at("zeroed_bytes"));
  out.cluster = B == 0 ? 0 : static_cast<int>(plan.at("cluster"));
  out.form = static_cast<int>(plan.at("form"));
  return out;
}

void launch_tree_rejection_sample(const void* target_probs, int64_t target_stride_b,
                                  int64_t target_stride_n, const void* draft_probs,
                                  int64_t draft_stride_b, int64_t draft_stride_n,
                                  IndexMatrix tree_tokens, IndexMatrix parents,
                                  TreeRandomness randomness, int64_t* out_tokens,
                                  int64_t* num_accepted, int64_t* accepted_nodes, void* workspace,
                                  void* zeroed_workspace, int64_t B, int64_t N, int64_t V, int64_t max_depth,
                                  int dtype, cudaStream_t stream, bool without_replacement, int form) {
  const char* op = "tree_rejection_sample";
  check_common(op, B, N, max_depth, dtype);
  const plans::Plan plan = current_rejection_plan(B, N, V, form);
  check_arg(plan.ok(), op, plan.refusal.c_str());
  if (B == 0) return;
  const bool split = plan.at("form") == plans::kTreeFormSplit;  // the cluster form takes no zeroed words
  check_arg(target_probs && draft_probs && tree_tokens.data && parents.data && out_tokens &&
                num_accepted && accepted_nodes && workspace && (zeroed_workspace || !split),
            op, "null device pointer");
  check_arg(reinterpret_cast<uintptr_t>(workspace) % 8 == 0 && reinterpret_cast<uintptr_t>(zeroed_workspace) % 8 == 0,
            op, "workspaces must be 8-byte aligned");
  SplitParams params{};
  params.target = target_probs;
  params.t_sb = target_stride_b;
  params.t_sn = target_stride_n;
  params.draft = draft_probs;
  params.q_sb = draft_stride_b;
  params.q_sn = draft_stride_n;
  params.tree_tokens = tree_tokens;
  params.parents = parents;
  params.rnd = randomness;
  params.out_tokens = out_tokens;
  params.num_accepted = num_accepted;
  params.accepted_nodes = accepted_nodes;
  params.scratch = static_cast<int64_t*>(workspace);
  params.sync = static_cast<unsigned long long*>(zeroed_workspace);
  params.N = static_cast<int>(N);
  params.V = static_cast<int>(V);
  params.max_depth = max_depth;
  params.chunks = static_cast<int>(plan.at("chunks"));
  params.chunk = plan.at("chunk");
  params.scratch_stride = plan.at("scratch_stride");
  params.tree_in_smem = static_cast<int>(plan.at("tree_in_smem"));
  dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_rejection_typed<T>(params, plan, without_replacement, stream);
  });
  SPECDEC_CUDA_CHECK(cudaGetLastError());
}

}  // namespace specdec
