"""Strategy `bild` (Kim et al., Big Little Decoder). LOSSY: not the large model's distribution nor,
in general, its greedy output (the paper's "ensembling effect").

The options (mode, rollback_rule, verify_small_eos) and the statistics: docs/strategies/bild.md.
Under CUDA graphs the small model runs max_small_run forwards every round (static shapes) and a row's
tokens after its fallback are ignored; eagerly the round stops once no row is still running.
"""

import torch
from torch import Tensor

from .. import ops
from ..common import validate as check
from .draft_model import TwoModelDrafter
from .engine import OP, Engine, weight_addresses
from .step import Accepted, Proposal
from .verifier import Verification


class BildDecoder(TwoModelDrafter):
    """`BildDecoder(large, small, fallback_threshold=0.6, rollback_threshold=5.0).generate(ids, ...)`,
    or `specdec_kernels.generate(large, ids, strategy="bild", draft_model=small, ...)`."""

    name = "bild"
    needs = "the small model, sharing the large one's vocabulary"

    def __init__(self, target=None, draft_model=None, *, fallback_threshold: float = 0.6,
                 rollback_threshold: float = 5.0, max_small_run: int = 10, mode: str = "paper",
                 rollback_rule: str = "nll", verify_small_eos: bool = True):
        super().__init__(target, draft_model)
        self.fallback_threshold = check.real_number(OP, "fallback_threshold", fallback_threshold, minimum=0.0)
        if self.fallback_threshold > 1:
            check.fail(OP, f"`fallback_threshold` is a probability, at most 1 (got {fallback_threshold})")
        self.rollback_threshold = check.real_number(OP, "rollback_threshold", rollback_threshold, minimum=0.0)
        self.max_small_run = self.max_width = check.positive_int(OP, "max_small_run", max_small_run)
        for name, value, allowed in (("mode", mode, ("paper", "official")),
                                     ("rollback_rule", rollback_rule, ("nll", "exact"))):
            if value not in allowed:
                check.fail(OP, f"`{name}` must be one of {allowed} (got {value!r})")
        self.mode, self.rollback_rule, self.verify_small_eos = mode, rollback_rule, bool(verify_small_eos)
        self.verification = Verification(rule="bild", rollback_threshold=self.rollback_threshold,
                                         rollback_rule=rollback_rule, keep_matching_run=mode == "official",
                                         trust_draft_eos=not self.verify_small_eos)

    # ---- engine interface --------------------------------------------------------------------

    def start(self, engine: Engine) -> None:
        super().start(engine)
        batch = engine.root.shape[0]
        # official mode: the large model takes the first round, and the round after a rollback
        self.large_next = engine.keep("bild.large_next", torch.full((batch,), self.mode == "official",
                                                                    dtype=torch.bool, device=engine.device))
        # fallbacks, rollbacks, forced
        self.counts = engine.keep("bild.counts", torch.zeros(3, dtype=torch.int64, device=engine.device))

    def graph_key(self):
        return (self.name, id(self.draft_model), weight_addresses(self.draft_model), self.fallback_threshold,
                self.max_small_run, self.mode)

    def propose(self, engine: Engine, first: bool) -> Proposal:
        feed = self.draft.begin(engine, first)
        running = ~self.large_next & ~engine.finished
        count = torch.zeros_like(engine.root)
        fell_back = torch.zeros_like(running)
        tokens = []
        for i in range(self.max_small_run):
            logits = self.draft.next_logits(feed)
            token, q = self.draft_token(engine, logits, engine.cursor + i)
            # confidence of the distribution the token came from (log q: max_prob of it is max q)
            unsure = ops.fallback_check(logits if q is None else q.log(), self.fallback_threshold,
                                        backend=engine.backend)
            fell_back |= running & unsure
            running = running & ~unsure
            count += running
            if self.verify_small_eos:
                running = running & ~torch.isin(token, engine.eos_ids)
            tokens.append(token)
            if not engine.graphs.enabled and not bool(running.any()):
                break  # every row has handed over: more small-model tokens would all be ignored
            feed = token.unsqueeze(1)
        forced = count == self.max_small_run
        return Proposal(torch.stack(tokens, dim=1), None, count, torch.stack([fell_back, forced], dim=1))

    def commit(self, engine: Engine, proposal: Proposal, accepted: Accepted) -> None:
        """The draft cache's rollback; the round's statistics, and who starts the next round (official
        mode: the large model, after a rollback)."""
        super().commit(engine, proposal, accepted)
        rolled_back = (accepted.num_accepted < proposal.num_draft) & ~engine.finished
        fell_back, forced = proposal.extra.unbind(1)
        active = ~engine.finished
        self.counts += torch.stack([(fell_back & active).sum(), rolled_back.sum(), (forced & active).sum()])
        self.large_next.copy_(rolled_back if self.mode == "official" else torch.zeros_like(rolled_back))

    def end_step(self, engine: Engine, all_accepted: bool, kept_rows: Tensor | None) -> None:
        super().end_step(engine, all_accepted, kept_rows)
        if kept_rows is not None:
            self.large_next = self.large_next.index_select(0, kept_rows)

    def finish(self, engine: Engine) -> dict:
        fallbacks, rollbacks, forced = self.counts.tolist()
        passes = max(int(engine.counts[0]), 1)
        return {"fallback_rate": fallbacks / passes, "rollback_rate": rollbacks / passes, "forced_handoffs": forced}
