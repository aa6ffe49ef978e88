"""Strategy `bild` on tiny fp32 pairs (CPU): with the exact-match rollback rule it reproduces the
large model's greedy output (decoder-only and encoder-decoder, both modes, both op backends);
the degenerate thresholds give the large model's output (always fall back) or the small model's
(never hand off, never roll back); the official mode's first token is the large model's."""

import pytest
import torch

import specdec_kernels
from specdec_kernels.decoding import BildDecoder

from decoding_support import left_padded, make_pair
from hf_support import one_thread

NEW = 14
NEVER = 1e30  # a rollback threshold no -log p exceeds


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module", params=["llama", "bart"])
def pair(request, tmp_path_factory):
    family = request.param
    # BART's tiny decoder repeats itself: a noisier small model makes it disagree now and then
    target, draft = make_pair(family, tmp_path_factory.mktemp(family), noise=0.06 if family == "bart" else 0.03)
    pad = 1 if family == "bart" else 0
    ids, mask = left_padded([6, 3, 5, 1] if family != "bart" else [6, 3, 5], seed=1, pad=pad)
    return family, target, draft, ids, mask, pad


def greedy(model, ids, mask, pad, max_new_tokens=NEW):
    """HF greedy decoding (BART's forced BOS/EOS processors off: plain argmax decoding)."""
    return model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad,
                          forced_bos_token_id=None, forced_eos_token_id=None)


def bild(pair_, **options):
    _, target, draft, ids, mask, pad = pair_
    return specdec_kernels.generate(target, ids, attention_mask=mask, strategy="bild", draft_model=draft,
                                    max_new_tokens=options.pop("max_new_tokens", NEW), pad_token_id=pad, **options)


@pytest.mark.parametrize("mode,backend", [("paper", "torch"), ("official", "torch"), ("paper", "triton")])
def test_exact_match_rule_equals_large_greedy(pair, mode, backend):
    _, target, _, ids, mask, pad = pair
    out = bild(pair, mode=mode, rollback_rule="exact", fallback_threshold=0.08, max_small_run=4, backend=backend)
    assert torch.equal(out.sequences, greedy(target, ids, mask, pad))
    extra = out.stats.extra
    assert out.stats.accepted_tokens > 0 and extra["rollback_rate"] > 0 and extra["fallback_rate"] > 0


def test_always_falling_back_is_the_large_model(pair):
    _, target, _, ids, mask, pad = pair
    out = bild(pair, fallback_threshold=1.0, rollback_threshold=0.5)
    assert torch.equal(out.sequences, greedy(target, ids, mask, pad))
    assert out.stats.drafted_tokens == 0 and out.stats.extra["fallback_rate"] == 1.0


def test_eager_rounds_stop_once_every_row_has_handed_over(pair):
    """Always falling back: one small-model forward per round (not max_small_run), same output."""
    _, target, draft, ids, mask, pad = pair
    forwards = []  # the small model's LM-head calls: one per small-model step
    hook = draft.get_output_embeddings().register_forward_hook(lambda *args: forwards.append(1))
    try:
        out = bild(pair, fallback_threshold=1.0, rollback_threshold=0.5, max_small_run=6)
    finally:
        hook.remove()
    assert torch.equal(out.sequences, greedy(target, ids, mask, pad))
    assert len(forwards) <= out.stats.steps + 1  # one per round (+ the prefill), not max_small_run = 6


def test_never_handing_off_is_the_small_model(pair):
    _, _, draft, ids, mask, pad = pair
    out = bild(pair, fallback_threshold=0.0, rollback_threshold=NEVER, max_small_run=NEW, verify_small_eos=False)
    assert torch.equal(out.sequences, greedy(draft, ids, mask, pad))


def test_official_mode_starts_with_the_large_model(pair):
    _, target, draft, ids, mask, pad = pair
    width = ids.shape[1] if pair[0] != "bart" else 1
    out = bild(pair, mode="official", fallback_threshold=0.0, rollback_threshold=NEVER, max_small_run=NEW)
    large_first = greedy(target, ids, mask, pad, max_new_tokens=1)[:, width]
    assert torch.equal(out.sequences[:, width], large_first)
    assert out.stats.extra["forced_handoffs"] > 0


def test_sampling_runs_reproducibly(pair):
    first = bild(pair, do_sample=True, top_p=0.8, seed=3, fallback_threshold=0.05, rollback_threshold=3.0)
    again = bild(pair, do_sample=True, top_p=0.8, seed=3, fallback_threshold=0.05, rollback_threshold=3.0)
    assert torch.equal(first.sequences, again.sequences)
    assert first.sequences.shape[0] == pair[3].shape[0]


def test_bild_object_and_option_errors(pair):
    _, target, draft, ids, mask, pad = pair
    decoder = BildDecoder(target, draft, rollback_rule="exact", fallback_threshold=0.08)
    assert torch.equal(decoder.generate(ids, attention_mask=mask, max_new_tokens=NEW, pad_token_id=pad).sequences,
                       greedy(target, ids, mask, pad))
    with pytest.raises(ValueError, match="mode"):
        BildDecoder(target, draft, mode="fast")
    with pytest.raises(ValueError, match="fallback_threshold"):
        BildDecoder(target, draft, fallback_threshold=1.5)
