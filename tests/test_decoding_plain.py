"""Strategy `plain` (no draft, one target forward per token on our engine): greedy equals the target's
own generate for left-padded batches and both attention families, and sampling follows the target's
distribution (chi-square of the first two tokens' joint, exact probabilities by enumeration)."""

import pytest
import torch

import specdec_kernels
from specdec_kernels.decoding import PlainDecoder

from decoding_support import left_padded, make_pair
from hf_support import one_thread
from test_decoding_sampling import PROMPT, ROWS, SETTINGS, exact_joint, hf_warp, joint_pvalue, tiny_llama


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_greedy_equals_target_generate(family, tmp_path):
    target, _ = make_pair(family, tmp_path)
    ids, mask = left_padded([7, 3, 5])
    common = dict(attention_mask=mask, max_new_tokens=10, pad_token_id=0, eos_token_id=[])
    with one_thread():
        want = target.generate(ids, do_sample=False, **common)
        got = specdec_kernels.generate(target, ids, strategy="plain", **common)
    assert torch.equal(got.sequences, want)
    assert got.stats.steps == 10 and got.stats.target_forwards == 3 * 10  # one forward per token and row
    assert got.stats.drafted_tokens == 0 and got.stats.mean_accepted_tokens == 1.0


@pytest.mark.parametrize("setting", SETTINGS, ids=["plain", "temp_topk_topp"])
def test_sampling_follows_the_target(setting):
    target = tiny_llama(0)
    ids = torch.tensor([PROMPT]).repeat(ROWS, 1)
    with one_thread():
        out = PlainDecoder(target).generate(ids, max_new_tokens=2, do_sample=True, seed=9, eos_token_id=[],
                                            **setting)
    assert joint_pvalue(out.sequences, exact_joint(target, lambda x: hf_warp(x, **setting))) > 1e-3


def test_sampling_chi_square_rejects_the_wrong_temperature():
    """The same check fails when the draws come from another distribution (the test can fail)."""
    target = tiny_llama(0)
    ids = torch.tensor([PROMPT]).repeat(ROWS, 1)
    with one_thread():
        out = PlainDecoder(target).generate(ids, max_new_tokens=2, do_sample=True, seed=9, eos_token_id=[],
                                            temperature=0.5)
    assert joint_pvalue(out.sequences, exact_joint(target, lambda x: hf_warp(x, 1.0, None, None))) < 1e-6


def test_first_token_comes_from_the_prefill(tmp_path):
    """Greedy plain decoding takes token 1 from the prefill's logits, as HF does: T tokens cost the
    prefill + T - 1 forwards; a row whose first token is EOS stops there, others go on, all equal to HF."""
    target, _ = make_pair("llama", tmp_path)
    ids, mask = left_padded([7, 3, 5])
    layer = target.model.layers[0]
    calls = []
    hook = layer.register_forward_pre_hook(lambda module, args: calls.append(1))  # counts the forwards
    try:
        with one_thread():
            got = specdec_kernels.generate(target, ids, strategy="plain", attention_mask=mask, max_new_tokens=3,
                                           pad_token_id=0, eos_token_id=[])
            assert len(calls) == 3 and got.stats.steps == 3  # the prefill, then two one-token steps
            first = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=1, pad_token_id=0,
                                    eos_token_id=[])[:, -1]
            common = dict(attention_mask=mask, max_new_tokens=4, pad_token_id=0, eos_token_id=int(first[1]))
            want = target.generate(ids, do_sample=False, **common)
            got = specdec_kernels.generate(target, ids, strategy="plain", **common)
            one = specdec_kernels.generate(target, ids, strategy="plain", attention_mask=mask, max_new_tokens=1,
                                           pad_token_id=0, eos_token_id=[])
    finally:
        hook.remove()
    assert torch.equal(got.sequences, want)
    assert torch.equal(one.sequences[:, -1], first) and one.stats.steps == 1
