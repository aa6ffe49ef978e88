"""Sampling through HF's `model.generate(custom_generate=...)` is the target's own law: chi-square of
the first two tokens jointly against the exact distribution after HF's temperature, top-k, top-p and
min-p warpers (read from HF's processor list and applied to target and draft alike), batched, with
token-wise and block verification; a min-p the engine did not apply would fail it."""

import pytest
import torch

from specdec_kernels import custom_generate

from hf_support import one_thread
from sampling_support import PROMPT, ROWS, exact_joint, hf_warp, joint_pvalue, tiny_llama

SETTING = dict(temperature=0.8, top_k=7, top_p=0.95, min_p=0.1)


@pytest.fixture(scope="module")
def models():
    return tiny_llama(0), tiny_llama(1)


def sample(models, verification, **setting):
    target, draft = models
    ids = torch.tensor([PROMPT]).repeat(ROWS, 1)
    with one_thread():
        return target.generate(ids, attention_mask=torch.ones_like(ids), custom_generate=custom_generate,
                               assistant_model=draft, num_draft_tokens=2, verification=verification,
                               max_new_tokens=2, do_sample=True, seed=11, eos_token_id=None, pad_token_id=0,
                               return_dict_in_generate=True, **setting)


@pytest.mark.parametrize("verification", ["token", "block"])
def test_first_two_tokens_follow_the_warped_target(models, verification):
    out = sample(models, verification, **SETTING)
    assert 0 < out.stats.accepted_tokens < out.stats.drafted_tokens  # acceptance and rejection both ran
    joint = exact_joint(models[0], lambda x: hf_warp(x, **SETTING))
    assert joint_pvalue(out.sequences, joint) > 1e-3


def test_a_missing_min_p_fails_the_same_test(models):
    """The law without min-p puts mass on tokens min-p removes: the test sees it."""
    out = sample(models, "block", **SETTING)
    loose = exact_joint(models[0], lambda x: hf_warp(x, SETTING["temperature"], SETTING["top_k"], SETTING["top_p"]))
    strict = exact_joint(models[0], lambda x: hf_warp(x, **SETTING))
    assert bool(((loose > 0) & (strict == 0)).any())  # min-p matters for this prompt
    unfiltered = sample(models, "block", **{**SETTING, "min_p": None})
    with pytest.raises(AssertionError):
        assert joint_pvalue(unfiltered.sequences, strict) > 1e-3
    assert joint_pvalue(out.sequences, strict) > 1e-3
