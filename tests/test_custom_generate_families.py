"""`model.generate(custom_generate=...)` on GPT-2 (learned positions, left padding) and BART (encoder-
decoder, right-padded encoder inputs, HF's forced EOS at max_length) pairs: greedy output equals the
target's own generate of each prompt alone, batch 4, for the strategies that take a draft model and
for plain decoding; a streamer sees BART's forced EOS."""

import pytest
import torch

from specdec_kernels import custom_generate

from hf_support import auto_class, one_thread, save_tiny_model

NEW = 10
LENGTHS = [7, 4, 6, 3]


@pytest.fixture(scope="module", params=["gpt2", "bart"])
def family_pair(request, tmp_path_factory):
    family = request.param
    folder = tmp_path_factory.mktemp(family)
    save_tiny_model(family, folder / "target", seed=0)
    save_tiny_model(family, folder / "draft", seed=1)
    load = lambda name: auto_class(family).from_pretrained(folder / name).eval()  # noqa: E731
    return family, load("target"), load("draft")


def batch(family: str):
    """4 prompts of LENGTHS: GPT-2 left-padded (its generate's layout), BART's encoder right-padded
    (its learned encoder positions would shift under left padding, in HF's own batched generate too)."""
    gen = torch.Generator().manual_seed(3)
    width = max(LENGTHS)
    ids = torch.full((len(LENGTHS), width), 1 if family == "bart" else 0)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(LENGTHS):
        span = slice(width - length, width) if family == "gpt2" else slice(0, length)
        ids[row, span] = torch.randint(3, 64, (length,), generator=gen)
        mask[row, span] = 1
    return ids, mask


@pytest.mark.parametrize("strategy", ["speculative", "bild", "plain"])
def test_greedy_equals_each_prompt_alone(family_pair, strategy):
    family, target, draft = family_pair
    ids, mask = batch(family)
    options = dict(assistant_model=draft) if strategy != "plain" else {}
    if strategy != "speculative":
        options["strategy"] = strategy
    with one_thread():
        out = target.generate(ids, attention_mask=mask, custom_generate=custom_generate, max_new_tokens=NEW,
                              do_sample=False, **options)
        width = 1 if family == "bart" else ids.shape[1]  # BART's sequences are the decoder's
        for row in range(len(LENGTHS)):
            alone = target.generate(ids[row:row + 1, mask[row].bool()], max_new_tokens=NEW, do_sample=False)
            start = 1 if family == "bart" else int(mask[row].sum())
            reference = alone[0, start:]
            assert torch.equal(out[row, width:width + len(reference)], reference), (family, strategy, row)
    if family == "bart":  # forced_eos_token_id: a row that reaches max_length ends with EOS, as HF forces it
        assert target.generation_config.forced_eos_token_id == 2
        assert any(int(out[row, -1]) == 2 and bool((out[row, 1:-1] != 2).all()) for row in range(len(LENGTHS)))


def test_streamer_sees_the_forced_eos(family_pair):
    family, target, draft = family_pair
    if family != "bart":
        pytest.skip("forced EOS is BART's")
    ids, mask = batch(family)

    class Recording:
        puts = []

        def put(self, value):
            self.puts.append(value.flatten().tolist())

        def end(self):
            pass

    streamer = Recording()
    row = 0
    with one_thread():
        out = target.generate(ids[row:row + 1, :LENGTHS[row]], custom_generate=custom_generate, assistant_model=draft,
                              max_new_tokens=NEW, streamer=streamer)
    assert sum(streamer.puts[1:], []) == out[0, 1:].tolist()
    assert out[0, -1] == 2
