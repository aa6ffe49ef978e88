// pybind11 bindings of the speculative-sampling launchers (csrc/rejection_sampling.cu).
// Tensors cross as device addresses (tensor.data_ptr(), 0 for an absent optional
// input) and the stream as an integer; see rejection_sampling.h for the contract.

#include <cstdint>

#include "registry.h"
#include "rejection_sampling.h"

namespace py = pybind11;

namespace {

cudaStream_t as_stream(uint64_t stream) { return reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(stream)); }

void rejection_sample(uint64_t target_probs, int64_t target_stride_b, int64_t target_stride_g, uint64_t draft_probs,
                      int64_t draft_stride_b, int64_t draft_stride_g, uint64_t draft_tokens,
                      uint64_t num_draft_tokens, uint64_t uniforms, bool uniforms_float64, int64_t seed,
                      uint64_t seeds, uint64_t offsets, uint64_t out_tokens, uint64_t num_accepted,
                      uint64_t draft_passes, uint64_t workspace, int64_t B, int64_t G, int64_t V, int dtype,
                      uint64_t stream) {
  using specdec::device_ptr;
  specdec::launch_rejection_sample(
      device_ptr<const void>(target_probs), target_stride_b, target_stride_g, device_ptr<const void>(draft_probs),
      draft_stride_b, draft_stride_g, device_ptr<const int64_t>(draft_tokens),
      device_ptr<const int64_t>(num_draft_tokens), device_ptr<const void>(uniforms), uniforms_float64, seed,
      device_ptr<const int64_t>(seeds), device_ptr<const int64_t>(offsets), device_ptr<int64_t>(out_tokens),
      device_ptr<int64_t>(num_accepted), device_ptr<bool>(draft_passes), device_ptr<void>(workspace), B, G, V, dtype,
      as_stream(stream));
}

void rejection_sample_logits(uint64_t target_logits, int64_t target_stride_b, int64_t target_stride_g,
                             uint64_t draft_logits, int64_t draft_stride_b, int64_t draft_stride_g,
                             uint64_t draft_tokens, uint64_t num_draft_tokens, float temperature,
                             uint64_t temperatures, uint64_t uniforms, bool uniforms_float64, int64_t seed,
                             uint64_t seeds, uint64_t offsets, uint64_t out_tokens, uint64_t num_accepted,
                             uint64_t workspace, int64_t B, int64_t G, int64_t V, int dtype, uint64_t stream) {
  using specdec::device_ptr;
  specdec::launch_rejection_sample_logits(
      device_ptr<const void>(target_logits), target_stride_b, target_stride_g, device_ptr<const void>(draft_logits),
      draft_stride_b, draft_stride_g, device_ptr<const int64_t>(draft_tokens),
      device_ptr<const int64_t>(num_draft_tokens), temperature, device_ptr<const float>(temperatures),
      device_ptr<const void>(uniforms), uniforms_float64, seed, device_ptr<const int64_t>(seeds),
      device_ptr<const int64_t>(offsets), device_ptr<int64_t>(out_tokens), device_ptr<int64_t>(num_accepted),
      device_ptr<void>(workspace), B, G, V, dtype, as_stream(stream));
}

const specdec::RegisterBindings registered([](py::module_& m) {
  m.def("rejection_sample", &rejection_sample, py::arg("target_probs"), py::arg("target_stride_b"),
        py::arg("target_stride_g"), py::arg("draft_probs"), py::arg("draft_stride_b"), py::arg("draft_stride_g"),
        py::arg("draft_tokens"), py::arg("num_draft_tokens"), py::arg("uniforms"), py::arg("uniforms_float64"),
        py::arg("seed"), py::arg("seeds"), py::arg("offsets"), py::arg("out_tokens"), py::arg("num_accepted"),
        py::arg("draft_passes"), py::arg("workspace"), py::arg("B"), py::arg("G"), py::arg("V"), py::arg("dtype"),
        py::arg("stream"), py::call_guard<py::gil_scoped_release>(),
        "Speculative sampling of chain drafts on `stream` (one kernel launch, no sync). Pointers are device "
        "addresses (0 = absent); randomness: uniforms if nonzero, else per-row seeds if nonzero, else `seed`; "
        "draft_passes: bool [B, G] address (0 = not written) of every draft's own test; "
        "workspace: rejection_sample_workspace_bytes(B, G, V) zeroed bytes, left zeroed.");
  m.def("rejection_sample_workspace_bytes", &specdec::rejection_sample_workspace_bytes, py::arg("B"), py::arg("G"),
        py::arg("V"), "Bytes of zeroed workspace rejection_sample needs (left zeroed after use).");
  m.def("rejection_sample_logits", &rejection_sample_logits, py::arg("target_logits"), py::arg("target_stride_b"),
        py::arg("target_stride_g"), py::arg("draft_logits"), py::arg("draft_stride_b"), py::arg("draft_stride_g"),
        py::arg("draft_tokens"), py::arg("num_draft_tokens"), py::arg("temperature"), py::arg("temperatures"),
        py::arg("uniforms"), py::arg("uniforms_float64"), py::arg("seed"), py::arg("seeds"), py::arg("offsets"),
        py::arg("out_tokens"), py::arg("num_accepted"), py::arg("workspace"), py::arg("B"), py::arg("G"),
        py::arg("V"), py::arg("dtype"), py::arg("stream"), py::call_guard<py::gil_scoped_release>(),
        "rejection_sample on softmax(logits / T) without materialising it (two launches: softmax statistics, "
        "then sampling; no sync); temperatures: float32 [B] address or 0 for the scalar `temperature`.");
  m.def("rejection_sample_logits_workspace_bytes", &specdec::rejection_sample_logits_workspace_bytes,
        py::arg("B"), py::arg("G"), py::arg("V"),
        "Bytes of zeroed workspace rejection_sample_logits needs (left zeroed after use).");
});

}  // namespace
