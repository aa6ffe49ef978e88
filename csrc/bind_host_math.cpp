// Host builds of the device arithmetic in philox.cuh, for CPU-only tests: CI has
// no GPU, but it can still prove that the exact functions the CUDA kernels call
// reproduce common/rng.py and common/sampling.py bit for bit.

#include <pybind11/stl.h>

#include <stdexcept>
#include <vector>

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

const specdec::RegisterBindings registered([](py::module_& m) {
  m.def("host_philox_uniform", &host_philox_uniform, py::arg("seed"), py::arg("position"),
        py::arg("row_key"), py::arg("salt"), py::arg("extra"),
        "Host build of the kernels' philox_uniform (testing only).");
  m.def("host_to_weights", &host_to_weights, py::arg("x"),
        "Host build of the kernels' fixed-point to_weight (testing only).");
  m.def("host_draw_threshold", &host_draw_threshold, py::arg("u"), py::arg("total"),
        "Host build of the kernels' draw_threshold (testing only).");
});

}  // namespace
