"""Exact sampling laws of tiny models for chi-square tests: the joint distribution of the first two
tokens after a fixed prompt, enumerated over a small vocabulary with HF's own warpers.

Two pairs: `tiny_llama(0)`/`tiny_llama(1)` (vocabulary 8, 2,000 rows: the op-level and warper
tests), and `loop_pair()` for the sampling loop (vocabulary 10, 24,000 rows), chosen so that a
step which reuses randomness an earlier step examined fails by a wide margin (see loop_pair).
"""

import torch
from scipy import stats
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.generation.logits_process import (MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

VOCAB, ROWS, PROMPT = 8, 2000, [3, 5, 1]


def tiny_llama(seed: int):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                         initializer_range=0.5, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(config).eval()


def hf_warp(logits, temperature, top_k, top_p, min_p=None):
    """The target's distribution after HF's own warpers, in HF's order."""
    scores = logits.float().reshape(-1, logits.shape[-1])  # HF's warpers take [rows, V]
    for warper in (TemperatureLogitsWarper(temperature), TopKLogitsWarper(top_k) if top_k else None,
                   TopPLogitsWarper(top_p) if top_p else None, MinPLogitsWarper(min_p) if min_p else None):
        if warper is not None:
            scores = warper(None, scores)
    return scores.softmax(-1).view(logits.shape)


@torch.no_grad()
def chained_joint(next_law, prompt=PROMPT) -> torch.Tensor:
    """[V, V] probability of (x1, x2) for a sampler whose token after a context c follows
    next_law(c) (contexts [R, L] -> laws [R, V]) whatever happened before c."""
    prompt = torch.tensor([prompt])
    p1 = next_law(prompt)[0]
    vocab = p1.shape[-1]
    seconds = torch.cat([prompt.repeat(vocab, 1), torch.arange(vocab).unsqueeze(1)], dim=1)
    return p1.unsqueeze(1) * next_law(seconds)


def exact_joint(target, warp, prompt=PROMPT) -> torch.Tensor:
    """[V, V] probability of (x1, x2) when sampling from the target with the given warpers."""
    return chained_joint(lambda context: warp(target(context).logits[:, -1]), prompt)


def target_pvalue(target, sequences: torch.Tensor) -> float:
    """joint_pvalue of the first two tokens against the target's own law at temperature 1 (an HF model,
    through its sdpa attention: a strategy may have switched it)."""
    target.set_attn_implementation("sdpa")
    with torch.no_grad():
        return joint_pvalue(sequences, exact_joint(target, lambda x: hf_warp(x, 1.0, None, None)))


def joint_pvalue(sequences: torch.Tensor, joint: torch.Tensor, prompt_length: int = len(PROMPT)) -> float:
    vocab = joint.shape[0]
    pairs = sequences[:, prompt_length] * vocab + sequences[:, prompt_length + 1]
    observed = torch.bincount(pairs, minlength=vocab * vocab).double()
    expected = joint.flatten().double() * len(pairs)
    assert observed[expected == 0].sum() == 0  # filtered-out tokens (top-k / top-p / min-p) never appear
    keep = expected >= 5  # cells expecting fewer than 5 draws are merged into one
    small = ~keep & (expected > 0)
    obs = torch.cat([observed[keep], observed[small].sum().view(1)])
    exp = torch.cat([expected[keep], expected[small].sum().view(1)])
    obs, exp = obs[exp > 0], exp[exp > 0]
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


# ---------------------------------------------------------------- the sampling loop's pair

LOOP_VOCAB, LOOP_ROWS, LOOP_PROMPT = 10, 24_000, [1, 4, 2, 7]


def loop_pair():
    """(target, draft) for chi-square tests through the decoding loop.

    A 2-layer Llama over 10 tokens with its LM head scaled by 10 (peaked laws), and as draft the
    same network with Gaussian noise of 0.7 parameter-std added to every weight (norm weights, of
    std 0, stay): block verification keeps 17-38% of the drafts (g = 2-4, T = 0.6-1), so the second
    new token often comes from a second step, and many rejected drafts were close calls. Measured on
    the loop that keyed steps by sequence position (block verification reusing coins it had
    examined): p = 6e-107 (g=2, T=1), 3e-132 (g=4, T=1), 8e-93 (g=2, T=0.6), 1e-109 (g=4, T=0.6)
    at 24,000 rows; tiny_llama(0)/(1) (9% acceptance) gave p = 0.5 even at 24,000 rows."""
    torch.manual_seed(1)
    config = LlamaConfig(vocab_size=LOOP_VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         initializer_range=0.05, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    target = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(10.0)
    draft = LlamaForCausalLM(config).eval()
    draft.load_state_dict(target.state_dict())
    torch.manual_seed(7)
    with torch.no_grad():
        for parameter in draft.parameters():
            parameter.add_(0.7 * parameter.std() * torch.randn_like(parameter))
    return target, draft


def loop_ids(rows: int = LOOP_ROWS) -> torch.Tensor:
    return torch.tensor([LOOP_PROMPT]).repeat(rows, 1)


def loop_joint(target, temperature: float) -> torch.Tensor:
    """The target's exact two-token law after LOOP_PROMPT at a temperature."""
    return exact_joint(target, lambda logits: (logits.float() / temperature).softmax(-1), LOOP_PROMPT)


def loop_pvalue(sequences: torch.Tensor, joint: torch.Tensor) -> float:
    return joint_pvalue(sequences, joint, len(LOOP_PROMPT))
