"""The CUDA kernels' random-number and fixed-point arithmetic (csrc/philox.cuh), built
for the host, against the torch specification: runs in CPU-only CI whenever _C is built."""

import pytest
import torch

from specdec_kernels.common import cuda_module as _cuda_module
from specdec_kernels.common import rng, sampling

_C = _cuda_module.load()
pytestmark = pytest.mark.skipif(_C is None, reason="specdec_kernels._C is not built here")


def test_philox_matches_random123_known_answers():
    # Random123's kat_vectors for philox4x32_10 (counter, key -> output).
    words = rng.philox4x32(0, 0, 0, 0, 0, 0)
    assert [int(w) for w in words] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


@pytest.mark.parametrize("seed", [0, 1, 12345, -1, 2**62 + 7, -(2**40) - 3])
@pytest.mark.parametrize("salt", [rng.SALT_ACCEPT, rng.SALT_FINAL])
def test_host_philox_uniform_is_the_reference(seed, salt):
    gen = torch.Generator().manual_seed(seed % 1000 + salt)
    n = 4000
    position = torch.randint(-(2**40), 2**40, (n,), generator=gen)
    position[:8] = torch.tensor([0, 1, 2**32 - 1, 2**32, -1, 2**31, 7, 2**33 + 5])
    row_key = torch.randint(0, 2**20, (n,), generator=gen)
    extra = torch.randint(0, 64, (n,), generator=gen)
    expected = rng.philox_uniform(seed, position, row_key, salt, extra)
    got = torch.tensor(_C.host_philox_uniform(seed, position.tolist(), row_key.tolist(), salt, extra.tolist()),
                       dtype=torch.float64)
    assert torch.equal(got, expected)


def test_host_to_weights_is_the_reference():
    gen = torch.Generator().manual_seed(0)
    special = torch.tensor([0.0, -0.0, 1.0, 1.5, -1.0, float("nan"), float("inf"), float("-inf"), 1e-45, 1e-38,
                            2.0**-40, 2.0**-41, 1.0 - 2.0**-24, 0.5, 3e-13])
    x = torch.cat([special, torch.rand(20000, generator=gen), torch.rand(2000, generator=gen) * 1e-9,
                   torch.randn(2000, generator=gen)]).float()
    for dtype in (torch.float32, torch.float16, torch.bfloat16):  # the kernels widen to fp32 first
        xs = x.to(dtype).float()
        expected = sampling.to_weights(xs)
        got = torch.tensor(_C.host_to_weights(xs.tolist()), dtype=torch.int64)
        assert torch.equal(got, expected), dtype


def test_host_draw_threshold_is_the_reference():
    gen = torch.Generator().manual_seed(1)
    u = rng.philox_uniform(3, torch.arange(5000), 0, rng.SALT_FINAL)
    total = torch.randint(0, 2**57, (5000,), generator=gen)
    total[:4] = torch.tensor([0, 1, 2**40, 151936 * 2**40])
    u = torch.cat([u, torch.tensor([1.0, 1.5, float("nan"), -0.5, 1e300, 1.0 - 2.0**-53])])
    total = torch.cat([total, torch.tensor([2**40, 7, 2**40, 5, 2**57, 2**54 + 3])])
    expected = sampling.draw_threshold(u, total)
    assert torch.equal(expected[:5000], torch.floor(u[:5000] * total[:5000].double()).to(torch.int64))  # valid u: plain floor
    assert bool(((expected >= 0) & (expected <= (total - 1).clamp(min=0))).all())
    assert expected[-6:-1].tolist() == [2**40 - 1, 6, 0, 0, 2**57 - 1]
    got = torch.tensor(_C.host_draw_threshold(u.tolist(), total.tolist()), dtype=torch.int64)
    assert torch.equal(got, expected)


# ---------------------------------------------------------------------------- logits verification
# csrc/logit_math.cuh + ordered_key.cuh run by the host emulation of the relaxed_verify,
# bild_verify and max_prob kernels (bind_logit_verify.cpp): the kernels' arithmetic and
# accept rule over their chunk/lane/split structure, against the reference. The kernels'
# memory and synchronisation are covered by tests/test_gpu_logit_verify.py on a GPU.

from specdec_kernels import reference  # noqa: E402
from specdec_kernels.cuda.logit_verify import _float32  # noqa: E402
from specdec_kernels.common.sampling import gather_token_values, nan_to_neg_inf  # noqa: E402

INF, NAN = float("inf"), float("nan")
EMULATED_PLANS = ((4096, 256), (16, 3), (8, 1), (5, 2))  # (chunk, lanes): one split .. many splits
MARGIN = 1e-3


def host_verify(mode, logits, drafts, counts=None, *, top_beta=1, tau=0.0, threshold=0.0, chunk=16, threads=3):
    batch, n_pos, vocab = logits.shape
    out, acc = _C.host_logit_verify(mode, logits.float().flatten().tolist(), drafts.flatten().tolist(),
                                    [] if counts is None else counts.tolist(), batch, n_pos - 1, vocab,
                                    min(top_beta, vocab + 1), _float32(tau), _float32(threshold), chunk, threads)
    return torch.tensor(out, dtype=torch.int64).view(batch, n_pos), torch.tensor(acc, dtype=torch.int64)


def margin_thresholds(logits, drafts, candidates):
    body = nan_to_neg_inf(logits[:, :drafts.shape[1]])
    value, in_range = gather_token_values(body, drafts)
    nll = (torch.logsumexp(body, dim=-1) - value)[in_range]
    nll = nll[torch.isfinite(nll)]
    out = []
    for t in candidates:
        while nll.numel() and bool(((nll - t).abs() < MARGIN).any()):
            t += 2.5 * MARGIN
        out.append(t)
    return out


def near_top(logits, gen):
    batch, n_pos, vocab = logits.shape
    order = torch.sort(nan_to_neg_inf(logits[:, :n_pos - 1]), dim=-1, descending=True, stable=True).indices
    rank = torch.randint(0, min(vocab, 4), (batch, n_pos - 1), generator=gen)
    drafts = order.gather(-1, rank.unsqueeze(-1)).squeeze(-1)
    wild = torch.rand(batch, n_pos - 1, generator=gen) < 0.15
    return torch.where(wild, torch.randint(-2, vocab + 2, (batch, n_pos - 1), generator=gen), drafts)


def logit_cases():
    gen = torch.Generator().manual_seed(11)
    for vocab, dtype in ((1, torch.float32), (7, torch.bfloat16), (40, torch.float16), (300, torch.float32)):
        logits = (torch.randint(-3, 4, (4, 4, vocab), generator=gen).float() * 0.5).to(dtype)  # many ties
        specials = torch.tensor([NAN, INF, -INF])[torch.randint(0, 3, logits.shape, generator=gen)]
        logits = torch.where(torch.rand(logits.shape, generator=gen) < 0.1, specials.to(dtype), logits)
        logits[0, 0] = NAN
        logits[0, 1] = -INF
        logits[1, 2, :] = -INF
        logits[1, 2, vocab - 1] = 1.0
        yield logits, near_top(logits, gen), torch.tensor([3, 0, 2, 1]), gen
        smooth = (torch.randn(4, 4, vocab, generator=gen) * 2).to(dtype)  # spread-out NLLs
        yield smooth, near_top(smooth, gen), torch.tensor([3, 3, 1, 2]), gen


@pytest.mark.parametrize("chunk,threads", EMULATED_PLANS)
def test_host_relaxed_verify_is_the_reference(chunk, threads):
    for logits, drafts, counts, _ in logit_cases():
        for beta, tau in ((1, 0.0), (1, 5.0), (3, 0.0), (2, 0.7), (4, 0.5), (50, 3.0), (2, INF), (2**40, 0.1)):
            for cnt in (None, counts):
                want = reference.relaxed_verify(logits, drafts, top_beta=beta, tau=tau, num_draft_tokens=cnt)
                got = host_verify("relaxed", logits, drafts, cnt, top_beta=beta, tau=tau, chunk=chunk, threads=threads)
                assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (beta, tau)


@pytest.mark.parametrize("chunk,threads", EMULATED_PLANS)
def test_host_bild_verify_is_the_reference(chunk, threads):
    for logits, drafts, counts, _ in logit_cases():
        for t in (0.0, *margin_thresholds(logits, drafts, [0.1 + 0.3 * k for k in range(20)])):
            for cnt in (None, counts):
                want = reference.bild_verify(logits, drafts, rollback_threshold=t, num_draft_tokens=cnt)
                got = host_verify("bild", logits, drafts, cnt, threshold=t, chunk=chunk, threads=threads)
                assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), t


@pytest.mark.parametrize("chunk,threads", EMULATED_PLANS)
def test_host_max_prob_is_the_reference(chunk, threads):
    for logits, _, _, gen in logit_cases():
        rows = torch.cat([logits.reshape(-1, logits.shape[-1]).float(),
                          torch.randn(5, logits.shape[-1], generator=gen) * 4])
        got = torch.tensor(_C.host_max_prob(rows.flatten().tolist(), rows.shape[0], rows.shape[1], chunk, threads))
        torch.testing.assert_close(got, reference.max_prob(rows), rtol=1e-5, atol=1e-6)
