"""Strategy `speculative` (Leviathan et al. 2023): a small causal LM drafts g tokens, the target
verifies them in one forward; greedy (ops.greedy_verify) and sampling (ops.rejection_sample) are
both lossless: greedy output is token-identical to the target's greedy decoding, sampled output
follows the target's (standardised) distribution.

Options:
  num_draft_tokens (g, default 5).
  schedule: "constant" or "heuristic" (HF's num_assistant_tokens_schedule="heuristic", made
      batch-wide so shapes stay static: g += 2 when every unfinished row accepted all g drafts,
      else g -= 1, within [1, max_draft_tokens]). Each new g is one more CUDA-graph capture.
  max_draft_tokens: the heuristic's ceiling (default 2 * num_draft_tokens).
  lenience: l in (0, 1], Appendix A.5 of the paper, LOSSY for l < 1. Sampling: q is scaled by l
      before the comparison (accept with min(1, p / (l q))), and the residual is
      norm(max(0, p - l q)); no token is emitted with probability above p(x) / l. Greedy: the
      pre-standardisation rule, accept x when p(x) >= l * max(p) (the paper prints "<=", a typo:
      with l = 1 it must reduce to exact match), i.e. logit gap <= -log(l), by ops.relaxed_verify.
Vocabularies: a draft LM head padded past the tokenizer is truncated to the target's V, a
smaller one padded with zero probability (standardize.fit_vocab); target ids past a smaller draft's
embedding table are fed to the draft as its last id (what the draft conditions on never affects
exactness, only the acceptance rate).
"""

import math

import torch
from torch import Tensor

from .. import ops
from ..ops import _validate as check
from .draft_model import TwoModelStrategy
from .engine import OP, Engine, Proposal, weight_addresses
from .standardize import standardize


class SpeculativeDecoder(TwoModelStrategy):
    """`SpeculativeDecoder(target, draft, num_draft_tokens=5).generate(input_ids, ...)`, or
    `specdec_kernels.generate(target, input_ids, strategy="speculative", draft_model=draft, ...)`."""

    name = "speculative"

    def __init__(self, target=None, draft_model=None, *, num_draft_tokens: int = 5, schedule: str = "constant",
                 max_draft_tokens: int | None = None, lenience: float = 1.0):
        super().__init__(target, draft_model)
        self.g = self.initial_g = check.positive_int(OP, "num_draft_tokens", num_draft_tokens)
        if schedule not in ("constant", "heuristic"):
            check.fail(OP, f"`schedule` must be 'constant' or 'heuristic' (got {schedule!r})")
        self.schedule = schedule
        self.g_max = self.g if schedule == "constant" else check.positive_int(
            OP, "max_draft_tokens", max_draft_tokens or 2 * self.g)
        self.g_max = max(self.g_max, self.g)
        self.lenience = check.real_number(OP, "lenience", lenience)
        if not 0 < self.lenience <= 1:
            check.fail(OP, f"`lenience` must be in (0, 1] (1 = exact; got {lenience})")

    # ---- engine interface --------------------------------------------------------------------

    def start(self, engine: Engine) -> None:
        self.g = self.initial_g
        super().start(engine)

    def num_draft_tokens(self) -> int:
        return self.g

    def graph_key(self):
        return (self.name, id(self.draft_model), weight_addresses(self.draft_model), self.initial_g, self.schedule,
                self.g_max, self.lenience)

    def max_draft_tokens(self) -> int:
        return self.g_max

    def propose(self, engine: Engine, first: bool) -> Proposal:
        feed = self.draft.begin(engine, first)
        offsets = engine.offsets
        tokens, probs = [], []
        for i in range(self.g):
            token, q = self.draft_token(engine, self.draft.next_logits(feed), offsets + i)
            tokens.append(token)
            if q is not None:
                probs.append(q)
            feed = token.unsqueeze(1)
        return Proposal(torch.stack(tokens, dim=1), torch.stack(probs, dim=1) if probs else None)

    def accept(self, engine: Engine, proposal: Proposal, logits: Tensor) -> tuple[Tensor, Tensor]:
        if not engine.sampling.do_sample:
            if self.lenience < 1:
                return ops.relaxed_verify(logits, proposal.tokens, top_beta=logits.shape[-1],
                                          tau=math.nextafter(-math.log(self.lenience), math.inf),
                                          backend=engine.backend)
            return ops.greedy_verify(logits, proposal.tokens, backend=engine.backend)
        target_probs = standardize(logits, engine.sampling)
        draft_probs = proposal.probs if self.lenience == 1 else proposal.probs * self.lenience
        return ops.rejection_sample(target_probs, draft_probs, proposal.tokens, seed=engine.seeds,
                                    offsets=engine.offsets, backend=engine.backend)

    def end_step(self, all_accepted: bool) -> None:
        if self.schedule == "heuristic":
            self.g = min(self.g + 2, self.g_max) if all_accepted else max(self.g - 1, 1)
