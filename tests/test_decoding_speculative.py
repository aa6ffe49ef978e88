"""Strategy `speculative` through specdec_kernels.generate on tiny fp32 models (CPU):
greedy output is token-identical to HF's greedy generate (batch 1 and 4, left-padded prompts of
different lengths, Llama and GPT-2, torch and Triton-interpreter backends), equals HF assisted
generation, stops rows at their own EOS with HF's padding; clear errors for bad pairs and prompts."""

import pytest
import torch

import specdec_kernels
from specdec_kernels.decoding import SpeculativeDecoder

from decoding_support import left_padded, make_pair
from hf_support import one_thread

NEW = 16


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def pair(request, tmp_path_factory):
    return (request.param, *make_pair(request.param, tmp_path_factory.mktemp(request.param)))


def hf_greedy(target, ids, mask, **kwargs):
    kwargs = {"max_new_tokens": NEW, **kwargs}
    return target.generate(ids, attention_mask=mask, do_sample=False, pad_token_id=0, **kwargs)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_greedy_equals_hf_generate(pair, backend):
    _, target, draft = pair
    new = NEW if backend == "torch" else NEW // 2  # Triton's interpreter: every op of each step, a few steps
    ids, mask = left_padded([7, 3, 5, 1], seed=1)
    expected = hf_greedy(target, ids, mask, max_new_tokens=new)
    out = specdec_kernels.generate(target, ids, attention_mask=mask, strategy="speculative", draft_model=draft,
                                   num_draft_tokens=3, max_new_tokens=new, pad_token_id=0, backend=backend)
    assert torch.equal(out.sequences, expected)
    stats = out.stats
    assert 0 < stats.accepted_tokens < stats.drafted_tokens  # both accept and reject paths ran
    assert stats.emitted_tokens == 4 * new and stats.target_forwards < 4 * new
    one = specdec_kernels.generate(target, ids[2:3, 2:], strategy="speculative", draft_model=draft,
                                   num_draft_tokens=4, max_new_tokens=new, pad_token_id=0, backend=backend)
    assert torch.equal(one.sequences, expected[2:3, 2:])  # batch 1, no padding


def test_greedy_equals_hf_assisted_generation(pair):
    _, target, draft = pair
    ids, _ = left_padded([6], seed=2)
    expected = target.generate(ids, assistant_model=draft, max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                               num_assistant_tokens=4, num_assistant_tokens_schedule="constant")
    decoder = SpeculativeDecoder(target, draft, num_draft_tokens=4)
    assert torch.equal(decoder.generate(ids, max_new_tokens=NEW, pad_token_id=0).sequences, expected)


def test_heuristic_schedule_stays_exact(pair):
    _, target, draft = pair
    ids, mask = left_padded([5, 2, 4], seed=3)
    out = specdec_kernels.generate(target, ids, attention_mask=mask, strategy="speculative", draft_model=draft,
                                   num_draft_tokens=2, schedule="heuristic", max_draft_tokens=6,
                                   max_new_tokens=NEW, pad_token_id=0)
    assert torch.equal(out.sequences, hf_greedy(target, ids, mask))


def test_per_row_eos_stops_rows_and_pads_like_hf(pair):
    _, target, draft = pair
    ids, mask = left_padded([7, 3, 5, 2], seed=1)
    plain = hf_greedy(target, ids, mask)[:, ids.shape[1]:]
    eos = int(plain[1, 4])  # a token row 1 emits mid-way: rows stop at different steps
    expected = hf_greedy(target, ids, mask, eos_token_id=eos)
    out = specdec_kernels.generate(target, ids, attention_mask=mask, strategy="speculative", draft_model=draft,
                                   num_draft_tokens=3, max_new_tokens=NEW, eos_token_id=eos, pad_token_id=0)
    assert torch.equal(out.sequences, expected)
    new = out.sequences[:, ids.shape[1]:]
    assert (new == eos).any(dim=1).sum() >= 1 and (new[1, 5:] == 0).all()


def test_lenience_one_is_exact_and_lower_lenience_accepts_more(pair):
    _, target, draft = pair
    ids, mask = left_padded([5, 4], seed=4)
    run = lambda l: specdec_kernels.generate(target, ids, attention_mask=mask, strategy="speculative",  # noqa: E731
                                             draft_model=draft, lenience=l, max_new_tokens=NEW, pad_token_id=0)
    assert torch.equal(run(1.0).sequences, hf_greedy(target, ids, mask))
    assert run(1e-6).stats.acceptance_rate > run(1.0).stats.acceptance_rate


def test_clear_errors(pair, tmp_path):
    family, target, draft = pair
    ids, _ = left_padded([4])
    with pytest.raises(ValueError, match="draft_model"):
        specdec_kernels.generate(target, ids, strategy="speculative", max_new_tokens=4)
    with pytest.raises(ValueError, match="unknown strategy"):
        specdec_kernels.generate(target, ids, strategy="nope", max_new_tokens=4)
    if family == "gpt2":  # learned positions: a prompt + budget past n_positions is refused up front
        with pytest.raises(ValueError, match="exceeds the target model's 128"):
            specdec_kernels.generate(target, ids, strategy="speculative", draft_model=draft, max_new_tokens=200)
    other = type(draft).from_pretrained(tmp_path_factory_dir(draft, tmp_path)).eval()
    other.config.eos_token_id = 7
    with pytest.raises(ValueError, match="different tokenizers"):
        specdec_kernels.generate(target, ids, strategy="speculative", draft_model=other, max_new_tokens=4)
    with pytest.raises(ValueError, match="differ by more than LM-head padding"):
        specdec_kernels.generate(target, ids, strategy="speculative", draft_model=resized(draft, tmp_path, 32),
                                 max_new_tokens=4)
    unsupported = torch.nn.Linear(2, 2)
    unsupported.config = type("Config", (), {"model_type": "rwkv"})()
    with pytest.raises(ValueError, match="not supported.*supported: "):
        specdec_kernels.generate(unsupported, ids, strategy="speculative", draft_model=draft, max_new_tokens=4)


def resized(model, tmp_path, vocab):
    copy = type(model).from_pretrained(tmp_path_factory_dir(model, tmp_path)).eval()
    copy.resize_token_embeddings(vocab)
    return copy


def test_padded_draft_vocabulary_is_fitted(pair, tmp_path):
    """A draft LM head padded past the tokenizer (more ids) or shorter is fitted to the target's V."""
    _, target, draft = pair
    ids, mask = left_padded([5, 3], seed=6)
    expected = hf_greedy(target, ids, mask)
    for vocab in (72, 60):
        out = specdec_kernels.generate(target, ids, attention_mask=mask, strategy="speculative",
                                       draft_model=resized(draft, tmp_path, vocab), max_new_tokens=NEW, pad_token_id=0,
                                       do_sample=vocab == 60, seed=0)
        if vocab == 72:
            assert torch.equal(out.sequences, expected)
        assert out.sequences.max() < 64


def tmp_path_factory_dir(model, tmp_path):
    model.save_pretrained(tmp_path / "copy")
    return tmp_path / "copy"


def test_generate_restores_the_models_attention(pair):
    _, target, draft = pair
    ids, _ = left_padded([4])
    before = target.config._attn_implementation
    specdec_kernels.generate(target, ids, strategy="speculative", draft_model=draft, max_new_tokens=4)
    assert target.config._attn_implementation == before == draft.config._attn_implementation
