// pybind11 binding of the kv_compact launcher (csrc/kv_cache.cu); contract in
// kv_cache.h. Tensors cross as device addresses (tensor.data_ptr()), strides
// and steps in elements, the stream as an integer; table 0 selects the fast path.

#include <pybind11/stl.h>

#include <array>
#include <cstdint>

#include "kv_cache.h"
#include "registry.h"

namespace py = pybind11;

namespace {

void kv_compact(uint64_t k_base, uint64_t v_base, int64_t k_step, int64_t v_step,
                const std::array<int64_t, 3>& k_strides, const std::array<int64_t, 3>& v_strides,
                uint64_t table, int64_t num_layers, int64_t heads, int64_t seq_capacity, int64_t head_dim,
                int64_t elem_size, int64_t vector_bytes, uint64_t seq_lens, bool seq_lens_int32,
                int64_t seq_lens_stride, uint64_t accepted, int64_t accepted_stride_b, int64_t accepted_stride_m,
                uint64_t new_lens, int64_t B, int64_t M, uint64_t stream) {
  using specdec::device_ptr;
  specdec::KvCacheSet caches{};
  caches.k_base = device_ptr<void>(k_base);
  caches.v_base = device_ptr<void>(v_base);
  caches.k_step = k_step;
  caches.v_step = v_step;
  for (int i = 0; i < 3; ++i) {
    caches.k_stride[i] = k_strides[i];
    caches.v_stride[i] = v_strides[i];
  }
  caches.table = device_ptr<const int64_t>(table);
  caches.num_layers = num_layers;
  caches.heads = heads;
  caches.seq_capacity = seq_capacity;
  caches.head_dim = head_dim;
  caches.elem_size = elem_size;
  caches.vector_bytes = vector_bytes;
  specdec::launch_kv_compact(caches, device_ptr<const void>(seq_lens), seq_lens_int32, seq_lens_stride,
                             device_ptr<const int64_t>(accepted), accepted_stride_b, accepted_stride_m,
                             device_ptr<void>(new_lens), B, M,
                             reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(stream)));
}

const specdec::RegisterBindings registered([](py::module_& m) {
  m.def("kv_compact", &kv_compact, py::arg("k_base"), py::arg("v_base"), py::arg("k_step"), py::arg("v_step"),
        py::arg("k_strides"), py::arg("v_strides"), py::arg("table"), py::arg("num_layers"), py::arg("heads"),
        py::arg("seq_capacity"), py::arg("head_dim"), py::arg("elem_size"), py::arg("vector_bytes"),
        py::arg("seq_lens"), py::arg("seq_lens_int32"), py::arg("seq_lens_stride"), py::arg("accepted"),
        py::arg("accepted_stride_b"), py::arg("accepted_stride_m"), py::arg("new_lens"), py::arg("B"),
        py::arg("M"), py::arg("stream"), py::call_guard<py::gil_scoped_release>(),
        "Move accepted tree nodes' K/V into place in every layer's caches on `stream` (one kernel launch, "
        "no sync, in place). table = 0: fast path (K layer l at k_base + l * k_step elements, strides "
        "k_strides; V likewise); else a device [2L, 4] int64 table of (address, stride_b, stride_h, "
        "stride_s). Writes new_lens = seq_lens + valid entries.");
});

}  // namespace
