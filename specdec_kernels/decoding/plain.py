"""Strategy `plain`: no draft, one target forward per token (greedy or sampled), through the same
engine, SpecCache, kernels and CUDA graphs as the speculative strategies. It is the baseline they are
measured against (Leviathan's speedup is over this loop, not over a different implementation) and a
fast plain decoder in its own right: greedy output equals the target's `generate(do_sample=False)`,
sampled output follows the target's standardised distribution with the engine's per-row Philox seeds.
"""

from .drafter import Drafter
from .step import Proposal


class PlainDecoder(Drafter):
    """`PlainDecoder(target).generate(input_ids, ...)`, or
    `specdec_kernels.generate(target, input_ids, strategy="plain", ...)`."""

    name = "plain"
    first_token_from_prefill = True  # greedy: the prefill's last logits give the first token, as in HF

    def __init__(self, target=None):
        self.target_model = target

    def graph_key(self):
        return (self.name,)

    def propose(self, engine, first: bool) -> Proposal:
        return Proposal(engine.root.new_zeros(engine.root.shape[0], 0))  # no drafts: the verifier's plain step
