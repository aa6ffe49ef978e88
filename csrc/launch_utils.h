#pragma once
// Host-side helpers shared by the kernel launchers (no device code).

#include <cstdint>

#include "launch_plan.h"

namespace specdec {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// SM count of the current device, queried once per device and cached (an
// attribute query, not a sync, so it is also legal during stream capture).
int sm_count_of_current_device();

// The launch limits of the current device (SM count, shared memory with and without
// the opt-in, grid and block limits), queried once per device and cached.
plans::DeviceLimits current_device_limits();

}  // namespace specdec
