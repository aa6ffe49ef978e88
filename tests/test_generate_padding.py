"""A padded batch without attention_mask: the mask is inferred from the pad id as HF infers it, or the call is
refused in one line; never tokens that depend on the padding (specdec_kernels/decoding/padding.py)."""

import pytest
import torch

import specdec_kernels
from specdec_kernels import custom_generate
from specdec_kernels.decoding.padding import attention_mask_for, padded
from decoding_support import left_padded, make_pair

NEW = 6


def alone(target, ids, mask):
    """Each row's greedy tokens from HF's generate with the row by itself, padding removed."""
    rows = []
    for row in range(ids.shape[0]):
        prompt = ids[row][mask[row].bool()].unsqueeze(0)
        rows.append(target.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                    max_new_tokens=NEW, min_new_tokens=NEW, eos_token_id=None)[0, -NEW:])
    return torch.stack(rows)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return make_pair("llama", tmp_path_factory.mktemp("padding"))


@pytest.mark.parametrize("strategy", ["plain", "speculative"])
def test_a_pad_id_that_is_no_eos_infers_the_mask(pair, strategy):
    target, draft = pair
    ids, mask = left_padded([7, 3, 5], seed=1, pad=1)
    options = {"draft_model": draft, "num_draft_tokens": 3} if strategy == "speculative" else {}
    out = specdec_kernels.generate(target, ids, strategy=strategy, max_new_tokens=NEW, pad_token_id=1,
                                   eos_token_id=[2], min_new_tokens=NEW, **options)
    assert torch.equal(out.sequences[:, ids.shape[1]:], alone(target, ids, mask))


def test_a_pad_id_that_is_no_eos_infers_the_mask_through_custom_generate(pair):
    target, _ = pair
    ids, mask = left_padded([7, 3, 5], seed=2, pad=1)
    out = target.generate(ids, custom_generate=custom_generate, max_new_tokens=NEW, min_new_tokens=NEW,
                          pad_token_id=1, eos_token_id=2)
    assert torch.equal(out[:, ids.shape[1]:], alone(target, ids, mask))


def test_without_inference_the_rows_would_differ(pair):
    """The mutation the tests above catch: the same batch with every token read as text gives other tokens."""
    target, _ = pair
    ids, mask = left_padded([7, 3, 5], seed=1, pad=1)
    out = specdec_kernels.generate(target, ids, attention_mask=torch.ones_like(ids), strategy="plain",
                                   max_new_tokens=NEW, pad_token_id=1, eos_token_id=[2], min_new_tokens=NEW)
    assert not torch.equal(out.sequences[:, ids.shape[1]:], alone(target, ids, mask))


@pytest.mark.parametrize("through", ["generate", "custom_generate"])
def test_padding_with_an_eos_id_is_refused_in_one_line(pair, through):
    target, _ = pair
    ids, _ = left_padded([7, 3, 5], seed=3, pad=2)
    with pytest.raises(ValueError) as error:
        if through == "generate":
            specdec_kernels.generate(target, ids, strategy="plain", max_new_tokens=NEW, pad_token_id=2,
                                     eos_token_id=[2])
        else:
            target.generate(ids, custom_generate=custom_generate, max_new_tokens=NEW, pad_token_id=2, eos_token_id=2)
    message = str(error.value)
    assert "\n" not in message and "attention_mask" in message and "token 2" in message


def test_a_shared_leading_eos_is_text_not_padding(pair):
    """Every row opening with the EOS id (a BOS that is also EOS and pad) is no padding: the call runs as
    with an all-ones mask."""
    target, _ = pair
    ids = torch.randint(3, 64, (3, 6), generator=torch.Generator().manual_seed(4))
    ids[:, 0] = 2
    kwargs = dict(strategy="plain", max_new_tokens=NEW, pad_token_id=2, eos_token_id=[2], min_new_tokens=NEW)
    out = specdec_kernels.generate(target, ids, **kwargs)
    ones = specdec_kernels.generate(target, ids, attention_mask=torch.ones_like(ids), **kwargs)
    assert torch.equal(out.sequences, ones.sequences)


@pytest.mark.parametrize("rows, expected", [
    ([[0, 0, 5, 6], [0, 7, 8, 9]], True),    # left padding: leading runs 2 and 1
    ([[5, 6, 0, 0], [7, 8, 9, 0]], True),    # right padding
    ([[0, 5, 6, 0], [0, 7, 8, 0]], False),   # the same run in every row: text
    ([[5, 0, 6, 7], [7, 8, 9, 4]], False),   # a pad id inside the text only
    ([[0, 0, 5, 6]], False),                 # one row carries no batch padding
])
def test_padded_reads_the_edge_runs(rows, expected):
    assert padded(torch.tensor(rows), 0) is expected


def test_an_explicit_mask_and_an_unknown_pad_id_are_left_alone():
    ids = torch.tensor([[0, 0, 5], [0, 7, 8]])
    given = torch.ones_like(ids)
    assert attention_mask_for("generate", ids, given, 0, [0]) is given
    assert attention_mask_for("generate", ids, None, None, [0]) is None
    assert attention_mask_for("generate", ids, None, 3, [0]) is None  # the pad id does not occur
