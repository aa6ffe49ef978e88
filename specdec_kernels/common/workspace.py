"""Zeroed per-stream workspaces, shared by the CUDA and the Triton launchers.

Single-launch kernels combine per-chunk partials through per-row tickets (an atomic
counter per batch row: the program or block that draws the last ticket merges the row).
The counters must be zero when a launch starts, and every such kernel stores them back to
zero before it ends, so one zeroed buffer per stream serves every call and every CUDA-graph
replay without a memset. A call that stops half-way (an interpreter error, a failed launch after
an earlier one ran) would leave tickets behind, so the launchers run inside `launch_guard`.
"""

import contextlib

import torch

_zeroed_workspaces: dict[tuple, torch.Tensor] = {}
_retired: list[torch.Tensor] = []
_open_calls: dict[tuple, int] = {}  # stream key -> guards entered and not left (an exception skips the exit)


def _stream_key(device: torch.device) -> tuple:
    """(type, index, stream) that owns a buffer: two streams must not share one."""
    if device.type != "cuda":  # the CPU (Triton interpreter): calls run one after another
        return (device.type, device.index, 0)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return (device.type, index, torch.cuda.current_stream(index).cuda_stream)


def zeroed_workspace(device: torch.device, nbytes: int) -> torch.Tensor:
    """A zeroed uint8 buffer of >= nbytes for kernels that leave their workspace zeroed.

    One buffer per stream, grown by doubling. A buffer that a CUDA graph may have captured
    is never freed: a grown-out buffer is retired, not released. During stream capture the
    key is the capturing stream: warm up ON THAT STREAM first (torch.cuda.graph(g, stream=s)
    after a warm-up under torch.cuda.stream(s), as decoding.graphs.GraphRunner does) and the
    capture finds the buffer, so the graph holds one kernel node per op. torch.cuda.graph
    without stream= captures on a private stream of its own, which has no buffer: then a
    fresh zeroed one is returned and its memset is captured too. Graphs captured on one
    stream share that stream's buffer, so replay them one at a time (on one stream), as
    serving loops do.
    """
    key = _stream_key(device)
    cached = _zeroed_workspaces.get(key)
    if cached is not None and cached.numel() >= nbytes:
        return cached
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return torch.zeros(max(nbytes, 1), dtype=torch.uint8, device=device)
    size = max(nbytes, 256, 2 * (cached.numel() if cached is not None else 0))
    if cached is not None:
        _retired.append(cached)
    fresh = torch.zeros(size, dtype=torch.uint8, device=device)
    _zeroed_workspaces[key] = fresh
    return fresh


def zeroed_counters(device: torch.device, count: int) -> torch.Tensor:
    """int32 [count] ticket counters at the start of the stream's zeroed workspace."""
    return zeroed_workspace(device, 4 * count)[:4 * count].view(torch.int32)


@contextlib.contextmanager
def launch_guard(device: torch.device):
    """Around one call's kernel launches on `device`'s current stream (nested guards count as
    one call). If the stream's last guarded call did not return, its kernels may have stopped
    half-way with tickets or partial state in the zeroed buffer: zero it before launching.
    A kernel that faults asynchronously on a GPU needs no guard: its error is sticky, so every later
    call on the context fails loudly."""
    key = _stream_key(device)
    depth = _open_calls.get(key, 0)
    if depth < 0:  # the outermost guard of a call that raised: its buffer may be dirty
        buffer = _zeroed_workspaces.get(key)
        if buffer is not None:
            buffer.zero_()
        depth = 0
    _open_calls[key] = depth + 1
    try:
        yield
    except BaseException:
        _open_calls[key] = -1  # whatever the depth: the next call starts by zeroing
        raise
    _open_calls[key] = depth


def left_dirty(device: torch.device) -> bool:
    """Whether the last guarded call on `device`'s current stream stopped half-way (so the next
    call will zero the stream's buffer first)."""
    return _open_calls.get(_stream_key(device), 0) < 0
