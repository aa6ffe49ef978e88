// Host builds of the device arithmetic in philox.cuh, for CPU-only tests: CI has
// no GPU, but it can still prove that the exact functions the CUDA kernels call
// reproduce common/rng.py and common/sampling.py bit for bit.

#include <pybind11/stl.h>

#include <stdexcept>
#include <vector>

#include "logit_math.cuh"
#include "philox.cuh"
#include "registry.h"

namespace py = pybind11;

namespace {

std::vector<double> host_philox_uniform(int64_t seed, const std::vector<int64_t>& position,
                                        const std::vector<int64_t>& row_key, uint32_t salt,
                                        const std::vector<int64_t>& extra) {
  if (row_key.size() != position.size() || extra.size() != position.size()) {
    throw std::invalid_argument("host_philox_uniform: position, row_key and extra need one length");
  }
  std::vector<double> out(position.size());
  for (size_t i = 0; i < position.size(); ++i) {
    out[i] = specdec::philox_uniform(seed, position[i], row_key[i], salt, extra[i]);
  }
  return out;
}

std::vector<int64_t> host_to_weights(const std::vector<float>& x) {
  std::vector<int64_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = specdec::to_weight(x[i]);
  return out;
}

std::vector<int64_t> host_draw_threshold(const std::vector<double>& u, const std::vector<int64_t>& total) {
  if (u.size() != total.size()) throw std::invalid_argument("host_draw_threshold: u and total need one length");
  std::vector<int64_t> out(u.size());
  for (size_t i = 0; i < u.size(); ++i) out[i] = specdec::draw_threshold(u[i], total[i]);
  return out;
}

// logit_math.cuh's softmax(x / T) of the logits sampling ops, host build (std::exp2 where the
// device runs ex2.approx): x / T as the kernels compute it, one row's statistics (M, S) from
// slots of `slot` values (1, 4 or 8: the fp32 / 16-bit vector widths) merged like the
// kernels' per-thread partials, and p = softmax_prob(x) from (M, S).
std::vector<float> host_scaled_logits(const std::vector<float>& x, float temperature) {
  const specdec::logit::TempScale ts = specdec::logit::temp_scale(temperature);
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = specdec::logit::div_mantissa(x[i], ts) * ts.scale;
  return out;
}

template <int N>
void add_slots(const std::vector<float>& x, const specdec::logit::TempScale& ts, float& m, float& s) {
  for (size_t i = 0; i < x.size(); i += N) {
    float z[N];
    for (int k = 0; k < N; ++k) {
      z[k] = i + k < x.size() ? specdec::logit::div_mantissa(x[i + k], ts) : -INFINITY;
    }
    specdec::logit::softmax_partial_add(m, s, z, ts.scale);
  }
}

py::tuple host_softmax_stats(const std::vector<float>& x, float temperature, int slot) {
  const specdec::logit::TempScale ts = specdec::logit::temp_scale(temperature);
  float m = -INFINITY, s = 0.0f;
  if (slot == 1) add_slots<1>(x, ts, m, s);
  else if (slot == 4) add_slots<4>(x, ts, m, s);
  else if (slot == 8) add_slots<8>(x, ts, m, s);
  else throw std::invalid_argument("host_softmax_stats: slot must be 1, 4 or 8");
  return py::make_tuple(m, s, specdec::logit::softmax_partial_bad(m, s));
}

std::vector<float> host_softmax_probs(const std::vector<float>& x, float temperature, float m, float s) {
  const specdec::logit::TempScale ts = specdec::logit::temp_scale(temperature);
  const float inv_s = 1.0f / s;
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = specdec::logit::softmax_prob(x[i], ts, m, inv_s);
  return out;
}

const specdec::RegisterBindings registered([](py::module_& m) {
  m.def("host_scaled_logits", &host_scaled_logits, py::arg("x"), py::arg("temperature"),
        "Host build of the logits sampling kernels' x / T (testing only).");
  m.def("host_softmax_stats", &host_softmax_stats, py::arg("x"), py::arg("temperature"), py::arg("slot"),
        "Host build of the logits sampling kernels' per-thread softmax statistics (m, s, bad) (testing only).");
  m.def("host_softmax_probs", &host_softmax_probs, py::arg("x"), py::arg("temperature"), py::arg("m"), py::arg("s"),
        "Host build of the logits sampling kernels' softmax-prob functor (testing only).");
  m.def("host_philox_uniform", &host_philox_uniform, py::arg("seed"), py::arg("position"),
        py::arg("row_key"), py::arg("salt"), py::arg("extra"),
        "Host build of the kernels' philox_uniform (testing only).");
  m.def("host_to_weights", &host_to_weights, py::arg("x"),
        "Host build of the kernels' fixed-point to_weight (testing only).");
  m.def("host_draw_threshold", &host_draw_threshold, py::arg("u"), py::arg("total"),
        "Host build of the kernels' draw_threshold (testing only).");
});

}  // namespace
