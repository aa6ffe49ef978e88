"""The target's hidden states a drafter reads (EAGLE-style heads, HF's MTP layers, DFlash drafters), taken
from the target's own forwards: no extra forward, and not HF's all-layer `output_hidden_states`.

A drafter names what it reads in `target_layers()`: decoder-layer indices (the output of layers[i],
HF's hidden_states[i + 1], before the final norm) and/or FINAL_NORM (the final norm's output, what the
LM head reads). The engine puts a forward hook on each of those modules for the call; the hooks write
only during the engine's own target forwards (the prefill and the verify step), never during a
drafter's forward through the target's layers (PPD's early exit).

What the drafter reads, `engine.hidden`:
  states(layer)  [B, W, H]: row b's first count[b] entries are the states of the positions the last
                 target forward committed, in order. After the prefill: the prompt's (all of it when the
                 first token came from the prefill, else all but its last token, which the first step
                 feeds); after a step: the root and the accepted drafts (num_accepted + 1 positions;
                 a tree's accepted path, moved to the front as the KV cache is compacted).
  count          [B] int64; 0 for a row that had finished before the step.
Entries past count[b] are stale. Under CUDA graphs the step's states are static buffers [B, max_width + 1,
H], filled by the hook's copy inside the captured verify step and compacted there (no Python-side lists);
the prefill's are the prefill forward's own tensors (eager: the first step never runs from a graph).
"""

import torch
from torch import Tensor

from ..common import validate as check

OP = "generate"
FINAL_NORM = "final_norm"  # the final norm's output: what the LM head reads (HF's last_hidden_state)


class TargetStates:
    """One call's hidden states of the target for its drafter (see the module docstring)."""

    def __init__(self, engine, layers: tuple):
        self.engine = engine
        self.layers = checked_layers(layers, engine.target.num_layers)
        if self.layers and engine.encoder_decoder:
            check.fail(OP, "target hidden states are for decoder-only targets (the drafter asks for "
                           f"{', '.join(map(str, self.layers))})")
        self.writing = None  # None: hooks ignore the forward; "prefill" or "step": they keep its states
        self.prefill: dict = {}  # layer -> [B, P, H]: the prefill forward's output, as it was
        self.buffers: dict = {}  # layer -> [B, max_width + 1, H]: the step's, static (engine.keep)
        self.stepped = False  # after the first verify step the drafter reads the step's buffers
        batch = engine.prompts.shape[0]
        self.count = engine.keep("hidden.count", torch.zeros(batch, dtype=torch.int64, device=engine.device))
        adapter = engine.target
        modules = {layer: adapter.final_norm if layer == FINAL_NORM else adapter.layers[layer] for layer in self.layers}
        self.handles = [module.register_forward_hook(self.hook(layer)) for layer, module in modules.items()]

    def close(self) -> None:
        """Take the hooks off the target's modules (the call is over; kept graphs replay without them)."""
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def states(self, layer) -> Tensor:
        """[B, W, H]: the states of `layer` (an index or FINAL_NORM) of the positions the last target
        forward committed, the first count[b] entries of row b."""
        if layer not in self.layers:
            check.fail(OP, f"the drafter reads target layer {layer!r} but did not name it in target_layers() "
                           f"(it names {list(self.layers)})")
        if self.stepped:
            return self.buffers[layer]
        if layer not in self.prefill:  # no prefill forward ran (a one-token prompt whose token the first step feeds)
            hidden = self.engine.target.config.hidden_size
            weight = self.engine.target.lm_head.weight
            self.prefill[layer] = weight.new_zeros(self.count.shape[0], 0, hidden)
        return self.prefill[layer]

    # ---- what the engine calls ---------------------------------------------------------------

    def writing_prefill(self, lengths: Tensor):
        """Context of the prefill forward; lengths [B]: the prompt tokens it commits per row."""
        self.count.copy_(lengths)
        return _Writing(self, "prefill")

    def writing_step(self):
        """Context of a verify step's target forward."""
        return _Writing(self, "step")

    def keep_accepted(self, nodes: Tensor | None, num_accepted: Tensor, finished: Tensor) -> None:
        """After the verdict, in the verify step: the accepted positions' states move to the front, as
        the target's KV does (a chain's accepted prefix is already there; a tree's accepted nodes
        [B, D+1], root first, are gathered), and count becomes num_accepted + 1 (0 where finished)."""
        self.stepped = True
        if not self.layers:
            return
        if nodes is not None:
            index = nodes.clamp(min=0).unsqueeze(-1)
            for buffer in self.buffers.values():
                path = buffer.gather(1, index.expand(-1, -1, buffer.shape[-1]))
                buffer[:, :path.shape[1]].copy_(path)
        self.count.copy_(torch.where(finished, 0, num_accepted + 1))

    def select_rows(self, index: Tensor) -> None:
        """Eager mode: keep only the rows `index` (finished rows were dropped)."""
        self.count = self.count.index_select(0, index)
        self.buffers = {layer: buffer.index_select(0, index) for layer, buffer in self.buffers.items()}

    def hook(self, layer):
        def keep(module, args, output):
            if self.writing is None:
                return
            hidden = output[0] if isinstance(output, tuple) else output  # some decoder layers return tuples
            if self.writing == "prefill":
                self.prefill[layer] = hidden  # a fresh tensor of the prefill's own, never written again
                return
            buffer = self.buffers.get(layer)
            if buffer is None:  # the first verify step runs eagerly, before any warm-up or capture
                engine = self.engine
                shape = (hidden.shape[0], engine.drafter.max_width + 1, hidden.shape[-1])
                buffer = self.buffers[layer] = engine.keep(f"hidden.{layer}", hidden.new_zeros(shape))
            buffer[:, :hidden.shape[1]].copy_(hidden)
        return keep


class _Writing:
    def __init__(self, states: TargetStates, what: str):
        self.states, self.what = states, what

    def __enter__(self):
        self.states.writing = self.what

    def __exit__(self, *exc):
        self.states.writing = None


def checked_layers(layers, num_layers: int) -> tuple:
    """A drafter's target_layers() as a tuple of distinct entries, each a layer index in [0, num_layers)
    or FINAL_NORM."""
    layers = tuple(dict.fromkeys(layers))
    for layer in layers:
        if layer == FINAL_NORM:
            continue
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < num_layers:
            check.fail(OP, f"target_layers() must name decoder layers in [0, {num_layers - 1}] or "
                           f"{FINAL_NORM!r} (got {layer!r})")
    return layers
