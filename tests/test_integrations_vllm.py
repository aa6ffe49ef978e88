"""The vLLM adapter without vLLM: off by default, never imports vLLM, and its packing of vLLM's
flattened ragged layout round-trips, and drafts vLLM marks as rejected (-1) are rejected drafts
(the engine tests are in tests_vllm/, run by .ci/run's vLLM stage)."""

import subprocess
import sys
import types

import pytest
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


# -1 drafts: vLLM pads drafts that structured output rejected with PLACEHOLDER_TOKEN_ID (-1)
# (Scheduler.update_draft_token_ids_in_output, AsyncScheduler's placeholders). vLLM 0.32's
# kernels: rejection_random_sample_kernel rejects any draft < 0 and emits the recovered token;
# sample_recovered_tokens_kernel draws it from max(0, p - q) with draft probabilities, and from
# p with only `vocab_offset != draft_token_id` masked without them, i.e. from all of p for -1;
# rejection_greedy_sample_kernel rejects it (-1 != argmax) and emits the argmax.

def placeholder_batch(placeholder, vocab=9):
    """Ragged rows with a rejected-draft id at every position (first, middle, last, several),
    rows without one and a row without drafts. Each real draft is certain under the target
    (accepted by greedy and random rows alike); the target at a placeholder position is one-hot
    on a token, so every row's output is known exactly: the drafts before the first
    placeholder, that token, then -1 (or all drafts and the bonus)."""
    P = placeholder
    drafts = [[P, 3, 4], [2, P, 5], [1, 6, P], [7, 0, 8], [], [P], [5, P, P], [8]]
    bonus = torch.tensor([vocab - 1, 2, 3, 4, 5, 6, 7, 0])
    logits, draft_probs, expected = [], [], []
    g = max(len(d) for d in drafts)
    for row, tokens in enumerate(drafts):
        emitted, rejected = [], False
        for j, token in enumerate(tokens):
            want = token if 0 <= token < vocab else (row + 2 * j + 1) % vocab
            logits.append(torch.full((vocab,), -1e4).index_fill(0, torch.tensor([want]), 0.0))
            q = torch.zeros(vocab)  # half on the target's token, half elsewhere: residual one-hot on `want`
            q[want], q[(want + 1) % vocab] = 0.5, 0.5
            draft_probs.append(q)
            if not rejected:
                emitted.append(want)
                rejected = want != token
        if not rejected:
            emitted.append(int(bonus[row]))
        expected.append(emitted + [-1] * (g + 1 - len(emitted)))
    return drafts, torch.stack(logits), torch.stack(draft_probs), bonus, torch.tensor(expected, dtype=torch.int32)


@pytest.mark.parametrize("placeholder", [-1, -2, 9, 1000], ids=["minus1", "minus2", "V", "beyond_V"])
@pytest.mark.parametrize("with_draft_probs", [False, True], ids=["no_draft_probs", "draft_probs"])
@pytest.mark.parametrize("rows", ["random", "greedy", "mixed"])
def test_placeholder_drafts_are_rejected_drafts(placeholder, with_draft_probs, rows):
    drafts, logits, draft_probs, bonus, expected = placeholder_batch(placeholder)
    temperature = {"random": [1.0] * 8, "greedy": [0.0] * 8, "mixed": [1.0, 0.0, 0.7, 0.0, 1.0, 0.0, 1.3, 1.0]}[rows]
    meta = metadata(temperature, {2: torch.Generator().manual_seed(5), 6: torch.Generator().manual_seed(6)})
    out = call(drafts, logits, bonus, meta, draft_probs if with_draft_probs else None)
    assert out.dtype == torch.int32
    assert torch.equal(out, expected), f"\n{out}\n{expected}"


@pytest.mark.parametrize("with_draft_probs", [False, True], ids=["no_draft_probs", "draft_probs"])
def test_the_token_at_a_placeholder_follows_vllms_distribution(with_draft_probs):
    """Random rows: at a -1 draft the emitted token follows p without draft probabilities (vLLM
    masks nothing: no token is excluded) and norm(max(0, p - q)) with them. Token 0 carries most
    of p, so treating -1 as a draft of token 0 (one-hot q at 0) would fail this."""
    from scipy.stats import chisquare
    vocab, n = 6, 4000
    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05, 0.0])
    q = torch.tensor([0.3, 0.4, 0.0, 0.1, 0.0, 0.2])
    want = (p - q).clamp(min=0) / (p - q).clamp(min=0).sum() if with_draft_probs else p
    # half the rows: -1 at position 0 of 2; the others: a certain draft, then -1
    drafts = [[-1, 2] if i % 2 == 0 else [4, -1] for i in range(n)]
    certain = torch.full((vocab,), -1e4).index_fill(0, torch.tensor([4]), 0.0)
    rows = []
    for d in drafts:
        rows += [p.log(), certain] if d[0] == -1 else [certain, p.log()]
    logits = torch.stack(rows)
    draft_probs = torch.stack([q if d[j] == -1 else torch.eye(vocab)[d[j]] for d in drafts for j in range(2)])
    meta = metadata([1.0] * n)
    out = call(drafts, logits, torch.zeros(n, dtype=torch.long), meta, draft_probs if with_draft_probs else None)
    first = torch.tensor([i % 2 == 0 for i in range(n)])
    assert bool((out[~first, 0] == 4).all()), "the certain draft before the -1 was not accepted"
    tokens = torch.cat([out[first, 0], out[~first, 1]]).long()
    assert bool((out[first, 1:] == -1).all()) and bool((out[~first, 2:] == -1).all()), "drafts after a -1 were used"
    counts = torch.bincount(tokens, minlength=vocab).double()
    support = want > 0
    assert counts[~support].sum() == 0, counts
    expected = want[support].double() / want[support].double().sum() * n
    pvalue = chisquare(counts[support].numpy(), expected.numpy(), sum_check=False).pvalue
    assert pvalue > 1e-4, f"token at the -1 position off vLLM's distribution: {counts.tolist()} (p={pvalue:.2e})"


def test_a_bonus_id_is_copied_like_vllm_and_never_indexes():
    """vLLM's kernels copy bonus_token_ids verbatim into a row that accepted every draft; an id
    outside [0, V) (never sampled by vLLM, but never an index either) is copied, not looked up."""
    vocab = 5
    drafts = [[2], [], [3]]
    logits = torch.full((2, vocab), -1e4)
    logits[0, 2] = logits[1, 3] = 0.0
    bonus = torch.tensor([-1, vocab, 4])
    for temperature in ([1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 1.0]):
        out = call(drafts, logits, bonus, metadata(temperature))
        assert out.tolist() == [[2, -1], [vocab, -1], [3, 4]]
