"""Exact sampling laws of tiny models for chi-square tests: the joint distribution of the first two
tokens after a fixed prompt, enumerated over a vocabulary of 8 with HF's own warpers."""

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
def exact_joint(target, warp) -> torch.Tensor:
    """[V, V] probability of (x1, x2) when sampling from the target with the given warpers."""
    prompt = torch.tensor([PROMPT])
    p1 = warp(target(prompt).logits[0, -1])
    seconds = torch.cat([prompt.repeat(VOCAB, 1), torch.arange(VOCAB).unsqueeze(1)], dim=1)
    p2 = warp(target(seconds).logits[:, -1])
    return p1.unsqueeze(1) * p2


def joint_pvalue(sequences: torch.Tensor, joint: torch.Tensor) -> float:
    pairs = sequences[:, len(PROMPT)] * VOCAB + sequences[:, len(PROMPT) + 1]
    observed = torch.bincount(pairs, minlength=VOCAB * VOCAB).double()
    expected = joint.flatten().double() * len(pairs)
    assert observed[expected == 0].sum() == 0  # filtered-out tokens (top-k / top-p / min-p) never appear
    keep = expected >= 5  # cells expecting fewer than 5 draws are merged into one
    small = ~keep & (expected > 0)
    obs = torch.cat([observed[keep], observed[small].sum().view(1)])
    exp = torch.cat([expected[keep], expected[small].sum().view(1)])
    obs, exp = obs[exp > 0], exp[exp > 0]
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)
