"""`specdec_kernels.generate`: the public entry of every decoding strategy. It names the strategy's drafter
through the strategy table (strategies.py) and runs it (decode.py)."""

import torch

from ..common import validate as check
from .decode import decode
from .drafter import Drafter
from .engine import OP
from .output import GenerateOutput
from .strategies import strategy as table_row


def generate(target, input_ids: torch.Tensor, *, strategy, attention_mask: torch.Tensor | None = None,
             max_new_tokens: int, do_sample: bool = False,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None, eos_token_id=None,
             pad_token_id: int | None = None, seed: int | None = None, backend: str = "auto",
             cuda_graphs: bool | None = None, min_p: float | None = None, min_new_tokens: int = 0, on_step=None,
             **strategy_options) -> GenerateOutput:
    """Generate with a speculative-decoding strategy; HF-style arguments and output layout.

    Args:
        target: the HF model whose output this reproduces (`AutoModelForCausalLM`, or
            `AutoModelForSeq2SeqLM` for encoder-decoder pairs); see hf.SUPPORTED_MODEL_TYPES.
        input_ids: int64 [B, P] prompts (encoder inputs for encoder-decoder models), left- or
            right-padded as marked by `attention_mask` [B, P] (1 = token). Without attention_mask, as HF:
            where the pad id (pad_token_id, else the generation_config's) occurs in input_ids and is no
            EOS id, the mask is input_ids != pad; a batch padded with an id that is also an EOS id is
            refused (padding could not be told from text).
        strategy: a strategy's name (the table in decoding/strategies.py; docs/generate.md lists them, "plain"
            among them: no draft, one target forward per token on the same engine, the baseline), or a
            Drafter object (SpeculativeDecoder, BildDecoder, SpecDecDecoder, PPDDecoder, LookupDecoder,
            PlainDecoder, or a drafter of your own: docs/design.md).
        max_new_tokens: new tokens per row at most.
        do_sample, temperature, top_k, top_p, min_p: sampling; the same standardisation (HF's
            warpers, in HF's order) is applied to target and draft. do_sample=False or temperature 0
            is argmax decoding; with do_sample=False the other settings (and seed) change nothing and,
            as in HF, a warning says so. Unlike HF, top_k defaults to None (no filter), not 50.
        eos_token_id: int or list; None takes the target's generation_config, like HF. A row
            stops after its EOS. pad_token_id: fills rows after they stop (default: the
            generation_config's, else the first EOS, else 0).
        seed: makes sampling reproducible; each row draws from its own Philox stream, so its
            tokens do not depend on the rest of the batch.
        backend: the backend of every op a step runs ("auto", "torch", "triton", "cuda"): the verify
            ops, tree attention, kv_compact / kv_rollback and the early-exit top-k (kv_rollback, one
            add with only a torch form, stays torch).
        cuda_graphs: capture the draft and verify steps as CUDA graphs (default: on a GPU). The graphs
            are kept for later calls with the same models, strategy options, batch size, length bucket
            and sampling (decoding.clear_graph_cache() frees them; graphs.MAX_SESSIONS bounds them).
        min_new_tokens: no EOS before this many new tokens (HF's min_new_tokens: the target's EOS
            probability is 0 there; lossless, drafts of EOS are rejected).
        on_step: called after every step as on_step(rows, tokens) with the output row ids that
            emitted tokens and each one's new token ids (several per step, in order; cut at EOS and
            max_new_tokens); return None, or {row: n} to keep only the first n of that row's new
            tokens and stop the row (e.g. a stop string ended there). Costs one host read per step.
        strategy_options: the strategy's own (e.g. draft_model=, num_draft_tokens= for
            "speculative"; draft_model=, fallback_threshold=, rollback_threshold= for "bild"; drafter=, block_size=, top_beta=, tau= for "specdec"; exit_layer=, k=, head= for "ppd").

    Returns:
        GenerateOutput(sequences [B, P + T] int64 like HF's generate, stats).
    """
    named = isinstance(strategy, str)
    if named:
        strategy = table_row(strategy).make(target, **strategy_options)
        strategy_options = {}
    elif not isinstance(strategy, Drafter):
        check.fail(OP, f"`strategy` must be a name or a Drafter object (got {type(strategy).__name__})", TypeError)
    return decode(target, strategy, input_ids, named=named, attention_mask=attention_mask,
                  max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature, top_k=top_k,
                  top_p=top_p, eos_token_id=eos_token_id, pad_token_id=pad_token_id, seed=seed, backend=backend,
                  cuda_graphs=cuda_graphs, min_p=min_p, min_new_tokens=min_new_tokens, on_step=on_step,
                  **strategy_options)
