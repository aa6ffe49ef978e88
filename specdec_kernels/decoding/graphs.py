"""CUDA graphs for the engine: the draft step and the verify step, captured once per (step, batch size,
draft length) and replayed, and kept between `generate` calls.

The eager path and the graph path run the SAME step functions; a step reads and writes engine
state in place (caches, roots, counters are preallocated tensors), takes its tensor inputs as
arguments and returns its outputs. The first call of a key runs eagerly (real work, and the warm-up
CUDA graphs need); the second captures and replays; later calls copy their inputs into the captured
input buffers (skipped when they already are those buffers) and replay. Outputs of a replayed step
are the captured output tensors, overwritten by the next replay.

Warm-up and capture run on ONE side stream per device, so the per-stream workspaces of the
single-launch kernels (common/workspace.py) are found again during capture and an op captures as one
kernel node. A GraphSession keeps the graphs, their strategy object and every tensor they read,
keyed by engine.Engine.session_key; at most MAX_SESSIONS are kept, clear_graph_cache() frees them.
A capture that raises warns once and runs that step and the rest of the call eagerly (the tokens are
the eager path's); the session is discarded, so the next call tries again. CudaGraphs is the seam
that tests replace with a fake (use_backend) to count captures on the CPU.
"""

import collections
import contextlib
import warnings

import torch

MAX_SESSIONS = 4  # kept sessions (each holds KV caches for its batch and length bucket); LRU beyond; 0 keeps none


class CudaGraphs:
    """What GraphRunner needs from torch.cuda: a capture stream, warm-up, capture, replay.
    capture(stream, fn, inputs) returns an opaque graph; replay(graph) runs it and returns the
    outputs fn returned at capture (the same tensors every replay, overwritten)."""

    def __init__(self):
        self._streams: dict[int, torch.cuda.Stream] = {}

    def available(self) -> bool:
        return torch.cuda.is_available()

    def stream(self, device: torch.device):
        """The device's one warm-up-and-capture stream: graphs captured on it share its workspace
        (replay them one at a time, as the engine does)."""
        index = device.index if device is not None and device.index is not None else torch.cuda.current_device()
        if index not in self._streams:
            self._streams[index] = torch.cuda.Stream(device=index)
        return self._streams[index]

    def warm_up(self, stream, fn, inputs):
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            out = fn(*inputs)
        torch.cuda.current_stream().wait_stream(stream)
        return out

    def capture(self, stream, fn, inputs):
        graph = torch.cuda.CUDAGraph()
        caller = torch.cuda.current_stream()
        try:
            # stream=: capture where the warm-up ran (see the module docstring); torch.cuda.graph
            # synchronises the device before capture begins
            with torch.cuda.graph(graph, stream=stream):
                out = fn(*inputs)
        except Exception:  # the half-made graph goes with the exception (GraphRunner._capture)
            self._settle(caller)
            raise
        return graph, out

    @staticmethod
    def _settle(caller):
        """After a failed capture: when capture_end raised (an invalidated capture), torch.cuda.graph
        left the capture stream current, so the caller's is put back; and a synchronize reports any
        error the device holds here, not in the eager rerun's first kernel."""
        torch.cuda.set_stream(caller)
        torch.cuda.synchronize()

    def replay(self, graph):
        cuda_graph, out = graph
        cuda_graph.replay()
        return out


_backend = CudaGraphs()


@contextlib.contextmanager
def use_backend(backend):
    """Run GraphRunners (and the sessions created meanwhile) on `backend` (tests: a CPU fake)."""
    global _backend
    previous, _backend = _backend, backend
    try:
        yield backend
    finally:
        _backend = previous


def current_backend():
    """The graph backend GraphRunners use now (CUDA graphs, or a stand-in under use_backend)."""
    return _backend


class GraphRunner:
    def __init__(self, enabled: bool, device: torch.device | None = None, backend=None):
        self.backend = backend or _backend
        if enabled and not self.backend.available():
            raise ValueError("generate: cuda_graphs=True needs a CUDA device (pass cuda_graphs=False)")
        self.enabled, self.device = enabled, device
        self.graphs: dict = {}
        self.warmed: set = set()
        # a capture raised: every later step runs eagerly, `enabled` (graph-mode bookkeeping) unchanged
        self.failed = False

    def __call__(self, key, fn, *inputs):
        if not self.enabled or self.failed:
            return fn(*inputs)
        if key not in self.graphs:
            stream = self.backend.stream(self.device)
            if key not in self.warmed:
                self.warmed.add(key)
                return self.backend.warm_up(stream, fn, inputs)
            if not self._capture(key, stream, fn, inputs):
                # CUDA records captured kernels without running them: the in-place state is as it was
                return fn(*inputs)  # so this step runs again, eagerly
        graph, static_inputs = self.graphs[key]
        for static, x in zip(static_inputs, inputs):
            if static is not None and static.data_ptr() != x.data_ptr():
                static.copy_(x)
        return self.backend.replay(graph)

    def _capture(self, key, stream, fn, inputs) -> bool:
        """Capture `key`'s step on copies of `inputs` (the graph's fixed input buffers); False when the
        capture raised, after one warning, with this runner eager and its session no longer kept."""
        static_inputs = tuple(None if x is None else x.clone() for x in inputs)
        try:
            self.graphs[key] = (self.backend.capture(stream, fn, static_inputs), static_inputs)
            return True
        except Exception as error:  # the exception, and the half-made graph its frames hold, end with this block
            self.failed = True  # no second capture, so no second warning, in this call
            _forget_runner(self)
            warnings.warn(f"generate: capturing the CUDA graph of step {key!r} failed ({_one_line(error)}); "
                          "this call runs eagerly from here and keeps no graphs (the next call tries again)",
                          RuntimeWarning)
            return False

    @property
    def captured(self) -> int:
        return len(self.graphs)


def _one_line(error: BaseException) -> str:
    """`Type: first line`, with the error it followed when there is one (torch.cuda.graph's
    capture_end fails after the step's own error, which names the op)."""
    if error.__context__ is not None:
        return f"{_first_line(error)}, after {_first_line(error.__context__)}"
    return _first_line(error)


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()  # CUDA errors add lines of advice
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]


class GraphSession:
    """One key's runner, drafter object and kept state (see the module docstring). `stored`: whether
    it lives in the cache (eager calls and unkeyable configurations get a throwaway one)."""

    def __init__(self, runner: GraphRunner, drafter, stored: bool):
        self.runner, self.drafter, self.stored = runner, drafter, stored
        self.state: dict = {}
        self.busy = False


_sessions: "collections.OrderedDict[tuple, GraphSession]" = collections.OrderedDict()


def session(key, drafter, enabled: bool, device: torch.device) -> GraphSession:
    """The kept session of `key` (its drafter object replaces `drafter`), or a new one: stored when
    graphs are on and key is not None, evicting the least recently used beyond MAX_SESSIONS."""
    if enabled and key is not None:
        found = _sessions.get(key)
        if found is not None and not found.busy:  # busy: a call re-entered; it gets its own
            _sessions.move_to_end(key)
            return found
    stored = enabled and key is not None and key not in _sessions
    made = GraphSession(GraphRunner(enabled, device), drafter, stored)
    if stored:
        _sessions[key] = made
        while len(_sessions) > MAX_SESSIONS:
            _sessions.popitem(last=False)[1].stored = False  # a call still running on it finishes normally
    return made


def discard(made: GraphSession) -> None:
    """Forget a session whose call failed (its graphs or state may be half made)."""
    made.stored = False
    for key, value in list(_sessions.items()):
        if value is made:
            del _sessions[key]


def _forget_runner(runner: GraphRunner) -> None:
    """Discard the session that holds `runner` (a capture failed in it)."""
    for made in [made for made in _sessions.values() if made.runner is runner]:
        discard(made)


def clear_graph_cache() -> None:
    """Free every kept session: graphs, their memory pools, caches and the models they hold."""
    for made in _sessions.values():
        made.stored = False
    _sessions.clear()


def kept_sessions() -> int:
    return len(_sessions)
