"""Strategy dflash: HF's DFlash block drafter (transformers' muse_glimmer_assistant, `speculation_type="dflash"`)
as a drafter of the engine. A tiny Llama target and a tiny DFlash assistant are built in memory (nothing
downloads; vocabulary 8, so drafts are often accepted and rows accept different counts). Checked: batch 1 tokens
equal HF's own dflash path (through generate and custom_generate, prompts of 7 and 1 tokens) and each step's
block of drafts is the one HF's DFlash candidate generator drafts there; a left-padded batch of 4 is greedy row by
row with each row's drafts HF's batch-1 drafts on that row; rows ending at EOS at different steps; chi-square of
the first two sampled tokens (token and block verification) and the wrong-residual mutation rejected; bad
assistants, settings and strategies refused in one line."""

import re

import pytest
import torch

import specdec_kernels
from specdec_kernels import custom_generate
from specdec_kernels.decoding import engine as engine_module
from specdec_kernels.decoding.dflash import DFlashDrafter

from decoding_support import left_padded
from hf_support import one_thread
from sampling_support import LOOP_ROWS, PROMPT, ROWS, target_pvalue
from test_decoding_sampling import ResampleFromP

pytest.importorskip("transformers.models.muse_glimmer_assistant")
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, LlamaConfig  # noqa: E402
from transformers.generation import candidate_generator  # noqa: E402

VOCAB, MASK, NEW = 8, 7, 12
SHARED = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
              max_position_embeddings=256, bos_token_id=None, eos_token_id=None, pad_token_id=0)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


def build_assistant(*, block_size=4, layers=(0, 2), seed=1, **config):
    torch.manual_seed(seed)
    shared = dict(SHARED, initializer_range=0.3, **config)
    return AutoModel.from_config(AutoConfig.for_model(
        "muse_glimmer_assistant", num_hidden_layers=2, target_layer_ids=list(layers), block_size=block_size,
        mask_token_id=MASK, **shared)).eval()


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, num_hidden_layers=4, initializer_range=0.3, **SHARED)
    target = AutoModelForCausalLM.from_config(config).eval()
    return target, build_assistant()


def tokens(ids, mask):
    """Prompt tokens in 1 .. MASK - 1: none is the pad id 0 (HF's greedy on a row alone would mask it) or the mask
    token."""
    return torch.where(mask.bool(), ids % (MASK - 1) + 1, 0)


def greedy(target, ids, new=NEW, **kwargs):
    target.set_attn_implementation("sdpa")
    return target.generate(ids, max_new_tokens=new, do_sample=False, **kwargs)


def hf_dflash(target, assistant, ids, monkeypatch):
    """HF's own dflash output on one row and the blocks its candidate generator drafted, by the number of tokens
    generated when it drafted them (the anchor, the last of them, included)."""
    blocks, original = {}, candidate_generator.DFlashTokenCandidateGenerator.get_candidates

    def recording(self, input_ids, *args, **kwargs):
        candidates, logits = original(self, input_ids, *args, **kwargs)
        if logits is not None:
            blocks[input_ids.shape[1] - ids.shape[1]] = candidates[0, input_ids.shape[1]:].tolist()
        return candidates, logits

    with monkeypatch.context() as patch:
        patch.setattr(candidate_generator.DFlashTokenCandidateGenerator, "get_candidates", recording)
        target.set_attn_implementation("sdpa")
        out = target.generate(ids, max_new_tokens=NEW, do_sample=False, assistant_model=assistant,
                              speculation_type="dflash")
    return out, blocks


class Recording(DFlashDrafter):
    """Records each row's blocks of drafts by the number of tokens generated when they were drafted (the root
    included, 0 at the first step, whose root is the prompt's last token)."""

    def propose(self, engine, first):
        proposal = super().propose(engine, first)
        for b, row in enumerate(engine.row_ids.tolist()):
            self.blocks.setdefault(row, {})[int(engine.num_generated[b])] = proposal.tokens[b].tolist()
        return proposal


def recording(target, assistant):
    drafter = Recording(target, assistant)
    drafter.blocks = {}
    return drafter


def same_blocks(ours: dict, theirs: dict) -> bool:
    """Where both drafted at the same point of the (same, greedy) text, the blocks are the same. Our first step
    drafts from the prompt less its last token, where HF's first step is a plain target forward, so the two
    step at the same points from the first step where our first one accepted nothing, else from where they meet."""
    common = sorted(set(ours) & set(theirs))
    return len(common) > 0 and all(ours[n] == theirs[n] for n in common)


def test_batch_one_gives_hfs_own_dflash_tokens_and_drafts(pair, monkeypatch):
    target, assistant = pair
    gen = torch.Generator().manual_seed(0)
    for length in (7, 1):
        ids = torch.randint(1, MASK, (1, length), generator=gen)  # no pad id 0, no mask token
        theirs, blocks = hf_dflash(target, assistant, ids, monkeypatch)
        assert torch.equal(theirs, greedy(target, ids))
        ours = specdec_kernels.generate(target, ids, strategy="dflash", draft_model=assistant, max_new_tokens=NEW,
                                        eos_token_id=[])
        assert torch.equal(ours.sequences, theirs), length
        assert ours.stats.drafted_tokens == 3 * ours.stats.steps  # block_size - 1 per step
        drafter = recording(target, assistant)
        assert torch.equal(drafter.generate(ids, max_new_tokens=NEW, eos_token_id=[]).sequences, theirs)
        assert same_blocks(drafter.blocks[0], blocks), (drafter.blocks[0], blocks)
        assert len(set(drafter.blocks[0]) & set(blocks)) >= len(blocks) - 1
        hooked = target.generate(ids, custom_generate=custom_generate, assistant_model=assistant,
                                 speculation_type="dflash", max_new_tokens=NEW, return_dict_in_generate=True)
        assert torch.equal(hooked.sequences, theirs) and hooked.stats.drafted_tokens == ours.stats.drafted_tokens


def test_an_assistant_reading_the_last_layer_reads_hfs_normed_state(pair, monkeypatch):
    """HF's hidden_states[num_layers] is the final norm's output, not the last layer's: an assistant naming the
    last layer (3 of 4) reads that."""
    target, _ = pair
    assistant = build_assistant(layers=(1, 3), seed=4)
    drafter = recording(target, assistant)
    ids = torch.tensor([[3, 5, 1, 6, 2]])
    theirs, blocks = hf_dflash(target, assistant, ids, monkeypatch)
    assert torch.equal(drafter.generate(ids, max_new_tokens=NEW, eos_token_id=[]).sequences, theirs)
    assert same_blocks(drafter.blocks[0], blocks), (drafter.blocks[0], blocks)
    assert len(set(drafter.blocks[0]) & set(blocks)) >= len(blocks) - 1


def test_left_padded_batch_of_four_is_greedy_row_by_row(pair, monkeypatch):
    target, assistant = pair
    ids, mask = left_padded([5, 1, 7, 3], seed=2)
    ids = tokens(ids, mask)
    drafter = recording(target, assistant)
    out = drafter.generate(ids, attention_mask=mask, max_new_tokens=NEW, pad_token_id=0, eos_token_id=[])
    hooked = target.generate(ids, attention_mask=mask, custom_generate=custom_generate, assistant_model=assistant,
                             speculation_type="dflash", max_new_tokens=NEW, pad_token_id=0)
    assert torch.equal(hooked, out.sequences)
    accepted, matched = set(), 0
    for row in range(4):
        alone = ids[row, mask[row].bool()].unsqueeze(0)
        want, blocks = hf_dflash(target, assistant, alone, monkeypatch)
        assert torch.equal(out.sequences[row, ids.shape[1]:], want[0, alone.shape[1]:]), row
        assert same_blocks(drafter.blocks[row], blocks), f"{row} {drafter.blocks[row]} {blocks}"
        accepted.add(len(drafter.blocks[row]))
        matched += len(set(drafter.blocks[row]) & set(blocks))
    assert 0 < out.stats.accepted_tokens < out.stats.drafted_tokens
    assert matched >= 12  # blocks drafted at the same points of the text as HF's
    assert len(accepted) > 1  # rows took different numbers of steps: they accepted different counts


def test_rows_ending_at_eos_at_different_steps(pair):
    """Rows finish at different steps and are dropped (the assistant's cache, mask and positions drop theirs);
    every row is still its greedy output, cut at EOS."""
    target, assistant = pair
    ids, mask = left_padded([5, 1, 7, 3], seed=3)
    ids = tokens(ids, mask)
    alone = [ids[row, mask[row].bool()].unsqueeze(0) for row in range(4)]
    eos = int(greedy(target, alone[0])[0, alone[0].shape[1] + 3])  # row 0 ends at its 4th new token (or sooner)
    out = specdec_kernels.generate(target, ids, attention_mask=mask, strategy="dflash", draft_model=assistant,
                                   max_new_tokens=NEW, pad_token_id=0, eos_token_id=eos)
    lengths = []
    for row in range(4):
        want = greedy(target, alone[row], eos_token_id=eos, pad_token_id=0)[0, alone[row].shape[1]:]
        got = out.sequences[row, ids.shape[1]:]
        assert torch.equal(got[:len(want)], want) and bool((got[len(want):] == 0).all()), row
        lengths.append(len(want))
    assert min(lengths) < max(lengths)


@pytest.mark.parametrize("verification", ["token", "block"])
def test_first_two_sampled_tokens_follow_the_target(pair, verification):
    target, assistant = pair
    ids = torch.tensor([PROMPT]).repeat(LOOP_ROWS, 1)  # 24,000 rows: a residual off by 1% shows
    out = specdec_kernels.generate(target, ids, strategy="dflash", draft_model=assistant, max_new_tokens=2,
                                   do_sample=True, seed=123, eos_token_id=[], verification=verification)
    assert 0 < out.stats.accepted_tokens < out.stats.drafted_tokens  # both paths ran
    assert target_pvalue(target, out.sequences) > 1e-3


def test_chi_square_rejects_a_wrong_residual(pair, monkeypatch):
    target, assistant = pair
    monkeypatch.setattr(engine_module, "Verifier", ResampleFromP)  # the engine's one verifier, mutated
    ids = torch.tensor([PROMPT]).repeat(ROWS, 1)
    out = specdec_kernels.generate(target, ids, strategy="dflash", draft_model=assistant, max_new_tokens=2,
                                   do_sample=True, seed=123, eos_token_id=[], verification="token")
    assert target_pvalue(target, out.sequences) < 1e-6


def test_custom_generate_maps_sampling(pair):
    target, assistant = pair
    ids, mask = left_padded([5, 2, 4, 3], seed=4)
    ids = tokens(ids, mask)
    ours = specdec_kernels.generate(target, ids, attention_mask=mask, strategy="dflash", draft_model=assistant,
                                    max_new_tokens=6, do_sample=True, seed=7, top_k=50, pad_token_id=0)
    hooked = target.generate(ids, attention_mask=mask, custom_generate=custom_generate, assistant_model=assistant,
                             speculation_type="dflash", max_new_tokens=6, do_sample=True, seed=7, pad_token_id=0)
    assert torch.equal(hooked, ours.sequences)


def one_line(error) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("kwargs, named", [
    (dict(), r"speculation_type='dflash' runs strategy 'dflash': pass a DFlash assistant .* \(got no assistant"),
    (dict(assistant="target"), r"pass a DFlash assistant .*got LlamaForCausalLM"),
    (dict(assistant="dflash", strategy="lookup"), r"runs strategy 'dflash'.*strategy='lookup'"),
    (dict(assistant="dflash", speculation_type="eagle"), r"speculation_type='eagle' is not supported"),
    (dict(assistant="dflash", speculation_type=None), r"model type 'muse_glimmer_assistant' is a DFlash assistant: "
                                                      r"it drafts in strategy 'dflash' \(custom_generate: "
                                                      r"speculation_type='dflash'\)"),
])
def test_custom_generate_refusals_are_one_line(pair, kwargs, named):
    target, assistant = pair
    models = {"target": target, "dflash": assistant}
    extra = {"speculation_type": kwargs.get("speculation_type", "dflash")}
    if "assistant" in kwargs:
        extra["assistant_model"] = models[kwargs["assistant"]]
    if "strategy" in kwargs:
        extra["strategy"] = kwargs["strategy"]
    if extra["speculation_type"] is None:
        del extra["speculation_type"]
    with pytest.raises(ValueError) as error:
        target.generate(torch.tensor([[5, 6, 3]]), custom_generate=custom_generate, max_new_tokens=4, **extra)
    assert re.search(named, one_line(error)), one_line(error)


def test_bad_assistants_are_refused_in_one_line(pair):
    target, assistant = pair
    ids = torch.tensor([[5, 6, 3]])
    with pytest.raises(ValueError) as error:
        specdec_kernels.generate(target, ids, strategy="speculative", draft_model=assistant, max_new_tokens=4)
    assert "model type 'muse_glimmer_assistant' is a DFlash assistant: it drafts in strategy 'dflash'" in \
        one_line(error)
    with pytest.raises(ValueError) as error:
        specdec_kernels.generate(target, ids, strategy="dflash", draft_model=target, max_new_tokens=4)
    assert "strategy 'dflash' needs a DFlash assistant as draft_model" in one_line(error)
    wide = build_assistant(hidden_size=64)
    with pytest.raises(ValueError) as error:
        specdec_kernels.generate(target, ids, strategy="dflash", draft_model=wide, max_new_tokens=4)
    assert "the DFlash assistant's hidden_size 64 must be the target's (32)" in one_line(error)


def test_cuda_graphs_are_refused_in_one_line(pair):
    """The assistant's cache grows each step: the drafter runs eagerly (graphs are off by default for it)."""
    from specdec_kernels.decoding import clear_graph_cache, graphs
    from test_graph_sessions import FakeGraphs

    target, assistant = pair
    clear_graph_cache()
    try:
        with graphs.use_backend(FakeGraphs()), pytest.raises(ValueError) as error:
            specdec_kernels.generate(target, torch.tensor([[3, 5, 1]]), strategy="dflash", draft_model=assistant,
                                     max_new_tokens=4, cuda_graphs=True)
    finally:
        clear_graph_cache()
    assert "strategy 'dflash' drafts eagerly (its assistant's cache grows each step): pass cuda_graphs=False" in \
        one_line(error)
