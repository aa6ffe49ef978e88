"""Strategy `specdec` through specdec_kernels.generate on tiny fp32 models (CPU): top_beta=1 (any
tau) and tau=0 (any beta) give the target's greedy output token for token (batch 1 and 4,
left-padded prompts, Llama and BART, torch and Triton-interpreter backends); a drafter trained for
a few dozen (dense) steps beats an untrained one in tokens per iteration; one drafter forward per step;
a saved and reloaded drafter decodes the same; the fully relaxed setting accepts every draft."""

import pytest
import torch

import specdec_kernels
from specdec_kernels.decoding import SpecDecDecoder
from specdec_kernels.models import SpecDecDrafter
from specdec_kernels.training import train_specdec_drafter

from decoding_support import left_padded
from hf_support import VOCAB, auto_class, one_thread, save_tiny_model

NEW = 16
K = 4
TRAIN = dict(block_size=K, batch_size=32, prompt_length=8, continuation_length=24, max_prompts=160,
             learning_rate=3e-3, warmup_steps=20, progress=False, seed=0)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


def texts(seed: int):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (1400,), generator=gen)]


@pytest.fixture(scope="module", params=["llama", "bart"])
def setup(request, tmp_path_factory):
    """(family, target, trained drafter, untrained drafter, ids, mask, pad): one trained drafter per
    family, shared by every test (dense training: every continuation prefix is a block, so Llama
    needs 60 steps where the one-block-per-row recipe took 300; BART's tiny target fewer)."""
    family = request.param
    directory = tmp_path_factory.mktemp(family)
    save_tiny_model(family, directory)
    target = auto_class(family).from_pretrained(directory).eval()
    steps = 60 if family == "llama" else 30
    trained = train_specdec_drafter(target, texts(1), steps=steps, **TRAIN)
    torch.manual_seed(0)
    untrained = SpecDecDrafter(trained.config).eval()
    pad = 1 if family == "bart" else 0
    ids, mask = left_padded([7, 3, 5, 8], seed=2, pad=pad)
    return family, target, trained, untrained, ids, mask, pad


def greedy(target, ids, mask, pad):
    """HF greedy decoding (BART's forced BOS/EOS processors off: plain argmax decoding)."""
    return target.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=pad,
                           forced_bos_token_id=None, forced_eos_token_id=None)


def run(target, drafter, ids, mask, pad, **options):
    return specdec_kernels.generate(target, ids, attention_mask=mask, strategy="specdec", drafter=drafter,
                                    max_new_tokens=NEW, pad_token_id=pad, **options)


@pytest.mark.parametrize("top_beta,tau", [(1, 0.0), (1, 5.0), (1, float("inf")), (3, 0.0), (VOCAB, 0.0)])
def test_lossless_settings_equal_greedy(setup, top_beta, tau):
    family, target, trained, _, ids, mask, pad = setup
    expected = greedy(target, ids, mask, pad)
    out = run(target, trained, ids, mask, pad, block_size=K, top_beta=top_beta, tau=tau, backend="torch")
    assert torch.equal(out.sequences, expected)
    stats = out.stats
    assert 0 < stats.accepted_tokens < stats.drafted_tokens  # both accept and reject paths ran
    assert stats.target_forwards < stats.emitted_tokens and stats.extra["lossless"]
    row = 2  # batch 1, no padding
    one = run(target, trained, ids[row:row + 1, -5:], None, pad, top_beta=top_beta, tau=tau)
    assert torch.equal(one.sequences, greedy(target, ids[row:row + 1, -5:], None, pad))


@pytest.mark.parametrize("block_size", [1, 7])
def test_triton_backend_and_other_block_sizes_equal_greedy(setup, block_size):
    _, target, trained, untrained, ids, mask, pad = setup
    expected = greedy(target, ids, mask, pad)
    # one drafter per size (Triton's interpreter runs every op of every step): the untrained one's rejections at
    # block 1, the trained one's longer runs at block 7
    drafter = untrained if block_size == 1 else trained
    out = run(target, drafter, ids, mask, pad, block_size=block_size, top_beta=2, tau=0.0, backend="triton")
    assert torch.equal(out.sequences, expected)


def test_trained_drafter_beats_untrained_in_tokens_per_iteration(setup):
    _, target, trained, untrained, _, _, pad = setup
    ids, mask = left_padded([8] * 16, seed=5, pad=pad)  # held-out prompts from the training distribution
    good = run(target, trained, ids, mask, pad).stats
    bad = run(target, untrained, ids, mask, pad).stats
    # (a 32-wide drafter after a few dozen CPU steps on a random target: a clear but modest gain)
    assert good.mean_accepted_tokens > bad.mean_accepted_tokens + 0.1
    assert good.per_position_acceptance[0] > 2 * bad.per_position_acceptance[0]
    assert len(good.per_position_acceptance) == K


def test_one_drafter_forward_per_step(setup):
    _, target, trained, _, ids, mask, pad = setup
    calls = []
    handle = trained.register_forward_hook(lambda module, args, output: calls.append(output.logits.shape))
    try:
        out = run(target, trained, ids, mask, pad, block_size=6)
    finally:
        handle.remove()
    assert len(calls) == out.stats.steps and all(shape[1] == 6 for shape in calls)


def test_saved_drafter_decodes_the_same(setup, tmp_path):
    _, target, trained, _, ids, mask, pad = setup
    trained.save_pretrained(tmp_path)
    loaded = SpecDecDrafter.from_pretrained(tmp_path).eval()
    options = dict(top_beta=3, tau=1.0)  # lossy: the drafts themselves shape the output
    first, second = run(target, trained, ids, mask, pad, **options), run(target, loaded, ids, mask, pad, **options)
    assert torch.equal(first.sequences, second.sequences)
    assert first.stats.accepted_tokens == second.stats.accepted_tokens


def test_fully_relaxed_verification_accepts_every_draft(setup):
    _, target, trained, _, ids, mask, pad = setup
    decoder = SpecDecDecoder(target, trained, block_size=K, top_beta=VOCAB, tau=float("inf"))
    out = decoder.generate(ids, attention_mask=mask, max_new_tokens=NEW, pad_token_id=pad, eos_token_id=[])
    stats = out.stats
    assert stats.accepted_tokens == stats.drafted_tokens and not stats.extra["lossless"]
    assert stats.steps == -(-NEW // (K + 1))  # K + 1 tokens every step
    assert stats.per_position_acceptance == [1.0] * K


def test_clear_errors(setup):
    family, target, trained, _, ids, mask, pad = setup
    with pytest.raises(ValueError, match="needs drafter="):
        specdec_kernels.generate(target, ids, strategy="specdec", max_new_tokens=4)
    with pytest.raises(ValueError, match="greedy"):
        run(target, trained, ids, mask, pad, do_sample=True)
    with pytest.raises(ValueError, match="top_beta"):
        run(target, trained, ids, mask, pad, top_beta=0)
    with pytest.raises(ValueError, match="tau"):
        run(target, trained, ids, mask, pad, tau=-1.0)
    other = SpecDecDrafter(trained.config.__class__(**{**trained.config.to_dict(), "vocab_size": VOCAB + 8}))
    with pytest.raises(ValueError, match="vocabulary"):
        run(target, other, ids, mask, pad)
    wrong_form = trained.config.to_dict()
    wrong_form["encoder_layers"] = 0 if family == "bart" else 1
    with pytest.raises(ValueError, match="encoder_layers"):
        run(target, SpecDecDrafter(trained.config.__class__(**wrong_form)), ids, mask, pad)
