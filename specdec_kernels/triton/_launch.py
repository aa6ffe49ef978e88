"""Host-side pieces every Triton launcher shares."""

import contextlib
import functools

import torch

from ..common.outputs import chain_outputs, tree_outputs  # noqa: F401  (re-exported for the launchers)
from ..common.workspace import launch_guard
from ._philox import INT_SEED, ROW_SEEDS, UNIFORMS


# CUDA's grid limits: x up to 2^31 - 1 programs, y and z up to 65535. The launchers put the
# dimensions that grow with the batch in x (folding several into it where needed) and register
# `limits` for the shapes that still do not fit, so `auto` runs those on another backend.
MAX_GRID_X = 2**31 - 1
MAX_GRID_YZ = 65535


def chain_launch(target: torch.Tensor, draft_tokens: torch.Tensor) -> tuple:
    """(batch, g, vocab, device, out_tokens, num_accepted) of a chain launch: target [B, g+1, V],
    draft_tokens [B, g]; the outputs are already the answer for batch == 0."""
    return (*draft_tokens.shape, target.shape[-1], draft_tokens.device, *chain_outputs(draft_tokens))


def grid_x_refusal(programs: int, what: str) -> str | None:
    """The registry's refusal when `programs` (described by `what`) do not fit grid x, else None."""
    if programs > MAX_GRID_X:
        return f"{what} = {programs} programs, past CUDA's grid limit of {MAX_GRID_X}"
    return None


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


@contextlib.contextmanager
def device_scope(device: torch.device):
    """Launch on the tensors' GPU (Triton uses the current device; nothing to select on the CPU),
    inside the stream's workspace guard (`common.workspace.launch_guard`): every launch of a call
    goes through here, so a call that stops half-way cannot leave the zeroed buffer dirty for
    the next one."""
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext(), launch_guard(device):
        yield


def randomness_mode(uniforms, seed) -> tuple[int, int, torch.Tensor | None]:
    """(RANDOM constexpr value, int seed, per-row seeds tensor) for the sampling kernels."""
    if uniforms is not None:
        return UNIFORMS.value, 0, None
    if isinstance(seed, torch.Tensor):
        return ROW_SEEDS.value, 0, seed
    return INT_SEED.value, int(seed), None


def temperature_args(temperature, placeholder: torch.Tensor) -> tuple:
    """(PER_ROW_TEMP, temperatures tensor, scalar temperature, temperatures stride) of a logits
    launch: a per-row float tensor, or one float (then `placeholder`, never read, and stride 0)."""
    if isinstance(temperature, torch.Tensor):
        return True, temperature, 1.0, temperature.stride(0)
    return False, placeholder, float(temperature), 0
