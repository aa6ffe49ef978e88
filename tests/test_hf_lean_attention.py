"""The lean CPU chain path of the `specdec_tree` attention (hf/attention.chain_attention) and the
custom ops' eager shortcut (common/registry.EagerFirstOp) compute what the reference computes."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from specdec_kernels import ops, reference
from specdec_kernels.common import registry
from specdec_kernels.ops import logit_verify
from specdec_kernels.hf.attention import ChainPlan, chain_attention


def _case(lengths, n, hq=4, hkv=2, d=8, s_max=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    batch = len(lengths)
    q = torch.randn(batch, hq, n, d, generator=g)  # as HF hands it over: [B, Hq, N, D]
    k, v = (torch.randn(batch, hkv, s_max, d, generator=g) for _ in range(2))
    return q, k, v, torch.tensor(lengths)


@pytest.mark.parametrize("lengths,n", [([5], 1), ([5], 3), ([0], 4), ([7, 2, 0, 11], 1), ([7, 2, 0, 11], 3)])
def test_chain_attention_equals_reference(lengths, n):
    q, k, v, seq_lens = _case(lengths, n)
    out = chain_attention(q, k, v, ChainPlan.of(seq_lens, n), 0.3)
    expected, _ = reference.tree_attention(q.transpose(1, 2), k, v, seq_lens, sm_scale=0.3)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_chain_attention_sees_exactly_the_rows_slots():
    # mutation: a key just past row 0's last visible slot changes nothing, one inside it changes the output
    q, k, v, seq_lens = _case([3, 6], 2)
    plan = ChainPlan.of(seq_lens, 2)
    out = chain_attention(q, k, v, plan, None)
    outside, inside = k.clone(), k.clone()
    outside[0, :, 3 + 2] += 100.0  # row 0's second new token sits at slot 4; slot 5 is not its own
    inside[0, :, 4] += 100.0
    torch.testing.assert_close(chain_attention(q, outside, v, plan, None), out)
    assert not torch.allclose(chain_attention(q, inside, v, plan, None)[0], out[0])
    torch.testing.assert_close(chain_attention(q, inside, v, plan, None)[1], out[1])  # row 1 untouched


def test_decode_step_of_one_row_needs_no_mask():
    assert ChainPlan.of(torch.tensor([9]), 1).mask is None
    assert ChainPlan.of(torch.tensor([9, 9]), 1).mask is None
    assert ChainPlan.of(torch.tensor([9, 4]), 1).mask is not None
    assert ChainPlan.of(torch.tensor([9]), 2).span == 11


def test_eager_shortcut_runs_the_body_and_tracing_keeps_the_custom_op():
    logits, drafts = torch.randn(2, 3, 11), torch.randint(0, 11, (2, 2))
    out, accepted = ops.greedy_verify(logits, drafts)
    expected = reference.greedy_verify(logits, drafts)
    assert torch.equal(out, expected[0]) and torch.equal(accepted, expected[1])
    assert registry.eager([logits, [drafts]]) and not registry.eager([torch.nn.Parameter(logits)])
    with FakeTensorMode() as mode:  # fake tensors: only the custom op's fake implementation can serve them
        fake_logits, fake_drafts = mode.from_tensor(logits), mode.from_tensor(drafts)
        assert not registry.eager([fake_logits])
        out, accepted = logit_verify._greedy_verify_op(fake_logits, fake_drafts, None, "torch")  # ops' wrapper reads values
        assert out.shape == (2, 3) and accepted.shape == (2,)
