"""The vLLM adapter without vLLM: off by default, never imports vLLM, and its packing of vLLM's
flattened ragged layout round-trips (the engine tests are in tests_vllm/, run by .ci/run's vLLM stage)."""

import subprocess
import sys
import types

import torch

from specdec_kernels.integrations import vllm as plugin
from specdec_kernels.integrations.vllm import sampler


def test_off_by_default_and_vllm_never_imported():
    code = ("import sys, specdec_kernels.integrations.vllm as p; assert p.register() is False; "
            "assert 'vllm' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, env={"SPECDEC_KERNELS_VLLM": "0"})


def test_expand_batch_to_tokens():
    x = torch.tensor([0.5, 0.0, 2.0, 0.7])
    cu = torch.tensor([3, 4, 4, 6], dtype=torch.int32)
    assert torch.equal(sampler.expand_batch_to_tokens(x, cu, 6, replace_from=0, replace_to=1),
                       torch.tensor([0.5, 0.5, 0.5, 1.0, 0.7, 0.7]))
    assert torch.equal(sampler.expand_batch_to_tokens(torch.tensor([5, 7]), torch.tensor([1, 3]), 3),
                       torch.tensor([5, 7, 7]))


def metadata(temperature, generators=None):
    return types.SimpleNamespace(all_greedy=all(t == 0 for t in temperature), all_random=all(t > 0 for t in temperature),
                                 temperature=torch.tensor(temperature), generators=generators or {})


def loop_greedy(drafts, logits, bonus, g):
    """vLLM's greedy rule, one row at a time."""
    out, start = [], 0
    for row, tokens in enumerate(drafts):
        emitted = []
        for j, token in enumerate(tokens):
            top = int(logits[start + j].argmax())
            emitted.append(top)
            if top != token:
                break
        else:
            emitted.append(int(bonus[row]))
        out.append(emitted + [-1] * (g + 1 - len(emitted)))
        start += len(tokens)
    return torch.tensor(out, dtype=torch.int32)


def call(drafts, logits, bonus, meta, draft_probs=None):
    counts = [len(d) for d in drafts]
    flat = torch.tensor(sum(drafts, []), dtype=torch.int32)
    cu = torch.tensor(counts).cumsum(0).to(torch.int32)
    return sampler.rejection_sample(flat, counts, max(counts), cu, draft_probs, logits, bonus.view(-1, 1), meta)


def test_greedy_rows_follow_vllms_rule_on_ragged_rows():
    gen = torch.Generator().manual_seed(0)
    vocab, lengths = 11, [3, 0, 1, 3, 2, 3]
    logits = torch.randn(sum(lengths), vocab, generator=gen)
    drafts, start = [], 0
    for n in lengths:  # mostly the argmax, so rows accept a few and reject some
        top = logits[start:start + n].argmax(-1)
        keep = torch.rand(n, generator=gen) < 0.75
        drafts.append(torch.where(keep, top, torch.randint(0, vocab, (n,), generator=gen)).tolist())
        start += n
    bonus = torch.randint(0, vocab, (len(lengths),), generator=gen)
    out = call(drafts, logits, bonus, metadata([0.0] * len(lengths)))
    assert out.dtype == torch.int32
    assert torch.equal(out, loop_greedy(drafts, logits, bonus, max(lengths)))


def test_random_rows_accept_a_draft_the_target_certainly_emits_and_take_the_bonus():
    vocab = 6
    drafts = [[2, 4], [1], [3, 3, 3]]
    logits = torch.full((6, vocab), -1e4)
    for i, token in enumerate(sum(drafts, [])):
        logits[i, token] = 0.0  # p = one-hot on the draft: always accepted, even with one-hot q (n-gram)
    bonus = torch.tensor([5, 0, 1])
    meta = metadata([1.0, 0.0, 0.7], {0: torch.Generator().manual_seed(3)})
    out = call(drafts, logits, bonus, meta)
    assert out.tolist() == [[2, 4, 5, -1], [1, 0, -1, -1], [3, 3, 3, 1]]


def test_an_unknown_interface_is_reported():
    fake = types.SimpleNamespace(rejection_sample=lambda a, b: None, expand_batch_to_tokens=sampler.expand_batch_to_tokens,
                                 apply_sampling_constraints=lambda logits, cu_num_draft_tokens, sampling_metadata: None,
                                 PLACEHOLDER_TOKEN_ID=-1, GREEDY_TEMPERATURE=0)
    assert "not a tested version" in plugin.interface_problem(fake, "0.40.1")
    assert "rejection_sample takes ['a', 'b']" in plugin.interface_problem(fake, "0.32.0")
