"""Strategy `mtp`: the target's own multi-token-prediction layers draft, loaded by transformers'
`MtpModel.from_pretrained(target)` from tiny checkpoints built here the way released ones store them (GLM-4-MoE:
the MTP layer as `model.layers.46.*` of a 46-layer model, the layer number HF matches; ERNIE 4.5 MoE:
`mtp_block.0.*`, `mtp_emb_norm.0.*`, ...). Checked on both model types: batch 1 gives the tokens of HF's own
`generate(use_mtp=True)`, through `generate` and through `custom_generate`; a left-padded batch of 4 gives each
row's greedy tokens; every step's first draft is HF's MtpModel's own prediction on the row's text (so the MTP
cache keeps exactly the committed positions; a drafter that forgets them fails); sampling follows the target's
law (chi-square of the first two tokens, token-wise and block verification), and the same test rejects a wrong
residual."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.cache_utils import MtpCache
from transformers.modeling_layers import MtpModel

import specdec_kernels
from specdec_kernels import custom_generate
from specdec_kernels.decoding import engine as engine_module
from specdec_kernels.decoding.mtp import MtpDrafter

from decoding_support import left_padded
from hf_support import one_thread
from sampling_support import LOOP_ROWS, PROMPT, ROWS, target_pvalue
from test_decoding_sampling import ResampleFromP

KINDS = ("glm4_moe", "ernie4_5_moe")
RELEASED = {"glm4_moe": 46}  # the MTP layer numbers HF matches for the type (None: stored by name)
NEW = 12


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


def build(kind: str, path, *, layers: int | None = None, vocab: int = 128, seed: int = 0):
    """A tiny `kind` model with one MTP layer, saved as a released checkpoint stores it and loaded as HF loads it.
    layers=None: the released layer count where HF matches one (GLM-4-MoE: 46); another count is loaded with the
    instance's _keys_to_ignore_on_load_unexpected naming its layer."""
    n = layers or RELEASED.get(kind, 2)
    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=8, num_mtp_layers=1, max_position_embeddings=256, eos_token_id=None, bos_token_id=None,
                  pad_token_id=0, moe_intermediate_size=16, initializer_range=0.3)
    if kind == "glm4_moe":
        common.update(n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
                      first_k_dense_replace=1)
    else:
        common.update(moe_num_experts=4, moe_num_shared_experts=1, moe_k=2, tie_word_embeddings=False)
    torch.manual_seed(seed)
    config = AutoConfig.for_model(kind, num_hidden_layers=n + 1, **common)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)  # layer n becomes the MTP layer's block
    weights = load_file(path / "model.safetensors")
    gen, h = torch.Generator().manual_seed(seed + 1), config.hidden_size
    extra = {"enorm": 1 + 0.1 * torch.randn(h, generator=gen), "hnorm": 1 + 0.1 * torch.randn(h, generator=gen),
             "eh_proj": 0.2 * torch.randn(h, 2 * h, generator=gen)}
    if kind == "glm4_moe":
        for part, value in extra.items():
            weights[f"model.layers.{n}.{part}.weight"] = value
        weights[f"model.layers.{n}.shared_head.norm.weight"] = 1 + 0.1 * torch.randn(h, generator=gen)
    else:  # ERNIE's MTP block is a first layer (a dense MLP): layer n's attention and norms, layer 0's MLP
        for key in [k for k in weights if k.startswith(f"model.layers.{n}.")]:
            value = weights.pop(key)
            if ".mlp." not in key:
                weights[key.replace(f"model.layers.{n}.", "mtp_block.0.")] = value
        for key in [k for k in weights if k.startswith("model.layers.0.mlp.")]:
            weights[key.replace("model.layers.0.", "mtp_block.0.")] = weights[key].clone()
        for part, value in zip(("mtp_emb_norm", "mtp_hidden_norm", "mtp_linear_proj"), extra.values()):
            weights[f"{part}.0.weight"] = value
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    saved = json.loads((path / "config.json").read_text())
    saved["num_hidden_layers"] = n
    if kind != "glm4_moe":
        saved["moe_layer_end_index"] = n - 1
    (path / "config.json").write_text(json.dumps(saved))
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    if kind in RELEASED and n != RELEASED[kind]:
        model._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{n}\..*"]
    model.generation_config.eos_token_id = None
    return model


@pytest.fixture(scope="module", params=KINDS)
def model(request, tmp_path_factory):
    return build(request.param, tmp_path_factory.mktemp(request.param))


def greedy(model, ids, new=NEW):
    model.set_attn_implementation("sdpa")
    return model.generate(ids, max_new_tokens=new, do_sample=False)


def test_batch_one_gives_hfs_own_use_mtp_tokens(model):
    gen = torch.Generator().manual_seed(0)
    for length in (7, 1):
        ids = torch.randint(1, 128, (1, length), generator=gen)
        theirs = model.generate(ids, max_new_tokens=NEW, do_sample=False, use_mtp=True)
        assert torch.equal(theirs, greedy(model, ids))
        ours = specdec_kernels.generate(model, ids, strategy="mtp", max_new_tokens=NEW, eos_token_id=[])
        assert torch.equal(ours.sequences, theirs), length
        # one MTP draft per step (HF's num_mtp_layers), but at the first step of a one-token prompt (no state yet)
        assert ours.stats.drafted_tokens == ours.stats.steps - (length == 1)
        hooked = model.generate(ids, custom_generate=custom_generate, use_mtp=True, max_new_tokens=NEW,
                                return_dict_in_generate=True)
        assert torch.equal(hooked.sequences, theirs) and hooked.stats.drafted_tokens == ours.stats.drafted_tokens


@pytest.mark.parametrize("k", [1, 3])
def test_left_padded_batch_of_four_is_greedy_row_by_row(model, k):
    ids, mask = left_padded([5, 1, 7, 3], seed=3)
    out = specdec_kernels.generate(model, ids, attention_mask=mask, strategy="mtp", num_draft_tokens=k,
                                   max_new_tokens=NEW, eos_token_id=[], pad_token_id=0)
    for row in range(4):
        alone = ids[row, mask[row].bool()].unsqueeze(0)
        assert torch.equal(out.sequences[row, ids.shape[1]:], greedy(model, alone)[0, alone.shape[1]:]), row
    assert out.stats.drafted_tokens >= 4 * (NEW // (k + 1))
    hooked = model.generate(ids, attention_mask=mask, custom_generate=custom_generate, use_mtp=True,
                            max_new_tokens=NEW, pad_token_id=0)  # HF's own use_mtp refuses batches
    assert torch.equal(hooked, out.sequences) if k == 1 else hooked.shape == out.sequences.shape


def test_kept_graphs_replay_the_mtp_steps(model):
    """Under (fake) CUDA graphs the draft and verify steps are captured once and replayed, by a second call too: the
    MTP cache and the fed tokens are kept tensors, and the output stays greedy's."""
    from specdec_kernels.decoding import clear_graph_cache, graphs
    from test_graph_sessions import FakeGraphs

    backend, captured = FakeGraphs(), None
    clear_graph_cache()
    try:
        with graphs.use_backend(backend):
            for seed, lengths in ((11, [7, 3, 5]), (12, [2, 6, 4])):
                ids, mask = left_padded(lengths, seed=seed)
                out = specdec_kernels.generate(model, ids, attention_mask=mask, strategy="mtp", num_draft_tokens=2,
                                               max_new_tokens=NEW, pad_token_id=0, eos_token_id=[], cuda_graphs=True)
                for row in range(3):
                    alone = ids[row, mask[row].bool()].unsqueeze(0)
                    assert torch.equal(out.sequences[row, ids.shape[1]:], greedy(model, alone)[0, alone.shape[1]:])
                captured = len(backend.captures) if captured is None else captured
        assert captured >= 1 and len(backend.captures) == captured and backend.replays > 2
    finally:
        clear_graph_cache()


@pytest.mark.parametrize("graphs_on", [False, True], ids=["eager", "fake_graphs"])
def test_rows_ending_at_eos_at_different_steps(model, graphs_on):
    """Rows finish at different steps: eager runs drop them (the MTP cache and fed tokens drop theirs too), kept
    graphs freeze them; every row is still its greedy output, cut at EOS."""
    from specdec_kernels.decoding import clear_graph_cache, graphs
    from test_graph_sessions import FakeGraphs

    ids, mask = left_padded([5, 1, 7, 3], seed=3)
    alone = [ids[row, mask[row].bool()].unsqueeze(0) for row in range(4)]
    eos = int(greedy(model, alone[0])[0, alone[0].shape[1] + 3])  # row 0 ends at its 4th new token (or sooner)
    clear_graph_cache()
    try:
        with graphs.use_backend(FakeGraphs()):
            out = specdec_kernels.generate(model, ids, attention_mask=mask, strategy="mtp", num_draft_tokens=2,
                                           max_new_tokens=NEW, pad_token_id=0, eos_token_id=eos, cuda_graphs=graphs_on)
    finally:
        clear_graph_cache()
    lengths = []
    for row in range(4):
        model.set_attn_implementation("sdpa")
        want = model.generate(alone[row], max_new_tokens=NEW, do_sample=False, eos_token_id=eos,
                              pad_token_id=0)[0, alone[row].shape[1]:]
        got = out.sequences[row, ids.shape[1]:]
        assert torch.equal(got[:len(want)], want) and bool((got[len(want):] == 0).all()), row
        lengths.append(len(want))
    assert min(lengths) < max(lengths)  # rows ended at different steps


class Recording(MtpDrafter):
    """Records each step's first draft with its row and the position it drafts for."""

    def propose(self, engine, first):
        proposal = super().propose(engine, first)
        if proposal.tokens.shape[1]:
            for b, row in enumerate(engine.row_ids.tolist()):
                self.seen.append((row, int(engine.cache.seq_lens[b]) + 1, int(proposal.tokens[b, 0])))
        return proposal


def hf_mtp_prediction(model, mtp, text: torch.Tensor, position: int) -> int:
    """HF's MtpModel's token for `position` of a row whose tokens are `text` [T]: its forward on a fresh MtpCache
    over the target's last hidden states of positions 0 .. position - 2 and the tokens one place right."""
    model.set_attn_implementation("sdpa")
    mtp.set_attn_implementation("sdpa")
    with torch.no_grad():
        hidden = model(text[:position - 1].unsqueeze(0), output_hidden_states=True).hidden_states[-1]
        tokens, _, _ = mtp(input_ids=text[1:position].unsqueeze(0), last_hidden_states=hidden, attention_mask=None,
                           position_ids=torch.arange(1, position).unsqueeze(0),
                           mtp_cache=MtpCache(config=model.config.get_mtp_config()))
    return int(tokens[0, 0])


def drafts_are_hfs(model, drafter, forget: bool = False) -> bool:
    ids, mask = left_padded([5, 2, 7], seed=4)
    drafter.seen = []
    out = drafter.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=[], pad_token_id=0)
    mtp = MtpModel.from_pretrained(model)
    texts = [torch.cat([ids[r, mask[r].bool()], out.sequences[r, ids.shape[1]:]]) for r in range(3)]
    assert len(drafter.seen) >= 3 * (NEW // 2)
    return all(hf_mtp_prediction(model, mtp, texts[row], position) == token for row, position, token in drafter.seen)


def test_each_first_draft_is_hfs_mtp_prediction(model):
    assert drafts_are_hfs(model, Recording(model))


def test_mutation_an_mtp_cache_that_forgets_the_committed_positions_fails(model, monkeypatch):
    drafter = Recording(model)
    real = drafter.forward

    def forgetful(states, tokens):  # every forward starts from an empty MTP cache
        drafter.cache.seq_lens.zero_()
        return real(states, tokens)

    monkeypatch.setattr(drafter, "forward", forgetful)
    assert not drafts_are_hfs(model, drafter)


@pytest.fixture(scope="module", params=KINDS)
def small(request, tmp_path_factory):
    """Vocabulary 8 and two layers (the chi-square's joint law has 64 cells), of each model type."""
    return build(request.param, tmp_path_factory.mktemp(f"mtp_small_{request.param}"), layers=2, vocab=8, seed=5)


@pytest.mark.parametrize("verification", ["token", "block"])
def test_first_two_sampled_tokens_follow_the_target(small, verification):
    ids = torch.tensor([PROMPT]).repeat(LOOP_ROWS, 1)  # 24,000 rows: a residual off by 1% shows
    out = specdec_kernels.generate(small, ids, strategy="mtp", max_new_tokens=2, do_sample=True, seed=123,
                                   eos_token_id=[], verification=verification)
    assert 0 < out.stats.accepted_tokens < out.stats.drafted_tokens  # both paths ran
    assert target_pvalue(small, out.sequences) > 1e-3


def test_chi_square_rejects_a_wrong_residual(small, monkeypatch):
    monkeypatch.setattr(engine_module, "Verifier", ResampleFromP)  # the engine's one verifier, mutated
    ids = torch.tensor([PROMPT]).repeat(ROWS, 1)
    out = specdec_kernels.generate(small, ids, strategy="mtp", max_new_tokens=2, do_sample=True, seed=123,
                                   eos_token_id=[], verification="token")
    assert target_pvalue(small, out.sequences) < 1e-6


def test_a_users_mtp_model_keeps_its_attention(small):
    """The drafter switches the MTP model's attention to ours for the call; a model the user passed comes back
    as it was (model.generate(use_mtp=True) works with it afterwards)."""
    mtp_model = MtpModel.from_pretrained(small).eval()
    mtp_model.set_attn_implementation("eager")
    ids = torch.randint(1, 8, (1, 5), generator=torch.Generator().manual_seed(4))
    out = specdec_kernels.generate(small, ids, strategy="mtp", mtp_model=mtp_model, max_new_tokens=4, eos_token_id=[])
    assert out.stats.drafted_tokens > 0 and mtp_model.config._attn_implementation == "eager"


def test_a_target_without_mtp_layers_is_refused_by_name(tmp_path):
    from decoding_support import make_pair

    target, _ = make_pair("llama", tmp_path)
    ids = torch.tensor([[3, 4, 5]])
    with pytest.raises(ValueError, match=r"strategy 'mtp' needs a target whose config has num_mtp_layers .*'llama'"):
        specdec_kernels.generate(target, ids, strategy="mtp", max_new_tokens=2)
    with pytest.raises(ValueError, match=r"use_mtp=True needs a model whose config has num_mtp_layers"):
        target.generate(ids, custom_generate=custom_generate, use_mtp=True, max_new_tokens=2)


def test_bad_options_are_refused_in_one_line(small):
    ids = torch.tensor([PROMPT])
    with pytest.raises(ValueError, match=r"num_draft_tokens"):
        specdec_kernels.generate(small, ids, strategy="mtp", num_draft_tokens=0, max_new_tokens=2)
    with pytest.raises(ValueError, match=r"`verification` must be one of"):
        specdec_kernels.generate(small, ids, strategy="mtp", verification="tree", max_new_tokens=2)
    with pytest.raises(ValueError, match=r"use_mtp runs strategy 'mtp'.*strategy='lookup'"):
        small.generate(ids, custom_generate=custom_generate, use_mtp=True, strategy="lookup", max_new_tokens=2)


def test_custom_generate_maps_the_draft_length_and_sampling(small):
    """HF's num_assistant_tokens sets the MTP drafter's num_draft_tokens; a sampled use_mtp call is the sampled
    strategy with the same seed (HF's default top_k=50 applies when sampling, as HF applies it)."""
    ids, mask = left_padded([5, 2, 4], seed=6, pad=0)
    ids = ids.clamp(max=7)
    common = dict(attention_mask=mask, max_new_tokens=8, pad_token_id=0)
    hooked = small.generate(ids, custom_generate=custom_generate, use_mtp=True, num_assistant_tokens=3,
                            return_dict_in_generate=True, **common)
    ours = specdec_kernels.generate(small, ids, strategy="mtp", num_draft_tokens=3, eos_token_id=[], **common)
    assert torch.equal(hooked.sequences, ours.sequences)
    assert len(hooked.stats.per_position_acceptance) == 3 == len(ours.stats.per_position_acceptance)
    sampled = small.generate(ids, custom_generate=custom_generate, use_mtp=True, do_sample=True, seed=5, **common)
    direct = specdec_kernels.generate(small, ids, strategy="mtp", do_sample=True, seed=5, top_k=50, eos_token_id=[],
                                      **common)
    assert torch.equal(sampled, direct.sequences)
