"""The Triton greedy_verify backend against the torch reference, bit for bit.

The cases are the catalog's (specdec_kernels/selftest/cases_logit_verify.py at profile "tiny": random
shapes and dtypes, ragged rows, NaN / inf rows, ties across tiles, -1 padding, V = 1, g = 0,
an empty batch, strided inputs, out-of-range ids and counts, small-integer fuzz), judged as
`specdec-kernels selftest` judges them; the GPU tests run the same catalog at production sizes.
Here besides: the launch plans (tile size, tiles per program, split cap) the catalog cannot pick.

Runs on CPU tensors under the Triton interpreter (TRITON_INTERPRET=1, set before triton is
imported); on a machine without triton the module is skipped.
"""

import pytest
import torch
from catalog_support import catalog_cases, check_case

from specdec_kernels import reference
from specdec_kernels.common.sampling import safe_argmax
from specdec_kernels.triton import logit_verify as triton_module

INF, NAN = float("inf"), float("nan")


@pytest.mark.parametrize("case", catalog_cases("tiny", "cpu", ops=("greedy_verify",)))
def test_catalog_case(case):
    check_case(case, "triton", "cpu")


def drafts_with_prefix(logits, gen):
    """Drafts equal to the argmax for a random prefix of each row, then one mismatch, then random ids."""
    batch, n_pos, vocab = logits.shape
    g = n_pos - 1
    top = safe_argmax(logits)[:, :g]
    drafts = torch.randint(-1, vocab, (batch, g), generator=gen)
    for b in range(batch):
        k = int(torch.randint(0, g + 1, (1,), generator=gen))  # k == g: all drafts match
        drafts[b, :k] = top[b, :k]
        if k < g:
            drafts[b, k] = -1 if vocab == 1 else (top[b, k] + 1) % vocab
    return drafts


@pytest.mark.parametrize("vocab", (1, 17, 95, 160, 300))
def test_many_splits(vocab):
    """Small tiles force several tiles per program and many splits (and the split cap)."""
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randint(-2, 3, (3, 4, vocab), generator=gen).float()  # heavy ties
    logits[0, 1] = -INF
    logits[1, 2, ::3] = NAN
    drafts = drafts_with_prefix(logits, gen)
    counts = torch.tensor([3, 1, 2])
    want = reference.greedy_verify(logits, drafts, num_draft_tokens=counts)
    for block_v, tiles, max_splits in ((16, 1, 64), (16, 2, 3), (32, 4, 1)):
        got = triton_module._launch_chain(logits, drafts, counts, mode=triton_module.GREEDY.value, block_v=block_v,
                                          tiles_per_program=tiles, max_splits=max_splits)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), (block_v, tiles, max_splits)
