"""The vLLM plugin's sampler keeps the target's law across steps, in a decoding loop shaped like vLLM's.

The loop stands in for vLLM's engine (no vLLM here; tests_vllm/ runs the real one, too slowly for a
chi-square): the draft samples g tokens from its tempered q, the target scores them, vLLM's sampler
draws the bonus token from p, and `sampler.rejection_sample` verifies, with vLLM's flattened layout and
a SamplingMetadata of per-request generators (seeded) or none (unseeded). The first two new tokens of
24,000 rows of one prompt (sampling_support.loop_pair) are tested against the target's exact law.

The plugin draws a fresh Philox seed per row and step (from the request's generator when seeded), so
no step can reuse a draw an earlier one examined; the mutation that keeps each request's seed fixed
over its steps (every call then reads the same coins) must fail the same test.
"""

import types

import pytest
import torch

from specdec_kernels.integrations.vllm import sampler

from hf_support import one_thread
from sampling_support import LOOP_ROWS, loop_ids, loop_joint, loop_pair, loop_pvalue


@pytest.fixture(scope="module")
def pair():
    return loop_pair()


@torch.no_grad()
def vllm_step(pair, context, g: int, temperature: float, generators: dict, noise: torch.Generator) -> list:
    """One speculative step of rows sharing a length: (each row's new tokens, as a list)."""
    target, draft = pair
    rows, length = context.shape
    drafts, q = [], []
    for _ in range(g):
        probs = (draft(torch.cat([context, *drafts], 1)).logits[:, -1].float() / temperature).softmax(-1)
        drafts.append(torch.multinomial(probs, 1, generator=noise))
        q.append(probs)
    drafts = torch.cat(drafts, 1)
    logits = target(torch.cat([context, drafts], 1)).logits[:, length - 1:].float() / temperature  # [R, g+1, V]
    bonus = torch.multinomial(logits[:, g].softmax(-1), 1, generator=noise)  # vLLM's sampler: the bonus token
    meta = types.SimpleNamespace(all_greedy=False, all_random=True, temperature=torch.full((rows,), temperature),
                                 generators=generators)
    out = sampler.rejection_sample(drafts.flatten().to(torch.int32), [g] * rows, g,
                                   torch.arange(1, rows + 1, dtype=torch.int32) * g, torch.stack(q, 1).flatten(0, 1),
                                   logits[:, :g].flatten(0, 1), bonus, meta)
    return [[t for t in row if t >= 0] for row in out.tolist()]


def first_two_tokens(pair, g: int, temperature: float, seeded: bool) -> torch.Tensor:
    """[rows, prompt + 2]: every row's prompt and first two new tokens, step after step."""
    ids = loop_ids()
    request_generators = [torch.Generator().manual_seed(1000 + r) for r in range(LOOP_ROWS)] if seeded else None
    noise = torch.Generator().manual_seed(5)
    new = [[] for _ in range(LOOP_ROWS)]
    with one_thread():
        while True:
            waiting = [r for r in range(LOOP_ROWS) if len(new[r]) < 2]
            if not waiting:
                break
            context = torch.cat([ids[waiting], torch.tensor([new[r] for r in waiting], dtype=torch.int64)], 1)
            generators = {b: request_generators[r] for b, r in enumerate(waiting)} if seeded else {}
            for r, tokens in zip(waiting, vllm_step(pair, context, g, temperature, generators, noise)):
                new[r] += tokens
    return torch.cat([ids, torch.tensor([row[:2] for row in new])], 1)


@pytest.mark.parametrize("seeded", [False, True], ids=["unseeded", "seeded"])
@pytest.mark.parametrize("verification, g, temperature", [("token", 2, 1.0), ("block", 2, 1.0), ("block", 4, 0.6)])
def test_the_plugin_follows_the_target_step_after_step(pair, monkeypatch, verification, g, temperature, seeded):
    monkeypatch.setenv(sampler.VERIFICATION_ENV, verification)
    sequences = first_two_tokens(pair, g, temperature, seeded)
    assert loop_pvalue(sequences, loop_joint(pair[0], temperature)) > 1e-3


@pytest.mark.parametrize("verification", ["token", "block"])
def test_a_request_seed_that_never_moves_fails_the_same_test(pair, monkeypatch, verification):
    monkeypatch.setenv(sampler.VERIFICATION_ENV, verification)
    monkeypatch.setattr(sampler, "_request_seeds", lambda batch, counts, generators, device: torch.tensor(
        [generators[b].initial_seed() for b in range(batch)], dtype=torch.int64))
    sequences = first_two_tokens(pair, 2, 1.0, seeded=True)
    assert loop_pvalue(sequences, loop_joint(pair[0], 1.0)) < 1e-6
