// pybind11 bindings of the block-verification launchers (csrc/block_verification.cu) and host builds
// of their arithmetic (block_verification_math.cuh) for CPU-only tests. Tensors cross as device
// addresses (tensor.data_ptr(), 0 for an absent optional input), the stream as an integer;
// see block_verification.h for the contract.

#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "block_verification.h"
#include "block_verification_math.cuh"
#include "launch_plan.h"
#include "philox.cuh"
#include "registry.h"

namespace py = pybind11;

namespace {

cudaStream_t as_stream(uint64_t stream) { return reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(stream)); }

specdec::BlockIndex index_of(uint64_t data, bool is_int64, int64_t stride0, int64_t stride1) {
  return specdec::BlockIndex{specdec::device_ptr<const void>(data), is_int64, stride0, stride1};
}

specdec::BlockRandomness randomness_of(uint64_t uniforms, bool uniforms_float64, int64_t u_stride_b,
                                       int64_t u_stride_g, int64_t seed, uint64_t seeds, bool seeds_int64,
                                       int64_t seeds_stride, uint64_t offsets, bool offsets_int64,
                                       int64_t offsets_stride) {
  return specdec::BlockRandomness{specdec::device_ptr<const void>(uniforms), uniforms_float64, u_stride_b, u_stride_g,
                                  seed, index_of(seeds, seeds_int64, seeds_stride, 0),
                                  index_of(offsets, offsets_int64, offsets_stride, 0)};
}

void block_verify(uint64_t target_probs, int64_t target_stride_b, int64_t target_stride_g, uint64_t draft_probs,
                  int64_t draft_stride_b, int64_t draft_stride_g, uint64_t draft_tokens, bool draft_tokens_int64,
                  int64_t draft_tokens_stride_b, int64_t draft_tokens_stride_g, uint64_t num_draft_tokens,
                  bool num_draft_tokens_int64, int64_t num_draft_tokens_stride, uint64_t uniforms,
                  bool uniforms_float64, int64_t uniforms_stride_b, int64_t uniforms_stride_g, int64_t seed,
                  uint64_t seeds, bool seeds_int64, int64_t seeds_stride, uint64_t offsets, bool offsets_int64,
                  int64_t offsets_stride, uint64_t out_tokens, uint64_t num_accepted, uint64_t workspace, int64_t B,
                  int64_t G, int64_t V, int dtype, uint64_t stream) {
  using specdec::device_ptr;
  specdec::launch_block_verify(
      device_ptr<const void>(target_probs), target_stride_b, target_stride_g, device_ptr<const void>(draft_probs),
      draft_stride_b, draft_stride_g,
      index_of(draft_tokens, draft_tokens_int64, draft_tokens_stride_b, draft_tokens_stride_g),
      index_of(num_draft_tokens, num_draft_tokens_int64, num_draft_tokens_stride, 0),
      randomness_of(uniforms, uniforms_float64, uniforms_stride_b, uniforms_stride_g, seed, seeds, seeds_int64,
                    seeds_stride, offsets, offsets_int64, offsets_stride),
      device_ptr<int64_t>(out_tokens), device_ptr<int64_t>(num_accepted), device_ptr<void>(workspace), B, G, V,
      dtype, as_stream(stream));
}

void block_verify_logits(uint64_t target_logits, int64_t target_stride_b, int64_t target_stride_g,
                         uint64_t draft_logits, int64_t draft_stride_b, int64_t draft_stride_g, uint64_t draft_tokens,
                         bool draft_tokens_int64, int64_t draft_tokens_stride_b, int64_t draft_tokens_stride_g,
                         uint64_t num_draft_tokens, bool num_draft_tokens_int64, int64_t num_draft_tokens_stride,
                         float temperature, uint64_t temperatures, int64_t temperatures_stride, uint64_t uniforms,
                         bool uniforms_float64, int64_t uniforms_stride_b, int64_t uniforms_stride_g, int64_t seed,
                         uint64_t seeds, bool seeds_int64, int64_t seeds_stride, uint64_t offsets,
                         bool offsets_int64, int64_t offsets_stride, uint64_t out_tokens, uint64_t num_accepted,
                         uint64_t workspace, int64_t B, int64_t G, int64_t V, int dtype, uint64_t stream) {
  using specdec::device_ptr;
  specdec::launch_block_verify_logits(
      device_ptr<const void>(target_logits), target_stride_b, target_stride_g, device_ptr<const void>(draft_logits),
      draft_stride_b, draft_stride_g,
      index_of(draft_tokens, draft_tokens_int64, draft_tokens_stride_b, draft_tokens_stride_g),
      index_of(num_draft_tokens, num_draft_tokens_int64, num_draft_tokens_stride, 0), temperature,
      device_ptr<const float>(temperatures), temperatures_stride,
      randomness_of(uniforms, uniforms_float64, uniforms_stride_b, uniforms_stride_g, seed, seeds, seeds_int64,
                    seeds_stride, offsets, offsets_int64, offsets_stride),
      device_ptr<int64_t>(out_tokens), device_ptr<int64_t>(num_accepted), device_ptr<void>(workspace), B, G, V,
      dtype, as_stream(stream));
}

// ---------------------------------------------------------------------------------------
// Host builds (testing only)
// ---------------------------------------------------------------------------------------

// p_0..p_g from the drafts' (P(X_i), Q(X_i), valid_i), i = 1..g.
std::vector<float> host_block_prefix_ratios(const std::vector<float>& p, const std::vector<float>& q,
                                            const std::vector<bool>& valid) {
  if (q.size() != p.size() || valid.size() != p.size()) {
    throw std::invalid_argument("host_block_prefix_ratios: p, q and valid need one length");
  }
  std::vector<float> out{1.0f};
  for (size_t i = 0; i < p.size(); ++i) out.push_back(specdec::block::prefix_ratio_step(out.back(), p[i], q[i], valid[i]));
  return out;
}

std::vector<int64_t> host_block_residual_weights(float scale, const std::vector<float>& p, const std::vector<float>& q) {
  if (q.size() != p.size()) throw std::invalid_argument("host_block_residual_weights: p and q need one length");
  std::vector<int64_t> out(p.size());
  for (size_t i = 0; i < p.size(); ++i) out[i] = specdec::block::residual_weight(scale, p[i], q[i]);
  return out;
}

// h_1..h_g of a row with n drafts: ratios p_0..p_g, totals[j] = the int64 weight sum of Z(j), j = 0..g-1.
std::vector<double> host_block_thresholds(const std::vector<float>& ratios, const std::vector<int64_t>& totals,
                                          int n) {
  if (ratios.size() != totals.size() + 1) {
    throw std::invalid_argument("host_block_thresholds: need g + 1 ratios and g totals");
  }
  std::vector<double> h(totals.size());
  for (size_t i = 1; i <= totals.size(); ++i) {
    const int64_t z = i < totals.size() ? totals[i] : 0;
    h[i - 1] = specdec::block::acceptance_threshold(static_cast<int>(i), n, z, ratios[i]);
  }
  return h;
}

// tau = the largest i in 1..g with eta_i < h_i and p_i > 0 (0 if none); ratios are p_0..p_g.
int host_block_tau(const std::vector<double>& h, const std::vector<double>& eta, const std::vector<float>& ratios) {
  if (eta.size() != h.size()) throw std::invalid_argument("host_block_tau: h and eta need one length");
  if (ratios.size() != h.size() + 1) throw std::invalid_argument("host_block_tau: ratios needs g + 1 entries");
  int tau = 0;
  for (size_t i = 0; i < h.size(); ++i) {
    if (specdec::block::block_passes(eta[i], h[i], ratios[i + 1])) tau = std::max(tau, static_cast<int>(i) + 1);
  }
  return tau;
}

// The whole probability kernel, step by step as a grid of (b, j, split) blocks would run it, on
// float32 rows (fp16/bf16 widen exactly) with caller uniforms [B][G+1] and ragged counts.
// target [B][G+1][V], draft [B][G][V] flattened; tokens [B][G] (any int64 ids).
std::tuple<std::vector<int64_t>, std::vector<int64_t>> host_block_verify(
    const std::vector<float>& target, const std::vector<float>& draft, const std::vector<int64_t>& tokens,
    const std::vector<int64_t>& counts, const std::vector<double>& uniforms, int64_t B, int64_t G, int64_t V,
    int64_t chunk) {
  if (B < 0 || G < 0 || V < 1 || chunk < 1 || static_cast<int64_t>(target.size()) != B * (G + 1) * V ||
      static_cast<int64_t>(draft.size()) != B * G * V || static_cast<int64_t>(tokens.size()) != B * G ||
      static_cast<int64_t>(uniforms.size()) != B * (G + 1) || (!counts.empty() && static_cast<int64_t>(counts.size()) != B)) {
    throw std::invalid_argument("host_block_verify: inconsistent sizes");
  }
  const int64_t splits = (V + chunk - 1) / chunk;
  std::vector<int64_t> out(B * (G + 1), -1), accepted(B, 0);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = counts.empty() ? G : std::clamp<int64_t>(counts[b], 0, G);
    auto P = [&](int64_t j, int64_t x) { return target[(b * (G + 1) + j) * V + x]; };
    auto Q = [&](int64_t j, int64_t x) { return draft[(b * G + j) * V + x]; };
    // blocks (b, j, s), j <= n: p_j, then chunk totals
    std::vector<float> ratios(n + 1);
    std::vector<std::vector<std::pair<int64_t, int64_t>>> totals(n + 1, std::vector<std::pair<int64_t, int64_t>>(splits));
    for (int64_t j = 0; j <= n; ++j) {
      float p_j = 1.0f;
      for (int64_t k = 0; k < j; ++k) {
        const int64_t t = tokens[b * G + k];
        const bool ok = k < n && t >= 0 && t < V;
        p_j = specdec::block::prefix_ratio_step(p_j, ok ? P(k, t) : 0.0f, ok ? Q(k, t) : 0.0f, ok);
      }
      ratios[j] = p_j;
      for (int64_t s = 0; s < splits; ++s) {
        int64_t r = 0, pl = 0;
        for (int64_t x = s * chunk; x < std::min(V, (s + 1) * chunk); ++x) {
          pl += specdec::to_weight(P(j, x));
          if (j < n) r += specdec::block::residual_weight(p_j, P(j, x), Q(j, x));
        }
        totals[j][s] = {r, pl};
      }
    }
    // the last block: tau
    int64_t tau = 0;
    for (int64_t i = 1; i <= n; ++i) {
      int64_t z = 0;
      if (i < n) for (int64_t s = 0; s < splits; ++s) z += totals[i][s].first;
      const double h = specdec::block::acceptance_threshold(static_cast<int>(i), static_cast<int>(n), z, ratios[i]);
      if (specdec::block::block_passes(uniforms[b * (G + 1) + i - 1], h, ratios[i])) tau = std::max(tau, i);
    }
    const float p_tau = tau == 0 ? 1.0f : ratios[tau];
    int64_t total_r = 0, total_p = 0;
    for (int64_t s = 0; s < splits; ++s) {
      total_r += totals[tau][s].first;
      total_p += totals[tau][s].second;
    }
    const bool use_r = tau < n && total_r > 0;
    const int64_t total = use_r ? total_r : total_p;
    int64_t token = 0;
    if (total > 0) {
      const int64_t threshold = specdec::draw_threshold(uniforms[b * (G + 1) + G], total);
      int64_t carry = 0, c = -1;
      for (int64_t s = 0; s < splits && c < 0; ++s) {
        const int64_t v = use_r ? totals[tau][s].first : totals[tau][s].second;
        if (carry <= threshold && threshold < carry + v) c = s; else carry += v;
      }
      token = V - 1;
      if (c >= 0) {
        for (int64_t x = c * chunk; x < std::min(V, (c + 1) * chunk); ++x) {
          carry += use_r ? specdec::block::residual_weight(p_tau, P(tau, x), Q(tau, x)) : specdec::to_weight(P(tau, x));
          if (carry > threshold) {
            token = x;
            break;
          }
        }
      }
    }
    for (int64_t k = 0; k <= G; ++k) {
      out[b * (G + 1) + k] = k < tau ? tokens[b * G + k] : (k == tau ? token : -1);
    }
    accepted[b] = tau;
  }
  return {out, accepted};
}

const specdec::RegisterBindings registered([](py::module_& m) {
  m.def("block_verify", &block_verify, py::arg("target_probs"), py::arg("target_stride_b"),
        py::arg("target_stride_g"), py::arg("draft_probs"), py::arg("draft_stride_b"), py::arg("draft_stride_g"),
        py::arg("draft_tokens"), py::arg("draft_tokens_int64"), py::arg("draft_tokens_stride_b"),
        py::arg("draft_tokens_stride_g"), py::arg("num_draft_tokens"), py::arg("num_draft_tokens_int64"),
        py::arg("num_draft_tokens_stride"), py::arg("uniforms"), py::arg("uniforms_float64"),
        py::arg("uniforms_stride_b"), py::arg("uniforms_stride_g"), py::arg("seed"), py::arg("seeds"),
        py::arg("seeds_int64"), py::arg("seeds_stride"), py::arg("offsets"), py::arg("offsets_int64"),
        py::arg("offsets_stride"), py::arg("out_tokens"), py::arg("num_accepted"), py::arg("workspace"),
        py::arg("B"), py::arg("G"), py::arg("V"), py::arg("dtype"), py::arg("stream"),
        py::call_guard<py::gil_scoped_release>(),
        "Block verification of chain drafts on `stream` (one kernel launch, no sync). Pointers are device "
        "addresses (0 = absent); index tensors int32 or int64 with element strides; randomness: uniforms if "
        "nonzero, else per-row seeds if nonzero, else `seed`; workspace: block_verify_workspace_bytes(B, G, V) "
        "zeroed bytes, left zeroed.");
  m.def("block_verify_workspace_bytes", &specdec::block_verify_workspace_bytes, py::arg("B"), py::arg("G"),
        py::arg("V"), "Bytes of zeroed workspace block_verify needs (left zeroed after use; independent of V).");
  m.def("block_verify_logits", &block_verify_logits, py::arg("target_logits"), py::arg("target_stride_b"),
        py::arg("target_stride_g"), py::arg("draft_logits"), py::arg("draft_stride_b"), py::arg("draft_stride_g"),
        py::arg("draft_tokens"), py::arg("draft_tokens_int64"), py::arg("draft_tokens_stride_b"),
        py::arg("draft_tokens_stride_g"), py::arg("num_draft_tokens"), py::arg("num_draft_tokens_int64"),
        py::arg("num_draft_tokens_stride"), py::arg("temperature"), py::arg("temperatures"),
        py::arg("temperatures_stride"), py::arg("uniforms"), py::arg("uniforms_float64"),
        py::arg("uniforms_stride_b"), py::arg("uniforms_stride_g"), py::arg("seed"), py::arg("seeds"),
        py::arg("seeds_int64"), py::arg("seeds_stride"), py::arg("offsets"), py::arg("offsets_int64"),
        py::arg("offsets_stride"), py::arg("out_tokens"), py::arg("num_accepted"), py::arg("workspace"),
        py::arg("B"), py::arg("G"), py::arg("V"), py::arg("dtype"), py::arg("stream"),
        py::call_guard<py::gil_scoped_release>(),
        "block_verify on softmax(logits / T) without materialising it (two launches, no sync); temperatures: "
        "float32 [B] address (with its element stride) or 0 for the scalar `temperature`.");
  m.def("block_verify_logits_workspace_bytes", &specdec::block_verify_logits_workspace_bytes, py::arg("B"),
        py::arg("G"), py::arg("V"), "Bytes of zeroed workspace block_verify_logits needs (left zeroed after use).");
  m.def("host_block_prefix_ratios", &host_block_prefix_ratios, py::arg("p"), py::arg("q"), py::arg("valid"),
        "Host build of the kernels' prefix-ratio scan: p_0..p_g (testing only).");
  m.def("host_block_residual_weights", &host_block_residual_weights, py::arg("scale"), py::arg("p"), py::arg("q"),
        "Host build of the kernels' residual weights floor(clamp(scale*p - q, 0, 1) * 2^40) (testing only).");
  m.def("host_block_thresholds", &host_block_thresholds, py::arg("ratios"), py::arg("totals"), py::arg("n"),
        "Host build of the kernels' thresholds h_1..h_g (testing only).");
  m.def("host_block_tau", &host_block_tau, py::arg("h"), py::arg("eta"), py::arg("ratios"),
        "Host build of the kernels' tau = max{i : eta_i < h_i, p_i > 0} (testing only).");
  m.def("host_block_verify", &host_block_verify, py::arg("target"), py::arg("draft"), py::arg("tokens"),
        py::arg("counts"), py::arg("uniforms"), py::arg("B"), py::arg("G"), py::arg("V"), py::arg("chunk"),
        "Host emulation of block_verify_kernel's steps with caller uniforms and V-chunks of `chunk` "
        "(testing only): (out_tokens [B*(G+1)], num_accepted [B]).");
});

}  // namespace
