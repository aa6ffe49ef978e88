"""SpecDecDrafter and its training pieces on tiny fp32 models (CPU): drafting through the prefix
cache (ragged rows, several steps) equals a full recompute of each row alone, in both forms;
prefix rows never see the masks; save/load round-trips (also through AutoModel); the training
data (greedy labels, EOS masking, uniform prefix lengths, GLAT reveal counts) and an exact resume."""

import pytest
import torch
from transformers import AutoModel

from specdec_kernels.models import SpecDecDrafter, SpecDecDrafterConfig
from specdec_kernels.training import train_specdec_drafter
from specdec_kernels.training.distill import IGNORE, DistillData, greedy_continuations, mask_after_eos
from specdec_kernels.training.specdec_drafter import glance, sample_batch

from hf_support import VOCAB, auto_class, one_thread, save_tiny_model

K = 4


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


def tiny_drafter(encoder_layers: int = 0, seed: int = 0) -> SpecDecDrafter:
    torch.manual_seed(seed)
    config = SpecDecDrafterConfig(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, intermediate_size=64,
                                  num_layers=2, encoder_layers=encoder_layers, max_position_embeddings=96,
                                  block_size=K, dropout=0.0, initializer_range=0.2)
    return SpecDecDrafter(config).eval()


def recompute(drafter, prefix, source=None):
    """The block logits [K, V] of one row from scratch (no cache, no padding)."""
    kwargs = {}
    if source is not None:
        kwargs["encoder_hidden"], kwargs["encoder_mask"] = drafter.encode(source.unsqueeze(0))
    return drafter(prefix.unsqueeze(0), block_size=K, **kwargs).logits[0]


@pytest.mark.parametrize("encoder_layers", [0, 2])
def test_cached_drafting_equals_recompute(encoder_layers):
    drafter = tiny_drafter(encoder_layers)
    gen = torch.Generator().manual_seed(1)
    batch = 3
    sources = torch.randint(3, VOCAB, (batch, 7), generator=gen) if encoder_layers else None
    cache = drafter.new_cache(batch, 40)
    if encoder_layers:
        drafter.encode(sources, None, cache)
    prefixes = [[] for _ in range(batch)]
    feeds = [(torch.randint(0, VOCAB, (batch, 9), generator=gen), torch.tensor([9, 4, 1])),
             (torch.randint(0, VOCAB, (batch, 5), generator=gen), torch.tensor([1, 5, 3])),
             (torch.randint(0, VOCAB, (batch, 5), generator=gen), torch.tensor([2, 0, 5]))]  # a row with nothing new
    for tokens, counts in feeds:
        drafts, logits = drafter.draft(tokens, counts, cache, K)
        assert drafts.shape == (batch, K) and logits.shape == (batch, K, VOCAB)
        for row in range(batch):
            prefixes[row] += tokens[row, :counts[row]].tolist()
            expected = recompute(drafter, torch.tensor(prefixes[row]), None if sources is None else sources[row])
            torch.testing.assert_close(logits[row], expected, rtol=1e-5, atol=1e-5)
            assert torch.equal(drafts[row], expected.argmax(-1))
    assert cache.seq_lens.tolist() == [len(p) for p in prefixes]


def test_prefix_rows_never_see_the_masks_but_masks_see_each_other():
    drafter = tiny_drafter()
    prefix = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(2))
    base = drafter(prefix, block_size=K).logits
    longer = drafter(prefix, block_size=K + 3).logits  # more masks change every mask's output...
    assert not torch.allclose(base, longer[:, :K])
    cache_a, cache_b = drafter.new_cache(1, 20), drafter.new_cache(1, 20)
    drafter.draft(prefix, None, cache_a, 1)
    drafter.draft(prefix, None, cache_b, 8)
    for keys_a, keys_b in zip(cache_a.keys, cache_b.keys):  # ...but never the prefix's cached K/V
        torch.testing.assert_close(keys_a, keys_b, rtol=1e-6, atol=1e-6)  # (only the summation order differs)


def test_save_and_load_round_trip(tmp_path):
    drafter = tiny_drafter(encoder_layers=2, seed=3)
    drafter.save_pretrained(tmp_path / "drafter")
    loaded = SpecDecDrafter.from_pretrained(tmp_path / "drafter").eval()
    auto = AutoModel.from_pretrained(tmp_path / "drafter").eval()
    assert type(auto) is SpecDecDrafter and loaded.config.encoder_layers == 2 and loaded.config.block_size == K
    source = torch.randint(0, VOCAB, (7,))
    prefix = torch.randint(0, VOCAB, (5,))
    for other in (loaded, auto):
        for a, b in zip(drafter.state_dict().values(), other.state_dict().values()):
            assert torch.equal(a, b)
        assert torch.equal(recompute(drafter, prefix, source), recompute(other, prefix, source))


def test_clear_errors():
    drafter = tiny_drafter()
    with pytest.raises(TypeError, match="SpecDecDrafter: input_ids must be an int64 tensor"):
        drafter(torch.zeros(1, 3, dtype=torch.int32))
    cache = drafter.new_cache(1, 8)
    with pytest.raises(ValueError, match="SpecDecDrafter: the cache holds 8 positions"):
        drafter.draft(torch.zeros(1, 9, dtype=torch.int64), None, cache)
    with pytest.raises(ValueError, match="num_new must be int64"):
        drafter(torch.zeros(2, 3, dtype=torch.int64), torch.tensor([1, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        drafter.new_cache(1, 200)
    with pytest.raises(ValueError, match="needs the seq2seq form"):
        drafter.encode(torch.zeros(1, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="needs the encoder output"):
        tiny_drafter(encoder_layers=1)(torch.zeros(1, 3, dtype=torch.int64))


# ---- training pieces ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llama")
    save_tiny_model("llama", directory)
    return auto_class("llama").from_pretrained(directory).eval()


def test_labels_are_the_target_greedy_output(llama):
    prompts = torch.randint(3, VOCAB, (3, 5), generator=torch.Generator().manual_seed(4))
    data = greedy_continuations(llama, prompts, 6, batch_size=2)
    expected = llama.generate(prompts, max_new_tokens=6, do_sample=False, pad_token_id=0)[:, 5:]
    assert data.continuations.shape == (3, 6) and data.start_token is None
    real = data.continuations != IGNORE
    assert torch.equal(data.continuations[real], expected[real])


def test_mask_after_eos_keeps_the_eos():
    tokens = torch.tensor([[5, 2, 7, 2], [5, 6, 7, 8], [2, 3, 3, 3]])
    assert mask_after_eos(tokens, [2]).tolist() == [[5, 2, -100, -100], [5, 6, 7, 8], [2, -100, -100, -100]]


def test_prefix_lengths_are_uniform_and_labels_follow_them():
    conts = torch.tensor([[10, 11, 12, 13, 14, 15], [20, 21, 22, IGNORE, IGNORE, IGNORE]])
    data = DistillData(torch.tensor([[1, 2], [3, 4]]), conts, None)
    input_ids, lengths, labels, sources = sample_batch(data, 6000, 3, torch.Generator().manual_seed(5))
    assert sources is None
    prefix = lengths - 2
    first_label = labels[:, 0]
    long_rows = first_label < 20  # rows of the first continuation (labels 10..15)
    counts = torch.bincount(prefix[long_rows], minlength=6)
    share = counts.float() / long_rows.sum()
    assert counts.shape == (6,) and (share - 1 / 6).abs().max() < 0.03  # p uniform over [0, 5] (L = 6)
    short = torch.bincount(prefix[~long_rows]).float() / (~long_rows).sum()
    assert short.shape == (3,) and (short - 1 / 3).abs().max() < 0.04  # p uniform over [0, 2] (L = 3)
    row = int(torch.nonzero(~long_rows & (prefix == 2))[0])
    assert labels[row].tolist() == [22, IGNORE, IGNORE]  # nothing past the continuation is trained
    assert input_ids[row, :4].tolist() == [3, 4, 20, 21]


def test_glancing_reveals_wrong_times_ratio_and_drops_them_from_the_loss():
    drafter = tiny_drafter()
    inputs = {"input_ids": torch.randint(0, VOCAB, (64, 5)), "block_size": 6}
    labels = torch.randint(0, VOCAB, (64, 6))
    labels[:, 5] = IGNORE
    predicted = drafter(**inputs).logits.argmax(-1)
    wrong = ((predicted != labels) & (labels != IGNORE)).sum(1)
    block_ids, remaining = glance(drafter, inputs, labels, 0.5, torch.Generator().manual_seed(6))
    revealed = block_ids != drafter.config.mask_token_id
    assert torch.equal(revealed.sum(1), (wrong.float() * 0.5).floor().long())
    assert torch.equal(block_ids[revealed], labels[revealed]) and not revealed[:, 5].any()
    assert (remaining[revealed] == IGNORE).all() and torch.equal(remaining[~revealed], labels[~revealed])


def test_resume_continues_exactly(llama, tmp_path):
    texts = [torch.randint(3, VOCAB, (200,), generator=torch.Generator().manual_seed(7))]
    options = dict(block_size=3, batch_size=4, prompt_length=6, continuation_length=8, max_prompts=12,
                   drafter_config={"hidden_size": 16, "num_attention_heads": 2, "intermediate_size": 32},
                   progress=False, seed=3)
    straight = train_specdec_drafter(llama, texts, steps=6, **options)
    # "interrupted" after 4 steps: a checkpoint at 4, then a resumed run to 6
    train_specdec_drafter(llama, texts, steps=5, output_dir=tmp_path, checkpoint_every=4, **options)
    assert (tmp_path / "checkpoint-4" / "trainer_state.pt").is_file() and (tmp_path / "distillation.pt").is_file()
    resumed = train_specdec_drafter(llama, texts, steps=6, output_dir=tmp_path, resume=True, **options)
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    saved = SpecDecDrafter.from_pretrained(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(resumed.state_dict().values(), saved.state_dict().values()))


def test_auto_prompts_give_every_training_row_a_fresh_prompt(llama, tmp_path):
    """max_prompts="auto" (the default) distills steps * batch_size prompts: the shipped drafter
    learned 2048 prompts by heart (0.72 first-position accuracy on them, 0.38 on held-out text)."""
    texts = [torch.randint(3, VOCAB, (400,), generator=torch.Generator().manual_seed(7))]
    options = dict(block_size=3, batch_size=4, prompt_length=6, continuation_length=4, progress=False,
                   drafter_config={"hidden_size": 16, "num_attention_heads": 2, "intermediate_size": 32})
    train_specdec_drafter(llama, texts, steps=3, output_dir=tmp_path / "auto", **options)
    data = torch.load(tmp_path / "auto" / "distillation.pt", weights_only=False)
    assert data["prompts"].shape[0] == 3 * 4
    train_specdec_drafter(llama, texts, steps=30, output_dir=tmp_path / "capped", **options)  # text runs out first
    data = torch.load(tmp_path / "capped" / "distillation.pt", weights_only=False)
    assert data["prompts"].shape[0] == 400 // 6
    with pytest.raises(ValueError, match="max_prompts must be 'auto'"):
        train_specdec_drafter(llama, texts, steps=1, max_prompts="all", **options)
