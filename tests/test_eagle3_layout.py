"""EAGLE-3 heads load from folders laid out as the EAGLE authors publish them (the layout vLLM's and SGLang's
llama_eagle3 loaders read: config.json with architectures ["LlamaForCausalLMEagle3"], draft_vocab_size,
target_hidden_size, eagle_config; weights fc.*, midlayer.*, norm.*, lm_head.*, d2t, t2d, in model.safetensors or
pytorch_model.bin). The folders here are written by hand with exactly those names and shapes, not by our own
save_pretrained, so a loader that drifted from the published names fails; every missing or misshapen tensor is
a one-line error naming it."""

import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

from specdec_kernels.models import Eagle3Drafter

H, HEADS, KV, D, INTER, VOCAB, DRAFT_VOCAB, LAYERS = 32, 4, 2, 8, 64, 96, 40, 8


def target_model(layers: int = LAYERS, hidden: int = H):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=INTER, num_hidden_layers=layers,
                         num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=hidden // HEADS,
                         max_position_embeddings=128, bos_token_id=None, eos_token_id=None, pad_token_id=0)
    return LlamaForCausalLM(config).eval()


def published_tensors(*, target_hidden: int = H, draft_vocab: int = DRAFT_VOCAB, seed: int = 1) -> dict:
    """The tensors of a published EAGLE-3 head, by their published names and shapes."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return 0.1 * torch.randn(*shape, generator=g)

    tensors = {
        "fc.weight": w(H, 3 * target_hidden),
        "midlayer.input_layernorm.weight": 1 + w(H), "midlayer.hidden_norm.weight": 1 + w(H),
        "midlayer.self_attn.q_proj.weight": w(HEADS * D, 2 * H), "midlayer.self_attn.k_proj.weight": w(KV * D, 2 * H),
        "midlayer.self_attn.v_proj.weight": w(KV * D, 2 * H), "midlayer.self_attn.o_proj.weight": w(H, HEADS * D),
        "midlayer.post_attention_layernorm.weight": 1 + w(H),
        "midlayer.mlp.gate_proj.weight": w(INTER, H), "midlayer.mlp.up_proj.weight": w(INTER, H),
        "midlayer.mlp.down_proj.weight": w(H, INTER),
        "norm.weight": 1 + w(H), "lm_head.weight": w(draft_vocab, H),
    }
    # draft ids 0..draft_vocab-1 -> every other target id from 5 on (EAGLE-3 stores the offsets)
    target_ids = 5 + 2 * torch.arange(draft_vocab)
    tensors["d2t"] = target_ids - torch.arange(draft_vocab)
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[target_ids] = True
    tensors["t2d"] = t2d
    return tensors


def published_config(**changes) -> dict:
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
              "intermediate_size": INTER, "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": D,
              "num_hidden_layers": 1, "hidden_act": "silu", "rms_norm_eps": 1e-5, "max_position_embeddings": 128,
              "rope_theta": 10000.0, "vocab_size": VOCAB, "draft_vocab_size": DRAFT_VOCAB, "tie_word_embeddings": False}
    config.update(changes)
    return {k: v for k, v in config.items() if v is not None}


def write(folder, tensors: dict, config: dict, *, fmt: str = "safetensors"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if fmt == "safetensors":
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    else:
        torch.save(tensors, folder / "pytorch_model.bin")
    return folder


@pytest.fixture(scope="module")
def target():
    return target_model()


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_a_published_folder_loads_every_tensor_by_its_name(tmp_path, target, fmt):
    tensors = published_tensors()
    head = Eagle3Drafter.from_pretrained(write(tmp_path / fmt, tensors, published_config(), fmt=fmt), target)
    assert torch.equal(head.fc.weight, tensors["fc.weight"])
    assert torch.equal(head.self_attn.q_proj.weight, tensors["midlayer.self_attn.q_proj.weight"])
    assert torch.equal(head.hidden_norm.weight, tensors["midlayer.hidden_norm.weight"])
    assert torch.equal(head.mlp.down_proj.weight, tensors["midlayer.mlp.down_proj.weight"])
    assert torch.equal(head.norm.weight, tensors["norm.weight"])
    assert torch.equal(head.lm_head.weight, tensors["lm_head.weight"])
    assert torch.equal(head.d2t, tensors["d2t"])
    assert head.aux_layers == (2, LAYERS // 2, LAYERS - 3)  # EAGLE-3's default low, middle, high
    assert not head.own_embed and head.embed(torch.tensor([3])).equal(target.get_input_embeddings()(torch.tensor([3])))


def test_drafts_come_out_as_target_ids(tmp_path, target):
    """d2t maps draft id i to target id i + d2t[i]: the head's logits over the target's ids are the draft's at
    those ids and -inf at every other, so argmax, top-k and sampling all give target ids."""
    tensors = published_tensors()
    head = Eagle3Drafter.from_pretrained(write(tmp_path / "h", tensors, published_config()), target)
    out = torch.randn(3, H)
    logits, draft = head.logits(out), head.draft_logits(out)
    mapped = 5 + 2 * torch.arange(DRAFT_VOCAB)
    assert torch.equal(logits[:, mapped], draft.float())
    others = torch.ones(VOCAB, dtype=torch.bool)
    others[mapped] = False
    assert torch.isinf(logits[:, others]).all() and (logits[:, others] < 0).all()
    assert torch.equal(logits.argmax(-1), 5 + 2 * draft.argmax(-1))


def test_the_configs_optional_keys(tmp_path, target):
    """eagle_config's aux layer ids and use_aux_hidden_state, norm_before_residual, target_hidden_size, and an
    embed_tokens.weight of the head's own."""
    tensors = published_tensors()
    eagle = {"eagle_aux_hidden_state_layer_ids": [1, 3, 6], "use_aux_hidden_state": True}
    head = Eagle3Drafter.from_pretrained(write(tmp_path / "a", tensors, published_config(
        eagle_config=eagle, norm_before_residual=True, target_hidden_size=H)), target)
    assert head.aux_layers == (1, 3, 6) and head.norm_before_residual
    plain = Eagle3Drafter.from_pretrained(write(tmp_path / "b", tensors, published_config()), target)
    states, tokens, positions = torch.randn(1, 4, H), torch.tensor([[1, 2, 3, 4]]), torch.arange(4).view(1, 4)
    mask = torch.ones(4, 4, dtype=torch.bool).tril().view(1, 1, 4, 4)
    assert not torch.allclose(head(states, tokens, positions, attention_mask=mask),
                              plain(states, tokens, positions, attention_mask=mask))  # the residual is normed
    own = dict(tensors, **{"embed_tokens.weight": torch.randn(VOCAB, H)})
    head = Eagle3Drafter.from_pretrained(write(tmp_path / "c", own, published_config()), target)
    assert head.own_embed and torch.equal(head.embed_tokens.weight, own["embed_tokens.weight"])
    no_aux = {k: v for k, v in tensors.items() if k != "fc.weight"}
    head = Eagle3Drafter.from_pretrained(write(tmp_path / "d", no_aux, published_config(
        eagle_config={"use_aux_hidden_state": False})), target)
    assert head.aux_layers == () and head.fc is None


def test_our_save_writes_the_published_layout(tmp_path, target):
    tensors = published_tensors()
    head = Eagle3Drafter.from_pretrained(write(tmp_path / "in", tensors, published_config()), target)
    head.save_pretrained(tmp_path / "out", dtype=torch.float32)
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(saved) == set(tensors)
    assert all(saved[k].shape == tensors[k].shape and saved[k].dtype == tensors[k].dtype for k in tensors)
    assert torch.equal(saved["t2d"], tensors["t2d"]) and torch.equal(saved["d2t"], tensors["d2t"])
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == DRAFT_VOCAB


WEIGHTS = sorted(k for k in published_tensors() if k != "t2d")


@pytest.mark.parametrize("name", WEIGHTS)
def test_a_missing_tensor_is_named(tmp_path, target, name):
    tensors = {k: v for k, v in published_tensors().items() if k != name}
    folder = write(tmp_path / "f", tensors, published_config())
    with pytest.raises(ValueError, match=rf"^Eagle3Drafter.from_pretrained: the weights lack {name} \(expected shape"):
        Eagle3Drafter.from_pretrained(folder, target)


@pytest.mark.parametrize("name", WEIGHTS + ["t2d"])
def test_a_misshapen_tensor_is_named(tmp_path, target, name):
    tensors = published_tensors()
    tensors[name] = torch.cat([tensors[name], tensors[name][:1]])  # one row too many
    folder = write(tmp_path / "f", tensors, published_config())
    with pytest.raises(ValueError, match=rf"^Eagle3Drafter.from_pretrained: {name} has shape \[.*\], expected \["):
        Eagle3Drafter.from_pretrained(folder, target)


@pytest.mark.parametrize("change, message", [
    (dict(architectures=["LlamaForCausalLM"]), r"architectures must name 'LlamaForCausalLMEagle3'"),
    (dict(vocab_size=VOCAB + 1), r"vocab_size 97 is not the target's \(96 ids\)"),
    (dict(target_hidden_size=2 * H), r"target states of width 64 .* target's hidden_size is 32"),
    (dict(eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 3, 5]}), r"three target layer ids in \[1, 8\]"),
    (dict(eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 3]}), r"three target layer ids"),
    (dict(hidden_size=None), r"hidden_size must be a positive int"),
])
def test_a_config_that_does_not_fit_is_refused_in_one_line(tmp_path, target, change, message):
    folder = write(tmp_path / "f", published_tensors(), published_config(**change))
    with pytest.raises(ValueError, match=r"^Eagle3Drafter.from_pretrained: .*" + message):
        Eagle3Drafter.from_pretrained(folder, target)


def test_other_bad_folders_are_refused_in_one_line(tmp_path, target):
    with pytest.raises(FileNotFoundError, match=r"has no config.json"):
        Eagle3Drafter.from_pretrained(tmp_path, target)
    (tmp_path / "config.json").write_text(json.dumps(published_config()))
    with pytest.raises(FileNotFoundError, match=r"neither model.safetensors nor pytorch_model.bin"):
        Eagle3Drafter.from_pretrained(tmp_path, target)
    tensors = published_tensors()
    tensors["d2t"] = tensors["d2t"] + VOCAB  # past the target's ids
    with pytest.raises(ValueError, match=r"d2t maps draft ids outside the target's \[0, 96\)"):
        Eagle3Drafter.from_pretrained(write(tmp_path / "d", tensors, published_config()), target)
    tensors = published_tensors()
    tensors["d2t"] = tensors["d2t"].float()
    with pytest.raises(ValueError, match=r"d2t must be an integer tensor"):
        Eagle3Drafter.from_pretrained(write(tmp_path / "e", tensors, published_config()), target)
    wide = target_model(hidden=2 * H)  # no embed_tokens.weight, and the target's embedding is wider than the head
    with pytest.raises(ValueError, match=r"no embed_tokens.weight and the target's embedding is 64 wide"):
        Eagle3Drafter.from_pretrained(write(tmp_path / "w", published_tensors(target_hidden=2 * H),
                                            published_config(target_hidden_size=2 * H)), wide)
