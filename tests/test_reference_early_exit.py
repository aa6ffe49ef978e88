"""The early_exit_topk reference widens a 16-bit LM head to float32 LOGIT_ROWS rows at a time, never the
whole head (2.1 GB as float32 at 128256 x 4096, on every call of `auto` at B > 8 on a GPU): the same
top-k, bit for bit, as widening the whole head, on integer-valued inputs whose sums are exact in any order."""

import pytest
import torch

from specdec_kernels.common.sampling import nan_to_neg_inf
from specdec_kernels.reference import early_exit as ref


def whole_head_topk(hidden, weight, k):
    logits = nan_to_neg_inf(hidden.float() @ weight.float().t())
    values, indices = torch.sort(logits, dim=-1, descending=True, stable=True)
    return values[:, :k], indices[:, :k]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_blocks_of_rows_give_the_whole_head_answer(monkeypatch, dtype):
    monkeypatch.setattr(ref, "LOGIT_ROWS", 64)  # V = 1000: 16 blocks, the last one partial
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randint(-3, 4, (5, 48), generator=gen).to(dtype)
    weight = torch.randint(-2, 3, (1000, 48), generator=gen).to(dtype)
    weight[700:705] = weight[3]  # ties across blocks go to the lower id
    hidden[4, 7] = float("nan")  # a NaN row: every logit -inf
    got = ref.early_exit_topk(hidden, None, weight, 16, norm="none")
    want = whole_head_topk(hidden, weight, 16)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert got[1][4].tolist() == list(range(16))


def test_a_16_bit_head_is_widened_a_block_at_a_time(monkeypatch):
    widened = []
    real = torch.Tensor.float

    def spy(self, *args, **kwargs):
        widened.append(self.shape[0] if self.dim() == 2 else None)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ref, "LOGIT_ROWS", 64)
    monkeypatch.setattr(torch.Tensor, "float", spy)
    ref.head_logits(torch.zeros(2, 8), torch.zeros(300, 8, dtype=torch.bfloat16))
    assert widened == [64, 64, 64, 64, 44]
