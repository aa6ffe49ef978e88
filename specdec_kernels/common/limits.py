"""Limits that the public ops and the kernels must agree on (csrc/ holds the C++ twins)."""

FUSED_MAX_K = 16  # the largest k the fused early-exit kernels keep in registers (csrc/early_exit_math.cuh kMaxK)
