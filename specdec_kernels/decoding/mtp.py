"""Strategy `mtp`: the target's own multi-token-prediction layers draft (DeepSeek-V3's MTP modules, as
GLM-4-MoE and ERNIE 4.5 MoE ship them), loaded with transformers' own `MtpModel.from_pretrained(target)`:
what HF's `generate(use_mtp=True)` runs at batch 1, here at any batch size, left-padded, greedy or sampled.

The MTP layer at position t reads the target's final-norm hidden state h_t (engine.hidden: no extra target
forward) and the embedding of token t + 1, and predicts token t + 2. Its cache (a SpecCache, one layer)
holds an entry for every position whose target state is committed: after each step the rows' newly
committed states (the root and the accepted drafts; the prompt's after the prefill) are fed with the
tokens one place to their right, which the step made known (the accepted drafts and the correction or
bonus token). The last of them gives the first draft; each further draft feeds the layer its own output
and the previous draft (the first MTP layer reused, as vLLM reuses it past num_mtp_layers), written past
the committed entries and forgotten before the next step. Verification is the engine's: exact match when
greedy, chain rejection sampling with the drafts' q when sampling, so the output is the target's.
"""

import weakref

import torch
from torch import Tensor

from ..common import validate as check
from .drafter import Drafter
from .engine import OP, weight_addresses
from .hidden_states import FINAL_NORM
from .standardize import draft_token, fit_vocab
from .step import Proposal, StepPlan
from .verifier import Verification, chain_rule

_LOADED = weakref.WeakKeyDictionary()  # target -> its MtpModel, loaded once per target


def has_mtp_layers(target) -> bool:
    """Whether the target's config has num_mtp_layers (what strategy mtp runs on)."""
    config = getattr(target, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return bool(getattr(text, "num_mtp_layers", None))


def mtp_layers(target) -> int:
    """The target's config.num_mtp_layers, or the one-line error naming the strategy's need."""
    config = getattr(target, "config", None)
    if not has_mtp_layers(target):
        check.fail(OP, "strategy 'mtp' needs a target whose config has num_mtp_layers (HF's multi-token-prediction "
                       f"layers; got model type {getattr(config, 'model_type', None)!r} without them)")
    return int(config.get_text_config().num_mtp_layers)


def load_mtp(target):
    """transformers' MtpModel of `target`, its weights read from the target's checkpoint, on the device of the
    target's LM head (kept for later calls on the same target)."""
    model = _LOADED.get(target)
    if model is None:
        from transformers.modeling_layers import MtpModel

        device = target.get_output_embeddings().weight.device
        model = _LOADED[target] = MtpModel.from_pretrained(target, device_map={"": device}).eval()
    return model


class MtpDrafter(Drafter):
    """`MtpDrafter(target, num_draft_tokens=None).generate(input_ids, ...)`, or
    `specdec_kernels.generate(target, input_ids, strategy="mtp", ...)` on a target whose config has
    num_mtp_layers.

    Args:
        num_draft_tokens: drafts per step (default: the model's num_mtp_layers, as HF's use_mtp).
        verification: sampled chains: "block" (default; "traversal" is the same rule on a chain) or "token"
            (see strategy speculative).
        mtp_model: the target's transformers MtpModel, if already loaded (default: loaded from the
            target's checkpoint with MtpModel.from_pretrained(target)).
    """

    name = "mtp"

    def __init__(self, target=None, *, num_draft_tokens: int | None = None, verification: str | None = None,
                 mtp_model=None):
        self.target_model = target
        layers = mtp_layers(target)
        self.k = check.positive_int(OP, "num_draft_tokens", layers if num_draft_tokens is None else num_draft_tokens)
        self.verification = Verification(chain=chain_rule(verification))
        self.max_width = self.k
        self.mtp = mtp_model if mtp_model is not None else load_mtp(target)

    def target_layers(self) -> tuple:
        return (FINAL_NORM,)

    def adapted_models(self) -> tuple:
        return (self.mtp,)  # start() switches its attention to ours: a user's mtp_model is given back as it was

    def graph_key(self):
        return (self.name, id(self.mtp), weight_addresses(self.mtp), self.k)

    def start(self, engine) -> None:
        from .. import hf

        self.mtp.set_attn_implementation(hf.register())
        batch, (_, heads, head_dim) = engine.prompts.shape[0], engine.target.cache_shape()
        weight = engine.target.lm_head.weight
        self.cache, reused = engine.reuse("mtp.cache", lambda: hf.SpecCache(
            1, batch, heads, head_dim, engine.cache_length(engine.target, "target"), dtype=weight.dtype,
            device=weight.device, backend=engine.backend))
        if reused:
            self.cache.reset()
        # the tokens right of the last step's committed states: its accepted drafts, then the new root
        self.fed = engine.keep("mtp.fed", torch.zeros(batch, self.k + 1, dtype=torch.int64, device=engine.device))

    def plan(self, engine, first: bool) -> StepPlan:
        # one-token prompts: no committed state to draft from yet, so the first step has no drafts
        return StepPlan(0 if first and engine.prompts.shape[1] == 1 else self.k)

    def propose(self, engine, first: bool) -> Proposal:
        if engine.step.width == 0:
            return Proposal(engine.root.new_zeros(engine.root.shape[0], 0))
        states, count = engine.hidden.states(FINAL_NORM), engine.hidden.count
        tokens = engine.prompts[:, 1:states.shape[1] + 1] if first else self.fed
        out = self.forward(states, tokens)  # the committed positions, kept in the MTP cache
        self.cache.commit(count)
        last = out.gather(1, (count - 1).clamp(min=0).view(-1, 1, 1).expand(-1, 1, out.shape[-1]))
        drafts, probs = [], []
        for i in range(self.k):
            if i:  # a draft's entry, forgotten below
                last = self.forward(last, drafts[-1].unsqueeze(1))
                self.cache.commit(1)
            logits = fit_vocab(self.mtp._project_to_logits(last)[:, -1], engine.vocab)
            token, q = draft_token(logits, engine.sampling, engine.seeds, engine.cursor + i)
            drafts.append(token)
            if q is not None:
                probs.append(q)
        self.cache.seq_lens.sub_(self.k - 1)
        return Proposal(torch.stack(drafts, dim=1), torch.stack(probs, dim=1) if probs else None)

    @torch.no_grad()
    def forward(self, states: Tensor, tokens: Tensor) -> Tensor:
        """The first MTP layer over states [B, N, H] and the tokens right of them [B, N] (written at the
        cache's seq_lens, position ids one past them, as HF shifts them); its output [B, N, H]."""
        positions = self.cache.positions(tokens.shape[1]) + 1
        return self.mtp.forward_layer(0, states, positions, self.cache, input_ids=tokens, use_cache=True,
                                      specdec_step=self.cache.step())

    def commit(self, engine, proposal, accepted) -> None:
        self.fed[:, :accepted.tokens.shape[1]].copy_(accepted.tokens.clamp(min=0))

    def end_step(self, engine, all_accepted: bool, kept_rows: Tensor | None) -> None:
        if kept_rows is not None:
            self.cache.select_rows(kept_rows)
            self.fed = self.fed.index_select(0, kept_rows)
