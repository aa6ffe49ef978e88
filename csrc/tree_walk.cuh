#pragma once
// tree_rejection_sample's walk split over V (tree_verify.cu's tree_rejection_split_kernel), as
// `SPECDEC_HD` pieces: the kernel runs them on the GPU, and bind_tree_verify.cpp runs the very same
// functions on the host, where `host_tree_rejection_split` emulates C CTAs claiming the V-chunks of
// each stage in a chosen interleaving (the only end-to-end evidence a machine without a GPU gives).
// No CUDA headers here: element loads come from a `Load` policy.
//
// The protocol (triton/tree_verify_sampling.py's): a row's walk is a sequence of stages; stage 0 is
// one empty chunk, every later one a pass over V split in `chunks` chunks. A CTA claims a chunk from
// the row's claim word (stage << 32 | chunks claimed), stores its sums and takes a ticket; the CTA
// completing the stage runs `walk_serial`, draws the token if the walk ends, and opens the next
// stage by rewriting the claim word. A CTA waits only for chunks that running CTAs hold, so no
// co-residency is needed. The row's last CTA to leave zeroes the row's words.

#include <cstdint>
#include <cstring>

#include "philox.cuh"
#include "tree_residual.cuh"

namespace specdec {
namespace tree_walk {

// What the next stage's pass computes (the walk state's `kind`).
constexpr int64_t kNoPass = 0;
constexpr int64_t kResid = 1;   // the residual after the state's `rank` rejections, p's and Q's weights
constexpr int64_t kFinalP = 2;  // p's weights alone (a final draw with no rejection at the node)
constexpr uint64_t kDoneStage = 0x7FFFFFFFu;  // the claim word's stage once the row is finished

// Per row, in the zeroed workspace: the claim word, finished chunks of the stage, CTAs that left, padded to
// a 128-byte line of their own: a row's waiting CTAs poll its claim word, and a line shared with other rows
// would bounce between their atomics and those polls (the workspace starts 128-byte aligned).
constexpr int kSyncWords = 16;
enum SyncWord : int { kClaim = 0, kFinished = 1, kLeaving = 2 };
// Per row, scratch written before it is read (no zeroing): the walk state, the rank table
// (2N words: per rejected rank the child or token, then the total or scale), the chunk sums.
constexpr int kStateWords = 8;
enum StateWord : int { kCur = 0, kLevel = 1, kRank = 2, kLast = 3, kTotal = 4, kQLeft = 5, kKind = 6 };
constexpr int kPartWords = 3;  // per chunk: sum of the residual's weights, of p's, of Q's (without replacement)
constexpr int64_t kRankTableColumns = 2;

// A word another CTA stored (state, table, chunk sums): read from L2 on the GPU (L1 is not coherent).
SPECDEC_HD int64_t load_word(const int64_t* p) {
#if defined(__CUDA_ARCH__)
  return static_cast<int64_t>(__ldcg(reinterpret_cast<const long long*>(p)));
#else
  return *p;
#endif
}

SPECDEC_HD double bits_to_double(int64_t bits) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(bits));
#else
  double d;
  memcpy(&d, &bits, sizeof d);
  return d;
#endif
}

SPECDEC_HD int64_t double_to_bits(double d) {
#if defined(__CUDA_ARCH__)
  return static_cast<int64_t>(__double_as_longlong(d));
#else
  int64_t bits;
  memcpy(&bits, &d, sizeof bits);
  return bits;
#endif
}

// ------------------------------------------------------------------ a batch row's inputs

// The tree of one batch row: parents and tokens with element strides (any int64 value).
struct TreeRow {
  const int64_t* parents;
  int64_t parents_stride;
  const int64_t* tokens;
  int64_t tokens_stride;
  int N;

  SPECDEC_HD int64_t parent(int c) const { return parents[c * parents_stride]; }
  SPECDEC_HD int64_t token(int c) const { return tokens[c * tokens_stride]; }
  // The first child of `cur` after index `after` (children in index order), or -1.
  SPECDEC_HD int next_child(int64_t cur, int64_t after) const {
    for (int64_t c = after + 1; c < N; ++c) {
      if (c > 0 && parent(static_cast<int>(c)) == cur) return static_cast<int>(c);
    }
    return -1;
  }
};

// The uniforms of one batch row's walk: the caller's (one per node, the final draw reads node 0's)
// or Philox at sequence position offset + level keyed by the row's seed (row key 0 with per-request
// seeds, else b), the rejection rank as the draw index. Same values as the reference's _Coins.
struct Coins {
  const void* uniforms;  // null: seeded
  bool uniforms_double;
  int64_t row_base, stride_n;
  int64_t seed, row_key, offset;

  SPECDEC_HD double at(int64_t node) const {
    const int64_t i = row_base + node * stride_n;
    return uniforms_double ? static_cast<const double*>(uniforms)[i]
                           : static_cast<double>(static_cast<const float*>(uniforms)[i]);
  }
  // Wrapping add: only the low 32 bits enter the counter, without signed-overflow UB.
  SPECDEC_HD int64_t position(int64_t level) const {
    return static_cast<int64_t>(static_cast<uint64_t>(offset) + static_cast<uint64_t>(level));
  }
  SPECDEC_HD double accept(int64_t child, int64_t level, int64_t rank) const {
    return uniforms != nullptr ? at(child) : philox_uniform(seed, position(level), row_key, kSaltAccept, rank);
  }
  SPECDEC_HD double final_draw(int64_t level) const {
    return uniforms != nullptr ? at(0) : philox_uniform(seed, position(level), row_key, kSaltFinal, 0);
  }
};

// Everything the walk of batch row b reads and writes. `table`, `state`, `parts` are the row's
// slices of the scratch; outputs are the row's [max_depth + 1] slices.
template <typename T>
struct RowView {
  const T* target;  // target[b]: node n's row at n * t_sn
  int64_t t_sn;
  const T* draft;   // draft[b]
  int64_t q_sn;
  TreeRow tree;
  Coins coins;
  int V;
  int64_t max_depth;
  int64_t* table;   // [2N]
  int64_t* state;   // [kStateWords]
  const int64_t* parts;  // [chunks][kPartWords]
  int64_t* out_tokens;
  int64_t* accepted_nodes;
  int64_t* num_accepted;

  SPECDEC_HD const T* p_row(int64_t cur) const { return target + cur * t_sn; }
  // Where the siblings' q rows start: the node's own draft row (without replacement: every child
  // of cur was drawn from it), else the row's draft block (child c's q is its row c).
  template <bool WR>
  SPECDEC_HD const T* q_base(int64_t cur) const { return WR ? draft + cur * q_sn : draft; }
};

// ------------------------------------------------------------------ the residual of K consecutive ids

// The residual weights R (and Q = to_weight(q) without replacement, else 0) of ids [first, first + K)
// after `count` >= 1 rejections at the node, from their p values (0 past the end, where every
// weight comes out 0). load_q(row, q) loads the K q values of a draft row (0 past the end): the
// independent rule reads rank i's rejected child's row (table[i]), the other rule the node's row.
// The table is read once per K ids and rank (the kernel's passes read it from L2).
template <bool WR, int K, typename LoadQ>
SPECDEC_HD void slot_residual(const float (&p)[K], const LoadQ& load_q, const int64_t* table, int N, int64_t count,
                              int64_t first, int64_t (&r)[K], int64_t (&q_weight)[K]) {
  float q[K];
  if (WR) {
    static_assert(K <= 32, "one bit per id");
    load_q(int64_t{0}, q);  // the node's own row (the row argument is ignored)
    for (int k = 0; k < K; ++k) {
      q_weight[k] = to_weight(q[k]);
      r[k] = residual_first(p[k], q[k]);
    }
    uint32_t removed = 0;  // bit k: id first + k was rejected before the current rank
    for (int64_t i = 1; i < count; ++i) {
      const int64_t token = load_word(table + i - 1);  // q_i is 0 on the tokens rejected before rank i
      const double scale = bits_to_double(load_word(table + N + i));
      if (token >= first && token < first + K) removed |= 1u << (token - first);
      for (int k = 0; k < K; ++k) {
        if (!((removed >> k) & 1u)) r[k] = sampled_residual_update(r[k], scale, q_weight[k]);
      }
    }
  } else {
    load_q(load_word(table), q);
    for (int k = 0; k < K; ++k) {
      q_weight[k] = 0;
      r[k] = residual_first(p[k], q[k]);
    }
    for (int64_t i = 1; i < count; ++i) {
      load_q(load_word(table + i), q);
      const double total = static_cast<double>(load_word(table + N + i - 1));  // S_{i}, before rank i's cut
      for (int k = 0; k < K; ++k) r[k] = residual_update(r[k], total, q[k]);
    }
  }
}

// The weights a pass sums over ids [first, first + K) (p values loaded, 0 past the end): w_p =
// to_weight(p); for a kResid pass the residual w_r and Q's w_q too (0 otherwise).
template <bool WR, int K, typename LoadQ>
SPECDEC_HD void slot_pass_weights(const float (&p)[K], const LoadQ& load_q, const int64_t* table, int N,
                                  int64_t kind, int64_t count, int64_t first, int64_t (&w_r)[K],
                                  int64_t (&w_p)[K], int64_t (&w_q)[K]) {
  for (int k = 0; k < K; ++k) w_p[k] = to_weight(p[k]);
  if (kind == kResid) {
    slot_residual<WR, K>(p, load_q, table, N, count, first, w_r, w_q);
  } else {
    for (int k = 0; k < K; ++k) w_r[k] = w_q[k] = 0;
  }
}

// The weights a final draw walks over ids [first, first + K): p's when `plain`, else the residual's.
template <bool WR, int K, typename LoadQ>
SPECDEC_HD void slot_draw_weights(const float (&p)[K], const LoadQ& load_q, const int64_t* table, int N,
                                  bool plain, int64_t count, int64_t first, int64_t (&w)[K]) {
  if (plain) {
    for (int k = 0; k < K; ++k) w[k] = to_weight(p[k]);
  } else {
    int64_t q_weight[K];
    slot_residual<WR, K>(p, load_q, table, N, count, first, w, q_weight);
  }
}

// A one-id q loader over a row view (the walk's tests read single ids): row `q_row_of(row)`.
template <typename T, typename Load>
struct PointQ {
  const T* q_base;
  int64_t q_sn;
  int64_t x;
  bool own_row;  // without replacement: the node's row whatever `row`
  SPECDEC_HD void operator()(int64_t row, float (&q)[1]) const {
    q[0] = Load::at(q_base + (own_row ? 0 : row * q_sn), x);
  }
};

// R(x) after `count` rejections at a real id x in [0, V).
template <bool WR, typename T, typename Load>
SPECDEC_HD int64_t residual_at(const RowView<T>& row, int64_t cur, int64_t count, int64_t x) {
  const float p[1] = {Load::at(row.p_row(cur), x)};
  int64_t r[1], q_weight[1];
  slot_residual<WR, 1>(p, PointQ<T, Load>{row.template q_base<WR>(cur), row.q_sn, x, WR}, row.table, row.tree.N,
                       count, x, r, q_weight);
  return r[0];
}

// ------------------------------------------------------------------ the walk's serial part

struct WalkState {
  int64_t cur, level, rank, last, total, q_left, kind;
};

SPECDEC_HD WalkState load_state(const int64_t* state) {
  return {load_word(state + kCur),  load_word(state + kLevel), load_word(state + kRank), load_word(state + kLast),
          load_word(state + kTotal), load_word(state + kQLeft), load_word(state + kKind)};
}

SPECDEC_HD void save_state(int64_t* state, const WalkState& s) {
  state[kCur] = s.cur;
  state[kLevel] = s.level;
  state[kRank] = s.rank;
  state[kLast] = s.last;
  state[kTotal] = s.total;
  state[kQLeft] = s.q_left;
  state[kKind] = s.kind;
}

// The row's chunk sums of the stage just completed, added over its chunks.
struct Sums {
  int64_t r, p, q;
};

// What the completer does after the serial part: open a pass (the state is saved), or draw the
// final token at `level` from the last pass's chunk sums (column 1, p's, when `plain`, else column
// 0, the residual's after `count` rejections at `cur`) with threshold draw_threshold(u, total);
// total == 0: no mass at all, the token is 0.
struct Outcome {
  bool draw;
  bool plain;
  int64_t total;
  double u;
  int64_t cur, level, count;
};

// Whether child (token x, an id the caller checked to be in [0, V)) passes at rank s.rank, by the
// independent rule: u * q(x) < p(x) first, then (u * q(x)) * S < R(x).
template <typename T, typename Load>
SPECDEC_HD bool test_independent(const RowView<T>& row, const WalkState& s, int child, int64_t x, double u) {
  const float p_x = Load::at(row.p_row(s.cur), x);
  const float q_x = Load::at(row.draft + child * row.q_sn, x);
  if (s.rank == 0) return accept_draft(u, q_x, p_x);
  const double r_x = static_cast<double>(residual_at<false, T, Load>(row, s.cur, s.rank, x));  // <= 2^40: exact
  return (u * static_cast<double>(q_x)) * static_cast<double>(s.total) < r_x;
}

// The serial part of a stage's completer, in one thread: absorb the pass the state asked for,
// then test children in index order until a rejection needs a pass over V (the state is saved
// and the caller opens that pass) or the walk ends (the caller draws). Outputs of accepted
// children are stored on the way. stage 0 starts at the root.
template <bool WR, typename T, typename Load>
SPECDEC_HD Outcome walk_serial(const RowView<T>& row, uint64_t stage, const Sums& sums) {
  WalkState s{0, 0, 0, 0, 0, 0, kNoPass};
  if (stage == 0) {
    row.accepted_nodes[0] = 0;
  } else {
    s = load_state(row.state);
  }
  Outcome out{false, false, 0, 0.0, 0, 0, 0};
  if (s.kind == kFinalP) {  // no rejection at the node: p's chunk sums are in
    return {true, true, sums.p, row.coins.final_draw(s.level), s.cur, s.level, 0};
  }
  if (s.kind == kResid) {  // the residual after s.rank rejections
    s.total = sums.r;
    if (WR) {
      const int64_t x = load_word(row.table + s.rank - 1);  // the token just rejected: a real sibling in [0, V)
      const int64_t q_weight_x = to_weight(Load::at(row.template q_base<WR>(s.cur), x));
      s.q_left = (s.rank == 1 ? sums.q : s.q_left) - q_weight_x;
    } else {
      row.table[row.tree.N + s.rank - 1] = s.total;  // read by later ranks' passes and tests
    }
  }
  while (true) {
    const int child = s.level < row.max_depth ? row.tree.next_child(s.cur, s.last) : -1;  // none past max_depth
    if (child < 0) {
      if (s.rank == 0) {  // p's chunk sums first
        s.kind = kFinalP;
        save_state(row.state, s);
        return out;
      }
      // from the residual (empty: from p) with this stage's chunk sums (the pass after the last rejection)
      const bool plain = s.total == 0;
      return {true, plain, plain ? sums.p : s.total, row.coins.final_draw(s.level), s.cur, s.level, s.rank};
    }
    s.last = child;
    const int64_t x = row.tree.token(child);
    const bool in_range = x >= 0 && x < row.V;
    bool real = true, accept = false;
    double scale = 0.0;
    if (WR) {
      // a child q_j could not have drawn (x outside [0, V), Q(x) = 0, a rejected token again): skipped
      const float q_x = in_range ? Load::at(row.template q_base<WR>(s.cur), x) : 0.0f;
      const int64_t q_weight = to_weight(q_x);
      bool repeated = false;
      for (int64_t i = 0; i < s.rank; ++i) repeated = repeated || load_word(row.table + i) == x;
      real = in_range && q_weight > 0 && !repeated;
      if (real) {
        const double u = row.coins.accept(child, s.level, s.rank);
        if (s.rank == 0) {
          accept = accept_draft(u, q_x, Load::at(row.p_row(s.cur), x));
        } else {
          scale = sampled_scale(s.total, s.q_left);
          accept = sampled_accept(u, scale, q_weight, residual_at<true, T, Load>(row, s.cur, s.rank, x));
        }
      }
    } else if (in_range) {  // an id outside [0, V) is rejected without a coin (its q still cuts the residual)
      accept = test_independent<T, Load>(row, s, child, x, row.coins.accept(child, s.level, s.rank));
    }
    if (!real) continue;
    if (accept) {  // move down: the child's token at slot `level`
      row.out_tokens[s.level] = x;
      row.accepted_nodes[s.level + 1] = child;
      s = WalkState{child, s.level + 1, 0, 0, 0, 0, kNoPass};
      continue;
    }
    // rejected: the residual's total over V is the next pass
    row.table[s.rank] = WR ? x : child;
    if (WR) row.table[row.tree.N + s.rank] = double_to_bits(scale);
    s.rank += 1;
    s.kind = kResid;
    save_state(row.state, s);
    return out;
  }
}

// The walk's serial part scans parents (next_child) and reads tokens one by one, in one thread: from global
// memory every one of those reads misses L1 at each stage after a fence. So the thread block that runs it
// first copies the row's tree into its shared memory, where the plan leaves room for trees of at most
// kSharedTreeNodes nodes (16 bytes a node); thread `first` of `step` copies nodes first, first + step, ...
constexpr int kSharedTreeNodes = 256;

SPECDEC_HD void copy_tree(const TreeRow& tree, int64_t* parents, int64_t* tokens, int first, int step) {
  for (int c = first; c < tree.N; c += step) {
    parents[c] = tree.parent(c);
    tokens[c] = tree.token(c);
  }
}

// The row view whose tree is the copy copy_tree made (dense, stride 1).
template <typename T>
SPECDEC_HD RowView<T> with_tree_copy(RowView<T> row, const int64_t* parents, const int64_t* tokens) {
  row.tree = TreeRow{parents, 1, tokens, 1, row.tree.N};
  return row;
}

// The row's outputs once the walk ends at `level` with `token`: num_accepted, -1 past it.
template <typename T>
SPECDEC_HD void finish_row(const RowView<T>& row, int64_t level, int64_t token) {
  row.out_tokens[level] = token;
  *row.num_accepted = level;
  for (int64_t j = level + 1; j <= row.max_depth; ++j) {
    row.out_tokens[j] = -1;
    row.accepted_nodes[j] = -1;
  }
}

// ------------------------------------------------------------------ the cluster form (sm_90)
// tree_verify.cu's tree_rejection_cluster_kernel runs the same walk with one thread-block cluster of
// C CTAs per batch row, CTA r owning the fixed slice [r * chunk, min(V, (r + 1) * chunk)) of every
// pass: per stage every CTA sums its slice into its own shared memory, a cluster barrier, rank 0
// gathers the C partials (distributed shared memory) and runs walk_serial, a cluster barrier, every
// CTA reads rank 0's decision. The final draw: every CTA gathers the partials' column and finds the
// slice holding the threshold (find_slice), whose CTA rescans it. No tickets, no global chunk sums;
// bind_tree_verify.cpp's host_tree_rejection_cluster runs these phases in lockstep on the host.
constexpr int kMaxCluster = 16;  // CTAs of a row's cluster (> 8: the non-portable size)

// The row's sums of a stage: the C slices' partials parts[C][kPartWords] added in slice order.
SPECDEC_HD Sums add_parts(const int64_t* parts, int slices) {
  Sums sums{0, 0, 0};
  for (int k = 0; k < slices; ++k) {
    sums.r += parts[k * kPartWords];
    sums.p += parts[k * kPartWords + 1];
    sums.q += parts[k * kPartWords + 2];
  }
  return sums;
}

// The first slice whose cumulative range of column `column` of parts[C][kPartWords] holds
// `threshold` (weights are >= 0, so at most one range holds it), with `base` the weight of the
// slices before it; -1 (base 0) when none does.
SPECDEC_HD int find_slice(const int64_t* parts, int slices, int column, int64_t threshold, int64_t& base) {
  int64_t cum = 0;
  for (int k = 0; k < slices; ++k) {
    const int64_t w = parts[k * kPartWords + column];
    if (cum <= threshold && threshold < cum + w) {
      base = cum;
      return k;
    }
    cum += w;
  }
  base = 0;
  return -1;
}

// Token ids stay in [0, V) whatever happened upstream.
SPECDEC_HD int64_t clamp_id(int64_t token, int V) { return token < 0 ? 0 : (token >= V ? V - 1 : token); }

}  // namespace tree_walk
}  // namespace specdec
