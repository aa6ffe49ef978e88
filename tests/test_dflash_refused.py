"""HF's DFlash drafting (`speculation_type="dflash"` with a DFlash assistant, transformers' muse_glimmer_assistant)
has no drafter here yet: custom_generate refuses the setting, and generate / custom_generate refuse such an assistant
as the draft, each in one line naming the reason and what runs instead. The tiny pair is built in memory (nothing
downloads), and HF's own DFlash path runs on it, so the refusal is ours, not the model's."""

import pytest
import torch

import specdec_kernels
from specdec_kernels import custom_generate

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.models.muse_glimmer_assistant")


@pytest.fixture(scope="module")
def pair():
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    shared = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                  max_position_embeddings=256, bos_token_id=None, eos_token_id=None, pad_token_id=0)
    target = AutoModelForCausalLM.from_config(LlamaConfig(vocab_size=128, num_hidden_layers=4, **shared)).eval()
    config = AutoConfig.for_model("muse_glimmer_assistant", num_hidden_layers=1, target_layer_ids=[0, 2],
                                  block_size=4, mask_token_id=127, **shared)
    return target, AutoModel.from_config(config).eval()


def one_line(error) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def test_hfs_own_dflash_path_runs_on_the_tiny_pair(pair):
    target, assistant = pair
    ids = torch.randint(1, 127, (1, 7), generator=torch.Generator().manual_seed(1))
    greedy = target.generate(ids, max_new_tokens=12, do_sample=False)
    theirs = target.generate(ids, max_new_tokens=12, do_sample=False, assistant_model=assistant,
                             speculation_type="dflash")
    assert torch.equal(theirs, greedy)


@pytest.mark.parametrize("with_assistant", [True, False])
def test_custom_generate_refuses_speculation_type_dflash_in_one_line(pair, with_assistant):
    target, assistant = pair
    extra = dict(assistant_model=assistant) if with_assistant else {}
    with pytest.raises(ValueError) as error:
        target.generate(torch.tensor([[5, 6, 7]]), custom_generate=custom_generate, speculation_type="dflash",
                        max_new_tokens=4, **extra)
    message = one_line(error)
    assert message.startswith("custom_generate: speculation_type='dflash' is not supported (HF's DFlash block ")
    assert "no strategy drafts with a DFlash assistant (muse_glimmer_assistant) yet" in message
    assert "use_mtp=True on a model with MTP layers, or a causal-LM assistant_model (strategy 'speculative')" in message


@pytest.mark.parametrize("via", ["generate", "custom_generate"])
def test_a_dflash_assistant_as_the_draft_is_refused_by_name(pair, via):
    target, assistant = pair
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError) as error:
        if via == "generate":
            specdec_kernels.generate(target, ids, strategy="speculative", draft_model=assistant, max_new_tokens=4)
        else:
            target.generate(ids, custom_generate=custom_generate, assistant_model=assistant, max_new_tokens=4)
    message = one_line(error)
    assert "the draft model is not supported" in message
    assert "model type 'muse_glimmer_assistant' is a DFlash assistant (HF's speculation_type='dflash'), which no " \
           "strategy drafts with yet" in message
    assert "(strategy 'speculative'), or the target's own MTP layers (strategy 'mtp')" in message
