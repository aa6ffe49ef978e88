"""The Triton relaxed_verify, bild_verify and max_prob (and fallback_check) backends against
the torch reference.

The cases are the catalog's (specdec_kernels/selftest/cases_logit_verify.py at profile "tiny": random
shapes and dtypes, beta / tau sweeps and their boundaries, tau compared in float32, BiLD
thresholds 0 / inf / clear of every draft NLL's rounding band, NaN / inf / padding rows, ties
across tiles, V = 1, g = 0, empty batches, strided inputs, out-of-range ids, max_prob's shapes
and special rows, fallback_check's thresholds, small-integer fuzz), judged as `specdec-kernels
selftest` judges them: relaxed bit for bit (and equal to greedy at top_beta = 1 or tau = 0),
bild bit for bit away from the logsumexp band, max_prob within rtol 1e-5 / atol 1e-6. The GPU
tests run the same catalog at production sizes. Here besides: the launch plans the catalog
cannot pick. Runs on CPU tensors under the Triton interpreter.
"""

import pytest
import torch
from catalog_support import catalog_cases, check_case

from specdec_kernels import ops
from specdec_kernels.common.sampling import nan_to_neg_inf
from specdec_kernels.selftest.compare import bild_threshold
from specdec_kernels.triton import logit_verify as triton_module

pytestmark = [
    # inf - inf and log(0) on NaN/inf rows are intended (they follow the reference); the
    # interpreter evaluates them with numpy, which warns
    pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter"),
]

INF, NAN = float("inf"), float("nan")


@pytest.mark.parametrize("case", catalog_cases("tiny", "cpu", ops=("relaxed_verify", "bild_verify", "max_prob")))
def test_catalog_case(case):
    check_case(case, "triton", "cpu")


def assert_same(got, want):
    for name, g_, w_ in zip(("output_tokens", "num_accepted"), got, want):
        assert g_.dtype == torch.int64 and g_.shape == w_.shape, name
        assert torch.equal(g_, w_), f"{name}: triton {g_.tolist()} != torch {w_.tolist()}"


def near_top_drafts(logits, gen):
    """Per slot: the argmax, a token of rank 1..4 (ties by lower id), a random id, or -1."""
    batch, n_pos, vocab = logits.shape
    g = n_pos - 1
    order = torch.sort(nan_to_neg_inf(logits[:, :g]), dim=-1, descending=True, stable=True).indices
    rank = torch.randint(0, min(vocab, 5), (batch, g), generator=gen)
    rank = torch.where(torch.rand(batch, g, generator=gen) < 0.5, torch.zeros_like(rank), rank)
    drafts = order.gather(-1, rank.unsqueeze(-1)).squeeze(-1)
    wild = torch.rand(batch, g, generator=gen) < 0.15
    return torch.where(wild, torch.randint(-1, vocab, (batch, g), generator=gen), drafts)


@pytest.mark.parametrize("vocab", (1, 17, 95, 160))
def test_many_splits(vocab):
    """Small tiles force several tiles per program, many splits and the split cap."""
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randint(-2, 3, (3, 4, vocab), generator=gen).float()  # heavy ties across splits
    logits[0, 1] = -INF
    logits[1, 2, ::3] = NAN
    logits[2, 0, vocab // 2] = INF
    drafts = near_top_drafts(logits, gen)
    counts = torch.tensor([3, 1, 2])
    thresholds = [bild_threshold(logits, drafts, 1.5)]
    for block_v, tiles, max_splits in ((16, 1, 64), (16, 2, 3), (32, 4, 1)):
        plan = dict(block_v=block_v, tiles_per_program=tiles, max_splits=max_splits)
        for beta, tau in ((1, 5.0), (2, 0.7), (50, 3.0)):
            got = triton_module._launch_chain(logits, drafts, counts, mode=triton_module.RELAXED.value, top_beta=beta,
                                              tau=tau, **plan)
            assert_same(got, ops.relaxed_verify(logits, drafts, top_beta=beta, tau=tau, num_draft_tokens=counts,
                                                backend="torch"))
        for t in thresholds:
            got = triton_module._launch_chain(logits, drafts, counts, mode=triton_module.BILD.value, threshold=t, **plan)
            assert_same(got, ops.bild_verify(logits, drafts, rollback_threshold=t, num_draft_tokens=counts,
                                             backend="torch"))
        torch.testing.assert_close(triton_module._launch_max_prob(logits, **plan),
                                   ops.max_prob(logits, backend="torch"), rtol=1e-5, atol=1e-6)
