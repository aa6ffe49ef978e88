// Python bindings of relaxed_verify, bild_verify and max_prob (logit_verify.h),
// plus host emulations of those kernels for CPU-only tests.
//
// The emulations run the kernels' own scalar arithmetic (logit_math.cuh,
// ordered_key.cuh: packed argmax keys, rank test, (max, sum-exp) pairs, accept
// rules) over the kernels' structure (V split into chunks, each chunk strided
// over `threads` lanes, lanes merged, splits merged in order, first rejection,
// output padding). They prove the math and the rule on a CPU; the memory and
// synchronisation of the kernels themselves can only be checked on a GPU. The
// lanes merge in lane order where the kernel uses a shuffle tree, so bild sums
// may round differently (the same band as against torch).

#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "logit_math.cuh"
#include "logit_verify.h"
#include "ordered_key.cuh"
#include "registry.h"

namespace py = pybind11;

namespace {

using specdec::device_ptr;
using specdec::logit::MaxSum;

cudaStream_t as_stream(uint64_t stream) {
  return reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(stream));
}

void relaxed_verify(uint64_t logits, int64_t stride_b, int64_t stride_g, uint64_t draft_tokens,
                    uint64_t num_draft_tokens, uint64_t out_tokens, uint64_t num_accepted,
                    uint64_t workspace, uint64_t workspace_bytes, int64_t B, int64_t G, int64_t V,
                    int dtype, int64_t top_beta, double tau, uint64_t stream) {
  specdec::launch_relaxed_verify(
      device_ptr<const void>(logits), stride_b, stride_g, device_ptr<const int64_t>(draft_tokens),
      device_ptr<const int64_t>(num_draft_tokens), device_ptr<int64_t>(out_tokens),
      device_ptr<int64_t>(num_accepted), device_ptr<void>(workspace), workspace_bytes, B, G, V,
      dtype, top_beta, tau, as_stream(stream));
}

void bild_verify(uint64_t logits, int64_t stride_b, int64_t stride_g, uint64_t draft_tokens,
                 uint64_t num_draft_tokens, uint64_t out_tokens, uint64_t num_accepted,
                 uint64_t workspace, uint64_t workspace_bytes, int64_t B, int64_t G, int64_t V,
                 int dtype, double rollback_threshold, uint64_t stream) {
  specdec::launch_bild_verify(
      device_ptr<const void>(logits), stride_b, stride_g, device_ptr<const int64_t>(draft_tokens),
      device_ptr<const int64_t>(num_draft_tokens), device_ptr<int64_t>(out_tokens),
      device_ptr<int64_t>(num_accepted), device_ptr<void>(workspace), workspace_bytes, B, G, V,
      dtype, rollback_threshold, as_stream(stream));
}

void max_prob(uint64_t logits, int64_t row_stride, uint64_t out, uint64_t workspace,
              uint64_t workspace_bytes, int64_t R, int64_t V, int dtype, uint64_t stream) {
  specdec::launch_max_prob(device_ptr<const void>(logits), row_stride, device_ptr<float>(out),
                           device_ptr<void>(workspace), workspace_bytes, R, V, dtype,
                           as_stream(stream));
}

// ---------------------------------------------------------------------------
// Host emulation
// ---------------------------------------------------------------------------
uint32_t order_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return specdec::order_preserving_bits_from_raw(u);
}

float float_of_order(uint32_t ord) {
  const uint32_t u = specdec::raw_bits_from_order_preserving(ord);
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

struct ChunkStats {
  unsigned long long key = 0;
  uint32_t ahead = 0;
  MaxSum max_sum = specdec::logit::max_sum_empty();
};

// One block: row[start, end) strided over `threads` lanes, lanes merged in order.
ChunkStats emulate_chunk(const float* row, int64_t start, int64_t end, int threads, bool rank,
                         bool sum_exp, float lx, int64_t d) {
  ChunkStats out;
  for (int lane = 0; lane < threads; ++lane) {
    uint32_t best_ord = 0, best_idx = 0xFFFFFFFFu;
    ChunkStats t;
    for (int64_t idx = start + lane; idx < end; idx += threads) {
      const float x = specdec::logit::nan_to_neg_inf(row[idx]);
      const uint32_t ord = order_of(x);
      if (ord > best_ord) {
        best_ord = ord;
        best_idx = static_cast<uint32_t>(idx);
      }
      if (rank) t.ahead += specdec::logit::ranks_ahead(x, idx, lx, d) ? 1u : 0u;
      if (sum_exp) {
        const float one[1] = {x};
        specdec::logit::max_sum_add(t.max_sum, one);
      }
    }
    out.key = std::max(out.key, specdec::make_argmax_key(best_ord, best_idx));
    out.ahead += t.ahead;
    out.max_sum = specdec::logit::max_sum_merge(out.max_sum, t.max_sum);
  }
  return out;
}

// The last block's two-pass merge of a row's partials (split order).
MaxSum merge_partials(const std::vector<MaxSum>& partials) {
  float m = -INFINITY;
  for (const MaxSum& p : partials) m = p.m > m ? p.m : m;
  float sum = 0.0f;
  if (specdec::logit::is_finite(m)) {
    for (const MaxSum& p : partials) sum += specdec::logit::max_sum_term(p, m);
  }
  return MaxSum{m, sum};
}

int64_t key_to_token(unsigned long long key, int64_t V) {
  const uint32_t idx = specdec::argmax_key_index(key);
  return idx < static_cast<uint64_t>(V) ? static_cast<int64_t>(idx) : 0;
}

void check_host(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("host_logit_verify: ") + what);
}

// mode "relaxed" or "bild"; logits fp32 [B, G+1, V] flat; drafts [B, G];
// counts [B] or empty (= G drafts per row). Returns (out_tokens flat, num_accepted).
std::pair<std::vector<int64_t>, std::vector<int64_t>> host_logit_verify(
    const std::string& mode, const std::vector<float>& logits, const std::vector<int64_t>& drafts,
    const std::vector<int64_t>& counts, int64_t B, int64_t G, int64_t V, int64_t top_beta,
    float tau, float threshold, int64_t chunk, int threads) {
  const bool relaxed = mode == "relaxed";
  check_host(relaxed || mode == "bild", "mode must be 'relaxed' or 'bild'");
  check_host(B >= 0 && G >= 0 && V >= 1 && chunk >= 1 && threads >= 1, "bad sizes");
  check_host(logits.size() == static_cast<size_t>(B * (G + 1) * V), "logits size");
  check_host(drafts.size() == static_cast<size_t>(B * G), "drafts size");
  check_host(counts.empty() || counts.size() == static_cast<size_t>(B), "counts size");
  const int64_t splits = (V + chunk - 1) / chunk;
  std::vector<int64_t> out(static_cast<size_t>(B * (G + 1)), -1), accepted(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = counts.empty() ? G : std::min(std::max<int64_t>(counts[b], 0), G);
    std::vector<unsigned long long> keys(static_cast<size_t>(n + 1), 0);
    std::vector<uint32_t> ranks(static_cast<size_t>(n + 1), 0);
    std::vector<std::vector<MaxSum>> partials(static_cast<size_t>(n + 1));
    for (int64_t pos = 0; pos <= n; ++pos) {
      const float* row = logits.data() + (b * (G + 1) + pos) * V;
      const int64_t d = pos < n ? drafts[b * G + pos] : -1;
      const bool stats = pos < n && d >= 0 && d < V;
      const float lx = stats ? specdec::logit::nan_to_neg_inf(row[d]) : 0.0f;
      for (int64_t s = 0; s < splits; ++s) {
        const ChunkStats c = emulate_chunk(row, s * chunk, std::min(V, (s + 1) * chunk), threads,
                                           stats && relaxed, stats && !relaxed, lx, d);
        keys[pos] = std::max(keys[pos], c.key);
        ranks[pos] += c.ahead;
        partials[pos].push_back(c.max_sum);
      }
    }
    int64_t first_reject = n;
    for (int64_t j = 0; j < n && first_reject == n; ++j) {
      const int64_t dj = drafts[b * G + j];
      bool ok = dj >= 0 && dj < V;
      if (ok) {
        const float lx = specdec::logit::nan_to_neg_inf(logits[(b * (G + 1) + j) * V + dj]);
        if (relaxed) {
          const float top = float_of_order(specdec::argmax_key_order(keys[j]));
          ok = specdec::logit::relaxed_accepts(ranks[j], top_beta, dj == key_to_token(keys[j], V),
                                               top, lx, tau);
        } else {
          ok = specdec::logit::bild_accepts(
              specdec::logit::logsumexp_of(merge_partials(partials[j])), lx, threshold);
        }
      }
      if (!ok) first_reject = j;
    }
    for (int64_t j = 0; j <= G; ++j) {
      out[b * (G + 1) + j] = j < first_reject ? drafts[b * G + j]
                             : (j == first_reject ? key_to_token(keys[first_reject], V) : -1);
    }
    accepted[b] = first_reject;
  }
  return {out, accepted};
}

std::vector<float> host_max_prob(const std::vector<float>& logits, int64_t R, int64_t V,
                                 int64_t chunk, int threads) {
  check_host(R >= 0 && V >= 1 && chunk >= 1 && threads >= 1, "bad sizes");
  check_host(logits.size() == static_cast<size_t>(R * V), "logits size");
  const int64_t splits = (V + chunk - 1) / chunk;
  std::vector<float> out(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    std::vector<MaxSum> partials;
    for (int64_t s = 0; s < splits; ++s) {
      partials.push_back(emulate_chunk(logits.data() + r * V, s * chunk,
                                       std::min(V, (s + 1) * chunk), threads, false, true, 0.0f, -1)
                             .max_sum);
    }
    // one split: the block's own result; several: the last block's ordered merge
    out[r] = specdec::logit::max_prob_of(splits == 1 ? partials[0] : merge_partials(partials));
  }
  return out;
}

const specdec::RegisterBindings registered([](py::module_& m) {
  m.def("logit_verify_workspace_bytes", &specdec::logit_verify_workspace_bytes, py::arg("B"),
        py::arg("G"), py::arg("V"),
        "Bytes of zeroed workspace relaxed_verify / bild_verify need on the current device "
        "(left zeroed after use).");
  m.def("relaxed_verify", &relaxed_verify, py::arg("logits"), py::arg("logits_stride_b"),
        py::arg("logits_stride_g"), py::arg("draft_tokens"), py::arg("num_draft_tokens"),
        py::arg("out_tokens"), py::arg("num_accepted"), py::arg("workspace"),
        py::arg("workspace_bytes"), py::arg("B"), py::arg("G"), py::arg("V"), py::arg("dtype"),
        py::arg("top_beta"), py::arg("tau"), py::arg("stream"),
        py::call_guard<py::gil_scoped_release>(),
        "SpecDec relaxed verification on `stream` (one kernel launch, no sync). tau is compared "
        "in float32. Pointers are device addresses; num_draft_tokens may be 0.");
  m.def("bild_verify", &bild_verify, py::arg("logits"), py::arg("logits_stride_b"),
        py::arg("logits_stride_g"), py::arg("draft_tokens"), py::arg("num_draft_tokens"),
        py::arg("out_tokens"), py::arg("num_accepted"), py::arg("workspace"),
        py::arg("workspace_bytes"), py::arg("B"), py::arg("G"), py::arg("V"), py::arg("dtype"),
        py::arg("rollback_threshold"), py::arg("stream"), py::call_guard<py::gil_scoped_release>(),
        "BiLD rollback verification on `stream` (one kernel launch, no sync). The threshold is "
        "compared in float32.");
  m.def("max_prob_workspace_bytes", &specdec::max_prob_workspace_bytes, py::arg("R"), py::arg("V"),
        "Bytes of zeroed workspace max_prob needs on the current device (0: none).");
  m.def("max_prob", &max_prob, py::arg("logits"), py::arg("row_stride"), py::arg("out"),
        py::arg("workspace"), py::arg("workspace_bytes"), py::arg("R"), py::arg("V"),
        py::arg("dtype"), py::arg("stream"), py::call_guard<py::gil_scoped_release>(),
        "Largest softmax probability of R rows (float32 out) on `stream` (one kernel launch).");
  m.def("host_logit_verify", &host_logit_verify, py::arg("mode"), py::arg("logits"),
        py::arg("drafts"), py::arg("counts"), py::arg("B"), py::arg("G"), py::arg("V"),
        py::arg("top_beta"), py::arg("tau"), py::arg("threshold"), py::arg("chunk"),
        py::arg("threads"),
        "CPU emulation of the relaxed/bild kernels' arithmetic and rule (testing only).");
  m.def("host_max_prob", &host_max_prob, py::arg("logits"), py::arg("R"), py::arg("V"),
        py::arg("chunk"), py::arg("threads"),
        "CPU emulation of the max_prob kernel's arithmetic (testing only).");
});

}  // namespace
