"""Strategy `specdec` (Xia et al., "Speculative Decoding"): a SpecDecDrafter drafts `block_size`
tokens in ONE forward ([MASK] queries after the committed prefix); the target scores them in one
forward and the verifier's relaxed rule (ops.relaxed_verify) accepts the leading drafts that are within
the target's top `top_beta` tokens AND within `tau` nats of its top-1 (Eq. 8 and 9); the target's top-1
follows.

Exactness: top_beta=1 (any tau) or tau=0 (any top_beta) is token-identical to the target's greedy
output. Any other setting is LOSSY by design (the paper selects top_beta=3, tau=1.0 and reports
86.5 relative BLEU against greedy): bench/sweep_specdec.py measures the drift as the share of
outputs identical to greedy. Greedy only: SpecDec has no sampling variant (do_sample=True is an error).

The drafter keeps its own prefix cache (models/specdec_drafter.py); each step feeds it the tokens
the previous step committed, from preallocated buffers so the step is CUDA-graph capturable.
"""

import torch
from torch import Tensor

from ..common import validate as check
from .drafter import Drafter
from .engine import OP, Engine, weight_addresses
from .step import Accepted, Proposal
from .verifier import Verification


class SpecDecDecoder(Drafter):
    """`SpecDecDecoder(target, drafter, block_size=10, top_beta=3, tau=1.0).generate(input_ids, ...)`,
    or `specdec_kernels.generate(target, input_ids, strategy="specdec", drafter=drafter, ...)`."""

    name = "specdec"

    def __init__(self, target=None, drafter=None, *, block_size: int | None = None, top_beta: int = 1,
                 tau: float = 0.0):
        from ..models import SpecDecDrafter
        if not isinstance(drafter, SpecDecDrafter):
            check.fail(OP, "strategy 'specdec' needs drafter= (a SpecDecDrafter, e.g. from "
                           "specdec_kernels.training.train_specdec_drafter or SpecDecDrafter.from_pretrained) "
                           f"(got {type(drafter).__name__})")
        self.target_model, self.drafter = target, drafter
        k = block_size if block_size is not None else drafter.config.block_size
        self.k = self.max_width = check.positive_int(OP, "block_size", k)
        self.top_beta = check.positive_int(OP, "top_beta", top_beta)
        self.tau = check.real_number(OP, "tau", tau, minimum=0.0)
        self.verification = Verification(rule="relaxed", top_beta=self.top_beta, tau=self.tau)

    @property
    def lossless(self) -> bool:
        return self.verification.lossless

    # ---- engine interface --------------------------------------------------------------------

    def start(self, engine: Engine) -> None:
        if engine.sampling.do_sample:
            check.fail(OP, "strategy 'specdec' is greedy (relaxed top-beta/tau verification); do_sample=True "
                           "is not supported")
        config = self.drafter.config
        if config.vocab_size != engine.vocab:
            check.fail(OP, f"the drafter's vocabulary ({config.vocab_size} ids) differs from the target's "
                           f"({engine.vocab}): train the drafter on this target (train_specdec_drafter)")
        if self.drafter.has_encoder != engine.encoder_decoder:
            kind = "encoder-decoder" if engine.encoder_decoder else "decoder-only"
            check.fail(OP, f"the target is {kind} but the drafter has config.encoder_layers="
                           f"{config.encoder_layers} (0 = decoder-only form, > 0 = seq2seq form)")
        param = self.drafter.lm_head.weight
        if param.device != engine.device:
            check.fail(OP, f"the drafter is on {param.device}, the target on {engine.device}")
        batch, width = engine.prompts.shape
        # committed tokens <= prompt + max_new_tokens + k (a step's overshoot), plus one feed of k+1
        length = width + engine.max_new_tokens + 2 * self.k + 1
        if length + self.k > config.max_position_embeddings:
            check.fail(OP, f"the longest prompt ({width}) + max_new_tokens ({engine.max_new_tokens}) + blocks "
                           f"needs {length + self.k} positions, more than the drafter's max_position_embeddings "
                           f"({config.max_position_embeddings})")
        # the engine's span (bucketed when graphs are kept) within the drafter's positions
        length = min(engine.span + 2 * self.k + 1, config.max_position_embeddings - self.k)
        self.cache, reused = engine.reuse("specdec.cache", lambda: self.drafter.new_cache(batch, length))
        if reused:  # empty rows, same storage: the kept graphs address it
            self.cache.reset()
        if engine.encoder_decoder:
            self.drafter.encode(engine.input_ids.to(torch.int64), engine.source_mask, self.cache)
        # what the next draft step feeds: the previous step's committed tokens (the first step: the prompt)
        self.pending = engine.keep("specdec.pending", torch.zeros(batch, self.k + 1, dtype=torch.int64,
                                                                  device=engine.device))
        self.pending_count = engine.keep("specdec.pending_count",
                                         torch.zeros(batch, dtype=torch.int64, device=engine.device))

    def graph_key(self):
        return (self.name, id(self.drafter), weight_addresses(self.drafter), self.k)

    def propose(self, engine: Engine, first: bool) -> Proposal:
        if first:
            tokens, count = engine.prompts, engine.prompt_lengths
        else:  # finished rows feed nothing (their cache stays as it was)
            tokens, count = self.pending, torch.where(engine.finished, 0, self.pending_count)
        drafts, _ = self.drafter.draft(tokens, count, self.cache, self.k)
        return Proposal(drafts)

    def commit(self, engine: Engine, proposal: Proposal, accepted: Accepted) -> None:
        """What the next draft step feeds: this step's committed tokens (in place: the captured draft step
        reads these buffers)."""
        self.pending.copy_(accepted.tokens.clamp(min=0))
        self.pending_count.copy_(accepted.num_accepted + 1)

    def end_step(self, engine: Engine, all_accepted: bool, kept_rows: Tensor | None) -> None:
        if kept_rows is not None:
            self.cache.select_rows(kept_rows)
            self.pending = self.pending.index_select(0, kept_rows)
            self.pending_count = self.pending_count.index_select(0, kept_rows)

    def finish(self, engine: Engine) -> dict:
        return {"block_size": self.k, "top_beta": self.top_beta, "tau": self.tau, "lossless": self.lossless}
