"""Strategy `dflash`: a DFlash block drafter (transformers' `muse_glimmer_assistant`, HF's
`generate(assistant_model=..., speculation_type="dflash")`, batch 1 there) at any batch size, left-padded,
greedy or sampled.

The assistant reads the target's decoder-layer outputs at its config's `target_layer_ids` (engine.hidden: no
extra target forward; for the last layer the final norm's output, as HF's hidden_states[-1]), concatenated,
for every committed position: each step the newly committed positions' states (the prompt's after the prefill,
then the root and the accepted drafts) enter its cache as context k/v. It drafts a block in one forward: the
root (the anchor, embedded with the target's embedding) and `block_size - 1` mask tokens attend
bidirectionally to each other and to the context; the target's LM head on the mask positions gives
`block_size - 1` drafts, each from its own position's logits (drawn independently when sampling, their q kept for
verification). The block's k/v are cropped from the cache before the next step. The cache is HF's DFlashCache
(grown batch-wide): a row that committed fewer positions than the widest row leaves masked holes, so the
attention mask is kept per row. It grows each step, so the drafter runs eagerly (no CUDA graphs). Verification
is the engine's: exact match when greedy, chain rejection sampling with the drafts' q when sampling, so the
output is the target's.
"""

import torch
from torch import Tensor

from ..common import validate as check
from ..hf.adapters import DFLASH_CONFIG, is_dflash_assistant
from .drafter import Drafter
from .engine import OP
from .hidden_states import FINAL_NORM
from .standardize import draw, fit_vocab, standardize
from .step import Proposal, StepPlan
from .verifier import Verification, chain_rule


def default_models_lack_it(target) -> bool:
    """The table's runs_on: False, since no models set (the demo's, the CLI's) has a DFlash assistant; the strategy
    runs with one passed as draft_model (generate, or custom_generate's speculation_type="dflash")."""
    return False


class DFlashDrafter(Drafter):
    """`DFlashDrafter(target, assistant).generate(input_ids, ...)`, or
    `specdec_kernels.generate(target, input_ids, strategy="dflash", draft_model=assistant, ...)`.

    Args:
        draft_model: the DFlash assistant (`AutoModel` of a `muse_glimmer_assistant` checkpoint), hidden_size the
            target's; it drafts block_size - 1 tokens per step with the target's embedding and LM head.
        verification: sampled chains: "block" (default; "traversal" is the same rule on a chain) or "token"
            (see strategy speculative).
    """

    name = "dflash"
    eager_only = True

    def __init__(self, target=None, draft_model=None, *, verification: str | None = None):
        self.target_model = target
        if not is_dflash_assistant(draft_model):
            check.fail(OP, "strategy 'dflash' needs a DFlash assistant as draft_model (a config with "
                           f"{', '.join(DFLASH_CONFIG)}: transformers' muse_glimmer_assistant; got "
                           f"{type(draft_model).__name__})")
        config = draft_model.config
        hidden = target.config.get_text_config().hidden_size
        if config.hidden_size != hidden:
            check.fail(OP, f"the DFlash assistant's hidden_size {config.hidden_size} must be the target's ({hidden}): "
                           "it reads the target's states and uses its embedding and LM head")
        self.assistant = draft_model
        # HF's hidden_states[i + 1]: layer i's output, but the final norm's for the last layer (transformers 5.x)
        last = target.config.get_text_config().num_hidden_layers - 1
        self.layer_ids = tuple(FINAL_NORM if int(i) == last else int(i) for i in config.target_layer_ids)
        self.block = check.positive_int(OP, "block_size", int(config.block_size))
        if self.block < 2:
            check.fail(OP, f"the DFlash assistant's block_size must be >= 2 (got {self.block})")
        self.mask_id = int(config.mask_token_id)
        self.k = self.max_width = self.block - 1
        self.verification = Verification(chain=chain_rule(verification))

    def target_layers(self) -> tuple:
        return self.layer_ids

    def start(self, engine) -> None:
        from transformers.cache_utils import DFlashCache

        if engine.graphs.enabled:
            check.fail(OP, "strategy 'dflash' drafts eagerly (its assistant's cache grows each step): pass "
                           "cuda_graphs=False")
        batch = engine.prompts.shape[0]
        self.cache = DFlashCache(config=self.assistant.config)
        self.valid = torch.zeros(batch, 0, dtype=torch.bool, device=engine.device)  # the cache's live entries
        self.seen = torch.zeros(batch, dtype=torch.int64, device=engine.device)  # committed positions so far
        self.embeddings = self.target_model.get_input_embeddings()

    def plan(self, engine, first: bool) -> StepPlan:
        return StepPlan(self.k)

    def embed(self, tokens: Tensor) -> Tensor:
        """The target's embedding without its optional embed_norm, as HF's DFlash candidate generator."""
        norm = getattr(self.embeddings, "embed_norm", None)
        if norm is None:
            return self.embeddings(tokens)
        try:
            self.embeddings.embed_norm = torch.nn.Identity()
            return self.embeddings(tokens)
        finally:
            self.embeddings.embed_norm = norm

    @torch.no_grad()
    def propose(self, engine, first: bool) -> Proposal:
        states = torch.cat([engine.hidden.states(layer) for layer in self.layer_ids], dim=-1)
        count, batch, width = engine.hidden.count, states.shape[0], states.shape[1]
        device = states.device
        if not first:  # the last block's k/v
            self.cache.crop(-self.block)
            self.valid = self.valid[:, :-self.block]
        steps = torch.arange(width + self.block, device=device)
        live = torch.cat([steps[:width].unsqueeze(0) < count.unsqueeze(1),
                          torch.ones(batch, self.block, dtype=torch.bool, device=device)], dim=1)
        # context positions seen + j, the block's from the root's position seen + count
        positions = self.seen.unsqueeze(1) + torch.where(steps < width, steps, steps - width + count.unsqueeze(1))
        self.valid = torch.cat([self.valid, live], dim=1)
        self.seen = self.seen + count
        noise = torch.cat([engine.root.unsqueeze(1), torch.full((batch, self.block - 1), self.mask_id,
                                                                dtype=torch.int64, device=device)], dim=1)
        self.cache.set_previous_accepted_tokens(width)
        out = self.assistant(noise_embeds=self.embed(noise), context_hidden_states=states, position_ids=positions,
                             attention_mask=self.valid.long(), cache=self.cache).last_hidden_state
        logits = fit_vocab(engine.target.lm_head(out[:, 1:]), engine.vocab)
        if not engine.sampling.do_sample:
            return Proposal(torch.argmax(logits, dim=-1))
        q = standardize(logits, engine.sampling)
        drafts = torch.stack([draw(q[:, i], engine.seeds, engine.cursor + i) for i in range(self.k)], dim=1)
        return Proposal(drafts, q)

    def end_step(self, engine, all_accepted: bool, kept_rows: Tensor | None) -> None:
        if kept_rows is None:
            return
        self.valid, self.seen = self.valid.index_select(0, kept_rows), self.seen.index_select(0, kept_rows)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, kept_rows)
            layer.values = layer.values.index_select(0, kept_rows)
