"""Block verification (SPECDEC_KERNELS_VLLM_VERIFICATION=block) in process, with vLLM's own
metadata objects and its `apply_sampling_constraints` (temperature, top-k, top-p) in front of the
patched `rejection_sample`, as `RejectionSampler.forward` calls them (the engine runs are in
test_engine.py):

- chi-square of the first two emitted tokens jointly against the exact target after vLLM's
  filters, in a batch of ragged rows mixing greedy and random requests, with draft probabilities
  (draft model) and without (n-gram: one-hot drafts);
- a mutant without the residual mass in the thresholds (h_i = 0 for i < n: only whole blocks or
  exact prefixes survive) fails it;
- greedy rows are those of token-wise verification, and random rows keep at least as many drafts.
"""

import pytest
import torch
from test_inprocess import ROW_TYPES, V, mixed_batch, processed_probs, rs, verify  # noqa: F401  (rs: a fixture)

ENV = "SPECDEC_KERNELS_VLLM_VERIFICATION"
P_MIN = 1e-4


@pytest.fixture(scope="module")
def batches(rs):
    """For draft-model and n-gram drafts: the mixed batch and its outputs under token-wise and block
    verification (built once: the batch of 15000 rows takes seconds on two cores)."""
    from specdec_kernels.integrations.vllm import sampler
    result = {}
    with pytest.MonkeyPatch.context() as env:
        env.setenv(sampler.BACKEND_ENV, "torch")
        for with_draft_probs in (True, False):
            batch = mixed_batch(rs, with_draft_probs=with_draft_probs)
            outs = {}
            for value in ("token", "block"):
                env.setenv(ENV, value)
                outs[value] = verify(rs, *batch[:5])
            result[with_draft_probs] = batch, outs
    return result


def target_of(rs, target, kind, position):
    t, k, p, _ = ROW_TYPES[kind]
    return processed_probs(rs, target[kind, position], t, k if k < V else None, p if p < 1 else None)


def first_two(out, rows, p1, gen):
    """(first, second) emitted token of each row; where the row stopped after one token, the second
    is what the engine's next step samples: a draw from the target at the next position (p1; the
    test's target at position 1 does not depend on the token before it)."""
    first, second = out[rows, 0].long(), out[rows, 1].long()
    stopped = second < 0
    second[stopped] = torch.multinomial(p1, int(stopped.sum()), replacement=True, generator=gen)
    return first, second


def joint_chi_square_p(first, second, p0, p1) -> float:
    """Chi-square of the (first, second) pairs against p0(a) p1(b); cells expecting fewer than 5
    pooled into one."""
    from scipy.stats import chisquare
    expected = (p0.double().unsqueeze(1) * p1.double().unsqueeze(0)).flatten() * len(first)
    counts = torch.bincount(first * V + second, minlength=V * V).double()
    assert counts[expected == 0].sum() == 0, "pairs outside the target's support"
    big = expected >= 5
    observed = torch.cat([counts[big], counts[~big & (expected > 0)].sum().view(1)])
    wanted = torch.cat([expected[big], expected[~big & (expected > 0)].sum().view(1)])
    keep = wanted > 0
    observed, wanted = observed[keep].numpy(), wanted[keep].numpy()
    return float(chisquare(observed, wanted / wanted.sum() * observed.sum(), sum_check=False).pvalue)


def random_kinds():
    return [kind for kind, (t, _, _, n) in enumerate(ROW_TYPES) if t > 0 and n >= 1]


@pytest.mark.parametrize("with_draft_probs", [True, False], ids=["draft_model", "ngram"])
def test_first_two_tokens_follow_the_target_jointly(rs, batches, with_draft_probs):
    (drafts, _, _, _, _, target), outs = batches[with_draft_probs]
    out = outs["block"]
    counts = torch.tensor([len(d) for d in drafts])
    emitted = (out >= 0).sum(1)
    assert bool((emitted >= 1).all() and (emitted <= counts + 1).all())
    assert bool(((out == -1) | ((out >= 0) & (out < V))).all())
    assert bool((out[:, 1:][out[:, :-1] == -1] == -1).all()), "-1 only as trailing padding"
    gen = torch.Generator().manual_seed(7)
    for kind in random_kinds():
        rows = torch.arange(kind, len(drafts), len(ROW_TYPES))
        p0, p1 = target_of(rs, target, kind, 0), target_of(rs, target, kind, 1)
        pvalue = joint_chi_square_p(*first_two(out, rows, p1, gen), p0, p1)
        assert pvalue > P_MIN, f"row type {ROW_TYPES[kind]}: first two tokens off the target (p={pvalue:.2e})"


def test_a_mutant_without_the_residual_mass_fails(rs, batches, monkeypatch):
    """h_i = Z(i) / (Z(i) + 1 - p_i) with Z = 0: the test must see the difference."""
    from specdec_kernels.integrations.vllm import sampler
    from specdec_kernels.reference import block_verification as spec
    monkeypatch.setenv(ENV, "block")
    monkeypatch.setenv(sampler.BACKEND_ENV, "torch")  # the mutant patches the torch reference
    monkeypatch.setattr(spec, "residual_masses", lambda p_cum, target_probs, draft_probs:
                        torch.zeros(draft_probs.shape[:2], dtype=torch.float64))
    (drafts, draft_probs, logits, bonus, metadata, target), _ = batches[True]
    out = verify(rs, drafts, draft_probs, logits, bonus, metadata)
    gen = torch.Generator().manual_seed(7)
    kind = 0  # three drafts from a flat q: much residual mass
    rows = torch.arange(kind, len(drafts), len(ROW_TYPES))
    p0, p1 = target_of(rs, target, kind, 0), target_of(rs, target, kind, 1)
    pvalue = joint_chi_square_p(*first_two(out, rows, p1, gen), p0, p1)
    assert pvalue < P_MIN, f"the chi-square did not catch thresholds without the residual mass (p={pvalue:.2e})"


@pytest.mark.parametrize("with_draft_probs", [True, False], ids=["draft_model", "ngram"])
def test_greedy_rows_unchanged_and_random_rows_keep_at_least_as_much(batches, with_draft_probs):
    """Greedy rows: token-wise's. Random rows: the paired difference in accepted drafts (same
    seeds, independent rows) must not sit 4 standard errors below 0."""
    (drafts, _, _, _, metadata, _), outs = batches[with_draft_probs]
    greedy = metadata.temperature == 0
    assert torch.equal(outs["token"][greedy], outs["block"][greedy])
    counts = torch.tensor([len(d) for d in drafts])
    random = ~greedy & (counts > 0)
    kept = {value: ((out >= 0).sum(1) - 1)[random].double() for value, out in outs.items()}  # accepted drafts
    difference = kept["block"] - kept["token"]
    standard_error = float(difference.std()) / len(difference) ** 0.5
    print(f"in process, {'draft model' if with_draft_probs else 'n-gram'} drafts, {len(difference)} random rows: "
          f"accepted drafts per row token {float(kept['token'].mean()):.4f}, block {float(kept['block'].mean()):.4f} "
          f"(difference {float(difference.mean()):+.4f} +- {standard_error:.4f})")
    assert float(difference.mean()) > -4 * standard_error
