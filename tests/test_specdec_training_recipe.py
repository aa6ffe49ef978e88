"""Issue 28: the SpecDec drafter's training recipe must make it draft.

- the dense training form (many blocks of one sequence in one forward) computes exactly what the
  strategy's drafting steps compute on the same prefixes (no train/inference mismatch), in both
  position encodings and both drafter forms;
- on a tiny synthetic language whose next tokens are predictable (each token determines the next
  through a fixed permutation), a drafter trained by train_specdec_drafter for a fixed small
  budget drafts the first block position almost always right, also after prefixes shorter than
  any it was trained on (the strategy's prompts are often shorter than the training prompts), and
  later block positions mostly right too. The recipe before the fix (one block per row, learned
  absolute positions, width-4 heads) reached ~0.05 here.
"""

import pytest
import torch

from specdec_kernels.models import SpecDecDrafter, SpecDecDrafterConfig
from specdec_kernels.training import train_specdec_drafter
from specdec_kernels.training.distill import DistillData

from hf_support import VOCAB, auto_class, one_thread, save_tiny_model

K = 4
STEPS = 300


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.mark.parametrize("encoding", ["learned", "rope"])
@pytest.mark.parametrize("encoder_layers", [0, 2])
def test_dense_training_forward_equals_the_drafting_steps(encoding, encoder_layers):
    torch.manual_seed(0)
    config = SpecDecDrafterConfig(vocab_size=VOCAB, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                                  num_layers=2, encoder_layers=encoder_layers, max_position_embeddings=96,
                                  block_size=K, dropout=0.0, initializer_range=0.2, position_encoding=encoding)
    drafter = SpecDecDrafter(config).eval()
    gen = torch.Generator().manual_seed(1)
    sequences = torch.randint(0, VOCAB, (2, 14), generator=gen)
    lengths = torch.tensor([14, 10])
    anchors = torch.tensor([[1, 5, 14, -1], [2, 3, 10, 7]])
    sources = torch.randint(0, VOCAB, (2, 6), generator=gen)
    extra = {}
    if encoder_layers:
        extra["encoder_hidden"], extra["encoder_mask"] = drafter.encode(sources)
    blocks = torch.full((2, 4, K), config.mask_token_id)
    dense = drafter.forward_blocks(sequences, lengths, anchors, blocks, **extra).logits
    for row in range(2):
        cache = drafter.new_cache(1, 40)
        if encoder_layers:
            drafter.encode(sources[row:row + 1], None, cache)
        fed = 0
        for a in sorted(int(x) for x in anchors[row] if x > 0):  # the strategy: feed what is new, draft
            _, logits = drafter.draft(sequences[row:row + 1, fed:a], torch.tensor([a - fed]), cache, K)
            fed = a
            column = anchors[row].tolist().index(a)
            torch.testing.assert_close(dense[row, column], logits[0], rtol=1e-5, atol=1e-5)


def permutation_language(count, prompt_length, continuation_length, generator, permutation):
    """Rows of a language where each token determines the next (token -> permutation[token]), from
    random first tokens: (prompts [count, prompt_length], continuations [count, continuation_length])."""
    tokens = [torch.randint(3, VOCAB, (count,), generator=generator)]
    for _ in range(prompt_length + continuation_length - 1):
        tokens.append(permutation[tokens[-1]])
    rows = torch.stack(tokens, 1)
    return rows[:, :prompt_length], rows[:, prompt_length:]


def test_a_drafter_trained_on_a_predictable_language_drafts_it(tmp_path):
    directory = tmp_path / "llama"
    save_tiny_model("llama", directory)
    target = auto_class("llama").from_pretrained(directory).eval()  # its width and vocabulary only
    gen = torch.Generator().manual_seed(0)
    permutation = torch.arange(VOCAB)
    permutation[3:] = 3 + torch.randperm(VOCAB - 3, generator=gen)
    prompts, continuations = permutation_language(1024, 8, 8, gen, permutation)
    # the distillation data (what the target's greedy decoding would be for this language)
    torch.save(DistillData(prompts, continuations, None).state(), tmp_path / "distillation.pt")
    drafter = train_specdec_drafter(target, [[1]], output_dir=tmp_path, block_size=K, steps=STEPS, batch_size=16,
                                    prompt_length=8, continuation_length=8, learning_rate=3e-3, warmup_steps=10,
                                    glancing=False, drafter_config={"dropout": 0.0}, progress=False, seed=0)
    test_prompts, expected = permutation_language(64, 20, K, torch.Generator().manual_seed(1), permutation)
    for length in (8, 11, 14):  # prefixes of the lengths it was trained on
        guesses = drafter(test_prompts[:, -length:], block_size=K).logits.argmax(-1)
        accuracy = (guesses == expected).float().mean(0)
        assert accuracy[0] >= 0.95, (length, accuracy.tolist())
        assert accuracy.mean() >= 0.8, (length, accuracy.tolist())


def test_dense_samples_cover_every_prefix_once():
    from specdec_kernels.training.specdec_drafter import sample_sequences
    conts = torch.tensor([[10, 11, 12, 13], [20, 21, -100, -100]])
    data = DistillData(torch.tensor([[1, 2], [3, 4]]), conts, None)
    gen = torch.Generator().manual_seed(0)
    while True:
        input_ids, lengths, anchors, labels, sources = sample_sequences(data, 1, 3, gen)
        if input_ids[0, 0] == 3:
            break
    assert sources is None and lengths.tolist() == [4] and input_ids[0, :4].tolist() == [3, 4, 20, 21]
    assert anchors.tolist() == [[2, 3, -1, -1]]
    assert labels[0, :2].tolist() == [[20, 21, -100], [21, -100, -100]] and (labels[0, 2:] == -100).all()


def test_prompts_cut_short_are_left_aligned_in_both_samplers():
    from specdec_kernels.training.specdec_drafter import sample_batch, sample_sequences
    prompts = torch.tensor([[-100, -100, 5, 6], [1, 2, 3, 4]])
    conts = torch.tensor([[10, 11, 12], [20, 21, -100]])
    data = DistillData(prompts, conts, None)
    input_ids, lengths, anchors, labels, _ = sample_sequences(data, 64, 2, torch.Generator().manual_seed(0))
    short = input_ids[:, 0] == 5
    assert short.any() and (~short).any()
    assert input_ids[short][0, :5].tolist() == [5, 6, 10, 11, 12] and set(lengths[short].tolist()) == {5}
    assert anchors[short][0].tolist() == [2, 3, 4] and anchors[~short][0].tolist() == [4, 5, -1]
    input_ids, lengths, labels, _ = sample_batch(data, 64, 2, torch.Generator().manual_seed(0))
    for row in range(64):
        if input_ids[row, 0] == 5:  # prefix = the 2 prompt tokens + p continuation tokens
            p = int(lengths[row]) - 2
            assert input_ids[row, :lengths[row]].tolist() == [5, 6, 10, 11, 12][:2 + p]
            assert labels[row].tolist() == ([10, 11, 12, -100, -100])[p:p + 2]
