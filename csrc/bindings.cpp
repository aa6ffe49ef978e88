// pybind11 module `_C`: the only translation unit that sees Python. Built by
// the host compiler; it must not include torch headers and must not touch the
// GPU at import time (the wheel has to import on machines without a driver).
//
// Tensors cross the boundary as raw device addresses (tensor.data_ptr()) and
// the stream as an integer (torch.cuda.current_stream().cuda_stream).

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "ops.h"
#include "registry.h"

// Set by the build, e.g. -DSPECDEC_CUDA_ARCHS="\"80;90\"".
#ifndef SPECDEC_CUDA_ARCHS
#define SPECDEC_CUDA_ARCHS "unknown"
#endif

namespace py = pybind11;

namespace specdec {
// setup.py generates its definition (build/.../source_identity.cpp) from the csrc files it compiles.
const char* source_identity_json();
}  // namespace specdec

namespace {

std::vector<std::string> compiled_archs() {
  std::vector<std::string> archs;
  std::string current;
  for (const char c : std::string(SPECDEC_CUDA_ARCHS)) {
    if (c == ';' || c == ',' || c == ' ') {
      if (!current.empty()) archs.push_back(current);
      current.clear();
    } else {
      current.push_back(c);
    }
  }
  if (!current.empty()) archs.push_back(current);
  return archs;
}

// Without a driver/GPU cudaGetDeviceCount fails; report 0 and clear the
// (non-sticky) error so it does not leak into a later cudaGetLastError().
int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

// Version of the (statically linked) runtime; needs no driver.
int cuda_runtime_version() {
  int version = 0;
  if (cudaRuntimeGetVersion(&version) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return version;
}

void greedy_verify(uint64_t logits, int64_t logits_stride_b, int64_t logits_stride_g,
                   uint64_t draft_tokens, uint64_t num_draft_tokens, uint64_t out_tokens,
                   uint64_t num_accepted, uint64_t workspace, int64_t B, int64_t G, int64_t V,
                   int dtype, uint64_t stream) {
  specdec::launch_greedy_verify(specdec::device_ptr<const void>(logits), logits_stride_b, logits_stride_g,
                                specdec::device_ptr<const int64_t>(draft_tokens),
                                specdec::device_ptr<const int64_t>(num_draft_tokens),
                                specdec::device_ptr<int64_t>(out_tokens), specdec::device_ptr<int64_t>(num_accepted),
                                specdec::device_ptr<void>(workspace), B, G, V, dtype,
                                reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(stream)));
}

}  // namespace

std::vector<specdec::Binder>& specdec::binder_registry() {
  static std::vector<Binder> registry;
  return registry;
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "specdec_kernels CUDA kernels (raw-pointer API; use the Python wrappers)";

  m.attr("DTYPE_FLOAT32") = 0;
  m.attr("DTYPE_FLOAT16") = 1;
  m.attr("DTYPE_BFLOAT16") = 2;

  // The launch is asynchronous and short; drop the GIL anyway so other Python
  // threads are not held up by a slow first-call attribute query.
  m.def("greedy_verify", &greedy_verify, py::arg("logits"), py::arg("logits_stride_b"),
        py::arg("logits_stride_g"), py::arg("draft_tokens"), py::arg("num_draft_tokens"),
        py::arg("out_tokens"), py::arg("num_accepted"), py::arg("workspace"), py::arg("B"),
        py::arg("G"), py::arg("V"), py::arg("dtype"), py::arg("stream"),
        py::call_guard<py::gil_scoped_release>(),
        "Greedy draft verification on `stream` (one kernel launch, no sync). Pointers are "
        "device addresses; num_draft_tokens may be 0; workspace must be zeroed.");
  m.def("greedy_verify_workspace_bytes", &specdec::greedy_verify_workspace_bytes, py::arg("B"),
        py::arg("G"), "Bytes of zeroed workspace greedy_verify needs (left zeroed after use).");
  m.def("compiled_archs", &compiled_archs, "CUDA archs this module was compiled for.");
  m.def("cuda_runtime_version", &cuda_runtime_version,
        "cudaRuntimeGetVersion() of the linked runtime, e.g. 13000.");
  m.def("device_count", &device_count, "Number of visible CUDA devices; 0 without driver/GPU.");
  m.def("source_identity", [] { return std::string(specdec::source_identity_json()); },
        "JSON {\"csrc/<file>\": [code hash, [included csrc files]]} of the sources this module was built from "
        "(specdec_kernels/common/kernel_identity.py): what the CUDA kernels' fingerprints are made of.");

  for (const specdec::Binder bind : specdec::binder_registry()) bind(m);  // csrc/bind_*.cpp
}
