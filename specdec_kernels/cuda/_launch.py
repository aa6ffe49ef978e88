"""Host-side pieces every CUDA launcher shares: raw pointers, dtype codes, the stream.
The zeroed per-stream workspaces live in `specdec_kernels.common.workspace` (shared with triton/)."""

import contextlib
import functools

import torch

from ..common import cuda_module as _cuda_module
from ..common.workspace import launch_guard
from ..common.outputs import chain_outputs, tree_outputs  # noqa: F401  (re-exported for the launchers)
# int32 index tensors as int64 for the kernels that read only int64 (the reference's own helper)
from ..common.sampling import as_int64  # noqa: F401  (re-exported for the launchers)

# dtype codes shared with csrc/common.cuh
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def chain_launch(target: torch.Tensor, draft_tokens: torch.Tensor) -> tuple:
    """(batch, g, vocab, device, out_tokens, num_accepted) of a chain launch; the outputs are
    already the answer for batch == 0. (Mirrors triton/_launch.py; the layers may not import each other.)"""
    return (*draft_tokens.shape, target.shape[-1], draft_tokens.device, *chain_outputs(draft_tokens))


def library():
    """The loaded `_C` module (resolve() has already checked that it loads)."""
    return _cuda_module.load()


def stream_handle(device: torch.device) -> int:
    """The current stream of `device` as the integer the `_C` launchers take."""
    return torch.cuda.current_stream(device).cuda_stream


@contextlib.contextmanager
def on_device(device: torch.device):
    """Make `device` current for a launch (the launchers read the current device), inside the
    stream's workspace guard (`common.workspace.launch_guard`): a call whose launcher raises
    after a kernel of it ran cannot leave the zeroed buffer dirty for the next call."""
    with torch.cuda.device(device), launch_guard(device):
        yield


def pointer(tensor: torch.Tensor | None) -> int:
    """Device address of a tensor, or 0 for an absent optional input."""
    return 0 if tensor is None else tensor.data_ptr()


# ---------------------------------------------------------------------------- launch plans
# Each CUDA backend registers `limits` that ask `_C`'s launch plan (csrc/launch_plan.h: the
# same function its launcher launches) whether the kernels can serve a call's sizes on the
# current device, so that backend="auto" moves a shape they cannot serve to triton / torch
# instead of into a launch error.

@functools.lru_cache(maxsize=4096)
def _device_plan_cached(device_index: int, kernel: str, items: tuple) -> dict:
    with torch.cuda.device(device_index):
        return library().device_launch_plan(kernel, dict(items))


def device_plan(kernel: str, sizes: dict) -> dict:
    """`_C`'s launch plan of `kernel` for `sizes` on the current CUDA device (cached per device)."""
    return _device_plan_cached(torch.cuda.current_device(), kernel, tuple(sorted(sizes.items())))


def plan_limits(kernel: str, plan_sizes):
    """A registry `limits(sizes)` for a CUDA backend: `plan_sizes(op sizes)` gives the sizes of
    `kernel`'s launch plan (None: nothing to check); the answer is the plan's refusal or None."""
    def limits(sizes: dict) -> str | None:
        lib = library()
        wanted = plan_sizes(sizes)
        if lib is None or not hasattr(lib, "device_launch_plan") or wanted is None:
            return None
        return device_plan(kernel, wanted)["refusal"]  # looked up at call time: tests plan on sm_80 / sm_90

    return limits
