"""CUDA-graph runner: the engine's draft step and verify step, captured once per (step, batch size,
draft length) and replayed.

The eager path and the graph path run the SAME step functions; a step reads and writes engine
state in place (caches, roots, counters are preallocated tensors), takes its tensor inputs as
arguments and returns its outputs. The first call of a key runs eagerly on a side stream (real
work, and the warm-up CUDA graphs need); the second captures and replays; later calls copy their
inputs into the captured input buffers (skipped when they already are those buffers) and replay.
Outputs of a replayed step are the captured output tensors, overwritten by the next replay.
"""

import torch


class GraphRunner:
    def __init__(self, enabled: bool):
        if enabled and not torch.cuda.is_available():
            raise ValueError("generate: cuda_graphs=True needs a CUDA device (pass cuda_graphs=False)")
        self.enabled = enabled
        self.graphs: dict = {}
        self.warmed: set = set()

    def __call__(self, key, fn, *inputs):
        if not self.enabled:
            return fn(*inputs)
        if key not in self.graphs:
            if key not in self.warmed:
                self.warmed.add(key)
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    out = fn(*inputs)
                torch.cuda.current_stream().wait_stream(side)
                return out
            static_inputs = tuple(None if x is None else x.clone() for x in inputs)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = fn(*static_inputs)
            self.graphs[key] = (graph, static_inputs, static_out)
        graph, static_inputs, static_out = self.graphs[key]
        for static, x in zip(static_inputs, inputs):
            if static is not None and static.data_ptr() != x.data_ptr():
                static.copy_(x)
        graph.replay()
        return static_out

    @property
    def captured(self) -> int:
        return len(self.graphs)
