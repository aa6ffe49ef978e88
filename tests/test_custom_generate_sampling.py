"""Sampling through HF's `model.generate(custom_generate=...)` is the target's own law: chi-square of
the first two tokens jointly against the exact distribution after HF's temperature, top-k, top-p and
min-p warpers (read from HF's processor list and applied to target and draft alike), batched, with
token-wise and block verification; a min-p the engine did not apply would fail it.

On sampling_support.loop_pair, 24,000 rows: the second token often comes from a second step, so a loop
that reuses randomness across steps fails here (tests/test_sampling_loops.py runs that mutation through
custom_generate). These tests once ran on the pair tiny_llama(0)/(1) at 2,000 rows, and passed on the
loop that did reuse it: with these warpers that pair accepts 9% of drafts, so the coins block
verification had examined past its prefix were near-certain failures either way, and the reuse moved
the law too little to see (p = 0.11 at 2,000 rows, 0.51 at 24,000; the loop pair: 3e-26 at 2,000)."""

import pytest
import torch

from specdec_kernels import custom_generate

from hf_support import one_thread
from sampling_support import LOOP_PROMPT, exact_joint, hf_warp, loop_ids, loop_pair, loop_pvalue

SETTING = dict(temperature=0.8, top_k=7, top_p=0.95, min_p=0.1)


@pytest.fixture(scope="module")
def models():
    return loop_pair()


def exact_joint_after(target, **setting):
    return exact_joint(target, lambda x: hf_warp(x, **setting), LOOP_PROMPT)


def sample(models, verification, **setting):
    target, draft = models
    ids = loop_ids()
    with one_thread():
        return target.generate(ids, attention_mask=torch.ones_like(ids), custom_generate=custom_generate,
                               assistant_model=draft, num_draft_tokens=2, verification=verification,
                               max_new_tokens=2, do_sample=True, seed=11, eos_token_id=None, pad_token_id=0,
                               return_dict_in_generate=True, **setting)


@pytest.mark.parametrize("verification", ["token", "block"])
def test_first_two_tokens_follow_the_warped_target(models, verification):
    out = sample(models, verification, **SETTING)
    assert 0 < out.stats.accepted_tokens < out.stats.drafted_tokens  # acceptance and rejection both ran
    joint = exact_joint_after(models[0], **SETTING)
    assert loop_pvalue(out.sequences, joint) > 1e-3


def test_a_missing_min_p_fails_the_same_test(models):
    """The law without min-p puts mass on tokens min-p removes: the test sees it."""
    out = sample(models, "block", **SETTING)
    loose = exact_joint_after(models[0], **{**SETTING, "min_p": None})
    strict = exact_joint_after(models[0], **SETTING)
    assert bool(((loose > 0) & (strict == 0)).any())  # min-p matters for this prompt
    unfiltered = sample(models, "block", **{**SETTING, "min_p": None})
    with pytest.raises(AssertionError):
        assert loop_pvalue(unfiltered.sequences, strict) > 1e-3
    assert loop_pvalue(out.sequences, strict) > 1e-3
