"""The Triton tree_rejection_sample with siblings="without_replacement" against the torch
reference, bit for bit (TRITON_INTERPRET=1 on the CPU, see conftest.py; shapes stay small).

Trees where each node's children really are draws without replacement from that node's draft
row, coins skewed high so that several siblings get rejected, plus the siblings the rule skips
(repeated tokens, zero draft weight, -1 padding), NaN / inf / zero rows, every randomness mode,
int32 and strided index tensors, a V spread over several tiles, and max_depth cuts.
"""

import pytest
import torch

from specdec_kernels import ops
from specdec_kernels.decoding.draft_tree import sample_children
from specdec_kernels.triton import tree_verify as triton_module

from test_triton_tree_verify import DTYPES, all_modes, check_outputs, dtype_id, random_parents

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]

NAN, INF = float("nan"), float("inf")
WR = "without_replacement"


def sampled_tree(batch, n, vocab, dtype, gen, *, unused_frac=0.15, odd_frac=0.1):
    """Per-parent draft rows; each node's children drawn without replacement from its row, in
    index order; a fraction `odd_frac` of children replaced by ids the rule skips or rejects."""
    parents = torch.tensor([random_parents(gen, n, unused_frac) for _ in range(batch)], dtype=torch.int64)
    target = torch.softmax(torch.randn(batch, n, vocab, generator=gen) * 2, -1)
    target = torch.where(torch.rand(target.shape, generator=gen) < 0.2, 0.0, target)
    draft = torch.softmax(torch.log(target + 1e-3) + torch.randn(batch, n, vocab, generator=gen) * 1.5, -1)
    draft = torch.where(torch.rand(draft.shape, generator=gen) < 0.1, 0.0, draft)  # zero-weight ids
    tokens = torch.full((batch, n), -1, dtype=torch.int64)
    for b in range(batch):
        for v in range(n):
            kids = [c for c in range(1, n) if int(parents[b, c]) == v]
            if kids:
                u = torch.rand(1, len(kids), generator=gen, dtype=torch.float64)
                drawn = sample_children(draft[b, v].to(dtype).float().unsqueeze(0), u)[0][0]
                tokens[b, kids] = drawn
    odd = (torch.rand(batch, n, generator=gen) < odd_frac) & (parents >= 0)
    tokens = torch.where(odd, torch.randint(0, vocab, (batch, n), generator=gen), tokens)
    return target.to(dtype), draft.to(dtype), tokens, parents


def high_coins(batch, n, gen, dtype=torch.float64):
    return (torch.rand(batch, n, generator=gen, dtype=torch.float64) ** 0.25).to(dtype)


def assert_matches(target, draft, tokens, parents, block_v=None, **kwargs):
    want = ops.tree_rejection_sample(target, draft, tokens, parents, backend="torch", siblings=WR, **kwargs)
    if block_v is None:
        got = ops.tree_rejection_sample(target, draft, tokens, parents, backend="triton", siblings=WR, **kwargs)
    else:
        max_depth = kwargs.pop("max_depth", want[0].shape[1] - 1)
        got = triton_module._launch_rejection(target, draft, tokens, parents, max_depth=max_depth, siblings=WR,
                                              block_v=block_v, **kwargs)
    check_outputs(got, want, target.shape[-1], sorted(kwargs))
    return want


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_sampled_trees_match_reference(dtype):
    batch, n, vocab = 4, 9, 37
    gen = torch.Generator().manual_seed(1)
    target, draft, tokens, parents = sampled_tree(batch, n, vocab, dtype, gen)
    parents[1, 5:] = -1  # ragged: row 1 a smaller tree
    tokens[1, 5:] = -1
    rejected_some = False
    for i, kwargs in enumerate([dict(uniforms=high_coins(batch, n, gen, torch.float32)),
                                dict(uniforms=high_coins(batch, n, gen))] + all_modes(batch, n, gen)[2:]):
        want = assert_matches(target, draft, tokens, parents, **kwargs)
        rejected_some |= bool((want[2][:, 1] > 0).any())
        if i % 2 == 0:
            assert_matches(target, draft, tokens, parents, max_depth=1, **kwargs)
    assert rejected_some


def test_many_rejections_over_several_tiles():
    """A star of 7 sampled siblings and a second level, V = 50 over 16-wide tiles: the recomputed
    residual, the totals and the draw cross tile boundaries at every rank."""
    gen = torch.Generator().manual_seed(2)
    batch, vocab = 5, 50
    parents = torch.tensor([[-1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 2, 2]] * batch)
    n = parents.shape[1]
    target = torch.softmax(torch.randn(batch, n, vocab, generator=gen) * 3, -1)
    draft = torch.softmax(torch.randn(batch, n, vocab, generator=gen), -1)  # far from the target
    tokens = torch.full((batch, n), -1, dtype=torch.int64)
    for b in range(batch):
        for v, kids in ((0, list(range(1, 8))), (1, [8, 9, 10]), (2, [11, 12])):
            tokens[b, kids] = sample_children(draft[b, v:v + 1], torch.rand(1, len(kids), generator=gen,
                                                                           dtype=torch.float64))[0][0]
    for kwargs in (dict(uniforms=high_coins(batch, n, gen)), dict(seed=7),
                   dict(seed=torch.arange(batch) * 3 - 5, offsets=torch.arange(batch, dtype=torch.int32))):
        want = assert_matches(target, draft, tokens, parents, block_v=16, **kwargs)
    # some rows rejected more than three siblings (accepted a later one, or none of the 7)
    assert bool(((want[2][:, 1] > 3) | (want[2][:, 1] == -1)).any())


def test_edge_rows_stay_in_range():
    """NaN / inf / zero / negative rows in p and q, repeated and zero-weight siblings."""
    gen = torch.Generator().manual_seed(3)
    batch, n, vocab = 6, 7, 19
    target, draft, tokens, parents = sampled_tree(batch, n, vocab, torch.float32, gen, odd_frac=0.3)
    target[0, 0] = NAN
    draft[1, 0] = NAN
    target[2, 0] = 0.0
    draft[3, 0] = 0.0
    draft[4, 0, :5] = INF
    target[5, 0, :5] = -INF
    draft[5, 0, 5:9] = 2.0
    tokens[:, 2] = tokens[:, 1]  # a repeated sibling where both hang off one parent
    for kwargs in (dict(uniforms=high_coins(batch, n, gen)), dict(seed=11)):
        assert_matches(target, draft, tokens, parents, **kwargs)


@pytest.mark.parametrize("index_dtype", (torch.int32, torch.int64))
def test_int32_and_strided_indices(index_dtype):
    gen = torch.Generator().manual_seed(4)
    batch, n, vocab = 3, 8, 23
    target, draft, tokens, parents = sampled_tree(batch, n, vocab, torch.float16, gen)
    # strided views (every other column of a wider tensor), in the index dtype
    wide_tokens = torch.zeros(batch, 2 * n, dtype=index_dtype)
    wide_tokens[:, ::2] = tokens
    wide_parents = torch.zeros(batch, 2 * n, dtype=index_dtype)
    wide_parents[:, ::2] = parents
    seeds = torch.tensor([5, -6, 7], dtype=index_dtype)
    offsets = torch.tensor([1, 2, 3], dtype=index_dtype)
    for kwargs in (dict(uniforms=high_coins(batch, n, gen)), dict(seed=seeds, offsets=offsets)):
        assert_matches(target, draft, wide_tokens[:, ::2], wide_parents[:, ::2], **kwargs)


def test_single_children_reproduce_the_independent_kernel():
    """A chain-shaped tree: the without-replacement kernel gives the independent one's outputs
    (with the draft rows moved from the parent to the child)."""
    gen = torch.Generator().manual_seed(5)
    batch, n, vocab = 4, 5, 29
    target = torch.softmax(torch.randn(batch, n, vocab, generator=gen) * 2, -1)
    draft = torch.softmax(torch.randn(batch, n, vocab, generator=gen) * 2, -1)
    tokens = torch.randint(0, vocab, (batch, n), generator=gen)
    parents = torch.arange(-1, n - 1).expand(batch, n)
    for kwargs in (dict(uniforms=high_coins(batch, n, gen)), dict(seed=3)):
        got = ops.tree_rejection_sample(target, draft, tokens, parents, backend="triton", siblings=WR, **kwargs)
        want = ops.tree_rejection_sample(target, torch.roll(draft, 1, 1), tokens, parents, backend="triton",
                                         **kwargs)
        check_outputs(got, want, vocab)
