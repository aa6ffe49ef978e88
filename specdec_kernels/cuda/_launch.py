"""Host-side pieces every CUDA launcher shares: raw pointers, dtype codes, the stream.
The zeroed per-stream workspaces live in `specdec_kernels.common.workspace` (shared with triton/)."""

import torch

from ..common import cuda_module as _cuda_module
from ..common.workspace import _zeroed_workspaces  # noqa: F401  (the GPU tests inspect the buffers through here)
from ..common.outputs import chain_outputs, tree_outputs  # noqa: F401  (re-exported for the launchers)

# dtype codes shared with csrc/common.cuh
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def library():
    """The loaded `_C` module (resolve() has already checked that it loads)."""
    return _cuda_module.load()


def stream_handle(device: torch.device) -> int:
    """The current stream of `device` as the integer the `_C` launchers take."""
    return torch.cuda.current_stream(device).cuda_stream


def on_device(device: torch.device):
    """Make `device` current for a launch: the launchers read the current device."""
    return torch.cuda.device(device)


def int64_index(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """An int32 or int64 index tensor as int64, for the kernels that read only int64 (a copy of a
    few bytes a row, capture-safe, only when the caller passed int32)."""
    return tensor if tensor is None or tensor.dtype == torch.int64 else tensor.to(torch.int64)


def pointer(tensor: torch.Tensor | None) -> int:
    """Device address of a tensor, or 0 for an absent optional input."""
    return 0 if tensor is None else tensor.data_ptr()
