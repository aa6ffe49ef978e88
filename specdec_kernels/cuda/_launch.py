"""Host-side pieces every CUDA launcher shares: raw pointers, dtype codes, the stream,
and zeroed workspaces that the kernels hand back zeroed (so they are reused, not re-zeroed)."""

import torch

from .. import _cuda_module
from ..ops._outputs import chain_outputs, tree_outputs  # noqa: F401  (re-exported for the launchers)

# dtype codes shared with csrc/common.cuh
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}

_zeroed_workspaces: dict[tuple[int, int], torch.Tensor] = {}
_retired: list[torch.Tensor] = []


def library():
    """The loaded `_C` module (resolve() has already checked that it loads)."""
    return _cuda_module.load()


def stream_handle(device: torch.device) -> int:
    """The current stream of `device` as the integer the `_C` launchers take."""
    return torch.cuda.current_stream(device).cuda_stream


def on_device(device: torch.device):
    """Make `device` current for a launch: the launchers read the current device."""
    return torch.cuda.device(device)


def pointer(tensor: torch.Tensor | None) -> int:
    """Device address of a tensor, or 0 for an absent optional input."""
    return 0 if tensor is None else tensor.data_ptr()


def zeroed_workspace(device: torch.device, nbytes: int) -> torch.Tensor:
    """A zeroed uint8 buffer of >= nbytes for kernels that leave their workspace zeroed.

    One buffer per stream (two streams must not share one), grown by doubling. A buffer
    that a CUDA graph may have captured is never freed: a grown-out buffer is retired,
    not released. During stream capture with no cached buffer yet, a fresh zeroed one
    is returned (its memset is captured too); warm up once before capturing to get a
    single-launch graph. Graphs captured on one stream share that stream's buffer, so
    replay them one at a time (on one stream), as serving loops do.
    """
    stream = torch.cuda.current_stream(device)
    key = (device.index if device.index is not None else torch.cuda.current_device(), stream.cuda_stream)
    cached = _zeroed_workspaces.get(key)
    if cached is not None and cached.numel() >= nbytes:
        return cached
    if torch.cuda.is_current_stream_capturing():
        return torch.zeros(max(nbytes, 1), dtype=torch.uint8, device=device)
    size = max(nbytes, 256, 2 * (cached.numel() if cached is not None else 0))
    if cached is not None:
        _retired.append(cached)
    fresh = torch.zeros(size, dtype=torch.uint8, device=device)
    _zeroed_workspaces[key] = fresh
    return fresh
