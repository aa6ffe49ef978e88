"""specdec_kernels.generate refuses what it would otherwise decode wrongly or fail on obscurely: an option
the strategy does not take (named, with the ones it does), and a prompt + max_new_tokens past a rotary
model's max_position_embeddings (which nothing else stops: rotary models place any position)."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import specdec_kernels


def tiny_llama(positions: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=positions,
                         eos_token_id=None, bos_token_id=0, pad_token_id=0)
    return LlamaForCausalLM(config).eval()


def test_unknown_option_names_the_strategy_and_its_options():
    with pytest.raises(TypeError, match="^generate: strategy 'plain' has no option 'nonsense'; its options: none$"):
        specdec_kernels.generate(tiny_llama(16), torch.ones(1, 3, dtype=torch.int64), strategy="plain",
                                 max_new_tokens=2, nonsense=1)


def test_prompt_plus_new_tokens_past_the_positions_is_refused_at_the_boundary():
    model = tiny_llama(16)
    prompt = torch.tensor([[0, 0, 5, 6, 7, 8]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1]])  # left padding does not use positions: 4 tokens
    out = specdec_kernels.generate(model, prompt, attention_mask=mask, strategy="plain", max_new_tokens=12,
                                   eos_token_id=[])
    assert out.sequences.shape == (1, 6 + 12)  # 4 + 12 = 16 positions: exactly fits
    with pytest.raises(ValueError, match=r"longest prompt \(4 tokens\) \+ max_new_tokens \(13\) = 17 positions "
                                         r"exceeds the target model's 16 \(config.max_position_embeddings\)"):
        specdec_kernels.generate(model, prompt, attention_mask=mask, strategy="plain", max_new_tokens=13)


def test_a_draft_with_fewer_positions_than_the_target_is_refused_too():
    with pytest.raises(ValueError, match=r"exceeds the draft model's 8 \(config.max_position_embeddings\)"):
        specdec_kernels.generate(tiny_llama(64), torch.ones(1, 4, dtype=torch.int64), strategy="speculative",
                                 draft_model=tiny_llama(8), max_new_tokens=5)


@pytest.mark.parametrize("settings, named", [(dict(temperature=0.5), "temperature applies"),
                                             (dict(top_k=5, top_p=0.9), "top_k, top_p apply"),
                                             (dict(min_p=0.1, seed=3), "min_p, seed apply")])
def test_sampling_settings_without_do_sample_warn_and_decode_greedily(settings, named):
    """HF's GenerationConfig warns about sampling settings in a greedy call; so does generate, once, and the
    tokens are the greedy ones."""
    model, prompt = tiny_llama(64), torch.tensor([[3, 4, 5]])
    greedy = specdec_kernels.generate(model, prompt, strategy="plain", max_new_tokens=5, eos_token_id=[])
    with pytest.warns(UserWarning) as caught:
        out = specdec_kernels.generate(model, prompt, strategy="plain", max_new_tokens=5, eos_token_id=[], **settings)
    assert [str(w.message) for w in caught] == [f"generate: {named} to sampling and greedy decoding ignores it: "
                                                "pass do_sample=True"]
    assert torch.equal(out.sequences, greedy.sequences)


def test_default_sampling_settings_in_a_greedy_call_do_not_warn(recwarn):
    specdec_kernels.generate(tiny_llama(64), torch.tensor([[3, 4, 5]]), strategy="plain", max_new_tokens=2,
                             temperature=1.0, eos_token_id=[])
    assert not [w for w in recwarn if "sampling" in str(w.message)]
