"""Host-side pieces every Triton launcher shares."""

import contextlib

import torch

from ..ops._outputs import chain_outputs, tree_outputs  # noqa: F401  (re-exported for the launchers)
from ._philox import INT_SEED, ROW_SEEDS, UNIFORMS


def device_scope(device: torch.device):
    """Launch on the tensors' GPU (Triton uses the current device); nothing on the CPU."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def randomness_mode(uniforms, seed) -> tuple[int, int, torch.Tensor | None]:
    """(RANDOM constexpr value, int seed, per-row seeds tensor) for the sampling kernels."""
    if uniforms is not None:
        return UNIFORMS.value, 0, None
    if isinstance(seed, torch.Tensor):
        return ROW_SEEDS.value, 0, seed
    return INT_SEED.value, int(seed), None
