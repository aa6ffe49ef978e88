"""Strategy `plain`: no draft, one target forward per token (greedy or sampled), through the same
engine, SpecCache, kernels and CUDA graphs as the speculative strategies. It is the baseline they are
measured against (Leviathan's speedup is over this loop, not over a different implementation) and a
fast plain decoder in its own right: greedy output equals the target's `generate(do_sample=False)`,
sampled output follows the target's standardised distribution with the engine's per-row Philox seeds.
"""

import torch
from torch import Tensor

from .. import ops
from .engine import Engine
from .strategy import Accepted, Proposal, Strategy
from .standardize import standardize


class PlainDecoder(Strategy):
    """`PlainDecoder(target).generate(input_ids, ...)`, or
    `specdec_kernels.generate(target, input_ids, strategy="plain", ...)`."""

    name = "plain"
    first_token_from_prefill = True  # greedy: the prefill's last logits give the first token, as in HF

    def __init__(self, target=None):
        self.target_model = target

    def generate(self, input_ids, **kwargs):
        """specdec_kernels.generate(target, input_ids, strategy=self, **kwargs)."""
        from .api import generate
        return generate(self.target_model, input_ids, strategy=self, **kwargs)

    # ---- engine interface --------------------------------------------------------------------

    def graph_key(self):
        return (self.name,)

    def propose(self, engine: Engine, first: bool) -> Proposal:
        return Proposal(engine.root.new_zeros(engine.root.shape[0], 0))

    def accept(self, engine: Engine, proposal: Proposal, logits: Tensor) -> Accepted:
        return accept_plain(engine, proposal, logits)


def accept_plain(engine: Engine, proposal: Proposal, logits: Tensor) -> Accepted:
    """A step without drafts (also lookup's steps where no row matched): argmax, or a draw from the target's row."""
    # the verification ops with zero drafts are exactly argmax / a draw from the target's row
    if not engine.sampling.do_sample:
        if engine.backend == "auto":  # greedy_verify of no drafts, without the op's cost per token
            inf = float("inf")  # NaN never wins (as in greedy_verify); infinities stay as they are
            token = torch.argmax(torch.nan_to_num(logits[:, -1].float(), nan=-inf, posinf=inf, neginf=-inf), dim=-1)
            return Accepted(token.unsqueeze(1), torch.zeros_like(token))
        return Accepted(*ops.greedy_verify(logits, proposal.tokens, backend=engine.backend))
    target_probs = standardize(logits, engine.sampling)
    no_drafts = target_probs.new_zeros(target_probs.shape[0], 0, target_probs.shape[-1])
    return Accepted(*ops.rejection_sample(target_probs, no_drafts, proposal.tokens, seed=engine.seeds,
                                         offsets=engine.cursor, backend=engine.backend))
