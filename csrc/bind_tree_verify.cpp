// pybind11 bindings of the token-tree verification launchers (tree_verify.h).
// Tensors cross as device addresses (tensor.data_ptr()), strides in elements,
// the stream as an integer; 0 stands for an absent optional tensor.

#include <pybind11/stl.h>

#include <cstdint>
#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "launch_plan.h"
#include "registry.h"
#include "tree_residual.cuh"
#include "tree_verify.h"
#include "tree_walk.cuh"

namespace py = pybind11;

namespace {

cudaStream_t as_stream(uint64_t stream) { return reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(stream)); }

specdec::IndexMatrix index_matrix(uint64_t data, int64_t stride_b, int64_t stride_n) {
  return {specdec::device_ptr<const int64_t>(data), stride_b, stride_n};
}

void tree_greedy_verify(uint64_t logits, int64_t logits_stride_b, int64_t logits_stride_n,
                        uint64_t tree_tokens, int64_t tokens_stride_b, int64_t tokens_stride_n,
                        uint64_t parents, int64_t parents_stride_b, int64_t parents_stride_n,
                        uint64_t out_tokens, uint64_t num_accepted, uint64_t accepted_nodes,
                        uint64_t workspace, int64_t B, int64_t N, int64_t V, int64_t max_depth,
                        int dtype, uint64_t stream) {
  specdec::launch_tree_greedy_verify(
      specdec::device_ptr<const void>(logits), logits_stride_b, logits_stride_n,
      index_matrix(tree_tokens, tokens_stride_b, tokens_stride_n),
      index_matrix(parents, parents_stride_b, parents_stride_n), specdec::device_ptr<int64_t>(out_tokens),
      specdec::device_ptr<int64_t>(num_accepted), specdec::device_ptr<int64_t>(accepted_nodes),
      specdec::device_ptr<void>(workspace), B, N, V, max_depth, dtype, as_stream(stream));
}

void tree_rejection_sample(uint64_t target_probs, int64_t target_stride_b, int64_t target_stride_n,
                           uint64_t draft_probs, int64_t draft_stride_b, int64_t draft_stride_n,
                           uint64_t tree_tokens, int64_t tokens_stride_b, int64_t tokens_stride_n,
                           uint64_t parents, int64_t parents_stride_b, int64_t parents_stride_n,
                           uint64_t uniforms, bool uniforms_double, int64_t uniforms_stride_b,
                           int64_t uniforms_stride_n, int64_t seed, uint64_t seeds, int64_t seeds_stride,
                           uint64_t offsets, int64_t offsets_stride, uint64_t out_tokens,
                           uint64_t num_accepted, uint64_t accepted_nodes, uint64_t workspace,
                           uint64_t zeroed_workspace, int64_t B, int64_t N, int64_t V, int64_t max_depth, int dtype,
                           uint64_t stream, bool without_replacement, int form) {
  const specdec::TreeRandomness randomness{specdec::device_ptr<const void>(uniforms),
                                           uniforms_double ? 1 : 0,
                                           uniforms_stride_b,
                                           uniforms_stride_n,
                                           seed,
                                           specdec::device_ptr<const int64_t>(seeds),
                                           seeds_stride,
                                           specdec::device_ptr<const int64_t>(offsets),
                                           offsets_stride};
  specdec::launch_tree_rejection_sample(
      specdec::device_ptr<const void>(target_probs), target_stride_b, target_stride_n,
      specdec::device_ptr<const void>(draft_probs), draft_stride_b, draft_stride_n,
      index_matrix(tree_tokens, tokens_stride_b, tokens_stride_n),
      index_matrix(parents, parents_stride_b, parents_stride_n), randomness,
      specdec::device_ptr<int64_t>(out_tokens), specdec::device_ptr<int64_t>(num_accepted),
      specdec::device_ptr<int64_t>(accepted_nodes), specdec::device_ptr<void>(workspace),
      specdec::device_ptr<void>(zeroed_workspace), B, N, V, max_depth, dtype, as_stream(stream), without_replacement,
      form);
}

py::dict tree_rejection_sample_plan(int64_t B, int64_t N, int64_t V, int arch, int form) {
  const specdec::TreeRejectionPlan plan = specdec::tree_rejection_sample_plan(B, N, V, arch, form);
  py::dict out;
  const bool cluster = plan.form == specdec::plans::kTreeFormCluster;
  out["form"] = cluster ? "cluster" : "split";
  out["cluster"] = plan.cluster;
  if (cluster) {
    out["grid"] = py::make_tuple(plan.blocks * plan.cluster);
  } else {
    out["grid"] = py::make_tuple(plan.blocks, plan.chunks);
  }
  out["threads"] = plan.threads;
  out["chunks"] = plan.chunks;
  out["chunk"] = plan.chunk;
  out["workspace_bytes"] = plan.workspace_bytes;
  out["zeroed_bytes"] = plan.zeroed_bytes;
  return out;
}

// Host build of the kernel's residual arithmetic (tree_residual.cuh) over whole rows:
// p [V] and the rejected siblings' q rows [k][V] (float32 values, as the kernel widens
// them) -> (R_k [V], [S_1, ..., S_k]). Testing only.
std::pair<std::vector<int64_t>, std::vector<int64_t>> host_tree_residual(const std::vector<float>& p,
                                                                         const std::vector<std::vector<float>>& q) {
  if (q.empty()) throw std::invalid_argument("host_tree_residual: need at least one rejected sibling");
  std::vector<int64_t> r(p.size());
  std::vector<int64_t> totals;
  for (size_t i = 0; i < q.size(); ++i) {
    if (q[i].size() != p.size()) throw std::invalid_argument("host_tree_residual: every q row needs V values");
    const double total = totals.empty() ? 0.0 : static_cast<double>(totals.back());
    int64_t sum = 0;
    for (size_t v = 0; v < p.size(); ++v) {
      r[v] = i == 0 ? specdec::residual_first(p[v], q[0][v]) : specdec::residual_update(r[v], total, q[i][v]);
      sum += r[v];
    }
    totals.push_back(sum);
  }
  return {r, totals};
}

// Host build of the sampled-siblings arithmetic (tree_residual.cuh, the kernel's order of
// operations) over whole rows: p, q [V] (float32 values) and the rejected tokens x_1..x_k in
// rank order -> (R after the k rejections [V], [S_1..S_k], [c_1..c_k] with c_0 = 0). Testing only.
std::tuple<std::vector<int64_t>, std::vector<int64_t>, std::vector<double>> host_sampled_residual(
    const std::vector<float>& p, const std::vector<float>& q, const std::vector<int64_t>& rejected) {
  if (q.size() != p.size()) throw std::invalid_argument("host_sampled_residual: q needs V values");
  if (rejected.empty()) throw std::invalid_argument("host_sampled_residual: need at least one rejected token");
  const size_t vocab = p.size();
  std::vector<int64_t> q_weight(vocab), r(vocab);
  std::vector<bool> removed(vocab, false);
  int64_t q_left = 0;
  for (size_t v = 0; v < vocab; ++v) {
    q_weight[v] = specdec::to_weight(q[v]);
    q_left += q_weight[v];
    r[v] = specdec::residual_first(p[v], q[v]);
  }
  std::vector<int64_t> totals;
  std::vector<double> scales;
  for (size_t i = 0; i < rejected.size(); ++i) {
    const int64_t x = rejected[i];
    if (x < 0 || x >= static_cast<int64_t>(vocab) || removed[x] || q_weight[x] == 0) {
      throw std::invalid_argument("host_sampled_residual: a rejected token must be a real sibling");
    }
    const double scale = i == 0 ? 0.0 : specdec::sampled_scale(totals.back(), q_left);
    int64_t sum = 0;
    for (size_t v = 0; v < vocab; ++v) {
      if (i > 0 && !removed[v]) r[v] = specdec::sampled_residual_update(r[v], scale, q_weight[v]);
      sum += r[v];
    }
    removed[x] = true;
    q_left -= q_weight[x];
    totals.push_back(sum);
    scales.push_back(scale);
  }
  return {r, totals, scales};
}

// ---------------------------------------------------------------------------------------------
// Host emulation of tree_rejection_split_kernel (tree_walk.cuh's protocol and serial part, run by
// the same SPECDEC_HD functions as on the GPU) over float32 rows at CPU addresses. Each of the
// grid's B x `ctas` CTAs is a state machine whose steps are the kernel's atomic actions (claim,
// chunk pass, ticket, publish, wait, leave); at most `resident` CTAs run at once, launched in the
// GPU's order (grid x fastest), and a seeded scheduler picks which one steps next. The block-wide
// parts (chunk sums, the chunk holding the threshold, the rescan) are sequential loops here: sums
// are exact integers, and the rescan walks ids in order as the block scan does. Testing only.
namespace emu {

namespace tw = specdec::tree_walk;
constexpr int K = 4;  // float32 rows: 16-byte slots of 4 ids, as the kernel's

struct HostLoad {
  static float at(const float* row, int64_t i) { return row[i]; }
};

struct HostSlotQ {
  const float* q_base;
  int64_t q_sn, i, end;
  bool own_row;
  void operator()(int64_t row, float (&q)[K]) const {
    for (int k = 0; k < K; ++k) q[k] = i + k < end ? q_base[(own_row ? 0 : row * q_sn) + i + k] : 0.0f;
  }
};

struct Launch {
  const float* target;
  int64_t t_sb, t_sn;
  const float* draft;
  int64_t q_sb, q_sn;
  specdec::IndexMatrix tokens, parents;
  specdec::TreeRandomness rnd;
  int64_t *out_tokens, *num_accepted, *accepted_nodes;
  int N, V;
  int64_t max_depth, chunk;
  int chunks;
  bool wr;
  std::vector<int64_t> scratch;      // per row: state, rank table, chunk sums (garbage-filled)
  std::vector<uint64_t> sync;        // per row: kSyncWords ticket words (zeroed)
  int64_t stride;
  mutable std::vector<int64_t> tree_copy;  // the completer's "shared memory" copy of a row's tree

  // The row view the serial part reads (kernel: walk_view): for a tree of at most kSharedTreeNodes nodes,
  // a copy made by the CTA's 256 "threads" (each copy_tree's slice) into garbage-filled memory.
  tw::RowView<float> walk_view(const tw::RowView<float>& row) const {
    if (N > tw::kSharedTreeNodes) return row;
    tree_copy.assign(static_cast<size_t>(2 * N), int64_t{0x5A5A5A5A5A5A5A5A});
    for (int thread = 0; thread < specdec::plans::kTreeRejectionThreads; ++thread) {
      tw::copy_tree(row.tree, tree_copy.data(), tree_copy.data() + N, thread, specdec::plans::kTreeRejectionThreads);
    }
    return tw::with_tree_copy(row, tree_copy.data(), tree_copy.data() + N);
  }

  tw::RowView<float> row(int64_t b) {
    int64_t* s = scratch.data() + b * stride;
    const specdec::TreeRandomness& r = rnd;
    const int64_t width = max_depth + 1;
    return {target + b * t_sb, t_sn, draft + b * q_sb, q_sn,
            {parents.data + b * parents.stride_b, parents.stride_n, tokens.data + b * tokens.stride_b,
             tokens.stride_n, N},
            {r.uniforms, r.uniforms_double != 0, b * r.uniforms_stride_b, r.uniforms_stride_n,
             r.seeds != nullptr ? r.seeds[b * r.seeds_stride] : r.seed, r.seeds != nullptr ? 0 : b,
             r.offsets != nullptr ? r.offsets[b * r.offsets_stride] : 0},
            V, max_depth, s + tw::kStateWords, s, s + tw::kStateWords + tw::kRankTableColumns * N,
            out_tokens + b * width, accepted_nodes + b * width, num_accepted + b};
  }
};

// One CTA's chunk c of the pass its row's state asks for (kernel: pass_chunk).
template <bool WR>
tw::Sums pass_chunk(const tw::RowView<float>& row, const Launch& l, int64_t c) {
  const int64_t cur = row.state[tw::kCur], count = row.state[tw::kRank], kind = row.state[tw::kKind];
  const int64_t start = c * l.chunk, end = std::min<int64_t>(l.V, start + l.chunk);
  tw::Sums sums{0, 0, 0};
  for (int64_t i = start; i < end; i += K) {
    float p[K];
    for (int k = 0; k < K; ++k) p[k] = i + k < end ? row.p_row(cur)[i + k] : 0.0f;
    int64_t w_r[K], w_p[K], w_q[K];
    tw::slot_pass_weights<WR, K>(p, HostSlotQ{row.template q_base<WR>(cur), row.q_sn, i, end, WR}, row.table, l.N,
                                 kind, count, i, w_r, w_p, w_q);
    for (int k = 0; k < K; ++k) {
      sums.r += w_r[k];
      sums.p += w_p[k];
      sums.q += w_q[k];
    }
  }
  return sums;
}

// The first id in [start, end) whose cumulative draw weight from `base` exceeds `threshold`, in id
// order (kernel: rescan_chunk); -1 if none.
template <bool WR>
int64_t rescan(const tw::RowView<float>& row, const Launch& l, const tw::Outcome& o, int64_t start, int64_t end,
               int64_t threshold, int64_t base) {
  int64_t cum = base;
  for (int64_t i = start; i < end; i += K) {
    float p[K];
    for (int k = 0; k < K; ++k) p[k] = i + k < end ? row.p_row(o.cur)[i + k] : 0.0f;
    int64_t w[K];
    tw::slot_draw_weights<WR, K>(p, HostSlotQ{row.template q_base<WR>(o.cur), row.q_sn, i, end, WR}, row.table, l.N,
                                 o.plain, o.count, i, w);
    for (int k = 0; k < K; ++k) {
      cum += w[k];
      if (cum > threshold) return i + k;
    }
  }
  return -1;
}

// The completer (kernel: complete_stage): the serial part, then the chunk holding the threshold
// and the rescan of that chunk in id order. Returns the claim word it publishes.
template <bool WR>
uint64_t complete_stage(const tw::RowView<float>& row, const Launch& l, uint64_t stage) {
  tw::Sums sums{0, 0, 0};
  for (int k = 0; stage > 0 && k < l.chunks; ++k) {
    sums.r += row.parts[k * tw::kPartWords];
    sums.p += row.parts[k * tw::kPartWords + 1];
    sums.q += row.parts[k * tw::kPartWords + 2];
  }
  const tw::Outcome o = tw::walk_serial<WR, float, HostLoad>(l.walk_view(row), stage, sums);
  if (!o.draw) return (stage + 1) << 32;
  int64_t token = 0;
  if (o.total > 0) {
    const int64_t threshold = specdec::draw_threshold(o.u, o.total);
    int64_t c = -1, base = 0;
    for (int k = 0; k < l.chunks && c < 0; ++k) {  // chunk order, as the block scan
      const int64_t w = row.parts[k * tw::kPartWords + (o.plain ? 1 : 0)];
      if (base + w > threshold) {
        c = k;
      } else {
        base += w;
      }
    }
    token = l.V - 1;
    if (c >= 0) {
      const int64_t start = c * l.chunk, end = std::min<int64_t>(l.V, start + l.chunk);
      const int64_t found = rescan<WR>(row, l, o, start, end, threshold, base);
      if (found >= 0) token = found;
    }
  }
  tw::finish_row(row, o.level, tw::clamp_id(token, l.V));
  return static_cast<uint64_t>(tw::kDoneStage) << 32;
}

enum Phase { kClaimStep, kPassStep, kTicketStep, kPublishStep, kWaitStep, kExited };

struct Cta {
  int64_t b;
  Phase phase = kClaimStep;
  uint64_t stage = 0;
  int64_t c = 0;
  tw::Sums sums{0, 0, 0};
  uint64_t next = 0;
};

// One atomic action of `cta`; returns whether it made progress (a wait that keeps waiting does not).
template <bool WR>
bool step(Launch& l, Cta& cta, std::map<std::string, int64_t>& stats) {
  uint64_t* sync = l.sync.data() + cta.b * tw::kSyncWords;
  const tw::RowView<float> row = l.row(cta.b);
  switch (cta.phase) {
    case kClaimStep: {
      const uint64_t word = sync[tw::kClaim]++;
      cta.stage = word >> 32;
      cta.c = static_cast<int64_t>(word & 0xFFFFFFFFull);
      const int64_t chunks = cta.stage == 0 ? 1 : l.chunks;
      if (cta.stage == tw::kDoneStage) {
        if (sync[tw::kLeaving]++ == static_cast<uint64_t>(l.chunks) - 1) {  // gridDim.y CTAs per row
          sync[tw::kClaim] = sync[tw::kFinished] = sync[tw::kLeaving] = 0;
        }
        cta.phase = kExited;
      } else {
        cta.phase = cta.c < chunks ? kPassStep : kWaitStep;
        if (cta.phase == kWaitStep) ++stats["waits"];
      }
      return true;
    }
    case kPassStep:
      if (cta.stage > 0) {
        const tw::Sums s = pass_chunk<WR>(row, l, cta.c);
        int64_t* part = const_cast<int64_t*>(row.parts) + cta.c * tw::kPartWords;
        part[0] = s.r;
        part[1] = s.p;
        part[2] = s.q;
        ++stats["chunk_passes"];
      }
      cta.phase = kTicketStep;
      return true;
    case kTicketStep: {
      const int64_t chunks = cta.stage == 0 ? 1 : l.chunks;
      if (sync[tw::kFinished]++ == static_cast<uint64_t>(chunks) - 1) {
        sync[tw::kFinished] = 0;
        cta.next = complete_stage<WR>(row, l, cta.stage);
        ++stats["stages"];
        cta.phase = kPublishStep;
      } else {
        cta.phase = kClaimStep;
      }
      return true;
    }
    case kPublishStep:
      sync[tw::kClaim] = cta.next;
      cta.phase = kClaimStep;
      return true;
    case kWaitStep:
      if ((sync[tw::kClaim] >> 32) != cta.stage) {
        cta.phase = kClaimStep;
        return true;
      }
      return false;
    default:
      return false;
  }
}

template <bool WR>
std::map<std::string, int64_t> run(Launch& l, int64_t B, int resident, uint64_t schedule_seed) {
  std::map<std::string, int64_t> stats{{"waits", 0}, {"chunk_passes", 0}, {"stages", 0}, {"steps", 0}};
  std::vector<Cta> pending;  // launch order: grid x fastest
  for (int64_t y = 0; y < l.chunks; ++y) {
    for (int64_t b = 0; b < B; ++b) pending.push_back(Cta{b});
  }
  std::reverse(pending.begin(), pending.end());
  std::vector<Cta> running;
  std::mt19937_64 rng(schedule_seed);
  int64_t idle = 0;
  while (!pending.empty() || !running.empty()) {
    while (static_cast<int>(running.size()) < resident && !pending.empty()) {
      running.push_back(pending.back());
      pending.pop_back();
    }
    const size_t i = static_cast<size_t>(rng() % running.size());
    const bool progress = step<WR>(l, running[i], stats);
    ++stats["steps"];
    idle = progress ? 0 : idle + 1;
    if (idle > 100000) throw std::runtime_error("host_tree_rejection_split: no CTA can make progress (deadlock)");
    if (running[i].phase == kExited) running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
  }
  for (uint64_t w : l.sync) {
    if (w != 0) throw std::runtime_error("host_tree_rejection_split: the ticket words were not handed back zeroed");
  }
  return stats;
}

// ---------------------------------------------------------------------------------------------
// Host emulation of tree_rejection_cluster_kernel (sm_90): per batch row, C CTAs in lockstep phases,
// each with its own "shared memory" (its slice's partial sums; rank 0's decision): rank 0 gathers the
// partials and runs walk_serial -> barrier -> every CTA reads the decision and sums its slice (in a
// seeded order: each writes only its own partials) -> barrier -> ...; the final draw: every CTA
// gathers the partials' column, find_slice names the owner, the owner rescans its slice. mutate: 1 =
// rank 0 reads the partials of the stage before (a missing barrier), 2 = the last slice is never
// summed (slices short of V); both must break the comparison with the reference. Testing only.
template <bool WR>
std::map<std::string, int64_t> run_cluster(Launch& l, int64_t B, int cluster, uint64_t schedule_seed, int mutate) {
  std::map<std::string, int64_t> stats{{"stages", 0}, {"slice_passes", 0}, {"barriers", 0}, {"rescans", 0}};
  std::mt19937_64 rng(schedule_seed);
  const int W = tw::kPartWords;
  for (int64_t b = 0; b < B; ++b) {
    const tw::RowView<float> row = l.row(b);
    const tw::RowView<float> walk = l.walk_view(row);  // rank 0's copy of the tree, made once
    std::vector<int64_t> part(static_cast<size_t>(cluster * W), int64_t{0x5A5A5A5A5A5A5A5A});  // per CTA
    std::vector<int64_t> before = part;  // the partials of the stage before (mutate 1)
    std::vector<int> order(static_cast<size_t>(cluster));
    for (int r = 0; r < cluster; ++r) order[static_cast<size_t>(r)] = r;
    uint64_t stage = 0;
    tw::Outcome o{};
    while (true) {
      // rank 0: gather the C partials through "DSMEM", the serial part, the decision
      const std::vector<int64_t> gathered = mutate == 1 ? before : part;
      const tw::Sums sums = stage > 0 ? tw::add_parts(gathered.data(), cluster) : tw::Sums{0, 0, 0};
      o = tw::walk_serial<WR, float, HostLoad>(walk, stage, sums);
      ++stats["stages"];
      ++stats["barriers"];  // A: every CTA reads the decision
      if (o.draw) break;
      before = part;
      std::shuffle(order.begin(), order.end(), rng);
      for (int r : order) {  // each CTA's fixed slice r of the pass
        if (mutate == 2 && r == cluster - 1) continue;
        const tw::Sums mine = pass_chunk<WR>(row, l, r);
        part[static_cast<size_t>(r * W)] = mine.r;
        part[static_cast<size_t>(r * W + 1)] = mine.p;
        part[static_cast<size_t>(r * W + 2)] = mine.q;
        ++stats["slice_passes"];
      }
      ++stats["barriers"];  // B: every slice's sums are in
      ++stage;
    }
    int64_t token = 0;  // no mass at all: id 0
    if (o.total > 0) {
      const int64_t threshold = specdec::draw_threshold(o.u, o.total);
      const int column = o.plain ? 1 : 0;
      int owner = -1;
      int64_t base = 0;
      for (int r = 0; r < cluster; ++r) {  // every CTA finds the same owner from the same partials
        int64_t base_r = 0;
        const int owner_r = tw::find_slice(part.data(), cluster, column, threshold, base_r);
        if (r > 0 && (owner_r != owner || base_r != base)) throw std::runtime_error("host_tree_rejection_cluster: owners differ");
        owner = owner_r;
        base = base_r;
      }
      token = l.V - 1;  // unreachable: threshold < total
      if (owner >= 0) {
        const int64_t start = static_cast<int64_t>(owner) * l.chunk, end = std::min<int64_t>(l.V, start + l.chunk);
        const int64_t found = rescan<WR>(row, l, o, start, end, threshold, base);
        if (found >= 0) token = found;
        ++stats["rescans"];
      }
    }
    tw::finish_row(row, o.level, tw::clamp_id(token, l.V));
    ++stats["barriers"];  // the last one: no CTA leaves while another reads its shared memory
  }
  return stats;
}

}  // namespace emu

// The launcher's arguments (CPU addresses, element strides) as the emulators read them; ctas: CTAs per
// row (the split form's chunk count, the cluster size). Scratch and ticket words are the caller's.
emu::Launch launch_of(uint64_t target, int64_t t_sb, int64_t t_sn, uint64_t draft, int64_t q_sb, int64_t q_sn,
                      uint64_t tokens, int64_t tokens_sb, int64_t tokens_sn, uint64_t parents, int64_t parents_sb,
                      int64_t parents_sn, uint64_t uniforms, bool uniforms_double, int64_t u_sb, int64_t u_sn,
                      int64_t seed, uint64_t seeds, int64_t seeds_stride, uint64_t offsets, int64_t offsets_stride,
                      uint64_t out_tokens, uint64_t num_accepted, uint64_t accepted_nodes, int64_t N, int64_t V,
                      int64_t max_depth, int64_t chunk, int ctas, bool without_replacement) {
  return emu::Launch{specdec::device_ptr<const float>(target), t_sb, t_sn, specdec::device_ptr<const float>(draft),
                     q_sb, q_sn, index_matrix(tokens, tokens_sb, tokens_sn),
                     index_matrix(parents, parents_sb, parents_sn),
                     specdec::TreeRandomness{specdec::device_ptr<const void>(uniforms), uniforms_double ? 1 : 0, u_sb,
                                             u_sn, seed, specdec::device_ptr<const int64_t>(seeds), seeds_stride,
                                             specdec::device_ptr<const int64_t>(offsets), offsets_stride},
                     specdec::device_ptr<int64_t>(out_tokens), specdec::device_ptr<int64_t>(num_accepted),
                     specdec::device_ptr<int64_t>(accepted_nodes), static_cast<int>(N), static_cast<int>(V), max_depth,
                     chunk, ctas, without_replacement, {}, {}, 0, {}};
}

// The cluster walk on the host (see emu::run_cluster): the split emulator's inputs, `cluster` CTAs a
// row owning slices of `chunk` ids (a multiple of 4; ceil(V / chunk) <= cluster <= 16: the slices
// cover V, trailing ones may be empty). Returns counters (stages, slice passes, barriers, rescans).
std::map<std::string, int64_t> host_tree_rejection_cluster(
    uint64_t target, int64_t t_sb, int64_t t_sn, uint64_t draft, int64_t q_sb, int64_t q_sn, uint64_t tokens,
    int64_t tokens_sb, int64_t tokens_sn, uint64_t parents, int64_t parents_sb, int64_t parents_sn, uint64_t uniforms,
    bool uniforms_double, int64_t u_sb, int64_t u_sn, int64_t seed, uint64_t seeds, int64_t seeds_stride,
    uint64_t offsets, int64_t offsets_stride, uint64_t out_tokens, uint64_t num_accepted, uint64_t accepted_nodes,
    int64_t B, int64_t N, int64_t V, int64_t max_depth, bool without_replacement, int64_t chunk, int cluster,
    uint64_t schedule_seed, int mutate) {
  const char* op = "host_tree_rejection_cluster: ";
  if (B < 1 || N < 1 || V < 1 || max_depth < 0) throw std::invalid_argument(std::string(op) + "need B, N, V >= 1");
  if (chunk < emu::K || chunk % emu::K != 0) throw std::invalid_argument(std::string(op) + "chunk must be a multiple of 4");
  if (cluster < 1 || cluster > specdec::tree_walk::kMaxCluster) {
    throw std::invalid_argument(std::string(op) + "cluster must be in [1, 16]");
  }
  if ((V + chunk - 1) / chunk > cluster) throw std::invalid_argument(std::string(op) + "the slices do not cover V");
  emu::Launch l = launch_of(target, t_sb, t_sn, draft, q_sb, q_sn, tokens, tokens_sb, tokens_sn, parents, parents_sb,
                            parents_sn, uniforms, uniforms_double, u_sb, u_sn, seed, seeds, seeds_stride, offsets,
                            offsets_stride, out_tokens, num_accepted, accepted_nodes, N, V, max_depth, chunk, cluster,
                            without_replacement);
  // the cluster form's per-row layout (state, rank table), garbage-filled; one spare row so that the
  // (unused) chunk-sum pointer of the last row stays inside the buffer
  l.stride = specdec::plans::kTreeRejectionStateWords + 2 * N;
  l.scratch.assign(static_cast<size_t>((B + 1) * l.stride), int64_t{0x5A5A5A5A5A5A5A5A});
  return without_replacement ? emu::run_cluster<true>(l, B, cluster, schedule_seed, mutate)
                             : emu::run_cluster<false>(l, B, cluster, schedule_seed, mutate);
}

// The whole split walk on the host (see emu above): float32 rows and int64 indices at CPU addresses
// with the launcher's strides; chunk: elements per V-chunk (a multiple of 4, the slot width); ctas:
// CTAs per row (grid y, the chunk count); resident: CTAs running at once. Returns counters of the
// run (stages, chunk passes, waits, steps); throws on a deadlock or a dirty workspace. Testing only.
std::map<std::string, int64_t> host_tree_rejection_split(
    uint64_t target, int64_t t_sb, int64_t t_sn, uint64_t draft, int64_t q_sb, int64_t q_sn, uint64_t tokens,
    int64_t tokens_sb, int64_t tokens_sn, uint64_t parents, int64_t parents_sb, int64_t parents_sn, uint64_t uniforms,
    bool uniforms_double, int64_t u_sb, int64_t u_sn, int64_t seed, uint64_t seeds, int64_t seeds_stride,
    uint64_t offsets, int64_t offsets_stride, uint64_t out_tokens, uint64_t num_accepted, uint64_t accepted_nodes,
    int64_t B, int64_t N, int64_t V, int64_t max_depth, bool without_replacement, int64_t chunk, int resident,
    uint64_t schedule_seed) {
  const char* op = "host_tree_rejection_split: ";
  if (B < 1 || N < 1 || V < 1 || max_depth < 0) throw std::invalid_argument(std::string(op) + "need B, N, V >= 1");
  if (chunk < emu::K || chunk % emu::K != 0) throw std::invalid_argument(std::string(op) + "chunk must be a multiple of 4");
  if (resident < 1) throw std::invalid_argument(std::string(op) + "resident must be >= 1");
  const int64_t chunks = (V + chunk - 1) / chunk;
  if (chunks > specdec::plans::kTreeRejectionMaxChunks) {
    throw std::invalid_argument(std::string(op) + "more chunks than the workspace holds (128)");
  }
  emu::Launch l = launch_of(target, t_sb, t_sn, draft, q_sb, q_sn, tokens, tokens_sb, tokens_sn, parents, parents_sb,
                            parents_sn, uniforms, uniforms_double, u_sb, u_sn, seed, seeds, seeds_stride, offsets,
                            offsets_stride, out_tokens, num_accepted, accepted_nodes, N, V, max_depth, chunk, static_cast<int>(chunks),
                            without_replacement);
  // the plan's per-row layout, garbage-filled: every word the walk reads must have been written first
  l.stride = specdec::plans::kTreeRejectionStateWords + 2 * N +
             specdec::plans::kTreeRejectionMaxChunks * specdec::plans::kTreeRejectionPartWords;
  l.scratch.assign(static_cast<size_t>(B * l.stride), int64_t{0x5A5A5A5A5A5A5A5A});
  l.sync.assign(static_cast<size_t>(B * emu::tw::kSyncWords), 0);
  return without_replacement ? emu::run<true>(l, B, resident, schedule_seed)
                             : emu::run<false>(l, B, resident, schedule_seed);
}

// One batch row's pass weights over ids [first, first + 4) and its draw weights, from p values and
// the q rows' values at those ids (host build of slot_pass_weights / slot_draw_weights): for tests of
// the slot arithmetic at chunk and slot boundaries. q_rows[i]: rank i's row (independent) or the node's.
std::tuple<std::vector<int64_t>, std::vector<int64_t>> host_tree_slot_weights(
    const std::vector<float>& p, const std::vector<std::vector<float>>& q_rows, const std::vector<int64_t>& table,
    int N, int64_t count, int64_t first, bool without_replacement) {
  if (p.size() != emu::K) throw std::invalid_argument("host_tree_slot_weights: p needs 4 values");
  float pv[emu::K];
  for (int k = 0; k < emu::K; ++k) pv[k] = p[k];
  auto load = [&](int64_t row, float (&q)[emu::K]) {
    const std::vector<float>& r = q_rows.at(static_cast<size_t>(without_replacement ? 0 : row));
    for (int k = 0; k < emu::K; ++k) q[k] = r.at(static_cast<size_t>(k));
  };
  int64_t w_r[emu::K], w_p[emu::K], w_q[emu::K];
  if (without_replacement) {
    emu::tw::slot_pass_weights<true, emu::K>(pv, load, table.data(), N, emu::tw::kResid, count, first, w_r, w_p, w_q);
  } else {
    emu::tw::slot_pass_weights<false, emu::K>(pv, load, table.data(), N, emu::tw::kResid, count, first, w_r, w_p, w_q);
  }
  return {std::vector<int64_t>(w_r, w_r + emu::K), std::vector<int64_t>(w_q, w_q + emu::K)};
}

const specdec::RegisterBindings registered([](py::module_& m) {
  m.def("tree_greedy_verify", &tree_greedy_verify, py::arg("logits"), py::arg("logits_stride_b"),
        py::arg("logits_stride_n"), py::arg("tree_tokens"), py::arg("tokens_stride_b"),
        py::arg("tokens_stride_n"), py::arg("parents"), py::arg("parents_stride_b"),
        py::arg("parents_stride_n"), py::arg("out_tokens"), py::arg("num_accepted"),
        py::arg("accepted_nodes"), py::arg("workspace"), py::arg("B"), py::arg("N"), py::arg("V"),
        py::arg("max_depth"), py::arg("dtype"), py::arg("stream"), py::call_guard<py::gil_scoped_release>(),
        "Greedy token-tree verification on `stream` (one kernel launch, no sync). workspace must be "
        "zeroed (tree_greedy_verify_workspace_bytes) and is left zeroed.");
  m.def("tree_greedy_verify_workspace_bytes", &specdec::tree_greedy_verify_workspace_bytes, py::arg("B"),
        py::arg("N"), "Bytes of zeroed workspace tree_greedy_verify needs (left zeroed after use).");
  m.def("tree_rejection_sample", &tree_rejection_sample, py::arg("target_probs"), py::arg("target_stride_b"),
        py::arg("target_stride_n"), py::arg("draft_probs"), py::arg("draft_stride_b"),
        py::arg("draft_stride_n"), py::arg("tree_tokens"), py::arg("tokens_stride_b"),
        py::arg("tokens_stride_n"), py::arg("parents"), py::arg("parents_stride_b"),
        py::arg("parents_stride_n"), py::arg("uniforms"), py::arg("uniforms_double"),
        py::arg("uniforms_stride_b"), py::arg("uniforms_stride_n"), py::arg("seed"), py::arg("seeds"),
        py::arg("seeds_stride"), py::arg("offsets"), py::arg("offsets_stride"), py::arg("out_tokens"),
        py::arg("num_accepted"), py::arg("accepted_nodes"), py::arg("workspace"), py::arg("zeroed_workspace"),
        py::arg("B"), py::arg("N"),
        py::arg("V"), py::arg("max_depth"), py::arg("dtype"), py::arg("stream"),
        py::arg("without_replacement") = false, py::arg("form") = 0, py::call_guard<py::gil_scoped_release>(),
        "Multi-draft speculative sampling over a token tree on `stream` (one kernel launch, no sync). "
        "without_replacement: siblings drawn from one q (draft row of their parent) without replacement. "
        "uniforms/seeds/offsets may be 0; workspace: tree_rejection_sample_plan(B, N, V)['workspace_bytes'] "
        "bytes, 8-byte aligned, need not be zeroed; zeroed_workspace: ['zeroed_bytes'] zeroed bytes, left zeroed "
        "(0 bytes and may be 0 in the cluster form). form: 0 auto, 1 split, 2 cluster (as the plan).");
  m.def("tree_rejection_sample_plan", &tree_rejection_sample_plan, py::arg("B"), py::arg("N"), py::arg("V"),
        py::arg("arch") = 0, py::arg("form") = 0,
        "Launch plan of tree_rejection_sample: {'form' ('cluster' on sm_90 where it fits, else 'split'), "
        "'grid' ((B, chunks) split, (B * cluster,) cluster), 'cluster' (CTAs per cluster, 0 split), 'threads', "
        "'chunks', 'chunk', 'workspace_bytes' (scratch), 'zeroed_bytes'} on the current device (arch 0) or the "
        "sm_80 / sm_90 table; form 0 auto, 1 split, 2 cluster (ValueError where it cannot run); neither buffer "
        "depends on V.");
  m.def("tree_cluster_facts", [] {
    int code_arch = 0, active[specdec::plans::kTreeRejectionMaxCluster + 1] = {};
    specdec::tree_cluster_facts(&code_arch, active);
    py::dict d;
    d["code_arch"] = code_arch;
    d["active"] = std::vector<int>(active, active + specdec::plans::kTreeRejectionMaxCluster + 1);
    return d;
  }, "The current device's cluster facts (needs a GPU): {'code_arch': the virtual arch of the cluster "
     "kernel's code it runs, 'active': clusters of C CTAs that fit at once, C = 0..16}.");
  m.def("host_tree_rejection_cluster", &host_tree_rejection_cluster, py::arg("target"), py::arg("t_sb"),
        py::arg("t_sn"), py::arg("draft"), py::arg("q_sb"), py::arg("q_sn"), py::arg("tokens"), py::arg("tokens_sb"),
        py::arg("tokens_sn"), py::arg("parents"), py::arg("parents_sb"), py::arg("parents_sn"), py::arg("uniforms"),
        py::arg("uniforms_double"), py::arg("u_sb"), py::arg("u_sn"), py::arg("seed"), py::arg("seeds"),
        py::arg("seeds_stride"), py::arg("offsets"), py::arg("offsets_stride"), py::arg("out_tokens"),
        py::arg("num_accepted"), py::arg("accepted_nodes"), py::arg("B"), py::arg("N"), py::arg("V"),
        py::arg("max_depth"), py::arg("without_replacement"), py::arg("chunk"), py::arg("cluster"),
        py::arg("schedule_seed"), py::arg("mutate") = 0,
        "Host emulation of tree_rejection_sample's sm_90 cluster kernel (tree_walk.cuh) over float32 CPU rows: "
        "C CTAs a row in lockstep phases (testing only; mutate 1/2 plant protocol bugs).");
  m.def("host_tree_rejection_split", &host_tree_rejection_split, py::arg("target"), py::arg("t_sb"), py::arg("t_sn"),
        py::arg("draft"), py::arg("q_sb"), py::arg("q_sn"), py::arg("tokens"), py::arg("tokens_sb"),
        py::arg("tokens_sn"), py::arg("parents"), py::arg("parents_sb"), py::arg("parents_sn"), py::arg("uniforms"),
        py::arg("uniforms_double"), py::arg("u_sb"), py::arg("u_sn"), py::arg("seed"), py::arg("seeds"),
        py::arg("seeds_stride"), py::arg("offsets"), py::arg("offsets_stride"), py::arg("out_tokens"),
        py::arg("num_accepted"), py::arg("accepted_nodes"), py::arg("B"), py::arg("N"), py::arg("V"),
        py::arg("max_depth"), py::arg("without_replacement"), py::arg("chunk"), py::arg("resident"),
        py::arg("schedule_seed"),
        "Host emulation of tree_rejection_sample's split-V kernel (tree_walk.cuh) over float32 CPU rows, "
        "CTAs interleaved by a seeded scheduler (testing only).");
  m.def("host_tree_slot_weights", &host_tree_slot_weights, py::arg("p"), py::arg("q_rows"), py::arg("table"),
        py::arg("N"), py::arg("count"), py::arg("first"), py::arg("without_replacement"),
        "Host build of the split kernel's residual weights of 4 ids (testing only).");
  m.def("host_tree_residual", &host_tree_residual, py::arg("p"), py::arg("q"),
        "Host build of tree_rejection_sample's residual arithmetic over whole rows (testing only).");
  m.def("host_sampled_residual", &host_sampled_residual, py::arg("p"), py::arg("q"), py::arg("rejected"),
        "Host build of the sampled-siblings (without replacement) residual over whole rows (testing only).");
  m.def("host_sampled_accept", &specdec::sampled_accept, py::arg("u"), py::arg("scale"), py::arg("q_weight"),
        py::arg("r"), "Host build of the sampled-siblings later test u * (c * Q(x)) < R(x) (testing only).");
});

}  // namespace
