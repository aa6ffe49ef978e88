// pybind11 bindings of the launch plans (launch_plan.h): the functions the launchers
// launch, callable from Python on the sm_80 / sm_90 limit tables (CPU tests, no GPU
// touched) or on the current device's limits (the CUDA backends' `limits`, so that
// backend="auto" routes a shape the kernels cannot serve elsewhere). Importing the
// module touches no GPU: only the device_* functions query the current device.

#include <pybind11/stl.h>

#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "launch_plan.h"
#include "launch_utils.h"
#include "registry.h"

namespace py = pybind11;
namespace plans = specdec::plans;

namespace {

// sizes[key] as an int; a missing key names itself.
int64_t need(const std::string& kernel, const py::dict& sizes, const char* key) {
  if (!sizes.contains(key)) {
    throw std::invalid_argument("launch_plan(" + kernel + "): sizes needs '" + key + "'");
  }
  return sizes[key].cast<int64_t>();
}

int64_t optional(const py::dict& sizes, const char* key, int64_t fallback) {
  return sizes.contains(key) && !sizes[key].is_none() ? sizes[key].cast<int64_t>() : fallback;
}

using Planner = std::function<plans::Plan(const std::string&, const py::dict&, const plans::DeviceLimits&)>;

// One entry per plan name: which sizes it reads. "dtype" is the csrc/common.cuh code.
const std::map<std::string, Planner>& planners() {
  static const std::map<std::string, Planner> table = {
      {"greedy_verify",
       [](const std::string& n, const py::dict& s, const plans::DeviceLimits& lim) {
         return plans::plan_greedy_verify(need(n, s, "B"), need(n, s, "G"), need(n, s, "V"), lim);
       }},
      {"logit_verify",  // relaxed_verify and bild_verify
       [](const std::string& n, const py::dict& s, const plans::DeviceLimits& lim) {
         return plans::plan_logit_verify(need(n, s, "B"), need(n, s, "G"), need(n, s, "V"), lim);
       }},
      {"max_prob",
       [](const std::string& n, const py::dict& s, const plans::DeviceLimits& lim) {
         return plans::plan_max_prob(need(n, s, "R"), need(n, s, "V"), lim);
       }},
      {"tree_greedy_verify",
       [](const std::string& n, const py::dict& s, const plans::DeviceLimits& lim) {
         return plans::plan_tree_greedy_verify(need(n, s, "B"), need(n, s, "N"), need(n, s, "V"), lim);
       }},
      {"rejection_sample",
       [](const std::string& n, const py::dict& s, const plans::DeviceLimits& lim) {
         return plans::plan_rejection_sample(need(n, s, "B"), need(n, s, "G"), need(n, s, "V"), lim);
       }},
      {"rejection_sample_logits",
       [](const std::string& n, const py::dict& s, const plans::DeviceLimits& lim) {
         return plans::plan_rejection_sample_logits(need(n, s, "B"), need(n, s, "G"), need(n, s, "V"), lim);
       }},
      {"block_verify",
       [](const std::string& n, const py::dict& s, const plans::DeviceLimits& lim) {
         return plans::plan_block_verify(need(n, s, "B"), need(n, s, "G"), need(n, s, "V"), lim);
       }},
      {"block_verify_logits",
       [](const std::string& n, const py::dict& s, const plans::DeviceLimits& lim) {
         return plans::plan_block_verify_logits(need(n, s, "B"), need(n, s, "G"), need(n, s, "V"), lim);
       }},
      {"tree_rejection_sample",  // code_arch and active[C] (a list of 17) stand in for a device's cluster facts
       [](const std::string& n, const py::dict& s, const plans::DeviceLimits& lim) {
         plans::ClusterFacts facts = plans::nominal_cluster_facts(lim);
         facts.code_arch = static_cast<int>(optional(s, "code_arch", facts.code_arch));
         if (s.contains("active")) {
           const auto active = s["active"].cast<std::vector<int>>();
           if (active.size() != plans::kTreeRejectionMaxCluster + 1) {
             throw std::invalid_argument("launch_plan(" + n + "): active needs 17 counts (cluster sizes 0..16)");
           }
           for (int c = 0; c <= plans::kTreeRejectionMaxCluster; ++c) facts.active[c] = active[c];
         }
         return plans::plan_tree_rejection_sample(need(n, s, "B"), need(n, s, "N"), need(n, s, "V"), lim,
                                                  static_cast<int>(optional(s, "form", 0)), &facts);
       }},
      {"kv_compact",  // vector_bytes: the widest access the caches allow (2, the worst case, if absent)
       [](const std::string& n, const py::dict& s, const plans::DeviceLimits& lim) {
         return plans::plan_kv_compact(need(n, s, "B"), need(n, s, "L"), optional(s, "Hkv", 0), optional(s, "S_max", 0),
                                       optional(s, "D", 0), optional(s, "elem_size", 2), optional(s, "vector_bytes", 2),
                                       lim);
       }},
      {"early_exit_topk",
       [](const std::string& n, const py::dict& s, const plans::DeviceLimits& lim) {
         // dtype (0 if absent: the SIMT path) and aligned (1 if absent) choose the tensor-core path
         return plans::plan_early_exit_topk(need(n, s, "B"), need(n, s, "H"), need(n, s, "V"), need(n, s, "k"), lim,
                                            0, static_cast<int>(optional(s, "dtype", 0)),
                                            optional(s, "aligned", 1) != 0);
       }},
      {"tree_attention",
       [](const std::string& n, const py::dict& s, const plans::DeviceLimits& lim) {
         return plans::plan_tree_attention(need(n, s, "B"), need(n, s, "N"), need(n, s, "Hq"), need(n, s, "Hkv"),
                                           need(n, s, "D"), need(n, s, "capacity"),
                                           static_cast<int>(need(n, s, "dtype")), lim);
       }},
  };
  return table;
}

py::dict to_dict(const plans::Plan& plan) {
  py::dict out;
  out["refusal"] = plan.ok() ? py::object(py::none()) : py::object(py::str(plan.refusal));
  py::list launches;
  for (const plans::Launch& l : plan.launches) {
    py::dict d;
    d["kernel"] = l.kernel;
    d["grid"] = py::make_tuple(l.grid[0], l.grid[1], l.grid[2]);
    d["block"] = l.block;
    d["static_smem"] = l.static_smem;
    d["dynamic_smem"] = l.dynamic_smem;
    d["opt_in"] = l.opt_in;
    launches.append(d);
  }
  out["launches"] = launches;
  for (const auto& [key, value] : plan.values) out[py::str(key)] = value;
  return out;
}

py::dict limits_dict(const plans::DeviceLimits& lim) {
  py::dict d;
  d["arch"] = lim.arch;
  d["sms"] = lim.sms;
  d["smem_per_block"] = lim.smem_per_block;
  d["smem_per_block_optin"] = lim.smem_per_block_optin;
  d["smem_per_sm"] = lim.smem_per_sm;
  d["reserved_smem_per_block"] = lim.reserved_smem_per_block;
  d["regs_per_sm"] = lim.regs_per_sm;
  d["regs_per_block"] = lim.regs_per_block;
  d["threads_per_block"] = lim.threads_per_block;
  d["threads_per_sm"] = lim.threads_per_sm;
  d["grid_x"] = lim.grid_x;
  d["grid_yz"] = lim.grid_yz;
  return d;
}

py::dict plan_with(const std::string& kernel, const py::dict& sizes, const plans::DeviceLimits& lim) {
  const auto& table = planners();
  const auto it = table.find(kernel);
  if (it == table.end()) {
    std::string names;
    for (const auto& [name, _] : table) names += (names.empty() ? "" : ", ") + name;
    throw std::invalid_argument("launch_plan: kernel must be one of " + names + " (got '" + kernel + "')");
  }
  return to_dict(it->second(kernel, sizes, lim));
}

const specdec::RegisterBindings registered([](py::module_& m) {
  m.def(
      "launch_plan",
      [](const std::string& kernel, const py::dict& sizes, int arch) {
        return plan_with(kernel, sizes, plans::arch_limits(arch));
      },
      py::arg("kernel"), py::arg("sizes"), py::arg("arch"),
      "The launch plan the CUDA launcher of `kernel` would run for `sizes` on a GPU of `arch` (80 or 90): "
      "{'refusal': None or why, 'launches': [{kernel, grid, block, static_smem, dynamic_smem, opt_in}], ...}. "
      "Touches no GPU.");
  m.def("runnable_code_arch", &plans::runnable_code_arch, py::arg("device_arch"), py::arg("built"),
        "The virtual arch of the code a device of `device_arch` runs from a module built for `built` (e.g. "
        "['80', '90']: SASS for each, PTX of the highest); 0 where it has none.");
  m.def("nominal_cluster_facts", [](int arch) {
    const plans::ClusterFacts facts = plans::nominal_cluster_facts(plans::arch_limits(arch));
    py::dict d;
    d["code_arch"] = facts.code_arch;
    d["active"] = std::vector<int>(facts.active, facts.active + plans::kTreeRejectionMaxCluster + 1);
    return d;
  }, py::arg("arch"), "The cluster facts the published limits of `arch` imply (80 or 90).");
  m.def(
      "device_launch_plan",
      [](const std::string& kernel, const py::dict& sizes) {
        return plan_with(kernel, sizes, specdec::current_device_limits());
      },
      py::arg("kernel"), py::arg("sizes"), "launch_plan on the current device's limits (needs a GPU).");
  m.def(
      "launch_limits", [](int arch) { return limits_dict(plans::arch_limits(arch)); }, py::arg("arch"),
      "The launch limits table of arch 80 or 90 that launch_plan uses.");
  m.def(
      "device_launch_limits", []() { return limits_dict(specdec::current_device_limits()); },
      "The current device's launch limits (needs a GPU).");
  m.def("launch_plan_kernels", []() {
    py::list names;
    for (const auto& [name, _] : planners()) names.append(name);
    return names;
  }, "The names launch_plan accepts.");
});

}  // namespace
