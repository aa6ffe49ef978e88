"""Group 3: our replacement of vLLM's rejection sampling, called in-process with vLLM's own
metadata objects (SpecDecodeMetadata, SamplingMetadata) and vLLM's own
`apply_sampling_constraints` (temperature, top-k, top-p) in front of it, as
`RejectionSampler.forward` calls them.

- chi-square: the first token each row emits follows the target distribution after vLLM's
  temperature/top-k/top-p, in a batch mixing greedy and random rows with ragged drafts, with
  draft probabilities (draft model) and without (n-gram: one-hot drafts);
- a mutant that skips the residual (draws the correction from p instead of norm(max(0, p - q)))
  fails that chi-square, so the test can fail;
- greedy rows equal vLLM's own greedy path exactly;
- seeded rows replay exactly and do not depend on the rest of the batch.
"""

import os
import types

import pytest
import torch

V = 8
N = 3000  # replicas per row type
P_MIN = 1e-4


@pytest.fixture(scope="module")
def rs():
    """vLLM's rejection_sampler module with our plugin registered (vLLM's originals restored after)."""
    import vllm.v1.sample.rejection_sampler as module
    from vllm.platforms import current_platform

    from specdec_kernels.integrations import vllm as plugin
    current_platform.register_triton_kernel_overrides()  # vLLM's CPU kernels, as its worker registers them
    old = os.environ.get("SPECDEC_KERNELS_VLLM")
    os.environ["SPECDEC_KERNELS_VLLM"] = "1"
    assert plugin.register()
    yield module
    plugin.unregister()
    if old is None:
        os.environ.pop("SPECDEC_KERNELS_VLLM")
    else:
        os.environ["SPECDEC_KERNELS_VLLM"] = old


def sampling_metadata(temperature, top_k=None, top_p=None, generators=None):
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    batch = len(temperature)
    return SamplingMetadata(
        temperature=torch.tensor(temperature, dtype=torch.float32), all_greedy=all(t == 0 for t in temperature),
        all_random=all(t > 0 for t in temperature),
        top_p=None if top_p is None else torch.tensor(top_p, dtype=torch.float32),
        top_k=None if top_k is None else torch.tensor(top_k, dtype=torch.int32),
        generators=generators or {}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(batch), presence_penalties=torch.zeros(batch),
        repetition_penalties=torch.ones(batch), output_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())


def verify(rs, drafts: list[list[int]], draft_probs, target_logits, bonus, metadata, *, function=None):
    """What RejectionSampler.forward does after the bonus sampling: vLLM's sampling constraints
    on the target logits, then the (patched) module-level rejection_sample."""
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
    spec = SpecDecodeMetadata.make_dummy(drafts, torch.device("cpu"))
    logits = rs.apply_sampling_constraints(target_logits.clone(), spec.cu_num_draft_tokens, metadata)
    function = function or rs.rejection_sample
    return function(spec.draft_token_ids, spec.num_draft_tokens, spec.max_spec_len, spec.cu_num_draft_tokens,
                    draft_probs, logits, bonus.view(-1, 1).contiguous(), metadata)


def processed_probs(rs, logits, temperature, top_k=None, top_p=None):
    """The target distribution vLLM samples from: softmax(top-k/top-p(logits / T)), by vLLM's own functions."""
    k = None if top_k is None else torch.tensor([top_k], dtype=torch.int32)
    p = None if top_p is None else torch.tensor([top_p], dtype=torch.float32)
    return rs.apply_top_k_top_p(logits.view(1, -1) / temperature, k, p).softmax(-1).view(-1)


def chi_square_p(tokens: torch.Tensor, expected: torch.Tensor) -> float:
    from scipy.stats import chisquare
    counts = torch.bincount(tokens.long(), minlength=V).double()
    support = expected > 0
    assert counts[~support].sum() == 0, f"tokens outside the support: {counts.tolist()} vs {expected.tolist()}"
    observed = counts[support].numpy()
    exp = expected[support].double().numpy()
    exp = exp / exp.sum() * observed.sum()
    return float(chisquare(observed, exp, sum_check=False).pvalue)


# Row types of the mixed batch: (temperature, top_k, top_p, number of drafts)
ROW_TYPES = [(0.8, V, 1.0, 3), (1.5, 5, 0.85, 2), (0.0, V, 1.0, 3), (1.0, V, 1.0, 0), (1.2, 3, 1.0, 1)]


def mixed_batch(rs, *, with_draft_probs: bool, seed: int = 0):
    """N replicas of each row type, interleaved; drafts drawn from q (draft model) or fixed (n-gram)."""
    gen = torch.Generator().manual_seed(seed)
    types_ = len(ROW_TYPES)
    max_g = max(t[3] for t in ROW_TYPES)
    target = torch.randn(types_, max_g + 1, V, generator=gen) * 2.0  # peaked target
    q = (torch.randn(types_, max_g, V, generator=gen) * 0.3).softmax(-1)  # flat draft: much residual mass
    drafts, draft_rows, logits_rows, bonus = [], [], [], []
    temperature, top_k, top_p = [], [], []
    for _ in range(N):
        for kind, (t, k, p, n) in enumerate(ROW_TYPES):
            if with_draft_probs:
                row = [int(torch.multinomial(q[kind, j], 1, generator=gen)) for j in range(n)]
            else:  # n-gram: a likely token, then the least likely one
                row = [int(target[kind, 0].argmax()), int(target[kind, 1].argmin()), 3][:n]
            drafts.append(row)
            draft_rows += [q[kind, j] for j in range(n)]
            logits_rows += [target[kind, j] for j in range(n)]
            bonus_p = processed_probs(rs, target[kind, n], t if t > 0 else 1.0, k if k < V else None,
                                      p if p < 1 else None)
            bonus.append(int(torch.multinomial(bonus_p, 1, generator=gen)) if t > 0 else int(target[kind, n].argmax()))
            temperature.append(t)
            top_k.append(k)
            top_p.append(p)
    metadata = sampling_metadata(temperature, top_k, top_p)
    draft_probs = torch.stack(draft_rows).contiguous() if with_draft_probs else None
    return drafts, draft_probs, torch.stack(logits_rows), torch.tensor(bonus), metadata, target


def expected_first_token(rs, target, kind: int, bonus_logits_row=None):
    t, k, p, n = ROW_TYPES[kind]
    return processed_probs(rs, target[kind, 0], t, k if k < V else None, p if p < 1 else None)


@pytest.mark.parametrize("with_draft_probs", [True, False], ids=["draft_model", "ngram"])
def test_first_token_follows_target_after_temperature_top_k_top_p(rs, with_draft_probs):
    drafts, draft_probs, logits, bonus, metadata, target = mixed_batch(rs, with_draft_probs=with_draft_probs)
    out = verify(rs, drafts, draft_probs, logits, bonus, metadata)
    assert out.dtype == torch.int32 and out.shape == (len(drafts), max(len(d) for d in drafts) + 1)
    counts = torch.tensor([len(d) for d in drafts])
    emitted = (out >= 0).sum(1)
    assert bool((emitted >= 1).all() and (emitted <= counts + 1).all())
    assert bool(((out == -1) | ((out >= 0) & (out < V))).all())
    assert bool((out[:, 1:][out[:, :-1] == -1] == -1).all()), "-1 only as trailing padding"
    for kind, (t, _, _, n) in enumerate(ROW_TYPES):
        first = out[kind::len(ROW_TYPES), 0]
        if t == 0:
            continue  # greedy rows: test_greedy_rows_equal_vllms_own
        pvalue = chi_square_p(first, expected_first_token(rs, target, kind))
        assert pvalue > P_MIN, f"row type {ROW_TYPES[kind]}: first token off the target distribution (p={pvalue:.2e})"


def test_a_mutant_that_skips_the_residual_fails_the_chi_square(rs, monkeypatch):
    from specdec_kernels import ops
    from specdec_kernels.integrations.vllm import sampler

    def skip_residual(target_probs, draft_probs, draft_tokens, **kwargs):
        out, accepted = ops.rejection_sample(target_probs, draft_probs, draft_tokens, **kwargs)
        rows = torch.arange(out.shape[0])
        rejected = accepted < kwargs["num_draft_tokens"]
        plain_p = target_probs[rows, accepted.clamp(max=target_probs.shape[1] - 1)]
        redraw = torch.multinomial(plain_p.clamp(min=0) + 1e-12, 1).squeeze(1)
        out[rows[rejected], accepted[rejected]] = redraw[rejected]
        return out, accepted

    monkeypatch.setattr(sampler, "ops", types.SimpleNamespace(greedy_verify=ops.greedy_verify,
                                                              rejection_sample=skip_residual))
    drafts, draft_probs, logits, bonus, metadata, target = mixed_batch(rs, with_draft_probs=True)
    out = verify(rs, drafts, draft_probs, logits, bonus, metadata)
    pvalue = chi_square_p(out[0::len(ROW_TYPES), 0], expected_first_token(rs, target, 0))
    assert pvalue < P_MIN, f"the chi-square did not catch a sampler without the residual (p={pvalue:.2e})"


@pytest.mark.parametrize("with_draft_probs", [True, False], ids=["draft_model", "ngram"])
def test_greedy_rows_equal_vllms_own(rs, with_draft_probs):
    from specdec_kernels.integrations.vllm import _PATCHED
    original = getattr(rs, _PATCHED)["rejection_sample"]
    drafts, draft_probs, logits, bonus, metadata, _ = mixed_batch(rs, with_draft_probs=with_draft_probs, seed=1)
    greedy = torch.tensor([t == 0 for t in metadata.temperature.tolist()])
    ours = verify(rs, drafts, draft_probs, logits, bonus, metadata)
    theirs = verify(rs, drafts, draft_probs, logits, bonus, metadata, function=original)
    assert torch.equal(ours[greedy], theirs[greedy])
    # an all-greedy batch (vLLM's fast path), ragged, with random drafts: some accepted, some not
    gen = torch.Generator().manual_seed(2)
    lengths = [3, 0, 1, 3, 2] * 40
    logits = torch.randn(sum(lengths), V, generator=gen)
    drafts, start = [], 0
    for n in lengths:
        argmax = logits[start:start + n].argmax(-1)
        keep = torch.rand(n, generator=gen) < 0.7
        drafts.append(torch.where(keep, argmax, torch.randint(0, V, (n,), generator=gen)).tolist())
        start += n
    bonus = torch.randint(0, V, (len(lengths),), generator=gen)
    metadata = sampling_metadata([0.0] * len(lengths))
    ours = verify(rs, drafts, None, logits, bonus, metadata)
    theirs = verify(rs, drafts, None, logits, bonus, metadata, function=original)
    assert torch.equal(ours, theirs)
    assert 0 < int((ours >= 0).sum()) - len(lengths) < sum(lengths), "some drafts accepted and some rejected"


def test_seeded_rows_replay_and_do_not_depend_on_the_batch(rs):
    drafts, draft_probs, logits, bonus, metadata, _ = mixed_batch(rs, with_draft_probs=True, seed=3)
    rows = len(ROW_TYPES) * 20
    drafts, logits_rows = drafts[:rows], sum(len(d) for d in drafts[:rows])
    draft_probs, logits, bonus = draft_probs[:logits_rows], logits[:logits_rows], bonus[:rows]
    temperature = metadata.temperature[:rows].tolist()
    top_k, top_p = metadata.top_k[:rows].tolist(), metadata.top_p[:rows].tolist()
    seeded = [i for i in range(rows) if temperature[i] > 0 and drafts[i]]

    def run(order, base=1000):
        """The rows in `order`; each seeded row carries a fresh generator seeded base + its identity."""
        starts = torch.tensor([0] + [len(d) for d in drafts]).cumsum(0)
        pick = torch.cat([torch.arange(int(starts[i]), int(starts[i + 1])) for i in order]).long()
        generators = {pos: torch.Generator().manual_seed(base + i) for pos, i in enumerate(order) if i in seeded}
        meta = sampling_metadata([temperature[i] for i in order], [top_k[i] for i in order],
                                 [top_p[i] for i in order], generators)
        out = verify(rs, [drafts[i] for i in order], draft_probs[pick].contiguous(), logits[pick],
                     bonus[torch.tensor(order)], meta)
        return {i: out[pos] for pos, i in enumerate(order)}

    first, again = run(list(range(rows))), run(list(range(rows)))
    shuffled = torch.randperm(rows, generator=torch.Generator().manual_seed(4)).tolist()
    alone = run(shuffled[: rows // 3])
    for i in seeded:
        assert torch.equal(first[i], again[i])
        if i in alone:
            assert torch.equal(first[i], alone[i]), "a seeded row changed with the batch around it"
    assert len(set(seeded) & set(alone)) >= 5
    other = run(list(range(rows)), base=2000)
    changed = sum(not torch.equal(first[i], other[i]) for i in seeded)
    assert changed >= 5, f"other seeds changed only {changed} of {len(seeded)} seeded rows"  # peaked targets: most agree


def test_seeded_rows_replay_but_not_vllms_own_stream(rs):
    """What docs/vllm.md says of seeds: a seeded request is exact and reproducible with our plugin,
    but its random stream is not plain vLLM's for the same seed (vLLM draws its coins with
    `uniform_` and its recovered tokens with `exponential_` from the request's generator; we
    draw one Philox seed from it per step), so the tokens differ from plain vLLM's, and the
    generator ends elsewhere (later steps' bonus tokens differ too)."""
    from specdec_kernels.integrations.vllm import _PATCHED
    original = getattr(rs, _PATCHED)["rejection_sample"]
    drafts, draft_probs, logits, bonus, metadata, _ = mixed_batch(rs, with_draft_probs=True, seed=5)
    rows = len(ROW_TYPES) * 40
    drafts, tokens = drafts[:rows], sum(len(d) for d in drafts[:rows])
    draft_probs, logits, bonus = draft_probs[:tokens].contiguous(), logits[:tokens], bonus[:rows]
    temperature = metadata.temperature[:rows].tolist()
    seeded = [i for i in range(rows) if temperature[i] > 0 and drafts[i]]

    def run(function=None):
        generators = {i: torch.Generator().manual_seed(100 + i) for i in seeded}
        meta = sampling_metadata(temperature, metadata.top_k[:rows].tolist(), metadata.top_p[:rows].tolist(),
                                 generators)
        out = verify(rs, drafts, draft_probs, logits, bonus, meta, function=function)
        return out, {i: g.get_state() for i, g in generators.items()}

    (ours, our_state), (again, _) = run(), run()
    (theirs, their_state), (theirs_again, _) = run(original), run(original)
    assert torch.equal(ours[seeded], again[seeded]) and torch.equal(theirs[seeded], theirs_again[seeded])
    differ = sum(not torch.equal(ours[i], theirs[i]) for i in seeded)
    assert differ >= 5, f"only {differ} of {len(seeded)} seeded rows differ from vLLM's own stream"
    assert all(not torch.equal(our_state[i], their_state[i]) for i in seeded)
