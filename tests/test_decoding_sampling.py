"""Sampling is lossless: the joint distribution of the first two tokens `speculative` generates
equals the target's own (exact probabilities by enumeration over a tiny vocabulary), with plain
sampling and with temperature + top-k + top-p applied to both models, under token-wise and block
verification; the same chi-square rejects a wrong residual (resampling from p instead of
norm(max(0, p - q))). The standardisation equals HF's warpers."""

import pytest
import torch

import specdec_kernels
from specdec_kernels import ops
from specdec_kernels.decoding import ChainSpeculative, SpeculativeDecoder
from specdec_kernels.decoding import engine as engine_module
from specdec_kernels.decoding.step import Accepted
from specdec_kernels.decoding.verifier import Verifier
from specdec_kernels.decoding.standardize import Sampling, draw, standardize

from hf_support import one_thread
from sampling_support import PROMPT, ROWS, VOCAB, exact_joint, hf_warp, joint_pvalue, tiny_llama

@pytest.fixture(scope="module")
def models():
    return tiny_llama(0), tiny_llama(1)  # independent weights: many rejections, the residual matters


class ResampleFromP(Verifier):
    """A deliberately wrong rule: after a rejection, draw from p instead of the residual."""

    def chain(self, proposal, logits, rows):
        verdict = super().chain(proposal, logits, rows)
        out, num_accepted = verdict.tokens, verdict.num_accepted
        p = standardize(logits, self.sampling)
        at = torch.arange(p.shape[0])
        wrong = draw(p[at, num_accepted], rows.seeds, rows.cursor + num_accepted, salt=7)
        rejected = num_accepted < proposal.tokens.shape[1]
        out[at, num_accepted] = torch.where(rejected, wrong, out[at, num_accepted])
        return Accepted(out, num_accepted)


SETTINGS = [dict(temperature=1.0, top_k=None, top_p=None), dict(temperature=0.7, top_k=6, top_p=0.8)]


@pytest.mark.parametrize("verification", ["token", "block"])
@pytest.mark.parametrize("setting", SETTINGS, ids=["plain", "temp_topk_topp"])
def test_first_two_tokens_follow_the_target(models, setting, verification):
    target, draft = models
    ids = torch.tensor([PROMPT]).repeat(ROWS, 1)
    with one_thread():
        out = specdec_kernels.generate(target, ids, strategy="speculative", draft_model=draft, num_draft_tokens=2,
                                       max_new_tokens=2, do_sample=True, seed=123, eos_token_id=[],
                                       verification=verification, **setting)
    joint = exact_joint(target, lambda x: hf_warp(x, **setting))
    assert 0 < out.stats.accepted_tokens < out.stats.drafted_tokens  # both paths ran
    assert joint_pvalue(out.sequences, joint) > 1e-3


@pytest.mark.parametrize("verification", ["token", "block"])
def test_chi_square_rejects_a_wrong_residual(models, verification, monkeypatch):
    target, draft = models
    ids = torch.tensor([PROMPT]).repeat(ROWS, 1)
    monkeypatch.setattr(engine_module, "Verifier", ResampleFromP)  # the engine's one verifier, mutated
    with one_thread():
        out = ChainSpeculative(target, draft, num_draft_tokens=2, verification=verification).generate(
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


@pytest.mark.parametrize("verification, op", [(None, "block_verify"), ("block", "block_verify"),
                                              ("token", "rejection_sample")])
def test_sampling_uses_the_op_on_the_requested_backend(models, monkeypatch, verification, op):
    """Block verification is the default for sampled chains; token-wise on request."""
    target, draft = models
    calls = {name: [] for name in ("block_verify", "rejection_sample")}
    for name in calls:
        real = getattr(ops, name)
        monkeypatch.setattr(ops, name, lambda *a, _real=real, _name=name, **k: calls[_name].append(k["backend"]) or _real(*a, **k))
    ids = torch.tensor([PROMPT])
    options = {} if verification is None else dict(verification=verification)
    specdec_kernels.generate(target, ids, strategy="speculative", draft_model=draft, max_new_tokens=3,
                             do_sample=True, seed=1, eos_token_id=[], backend="triton", **options)
    assert calls[op] and set(calls[op]) == {"triton"}
    assert not any(calls[other] for other in calls if other != op)


def test_block_verification_accepts_more_than_token_wise(models):
    """Same pair, same prompts: block verification keeps more drafts per step (Sun et al., Theorem 2:
    never fewer in expectation). 2000 rows x 4 new tokens; the gap is many standard errors wide."""
    target, draft = models
    ids = torch.tensor([PROMPT]).repeat(ROWS, 1)
    accepted = {}
    with one_thread():
        for verification in ("token", "block"):
            out = specdec_kernels.generate(target, ids, strategy="speculative", draft_model=draft,
                                           num_draft_tokens=3, max_new_tokens=4, do_sample=True, seed=9,
                                           eos_token_id=[], verification=verification)
            accepted[verification] = out.stats.accepted_tokens / out.stats.target_forwards
    assert accepted["block"] > accepted["token"], accepted


@pytest.mark.parametrize("options, needle", [
    (dict(verification="blocks"), "`verification` must be one of 'block', 'token'"),
    (dict(verification="block", lenience=0.5), "`lenience` < 1 needs verification='token'"),
])
def test_verification_option_errors(models, options, needle):
    target, draft = models
    with pytest.raises(ValueError, match=needle):
        specdec_kernels.generate(target, torch.tensor([PROMPT]), strategy="speculative", draft_model=draft,
                                 max_new_tokens=2, do_sample=True, seed=1, **options)


def test_lenience_defaults_to_token_wise(models):
    assert SpeculativeDecoder(*models, lenience=0.5).verification.chain == "token"
    assert SpeculativeDecoder(*models).verification.chain == "block"
