#pragma once
// Host-side helpers shared by the kernel launchers (no device code).

#include <cstdint>

namespace specdec {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// SM count of the current device, queried once per device and cached (an
// attribute query, not a sync, so it is also legal during stream capture).
int sm_count_of_current_device();

}  // namespace specdec
