"""`specdec_kernels.generate(on_step=...)`: the per-step hook behind streaming and stop strings. It sees
every row's new tokens in order (nothing lost or doubled, several per step where drafts were accepted),
and {row: n} keeps only n of them and finishes the row, leaving the other rows as they were."""

import pytest
import torch

import specdec_kernels

from hf_support import one_thread
from sampling_support import tiny_llama

PROMPTS = torch.tensor([[3, 5, 1, 2], [4, 4, 6, 0], [7, 1, 2, 3]])


@pytest.fixture(scope="module")
def models():
    target = tiny_llama(0)
    return target, target  # the target drafts for itself: every draft is accepted, steps emit several tokens


def run(models, on_step=None, **options):
    target, draft = models
    with one_thread():
        return specdec_kernels.generate(target, PROMPTS, strategy="speculative", draft_model=draft, num_draft_tokens=3,
                                        max_new_tokens=9, eos_token_id=[], pad_token_id=0, on_step=on_step, **options)


@pytest.mark.parametrize("do_sample", [False, True])
def test_every_new_token_is_seen_once_in_order(models, do_sample):
    seen = {row: [] for row in range(len(PROMPTS))}
    sizes = []

    def on_step(rows, tokens):
        for row, new in zip(rows, tokens):
            seen[row] += new
            sizes.append(len(new))

    out = run(models, on_step, do_sample=do_sample, seed=4)
    for row in seen:
        assert seen[row] == out.sequences[row, PROMPTS.shape[1]:].tolist()
    assert max(sizes) == 4  # 3 accepted drafts + the bonus token in one step


def test_a_cut_finishes_its_row_only(models):
    whole = run(models).sequences
    calls = []

    def on_step(rows, tokens):
        calls.append(rows)
        return {1: 2} if len(calls) == 1 else None  # row 1 keeps 2 tokens of its first step, then stops

    cut = run(models, on_step)
    width = PROMPTS.shape[1]
    assert cut.sequences[1, width:].tolist() == whole[1, width:width + 2].tolist() + [0] * 7
    assert torch.equal(cut.sequences[[0, 2]], whole[[0, 2]])
    assert all(1 not in rows for rows in calls[1:])  # a finished row is not shown again
    assert cut.stats.emitted_tokens == whole.numel() - PROMPTS.numel() - 7


def test_on_step_must_be_callable(models):
    with pytest.raises(TypeError, match="`on_step` must be callable"):
        run(models, on_step=3)
