"""Host-side pieces every Triton launcher shares."""

import contextlib
import functools

import torch

from ..common.outputs import chain_outputs, tree_outputs  # noqa: F401  (re-exported for the launchers)
from ._philox import INT_SEED, ROW_SEEDS, UNIFORMS


INTERPRETER_SMS = 4  # a stand-in SM count on the CPU, small enough that tests see several splits


def plans_for_gpu(device: torch.device) -> bool:
    """Whether launches for tensors on `device` are planned for a GPU (tile sizes, split counts,
    dot modes); False: the Triton interpreter on the CPU. The one place launchers ask, so
    tests/triton_compile_targets.py can plan GPU launches from CPU tensors and compile them."""
    return device.type == "cuda"


@functools.cache
def _cuda_sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors the split counts fill (INTERPRETER_SMS off the GPU)."""
    if device.type != "cuda":
        return INTERPRETER_SMS
    return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())


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
