// Python bindings of early_exit_topk (early_exit.h), plus a host emulation of the
// kernels' top-k selection for CPU-only tests.
//
// The emulation takes finished float32 logits (the GEMV itself can only be checked on
// a GPU) and runs the kernels' selection over their structure: the plan's vocabulary
// slices, each warp's kept set fed the rows v = start + warp, += 8 (early_exit_math.cuh),
// the per-CTA merge of the warps' sets (k rounds, strictly decreasing), then the merge
// kernel's per-thread sorted lists and k block-max pops.

#include <pybind11/stl.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "early_exit_math.cuh"
#include "early_exit.h"
#include "registry.h"

namespace py = pybind11;

namespace {

using specdec::device_ptr;
namespace ee = specdec::early_exit;
using Key = unsigned long long;

void early_exit_topk(uint64_t hidden, int64_t hidden_stride, uint64_t norm_weight, uint64_t norm_bias,
                     int norm_dtype, uint64_t lm_head, int64_t lm_head_stride, uint64_t values, uint64_t indices,
                     uint64_t workspace, uint64_t workspace_bytes, int64_t B, int64_t H, int64_t V, int64_t k,
                     int dtype, int norm, double eps, uint64_t stream) {
  specdec::launch_early_exit_topk(
      device_ptr<const void>(hidden), hidden_stride, device_ptr<const void>(norm_weight),
      device_ptr<const void>(norm_bias), norm_dtype, device_ptr<const void>(lm_head), lm_head_stride,
      device_ptr<float>(values), device_ptr<int64_t>(indices), device_ptr<void>(workspace), workspace_bytes, B, H,
      V, k, dtype, norm, eps, reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(stream)));
}

void check_host(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("host_early_exit_select: ") + what);
}

// logits: float32 [B, V] flat. Returns (values [B*k], ids [B*k], splits used).
std::tuple<std::vector<float>, std::vector<int64_t>, int> host_early_exit_select(
    const std::vector<float>& logits, int64_t B, int64_t V, int k, int sms, int ctas_per_sm, int merge_threads) {
  check_host(B >= 1 && V >= 1 && k >= 1 && k <= ee::kMaxK && k <= V && merge_threads >= 1, "bad sizes");
  check_host(logits.size() == static_cast<size_t>(B * V), "logits size");
  const ee::Plan p = ee::make_plan(B, V, sms, ctas_per_sm);
  std::vector<float> values(static_cast<size_t>(B * k));
  std::vector<int64_t> ids(static_cast<size_t>(B * k));
  for (int64_t b = 0; b < B; ++b) {
    const float* row = logits.data() + b * V;
    std::vector<Key> cand;
    for (int s = 0; s < p.splits; ++s) {
      const int64_t v0 = s * p.per_split, v1 = std::min(V, v0 + p.per_split);
      std::vector<Key> kept(static_cast<size_t>(ee::kWarps * k));
      for (int w = 0; w < ee::kWarps; ++w) {
        Key thresh = 0;
        ee::kept_init(&kept[w * k], k, thresh);
        for (int64_t v = v0 + w; v < v1; v += ee::kWarps) {
          ee::kept_offer(&kept[w * k], k, ee::logit_key(row[v], static_cast<uint32_t>(v)), thresh);
        }
      }
      Key prev = ~0ull;
      for (int j = 0; j < k; ++j) {
        Key best = 0;
        for (const Key key : kept) {
          if (key < prev && key > best) best = key;
        }
        cand.push_back(best);
        prev = best;
      }
    }
    std::vector<std::vector<Key>> lists(static_cast<size_t>(merge_threads));
    Key sorted[ee::kMaxK];
    for (int t = 0; t < merge_threads; ++t) {
      std::fill(sorted, sorted + ee::kMaxK, 0ull);
      for (size_t i = t; i < cand.size(); i += merge_threads) ee::sorted_insert(sorted, cand[i]);
      lists[t].assign(sorted, sorted + ee::kMaxK);
    }
    for (int j = 0; j < k; ++j) {
      Key best = 0;
      for (const auto& list : lists) best = std::max(best, list[0]);
      for (auto& list : lists) {
        if (list[0] == best) {
          std::copy(list.begin(), list.end(), sorted);
          ee::sorted_pop(sorted);
          list.assign(sorted, sorted + ee::kMaxK);
        }
      }
      values[b * k + j] = ee::key_logit(best);
      ids[b * k + j] = specdec::argmax_key_index(best);
    }
  }
  return {values, ids, p.splits};
}

const specdec::RegisterBindings registered([](py::module_& m) {
  m.def("early_exit_topk_workspace_bytes", &specdec::early_exit_topk_workspace_bytes, py::arg("B"), py::arg("H"),
        py::arg("V"), py::arg("k"),
        "Bytes of zeroed workspace early_exit_topk needs on the current device (left zeroed after use).");
  m.def("early_exit_topk", &early_exit_topk, py::arg("hidden"), py::arg("hidden_stride"), py::arg("norm_weight"),
        py::arg("norm_bias"), py::arg("norm_dtype"), py::arg("lm_head"), py::arg("lm_head_stride"),
        py::arg("values"), py::arg("indices"), py::arg("workspace"), py::arg("workspace_bytes"), py::arg("B"),
        py::arg("H"), py::arg("V"), py::arg("k"), py::arg("dtype"), py::arg("norm"), py::arg("eps"),
        py::arg("stream"), py::call_guard<py::gil_scoped_release>(),
        "Fused norm + LM head + top-k on `stream` (two kernel launches, no sync). norm: 0 none, 1 rms, "
        "2 layer; norm_weight / norm_bias may be 0; 1 <= k <= min(16, V).");
  m.def("host_early_exit_select", &host_early_exit_select, py::arg("logits"), py::arg("B"), py::arg("V"),
        py::arg("k"), py::arg("sms"), py::arg("ctas_per_sm"), py::arg("merge_threads"),
        "CPU emulation of the early_exit_topk kernels' top-k selection over given logits (testing only).");
});

}  // namespace
