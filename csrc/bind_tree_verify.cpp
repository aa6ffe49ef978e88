// pybind11 bindings of the token-tree verification launchers (tree_verify.h).
// Tensors cross as device addresses (tensor.data_ptr()), strides in elements,
// the stream as an integer; 0 stands for an absent optional tensor.

#include <pybind11/stl.h>

#include <cstdint>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "registry.h"
#include "tree_residual.cuh"
#include "tree_verify.h"

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
                           uint64_t num_accepted, uint64_t accepted_nodes, uint64_t workspace, int64_t B,
                           int64_t N, int64_t V, int64_t max_depth, int dtype, uint64_t stream,
                           bool without_replacement) {
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
      specdec::device_ptr<int64_t>(accepted_nodes), specdec::device_ptr<void>(workspace), B, N, V, max_depth,
      dtype, as_stream(stream), without_replacement);
}

py::dict tree_rejection_sample_plan(int64_t B, int64_t N, int64_t V) {
  const specdec::TreeRejectionPlan plan = specdec::tree_rejection_sample_plan(B, N, V);
  py::dict out;
  out["grid"] = py::make_tuple(plan.blocks);
  out["threads"] = plan.threads;
  out["workspace_bytes"] = plan.workspace_bytes;
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
        py::arg("num_accepted"), py::arg("accepted_nodes"), py::arg("workspace"), py::arg("B"), py::arg("N"),
        py::arg("V"), py::arg("max_depth"), py::arg("dtype"), py::arg("stream"),
        py::arg("without_replacement") = false, py::call_guard<py::gil_scoped_release>(),
        "Multi-draft speculative sampling over a token tree on `stream` (one kernel launch, no sync). "
        "without_replacement: siblings drawn from one q (draft row of their parent) without replacement. "
        "uniforms/seeds/offsets may be 0; workspace: tree_rejection_sample_plan(B, N, V)['workspace_bytes'] "
        "bytes, 8-byte aligned, need not be zeroed.");
  m.def("tree_rejection_sample_plan", &tree_rejection_sample_plan, py::arg("B"), py::arg("N"), py::arg("V"),
        "Launch plan of tree_rejection_sample (host only, no GPU): {'grid', 'threads', 'workspace_bytes'}; "
        "the workspace (per-row rank tables) does not depend on V.");
  m.def("host_tree_residual", &host_tree_residual, py::arg("p"), py::arg("q"),
        "Host build of tree_rejection_sample's residual arithmetic over whole rows (testing only).");
  m.def("host_sampled_residual", &host_sampled_residual, py::arg("p"), py::arg("q"), py::arg("rejected"),
        "Host build of the sampled-siblings (without replacement) residual over whole rows (testing only).");
  m.def("host_sampled_accept", &specdec::sampled_accept, py::arg("u"), py::arg("scale"), py::arg("q_weight"),
        py::arg("r"), "Host build of the sampled-siblings later test u * (c * Q(x)) < R(x) (testing only).");
});

}  // namespace
