"""The vLLM adapter's block verification (SPECDEC_KERNELS_VLLM_VERIFICATION=block) without vLLM:
on vLLM's flattened ragged layout it equals `ops.block_verify` on the padded tensors (draft
probabilities and one-hot n-gram drafts), greedy rows are unchanged, ids stay in range, the
counters say which rule ran, and the switch refuses values it does not know (in-engine tests:
tests_vllm/test_block_verification.py)."""

import json
import subprocess
import sys

import pytest
import torch

from specdec_kernels import ops
from specdec_kernels.integrations.vllm import sampler
from test_integrations_vllm import call, loop_greedy, metadata

ENV = "SPECDEC_KERNELS_VLLM_VERIFICATION"
INT64 = torch.iinfo(torch.int64)


def ragged_batch(lengths, vocab, *, seed=0, greedy_every=0):
    """vLLM-shaped inputs: flattened drafts drawn from q, target logits [T, V], draft probs [T, V],
    bonus ids, temperatures (every `greedy_every`-th row greedy), one seeded generator per row."""
    gen = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    logits = torch.randn(total, vocab, generator=gen) * 2.0
    q = (torch.randn(total, vocab, generator=gen) * 0.7).softmax(-1)
    flat = torch.multinomial(q, 1, generator=gen).squeeze(1) if total else torch.zeros(0, dtype=torch.long)
    drafts, start = [], 0
    for n in lengths:
        drafts.append(flat[start:start + n].tolist())
        start += n
    bonus = torch.randint(0, vocab, (len(lengths),), generator=gen)
    temperature = [0.0 if greedy_every and i % greedy_every == 1 else 1.0 for i in range(len(lengths))]
    return drafts, logits, q, bonus, temperature


def generators(batch, base=100):
    return {i: torch.Generator().manual_seed(base + i) for i in range(batch)}


def expected_block(drafts, logits, draft_probs, bonus, base=100):
    """ops.block_verify on padded tensors built here, row by row, with the seed each row's
    generator gives (the plugin draws one int64 Philox seed per step from a seeded request's
    generator)."""
    batch, vocab = len(drafts), logits.shape[-1]
    g = max(len(d) for d in drafts)
    target = torch.zeros(batch, g + 1, vocab)
    q = torch.zeros(batch, g, vocab)
    tokens = torch.zeros(batch, g, dtype=torch.long)
    probs = logits.softmax(-1)
    start = 0
    for b, row in enumerate(drafts):
        n = len(row)
        target[b, :n] = probs[start:start + n]
        target[b, n, bonus[b]] = 1.0
        q[b, :n] = draft_probs[start:start + n] if draft_probs is not None else torch.eye(vocab)[row]
        tokens[b, :n] = torch.tensor(row, dtype=torch.long)
        start += n
    seeds = torch.stack([torch.randint(INT64.min, INT64.max, (1,), dtype=torch.int64,
                                       generator=torch.Generator().manual_seed(base + b))[0] for b in range(batch)])
    counts = torch.tensor([len(d) for d in drafts])
    out, accepted = ops.block_verify(target, q, tokens, seed=seeds, num_draft_tokens=counts, backend="torch")
    return out.to(torch.int32), accepted


@pytest.fixture
def stats(tmp_path, monkeypatch):
    """The plugin's counters, reset, written to a folder (as in the engine's workers)."""
    monkeypatch.setenv(sampler.STATS_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(sampler, "STATS", {key: 0 for key in sampler.STATS})
    monkeypatch.setenv(sampler.BACKEND_ENV, "torch")
    return sampler.STATS


@pytest.mark.parametrize("with_draft_probs", [True, False], ids=["draft_probs", "one_hot"])
@pytest.mark.parametrize("greedy_every", [0, 3], ids=["random", "mixed"])
def test_block_path_equals_ops_block_verify_on_padded_tensors(stats, tmp_path, monkeypatch, with_draft_probs,
                                                               greedy_every):
    monkeypatch.setenv(ENV, "block")
    lengths = [3, 0, 1, 4, 2, 4, 1, 0, 3, 4] * 6
    vocab = 13
    drafts, logits, q, bonus, temperature = ragged_batch(lengths, vocab, greedy_every=greedy_every)
    draft_probs = q if with_draft_probs else None
    out = call(drafts, logits, bonus, metadata(temperature, generators(len(drafts))), draft_probs)
    want, accepted = expected_block(drafts, logits, draft_probs, bonus)
    greedy = torch.tensor(temperature) == 0
    assert out.dtype == torch.int32 and out.shape == (len(drafts), max(lengths) + 1)
    assert torch.equal(out[~greedy], want[~greedy])
    assert torch.equal(out[greedy], loop_greedy(drafts, logits, bonus, max(lengths))[greedy]), "greedy rows changed"
    # the rows are ragged and the drafts are neither all accepted nor all rejected
    counts = torch.tensor(lengths)
    random_accepted = accepted[~greedy & (counts > 0)]
    assert 0 < int(random_accepted.sum()) < int(counts[~greedy].sum())
    assert bool((random_accepted == counts[~greedy & (counts > 0)]).any())
    assert stats["block_rows"] == stats["random_rows"] == int((~greedy).sum())
    assert stats["one_hot_calls"] == (0 if with_draft_probs else 1)
    written = [json.loads(p.read_text()) for p in tmp_path.glob("specdec_kernels_vllm.*.json")]
    assert len(written) == 1 and written[0]["block_rows"] == stats["block_rows"]


def test_token_is_the_default_and_block_differs_from_it(stats, monkeypatch):
    """Unset (or empty): ops.rejection_sample, no block rows; "token" the same; "block" another rule
    on the same seeds (some rows come out different) that keeps no fewer drafts: the paired
    difference per row is independent across rows, so its mean must not sit 4 standard errors
    below 0 (block verification's expectation is >= token-wise's, row by row)."""
    lengths = [4] * 1000
    drafts, logits, q, bonus, temperature = ragged_batch(lengths, 9, seed=1)

    def run(value):
        if value is None:
            monkeypatch.delenv(ENV, raising=False)
        else:
            monkeypatch.setenv(ENV, value)
        before = dict(stats)
        out = call(drafts, logits, bonus, metadata(temperature, generators(len(drafts))), q)
        return out, {key: stats[key] - before[key] for key in stats}

    default, counted = run(None)
    assert counted["block_rows"] == 0 and counted["random_rows"] == len(drafts)
    for value in ("", "token"):
        again, counted = run(value)
        assert torch.equal(again, default) and counted["block_rows"] == 0
    block, counted = run("block")
    assert counted["block_rows"] == len(drafts)
    assert not torch.equal(block, default)
    difference = ((block >= 0).sum(1) - (default >= 0).sum(1)).double()
    standard_error = float(difference.std()) / len(drafts) ** 0.5
    assert float(difference.mean()) > -4 * standard_error, (float(difference.mean()), standard_error)


@pytest.mark.parametrize("value", ["Block", "blocks", "tree", "1"])
def test_an_unknown_value_is_an_error_naming_the_variable_and_the_choices(monkeypatch, value):
    monkeypatch.setenv(ENV, value)
    with pytest.raises(ValueError) as error:
        sampler.verification()
    message = str(error.value)
    assert "\n" not in message and ENV in message and repr(value) in message
    assert "token" in message and "block" in message
    drafts, logits, q, bonus, temperature = ragged_batch([2, 1], 5)
    with pytest.raises(ValueError, match=ENV):
        call(drafts, logits, bonus, metadata(temperature), q)


def test_register_refuses_an_unknown_value_before_importing_vllm():
    """register() checks the value first (vLLM would otherwise start and verify token by token
    while the user believes block verification runs); with the plugin off it is not read."""
    code = ("import os, sys, specdec_kernels.integrations.vllm as p\n"
            "try:\n    p.register()\nexcept ValueError as e:\n    print('ERROR', e)\n"
            "assert 'vllm' not in sys.modules\n"
            "os.environ['SPECDEC_KERNELS_VLLM'] = '0'\nassert p.register() is False\n")
    env = {"PATH": "/usr/bin:/bin", "SPECDEC_KERNELS_VLLM": "1", ENV: "blok"}
    out = subprocess.run([sys.executable, "-c", code], check=True, env=env, capture_output=True, text=True).stdout
    assert out.startswith("ERROR ") and ENV in out and "'blok'" in out, out


@pytest.mark.parametrize("with_draft_probs", [True, False], ids=["draft_probs", "one_hot"])
def test_ids_in_range_with_degenerate_rows_and_placeholder_drafts(stats, monkeypatch, with_draft_probs):
    """NaN, all -inf (a top-k/top-p mask gone wrong) and one-hot target rows, -1 and out-of-range
    drafts: every emitted id is in [0, V) and -1 only pads the end."""
    monkeypatch.setenv(ENV, "block")
    vocab = 7
    drafts = [[1, 2, 3], [-1, 4], [5, vocab], [0], [], [6, 6, 6]]
    total = sum(len(d) for d in drafts)
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(total, vocab, generator=gen)
    logits[0] = float("nan")
    logits[3] = float("-inf")
    logits[5, :] = -1e4
    logits[5, 0] = 0.0
    q = torch.rand(total, vocab, generator=gen)
    q[7] = float("nan")
    q = q / q.sum(-1, keepdim=True)
    bonus = torch.tensor([0, 1, 2, 3, 4, 5])
    for _ in range(20):
        out = call(drafts, logits, bonus, metadata([1.0] * len(drafts)), q if with_draft_probs else None)
        assert bool(((out == -1) | ((out >= 0) & (out < vocab))).all()), out
        assert bool((out[:, 1:][out[:, :-1] == -1] == -1).all()), "-1 only as trailing padding"
        assert bool((out[:, 0] >= 0).all())
        assert int(out[1, 0]) != -1 and int(out[1, 1]) == -1, "a -1 draft was kept"
        assert int(out[2, 1]) != vocab and int(out[2, 2]) == -1, "an out-of-range draft was kept"
    assert stats["block_rows"] == 20 * len(drafts)
