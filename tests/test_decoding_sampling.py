"""Sampling is lossless: the joint distribution of the first two tokens `speculative` generates
equals the target's own (exact probabilities by enumeration over a tiny vocabulary), with plain
sampling and with temperature + top-k + top-p applied to both models; the same chi-square rejects
a wrong residual (resampling from p instead of norm(max(0, p - q))). The standardisation equals
HF's warpers."""

import pytest
import torch
from scipy import stats
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

import specdec_kernels
from specdec_kernels import ops
from specdec_kernels.decoding import SpeculativeDecoder
from specdec_kernels.decoding.standardize import Sampling, draw, standardize

from hf_support import one_thread

VOCAB, ROWS, PROMPT = 8, 2000, [3, 5, 1]


def tiny_llama(seed: int):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                         initializer_range=0.5, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def models():
    return tiny_llama(0), tiny_llama(1)  # independent weights: many rejections, the residual matters


def hf_warp(logits, temperature, top_k, top_p):
    scores = logits.float().reshape(-1, logits.shape[-1])  # HF's warpers take [rows, V]
    for warper in (TemperatureLogitsWarper(temperature), TopKLogitsWarper(top_k) if top_k else None,
                   TopPLogitsWarper(top_p) if top_p else None):
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
    assert observed[expected == 0].sum() == 0  # filtered-out tokens (top-k / top-p) never appear
    keep = expected >= 5  # cells expecting fewer than 5 draws are merged into one
    small = ~keep & (expected > 0)
    obs = torch.cat([observed[keep], observed[small].sum().view(1)])
    exp = torch.cat([expected[keep], expected[small].sum().view(1)])
    obs, exp = obs[exp > 0], exp[exp > 0]
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


class ResampleFromP(SpeculativeDecoder):
    """A deliberately wrong rule: after a rejection, draw from p instead of the residual."""

    def accept(self, engine, proposal, logits):
        out, num_accepted = super().accept(engine, proposal, logits)
        p = standardize(logits, engine.sampling)
        rows = torch.arange(p.shape[0])
        wrong = draw(p[rows, num_accepted], engine.seeds, engine.offsets + num_accepted, salt=7)
        rejected = num_accepted < proposal.tokens.shape[1]
        out[rows, num_accepted] = torch.where(rejected, wrong, out[rows, num_accepted])
        return out, num_accepted


SETTINGS = [dict(temperature=1.0, top_k=None, top_p=None), dict(temperature=0.7, top_k=6, top_p=0.8)]


@pytest.mark.parametrize("setting", SETTINGS, ids=["plain", "temp_topk_topp"])
def test_first_two_tokens_follow_the_target(models, setting):
    target, draft = models
    ids = torch.tensor([PROMPT]).repeat(ROWS, 1)
    with one_thread():
        out = specdec_kernels.generate(target, ids, strategy="speculative", draft_model=draft, num_draft_tokens=2,
                                       max_new_tokens=2, do_sample=True, seed=123, eos_token_id=[], **setting)
    joint = exact_joint(target, lambda x: hf_warp(x, **setting))
    assert 0 < out.stats.accepted_tokens < out.stats.drafted_tokens  # both paths ran
    assert joint_pvalue(out.sequences, joint) > 1e-3


def test_chi_square_rejects_a_wrong_residual(models):
    target, draft = models
    ids = torch.tensor([PROMPT]).repeat(ROWS, 1)
    with one_thread():
        out = ResampleFromP(target, draft, num_draft_tokens=2).generate(
            ids, max_new_tokens=2, do_sample=True, seed=123, eos_token_id=[])
    pvalue = joint_pvalue(out.sequences, exact_joint(target, lambda x: hf_warp(x, 1.0, None, None)))
    assert pvalue < 1e-6


def test_seeded_sampling_is_reproducible(models):
    target, draft = models
    ids = torch.tensor([PROMPT, [2, 4, 6], [7, 7, 1]])
    run = lambda rows: specdec_kernels.generate(target, rows, strategy="speculative", draft_model=draft,  # noqa: E731
                                                max_new_tokens=6, do_sample=True, seed=5, eos_token_id=[]).sequences
    full = run(ids)
    assert torch.equal(full, run(ids))


def test_standardize_equals_hf_warpers():
    logits = torch.randn(5, 3, 40) * 3
    logits[0, 0, :4] = logits[0, 0, 4]  # ties at the top-k boundary
    for temperature, top_k, top_p in [(1.0, None, None), (0.6, 5, None), (1.3, None, 0.7), (0.8, 10, 0.5)]:
        ours = standardize(logits, Sampling(True, temperature, top_k, top_p))
        theirs = hf_warp(logits.view(-1, 40), temperature, top_k, top_p).view_as(ours)
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)


def test_sampling_uses_the_op_on_the_requested_backend(models, monkeypatch):
    target, draft = models
    calls = []
    real = ops.rejection_sample
    monkeypatch.setattr(ops, "rejection_sample", lambda *a, **k: calls.append(k["backend"]) or real(*a, **k))
    ids = torch.tensor([PROMPT])
    specdec_kernels.generate(target, ids, strategy="speculative", draft_model=draft, max_new_tokens=3,
                             do_sample=True, seed=1, eos_token_id=[], backend="triton")
    assert calls and set(calls) == {"triton"}
