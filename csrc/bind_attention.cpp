// pybind11 bindings of tree / chain verification attention (attention.h),
// plus host builds of its index and softmax arithmetic (attention_math.cuh)
// for CPU-only tests. Tensors cross as device addresses (tensor.data_ptr()),
// strides in elements, the stream as an integer; 0 stands for an absent tensor.

#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <vector>

#include "registry.h"
#include "attention.h"
#include "attention_math.cuh"

namespace py = pybind11;

namespace {

using IndexArgs = std::tuple<uint64_t, bool, int64_t, int64_t>;  // (address, int64?, stride0, stride1)
using KvArgs = std::tuple<uint64_t, int64_t, int64_t, int64_t>;  // (address, outer, slot, head strides)

specdec::IndexTensor index_tensor(const IndexArgs& t) {
  return {specdec::device_ptr<const void>(std::get<0>(t)), std::get<1>(t) ? 1 : 0, std::get<2>(t), std::get<3>(t)};
}

specdec::KvTensor kv_tensor(const KvArgs& t) {
  return {specdec::device_ptr<const void>(std::get<0>(t)), std::get<1>(t), std::get<2>(t), std::get<3>(t)};
}

void tree_attention(uint64_t q, int64_t q_stride_b, int64_t q_stride_n, int64_t q_stride_h, const KvArgs& k,
                    const KvArgs& v, const IndexArgs& seq_lens, const IndexArgs& parents,
                    const IndexArgs& block_table, int64_t page_size, int64_t num_pages, int64_t max_pages,
                    int64_t s_max, uint64_t out, int64_t out_stride_b, int64_t out_stride_n, int64_t out_stride_h,
                    uint64_t lse, int64_t B, int64_t N, int64_t Hq, int64_t Hkv, int64_t D, double sm_scale,
                    int dtype, uint64_t counters, uint64_t counter_bytes, uint64_t partials,
                    uint64_t partial_bytes, uint64_t stream) {
  specdec::TreeAttentionArgs a{};
  a.q = specdec::device_ptr<const void>(q);
  a.q_stride_b = q_stride_b;
  a.q_stride_n = q_stride_n;
  a.q_stride_h = q_stride_h;
  a.k = kv_tensor(k);
  a.v = kv_tensor(v);
  a.seq_lens = index_tensor(seq_lens);
  a.parents = index_tensor(parents);
  a.block_table = index_tensor(block_table);
  a.page_size = page_size;
  a.num_pages = num_pages;
  a.max_pages = max_pages;
  a.s_max = s_max;
  a.out = specdec::device_ptr<void>(out);
  a.out_stride_b = out_stride_b;
  a.out_stride_n = out_stride_n;
  a.out_stride_h = out_stride_h;
  a.lse = specdec::device_ptr<float>(lse);
  a.B = B;
  a.N = N;
  a.Hq = Hq;
  a.Hkv = Hkv;
  a.D = D;
  a.sm_scale = static_cast<float>(sm_scale);
  a.dtype = dtype;
  specdec::launch_tree_attention(a, specdec::device_ptr<void>(counters), counter_bytes,
                                 specdec::device_ptr<void>(partials), partial_bytes,
                                 reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(stream)));
}

py::tuple plan_tuple(const specdec::TreeAttentionPlan& p) {
  return py::make_tuple(p.splits, p.block_m, p.m_tiles, p.counter_bytes, p.partial_bytes, p.path);
}

// ---------------------------------------------------------------------------
// Host builds (testing only)
// ---------------------------------------------------------------------------
std::vector<uint64_t> host_windows(const std::vector<int64_t>& parents, const std::vector<int>& nodes,
                                   const std::vector<int>& w0s, int width) {
  if (nodes.size() != w0s.size()) throw std::invalid_argument("host_tree_attention_windows: nodes and w0s differ");
  if (width < 1 || width > 64) throw std::invalid_argument("host_tree_attention_windows: width in 1..64");
  std::vector<uint64_t> out(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i] < 0 || (!parents.empty() && static_cast<size_t>(nodes[i]) >= parents.size())) {
      throw std::invalid_argument("host_tree_attention_windows: node out of range");
    }
    out[i] = parents.empty()
                 ? specdec::tree_attn::chain_window(nodes[i], w0s[i], width)
                 : specdec::tree_attn::ancestor_window(nodes[i], w0s[i], width,
                                                       [&](int j) { return parents[static_cast<size_t>(j)]; });
  }
  return out;
}

// One packed row through the kernels' algorithm: the row's keys cut by
// row_split, each split an online softmax over `tile`-key tiles (prefix tiles
// unmasked, the others through the ancestor window), then the log-sum-exp
// merge. keys / values: [(prefix + N) * D] floats. Returns (out [D], lse).
std::pair<std::vector<float>, float> host_row(const std::vector<float>& q, const std::vector<float>& keys,
                                              const std::vector<float>& values, int64_t prefix, int node,
                                              const std::vector<int64_t>& parents, int N, double sm_scale,
                                              int splits, int tile) {
  using namespace specdec::tree_attn;
  const int64_t D = static_cast<int64_t>(q.size());
  const int64_t L = prefix + N;
  if (D < 1 || static_cast<int64_t>(keys.size()) != L * D || values.size() != keys.size() || node < 0 ||
      node >= N || (!parents.empty() && static_cast<int>(parents.size()) != N) || tile < 1 || tile > 64 ||
      kKeyAlign % tile != 0 || splits < 1 || splits > kMaxSplits) {
    throw std::invalid_argument("host_tree_attention_row: bad arguments");
  }
  const float scale_log2 = static_cast<float>(sm_scale) * 1.4426950408889634074f;
  const RowSplit rs = row_split(L, splits);
  std::vector<float> m(rs.active, -INFINITY), l(rs.active, 0.0f), acc(static_cast<size_t>(rs.active) * D, 0.0f);
  for (int s = 0; s < rs.active; ++s) {
    const int64_t lo = s * rs.chunk;
    const int64_t hi = std::min(lo + rs.chunk, L);
    for (int64_t start = lo; start < hi; start += tile) {
      const bool masked = start + tile > prefix;
      const int w0 = static_cast<int>(start - prefix);
      const uint64_t win = !masked ? 0
                           : parents.empty()
                               ? chain_window(node, w0, tile)
                               : ancestor_window(node, w0, tile, [&](int j) { return parents[static_cast<size_t>(j)]; });
      std::vector<float> x(tile, -INFINITY);
      float tile_max = -INFINITY;
      for (int j = 0; j < tile; ++j) {
        const int64_t pos = start + j;
        if (pos >= hi) continue;
        if (masked && !(j < prefix - start || ((win >> j) & 1ull))) continue;
        float dot = 0.0f;
        for (int64_t d = 0; d < D; ++d) dot += q[d] * keys[pos * D + d];
        x[j] = dot * scale_log2;
        tile_max = std::max(tile_max, x[j]);
      }
      const float m_new = std::max(m[s], tile_max);
      const float offset = softmax_offset(m_new);
      const float alpha = exp2f(m[s] - offset);
      m[s] = m_new;
      l[s] *= alpha;
      for (int64_t d = 0; d < D; ++d) acc[s * D + d] *= alpha;
      for (int j = 0; j < tile; ++j) {
        const float p = exp2f(x[j] - offset);
        if (p == 0.0f) continue;
        l[s] += p;
        for (int64_t d = 0; d < D; ++d) acc[s * D + d] += p * values[(start + j) * D + d];
      }
    }
  }
  float m_max = -INFINITY;
  for (const float ms : m) m_max = std::max(m_max, ms);
  float l_sum = 0.0f;
  std::vector<float> out(D, 0.0f);
  for (int s = 0; s < rs.active; ++s) {
    const float w = split_weight(m[s], m_max);
    l_sum += l[s] * w;
    for (int64_t d = 0; d < D; ++d) out[d] += acc[s * D + d] * w;
  }
  for (float& o : out) o /= l_sum;
  return {out, natural_lse(m_max, l_sum)};
}

const specdec::RegisterBindings registered([](py::module_& m) {
  m.def("tree_attention", &tree_attention, py::arg("q"), py::arg("q_stride_b"), py::arg("q_stride_n"),
        py::arg("q_stride_h"), py::arg("k"), py::arg("v"), py::arg("seq_lens"), py::arg("parents"),
        py::arg("block_table"), py::arg("page_size"), py::arg("num_pages"), py::arg("max_pages"), py::arg("s_max"),
        py::arg("out"), py::arg("out_stride_b"), py::arg("out_stride_n"), py::arg("out_stride_h"), py::arg("lse"),
        py::arg("B"), py::arg("N"), py::arg("Hq"), py::arg("Hkv"), py::arg("D"), py::arg("sm_scale"),
        py::arg("dtype"), py::arg("counters"), py::arg("counter_bytes"), py::arg("partials"),
        py::arg("partial_bytes"), py::arg("stream"), py::call_guard<py::gil_scoped_release>(),
        "Tree / chain verification attention on `stream` (one kernel launch, no sync). k, v: (address, "
        "outer, slot, head strides); seq_lens, parents, block_table: (address or 0, is_int64, stride0, "
        "stride1). counters must be zeroed and are left zeroed; partials need no zeroing.");
  m.def(
      "tree_attention_plan",
      [](int64_t B, int64_t N, int64_t Hq, int64_t Hkv, int64_t D, int64_t kv_capacity, int dtype) {
        return plan_tuple(specdec::tree_attention_plan_for_device(B, N, Hq, Hkv, D, kv_capacity, dtype));
      },
      py::arg("B"), py::arg("N"), py::arg("Hq"), py::arg("Hkv"), py::arg("D"), py::arg("kv_capacity"),
      py::arg("dtype"),
      "(splits, block_m, m_tiles, counter_bytes, partial_bytes, path) of a call on the current device: "
      "counter_bytes of zeroed workspace and partial_bytes of scratch.");
  m.def(
      "host_tree_attention_plan",
      [](int64_t B, int64_t N, int64_t Hq, int64_t Hkv, int64_t D, int64_t kv_capacity, int dtype, int sms,
         int ctas_per_sm) {
        return plan_tuple(specdec::plan_tree_attention(B, N, Hq, Hkv, D, kv_capacity, dtype, sms, ctas_per_sm));
      },
      py::arg("B"), py::arg("N"), py::arg("Hq"), py::arg("Hkv"), py::arg("D"), py::arg("kv_capacity"),
      py::arg("dtype"), py::arg("sms"), py::arg("ctas_per_sm"),
      "The launch plan as a pure function of the shapes and the GPU size (testing only).");
  m.def(
      "host_tree_attention_row_split",
      [](int64_t keys, int splits) {
        const specdec::tree_attn::RowSplit rs = specdec::tree_attn::row_split(keys, splits);
        return py::make_tuple(rs.chunk, rs.active);
      },
      py::arg("keys"), py::arg("splits"), "Host build of the kernels' row_split (testing only).");
  m.def("host_tree_attention_windows", &host_windows, py::arg("parents"), py::arg("nodes"), py::arg("w0s"),
        py::arg("width"),
        "Host build of the kernels' ancestor / chain windows (parents=[] is the chain; testing only).");
  m.def("host_tree_attention_row", &host_row, py::arg("q"), py::arg("keys"), py::arg("values"), py::arg("prefix"),
        py::arg("node"), py::arg("parents"), py::arg("N"), py::arg("sm_scale"), py::arg("splits"), py::arg("tile"),
        "One packed row through the kernels' split / mask / online-softmax / merge arithmetic (testing only).");
});

}  // namespace
