"""The CUDA tree-attention kernels' index and softmax arithmetic (csrc/attention_math.cuh
and the launch plan), built for the host, against the torch specification: runs in CPU-only CI
whenever _C is built. The kernels' memory layout, MMA fragments and synchronisation are covered
by tests/test_gpu_tree_attention_cuda.py on a GPU."""

import math

import pytest
import torch

from specdec_kernels import reference
from specdec_kernels.common import cuda_module as _cuda_module
from specdec_kernels.reference.tree import ancestor_mask
from specdec_kernels.selftest.tree_inputs import biased_parents as random_parents

_C = _cuda_module.load()
pytestmark = pytest.mark.skipif(_C is None or not hasattr(_C, "host_tree_attention_row"),
                                reason="specdec_kernels._C (with tree attention) is not built here")

FLOAT32, FLOAT16, BFLOAT16 = 0, 1, 2  # csrc/common.cuh dtype codes
KEY_ALIGN, MIN_SPLIT_KEYS, MAX_SPLITS = 64, 256, 64  # csrc/attention_math.cuh


def random_tree(n, gen, unused_frac=0.2):
    """parents [n] as a list: node 0 the root, node i > 0 unused (-1) or an earlier used node's child."""
    return random_parents(1, n, gen, unused_frac)[0].tolist()


def window_from_mask(row, w0, width):
    """Bits j of the reference mask row (node's visible tree nodes) for tree nodes w0 + j."""
    bits = 0
    for j in range(width):
        t = w0 + j
        if 0 <= t < len(row) and row[t]:
            bits |= 1 << j
    return bits


@pytest.mark.parametrize("n", [1, 2, 7, 64, 65, 130])
@pytest.mark.parametrize("width", [16, 64])
def test_ancestor_windows_are_the_reference_mask(n, width):
    gen = torch.Generator().manual_seed(n * 100 + width)
    for trial in range(4):
        parents = random_tree(n, gen, unused_frac=0.0 if trial == 0 else 0.25)
        mask = ancestor_mask(torch.tensor([parents]))[0].tolist()
        nodes, w0s = zip(*[(i, w0) for i in range(n) for w0 in range(-width - 3, n + 2, 5)])
        got = _C.host_tree_attention_windows(parents, list(nodes), list(w0s), width)
        want = [window_from_mask(mask[i], w0, width) for i, w0 in zip(nodes, w0s)]
        assert got == want, parents


@pytest.mark.parametrize("n", [1, 5, 64, 100])
@pytest.mark.parametrize("width", [16, 64])
def test_chain_windows_are_the_causal_mask(n, width):
    chain = torch.tril(torch.ones(n, n, dtype=torch.bool))
    assert torch.equal(chain, ancestor_mask(reference.chain_parents(1, n))[0])
    chain = chain.tolist()
    nodes, w0s = zip(*[(i, w0) for i in range(n) for w0 in range(-width - 2, n + 2, 3)])
    got = _C.host_tree_attention_windows([], list(nodes), list(w0s), width)
    assert got == [window_from_mask(chain[i], w0, width) for i, w0 in zip(nodes, w0s)]
    # the explicit chain parents walk to the same bits
    assert _C.host_tree_attention_windows(list(range(-1, n - 1)), list(nodes), list(w0s), width) == got


def test_malformed_parents_keep_the_walk_finite_and_inside_the_window():
    # values the validation would reject: forward / self references, < -1, huge
    parents = [-1, 0, 5, 2, -7, 3, 2**40, 6, 1]
    for node in range(len(parents)):
        for w0 in range(-70, 10):
            bits = _C.host_tree_attention_windows(parents, [node], [w0], 64)[0]
            assert 0 <= bits < 2**64
            visible = [w0 + j for j in range(64) if bits >> j & 1]
            assert all(0 <= t <= node for t in visible), (node, w0, visible)
            if w0 <= node < w0 + 64:
                assert node in visible  # a node always sees itself


@pytest.mark.parametrize("splits", [1, 2, 3, 7, 33, 64])
def test_row_split_covers_each_row_once_with_aligned_pieces(splits):
    for keys in [1, 2, 63, 64, 65, 255, 256, 257, 1000, 4096 + 32, 32768 + 64, 2**31 - 65]:
        chunk, active = _C.host_tree_attention_row_split(keys, splits)
        assert chunk % KEY_ALIGN == 0 and chunk >= MIN_SPLIT_KEYS
        assert 1 <= active <= splits
        assert (active - 1) * chunk < keys <= active * chunk  # every active split owns >= 1 key
        if keys >= splits * MIN_SPLIT_KEYS:  # long rows are cut as evenly as alignment allows
            assert chunk < math.ceil(keys / splits) + KEY_ALIGN


def test_plan_fills_one_wave_and_sizes_its_buffers():
    for B, N, Hq, Hkv, D, cap, dtype in [(8, 32, 32, 8, 128, 4096 + 32, BFLOAT16), (1, 8, 32, 8, 128, 32768, FLOAT16),
                                         (3, 64, 28, 4, 64, 2048, BFLOAT16), (32, 64, 32, 8, 128, 32768, BFLOAT16),
                                         (2, 5, 4, 2, 80, 700, FLOAT16), (4, 8, 8, 8, 128, 300, FLOAT32),
                                         (1, 1, 1, 1, 64, 1, BFLOAT16)]:
        for sms, per_sm in [(132, 1), (132, 2), (108, 3), (1, 1)]:
            splits, block_m, m_tiles, counter_bytes, partial_bytes, path = _C.host_tree_attention_plan(
                B, N, Hq, Hkv, D, cap, dtype, sms, per_sm)
            mma = dtype != FLOAT32 and D in (64, 128)
            rows = N * Hq // Hkv
            assert path == int(mma)
            assert block_m == ((128 if rows > 64 else 64) if mma else 16)
            assert m_tiles == math.ceil(rows / block_m)
            base = B * Hkv * m_tiles
            assert 1 <= splits <= min(MAX_SPLITS, math.ceil(cap / MIN_SPLIT_KEYS))
            assert splits == 1 or base * splits <= sms * per_sm  # one wave at most
            if splits == 1:
                assert counter_bytes == 0 and partial_bytes == 0
            else:
                assert counter_bytes == 4 * base
                assert partial_bytes == 4 * base * splits * block_m * (D + 2)
    with pytest.raises(ValueError, match="head dims"):
        _C.host_tree_attention_plan(1, 8, 8, 8, 512, 1024, BFLOAT16, 132, 1)
    with pytest.raises(ValueError, match="at least N"):
        _C.host_tree_attention_plan(1, 8, 8, 8, 64, 7, BFLOAT16, 132, 1)


@pytest.mark.parametrize("tile", [16, 64])
@pytest.mark.parametrize("splits", [1, 3, 64])
@pytest.mark.parametrize("tree", ["chain", "random"])
def test_split_online_softmax_and_merge_is_the_reference(tile, splits, tree):
    """One packed row at a time through the kernels' algorithm (row_split, unmasked prefix
    tiles, ancestor windows on the rest, exp2 online softmax, log-sum-exp merge) against
    reference.tree_attention, including rows whose prefix is empty and splits whose keys are
    all masked for a node."""
    gen = torch.Generator().manual_seed(tile * 1000 + splits * 10 + len(tree))
    n, d = 70, 8
    for prefix in [0, 5, 300, 1000]:
        parents = reference.chain_parents(1, n) if tree == "chain" else torch.tensor([random_tree(n, gen)])
        q = torch.randn(1, n, 1, d, generator=gen)
        k_cache = torch.randn(1, 1, prefix + n, d, generator=gen)
        v_cache = torch.randn(1, 1, prefix + n, d, generator=gen)
        k_cache[:, :, prefix:] *= 3  # tree keys weigh as much as the whole prefix: mask errors show
        seq_lens = torch.tensor([prefix])
        scale = 0.3
        want_out, want_lse = reference.tree_attention(q, k_cache, v_cache, seq_lens,
                                                      None if tree == "chain" else parents, sm_scale=scale)
        keys, values = k_cache[0, 0].flatten().tolist(), v_cache[0, 0].flatten().tolist()
        for node in range(n):
            out, lse = _C.host_tree_attention_row(q[0, node, 0].tolist(), keys, values, prefix, node,
                                                  [] if tree == "chain" else parents[0].tolist(), n, scale, splits,
                                                  tile)
            torch.testing.assert_close(torch.tensor(out), want_out[0, node, 0], rtol=1e-5, atol=1e-5)
            assert abs(lse - float(want_lse[0, node, 0])) < 1e-4
