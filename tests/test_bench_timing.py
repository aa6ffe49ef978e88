"""bench/_timing.capture_graph on the CPU, with torch.cuda replaced by a recorder: the warm-up side
stream must wait for the current stream before it reads the inputs (the race of the first H100 run)."""

import contextlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import _timing  # noqa: E402


class Recorder:
    def __init__(self):
        self.events = []

    def stream_class(self):
        recorder = self

        class FakeStream:
            def __init__(self, name="side"):
                self.name = name

            def wait_stream(self, other):
                recorder.events.append(f"{self.name} waits {other.name}")

        return FakeStream


def test_warm_up_waits_for_the_current_stream(monkeypatch):
    rec = Recorder()
    fake_stream = rec.stream_class()
    current = fake_stream("current")
    where = ["current"]

    @contextlib.contextmanager
    def on_stream(stream):
        where.append(stream.name)
        yield
        where.pop()

    @contextlib.contextmanager
    def graph_capture(graph):
        rec.events.append("capture")
        yield

    monkeypatch.setattr(torch.cuda, "Stream", fake_stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: current)
    monkeypatch.setattr(torch.cuda, "stream", on_stream)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: rec.events.append("sync"))
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: object())
    monkeypatch.setattr(torch.cuda, "graph", graph_capture)

    graph = _timing.capture_graph(lambda: rec.events.append(f"fn on {where[-1]}"))
    assert graph is not None
    assert rec.events[:2] == ["side waits current", "fn on side"], rec.events
    assert rec.events.index("current waits side") < rec.events.index("capture")
