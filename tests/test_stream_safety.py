"""Multi-stream and capture safety on the CPU, with torch.cuda's stream, event and graph calls faked.

1. kv_compact's device table (common/kv_layout.py): a table uploaded non-blocking on stream A and
   then used on stream B must be ordered (B waits on the event recorded after A's upload) and
   recorded on B (`record_stream`), so evicting it never hands its memory to a new allocation while
   B's kernels may still read it. Once per (table, stream); nothing during capture.
2. The per-stream workspace (common/workspace.py) under decoding.graphs.GraphRunner: warm-up and
   capture run on one stream, so the capture finds the warm-up's buffer (one kernel node per op,
   no captured memset). torch.cuda.graph without stream= captures on a private stream of its own;
   the fake does the same, so a runner capturing that way gets a fresh buffer and fails here.
"""

import collections
import contextlib
import itertools

import pytest
import torch

from specdec_kernels.common import kv_layout, workspace
from specdec_kernels.decoding import graphs

_handles = itertools.count(1)


class FakeStream:
    def __init__(self, device=None, **kwargs):
        self.cuda_stream = next(_handles)
        self.waited_events, self.waited_streams = [], []

    def wait_event(self, event):
        self.waited_events.append(event)

    def wait_stream(self, stream):
        self.waited_streams.append(stream)


class FakeCuda:
    """The torch.cuda calls the code under test makes, with a current stream and a capture flag."""

    def __init__(self):
        self.current = FakeStream()
        self.capturing = False
        self.events = []
        cuda = self

        class Event:
            def __init__(self, *args, **kwargs):
                self.stream = None
                cuda.events.append(self)

            def record(self, stream=None):
                self.stream = stream or cuda.current

        class CUDAGraph:
            def replay(self):
                pass

        self.Event, self.CUDAGraph = Event, CUDAGraph

    def current_stream(self, device=None):
        return self.current

    @contextlib.contextmanager
    def stream(self, stream):
        previous, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = previous

    @contextlib.contextmanager
    def graph(self, cuda_graph, pool=None, stream=None, capture_error_mode="global"):
        # like torch.cuda.graph: capture on `stream`, else on a side stream of its own
        previous, self.current = self.current, stream if stream is not None else FakeStream()
        self.capturing = True
        try:
            yield
        finally:
            self.capturing, self.current = False, previous

    def install(self, monkeypatch):
        for name in ("current_stream", "stream", "graph", "Event", "CUDAGraph"):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))
        monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: self.capturing)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


CUDA0 = torch.device("cuda", 0)


@pytest.fixture
def cuda(monkeypatch):
    fake = FakeCuda()
    fake.install(monkeypatch)
    return fake


# ------------------------------------------------------------------ 1. the kv_compact table


class FakeCache:
    """What kv_layout reads of a [B, Hkv, S, D] fp16 cache on cuda:0 (its address and strides)."""

    shape = (2, 2, 8, 4)

    def __init__(self, address: int):
        self.address, self.device = address, CUDA0

    def data_ptr(self):
        return self.address

    def stride(self):
        return (64, 32, 4, 1)

    def element_size(self):
        return 2


@pytest.fixture
def table_calls(cuda, monkeypatch):
    """Uploads become CPU clones; record_stream calls are logged as (tensor, stream)."""
    monkeypatch.setattr(kv_layout, "_tables", collections.OrderedDict())
    monkeypatch.setattr(kv_layout, "_captured", {})
    real_to = torch.Tensor.to
    recorded = []

    def to(self, *args, **kwargs):
        device = args[0] if args else kwargs.get("device")
        if isinstance(device, torch.device) and device.type == "cuda":
            return self.clone()
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self)
    monkeypatch.setattr(torch.Tensor, "to", to)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: recorded.append((self, stream)))
    return recorded


def separate_caches():
    """Unevenly spaced layers: only a device table describes them."""
    k = [FakeCache(1 << 20), FakeCache(3 << 20), FakeCache(4 << 20)]
    v = [FakeCache(9 << 20), FakeCache(10 << 20), FakeCache(12 << 20)]
    return k, v


def test_table_from_another_stream_is_waited_for_and_recorded(cuda, table_calls):
    k, v = separate_caches()
    upload_stream, other = cuda.current, FakeStream()
    table = kv_layout.cache_layout(k, v).table
    assert table is not None and len(cuda.events) == 1
    uploaded = cuda.events[0]
    assert uploaded.stream is upload_stream  # recorded right after the upload, on its stream
    assert upload_stream.waited_events == [] and table_calls == []  # its own stream is ordered already

    cuda.current = other
    assert kv_layout.cache_layout(k, v).table is table  # cached, not uploaded again
    assert other.waited_events == [uploaded]  # other's kernels start after the upload
    assert [(t is table, s is other) for t, s in table_calls] == [(True, True)]  # eviction waits for other

    kv_layout.cache_layout(k, v)  # once per (table, stream)
    cuda.current = upload_stream
    kv_layout.cache_layout(k, v)
    assert len(other.waited_events) == 1 and len(table_calls) == 1 and upload_stream.waited_events == []


def test_capture_neither_waits_nor_records(cuda, table_calls):
    """Waiting on an event recorded outside a capture is invalid inside it; torch.cuda.graph has
    synchronised the device before capturing, and a captured table is never freed."""
    k, v = separate_caches()
    table = kv_layout.cache_layout(k, v).table
    with cuda.graph(cuda.CUDAGraph()):
        assert kv_layout.cache_layout(k, v).table is table
        capture_stream = cuda.current
    assert capture_stream.waited_events == [] and table_calls == []
    assert len(kv_layout._captured) == 1 and not kv_layout._tables
    with cuda.graph(cuda.CUDAGraph()), pytest.raises(RuntimeError, match="before capturing"):
        kv_layout.cache_layout([k[0], k[2], k[1]], v)  # a new table cannot be uploaded during capture


# ------------------------------------------------------------------ 2. workspaces under capture


@pytest.fixture
def workspaces(cuda, monkeypatch):
    """zeroed_workspace on cuda:0 with CPU buffers, counting allocations."""
    monkeypatch.setattr(workspace, "_zeroed_workspaces", {})
    monkeypatch.setattr(workspace, "_retired", [])
    if hasattr(graphs, "CudaGraphs"):  # a fresh backend: no capture stream cached by another test
        monkeypatch.setattr(graphs, "_backend", graphs.CudaGraphs())
    real_zeros = torch.zeros
    made = []

    def zeros(*args, device=None, **kwargs):
        made.append(args)
        return real_zeros(*args, **kwargs)

    monkeypatch.setattr(torch, "zeros", zeros)
    return made


def test_capture_reuses_the_warm_up_workspace(cuda, workspaces):
    runner = graphs.GraphRunner(True)
    step = lambda: workspace.zeroed_workspace(CUDA0, 64)  # noqa: E731  (what a single-launch op asks for)
    warm = runner("verify", step)  # first call: eager warm-up on the runner's stream
    assert len(workspaces) == 1
    captured = runner("verify", step)  # second call: capture, then replay
    assert captured is warm, "the capture allocated (and would capture the memset of) a fresh workspace"
    assert len(workspaces) == 1 and runner.captured == 1
    assert runner("verify", step) is warm  # replays return the captured output

    runner("draft", step)  # another step on the same stream shares its buffer
    assert runner("draft", step) is warm and len(workspaces) == 1
