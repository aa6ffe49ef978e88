#pragma once
// Self-registration of pybind11 bindings: each csrc/bind_*.cpp adds the functions of
// one op family to the `_C` module with a file-scope
//
//   static const specdec::RegisterBindings registered([](pybind11::module_& m) { ... });
//
// so new kernels never edit a shared bindings file. Registration runs when the
// shared object is loaded, before PyInit__C walks the list (bindings.cpp).

#include <pybind11/pybind11.h>

#include <cstdint>
#include <vector>

namespace specdec {

using Binder = void (*)(pybind11::module_&);

// The list lives in a function-local static, so it exists before any file's
// static initialiser uses it, whatever the link order.
std::vector<Binder>& binder_registry();

struct RegisterBindings {
  explicit RegisterBindings(Binder binder) { binder_registry().push_back(binder); }
};

// A device address passed from Python (tensor.data_ptr()) as a typed pointer.
template <typename T>
T* device_ptr(uint64_t address) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(address));
}

}  // namespace specdec
