"""`specdec_kernels.generate`: the public entry of every decoding strategy."""

import torch

from ..ops import _validate as check
from .engine import OP, Engine, Strategy, restored_attention
from .output import GenerateOutput
from .standardize import Sampling


def _strategies() -> dict:
    from .bild import BildDecoder
    from .plain import PlainDecoder
    from .ppd import PPDDecoder
    from .specdec import SpecDecDecoder
    from .speculative import SpeculativeDecoder
    return {"speculative": SpeculativeDecoder, "bild": BildDecoder, "specdec": SpecDecDecoder, "ppd": PPDDecoder,
            "plain": PlainDecoder}


@torch.no_grad()
def generate(target, input_ids: torch.Tensor, *, strategy, attention_mask: torch.Tensor | None = None,
             max_new_tokens: int, do_sample: bool = False, temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None, eos_token_id=None, pad_token_id: int | None = None, seed: int | None = None,
             backend: str = "auto", cuda_graphs: bool | None = None, **strategy_options) -> GenerateOutput:
    """Generate with a speculative-decoding strategy; HF-style arguments and output layout.

    Args:
        target: the HF model whose output this reproduces (`AutoModelForCausalLM`, or
            `AutoModelForSeq2SeqLM` for encoder-decoder pairs); see hf.SUPPORTED_MODEL_TYPES.
        input_ids: int64 [B, P] prompts (encoder inputs for encoder-decoder models), left- or
            right-padded as marked by `attention_mask` [B, P] (1 = token).
        strategy: "speculative" | "bild" | "specdec" | "ppd", or "plain" (no draft: one target forward per
            token on the same engine, the baseline), or a strategy object (SpeculativeDecoder,
            BildDecoder, SpecDecDecoder, PPDDecoder, PlainDecoder).
        max_new_tokens: new tokens per row at most.
        do_sample, temperature, top_k, top_p: sampling; the same standardisation is applied to
            target and draft. do_sample=False or temperature 0 is argmax decoding. Unlike HF,
            top_k defaults to None (no filter), not 50.
        eos_token_id: int or list; None takes the target's generation_config, like HF. A row
            stops after its EOS. pad_token_id: fills rows after they stop (default: the
            generation_config's, else the first EOS, else 0).
        seed: makes sampling reproducible; each row draws from its own Philox stream, so its
            tokens do not depend on the rest of the batch.
        backend: the verification ops' backend ("auto", "torch", "triton", "cuda").
        cuda_graphs: capture the draft and verify steps as CUDA graphs (default: on a GPU). The graphs
            are kept for later calls with the same models, strategy options, batch size, length bucket
            and sampling (decoding.clear_graph_cache() frees them; graphs.MAX_SESSIONS bounds them).
        strategy_options: the strategy's own (e.g. draft_model=, num_draft_tokens= for
            "speculative"; draft_model=, fallback_threshold=, rollback_threshold= for "bild"; drafter=, block_size=, top_beta=, tau= for "specdec"; exit_layer=, k=, head= for "ppd").

    Returns:
        GenerateOutput(sequences [B, P + T] int64 like HF's generate, stats).
    """
    named = isinstance(strategy, str)
    if named:
        table = _strategies()
        if strategy not in table:
            check.fail(OP, f"unknown strategy {strategy!r}; available: {', '.join(sorted(table))}")
        strategy = table[strategy](target, **strategy_options)
    elif not isinstance(strategy, Strategy):
        check.fail(OP, f"`strategy` must be a name or a Strategy object (got {type(strategy).__name__})", TypeError)
    elif strategy_options:
        check.fail(OP, f"options {sorted(strategy_options)} go to the strategy's constructor, not to generate()")
    sampling = Sampling(bool(do_sample), float(temperature), top_k, top_p)
    with restored_attention(target, getattr(strategy, "draft_model", None)):
        engine = Engine(target, strategy, input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                        sampling=sampling, eos_token_id=eos_token_id, pad_token_id=pad_token_id, seed=seed,
                        backend=backend, cuda_graphs=cuda_graphs, named_strategy=named)
        return engine.run()
