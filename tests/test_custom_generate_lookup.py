"""HF's own assisted-generation arguments through `custom_generate`: prompt lookup (the same tokens as HF's
at batch 1, batches that HF refuses), the draft length and its schedule (transformers' own heuristic test,
re-run on a local model against custom_generate), the settings refused with one line, and the table of
every HF generation setting (specdec_kernels/hf_generate/settings.py) against GenerationConfig and
docs/hf.md."""

import pytest
import torch
from transformers import GenerationConfig

from specdec_kernels import custom_generate
from specdec_kernels.hf_generate import settings

from decoding_support import left_padded, make_pair
from hf_support import one_thread
from markdown_blocks import ROOT

NEW = 16


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return make_pair("llama", tmp_path_factory.mktemp("lookup_hf"))


def repeating(rows: int = 4):
    ids, mask = left_padded([12, 5, 11, 7][:rows], seed=3)
    ids[0, -12:] = torch.tensor([5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10])
    if rows > 2:
        ids[2, -11:] = torch.tensor([20, 21, 22, 23, 24, 25, 26, 20, 21, 22, 23])
    return ids, mask


def test_prompt_lookup_gives_hfs_tokens_at_batch_one_and_runs_batches(pair):
    target, _ = pair
    ids, mask = repeating()
    for k, n in ((10, None), (3, 3)):
        ngram = {} if n is None else dict(max_matching_ngram_size=n)
        for row in range(4):
            alone = ids[row:row + 1, ids.shape[1] - int(mask[row].sum()):]
            theirs = target.generate(alone, prompt_lookup_num_tokens=k, max_new_tokens=NEW, do_sample=False,
                                     pad_token_id=0, **ngram)
            ours = target.generate(alone, custom_generate=custom_generate, prompt_lookup_num_tokens=k,
                                   max_new_tokens=NEW, pad_token_id=0, return_dict_in_generate=True, **ngram)
            assert torch.equal(ours.sequences, theirs), (k, n, row)
            if row == 0:  # a repeating prompt: drafts were made and accepted
                assert ours.stats.accepted_tokens > 0 and ours.stats.extra["match_rate"] > 0
        with pytest.raises(ValueError, match="batch_size = 1"):  # HF's prompt lookup refuses batches
            target.generate(ids, attention_mask=mask, prompt_lookup_num_tokens=k, max_new_tokens=NEW, pad_token_id=0)
        batched = target.generate(ids, attention_mask=mask, custom_generate=custom_generate, prompt_lookup_num_tokens=k,
                                  max_new_tokens=NEW, pad_token_id=0, **ngram)
        greedy = target.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0)
        assert torch.equal(batched, greedy)


def test_the_heuristic_schedule_writes_its_length_back_as_hf_does(pair):
    """transformers' test_assisted_decoding_num_assistant_tokens_heuristic_schedule, on a local model: one
    verification of 5 tokens (eos -1, 5 new tokens) leaves num_assistant_tokens at 4 or 7 on the
    assistant; "heuristic_transient" leaves it as it was."""
    target, _ = pair
    ids, _ = repeating(rows=1)
    assistant = target
    config = assistant.generation_config
    saved = (config.num_assistant_tokens, config.num_assistant_tokens_schedule)
    try:
        assistant.generation_config.num_assistant_tokens = 5
        assistant.generation_config.num_assistant_tokens_schedule = "heuristic"
        target.generate(ids, custom_generate=custom_generate, assistant_model=assistant, eos_token_id=-1,
                        max_new_tokens=5, do_sample=False, pad_token_id=0)
        assert assistant.generation_config.num_assistant_tokens in (4, 7)
        assistant.generation_config.num_assistant_tokens = 5
        assistant.generation_config.num_assistant_tokens_schedule = "heuristic_transient"
        target.generate(ids, custom_generate=custom_generate, assistant_model=assistant, eos_token_id=-1,
                        max_new_tokens=5, do_sample=False, pad_token_id=0)
        assert assistant.generation_config.num_assistant_tokens == 5
    finally:
        config.num_assistant_tokens, config.num_assistant_tokens_schedule = saved


def test_num_assistant_tokens_sets_the_draft_length(pair):
    target, draft = pair
    ids, mask = repeating()
    common = dict(attention_mask=mask, custom_generate=custom_generate, assistant_model=draft, max_new_tokens=NEW,
                  pad_token_id=0, return_dict_in_generate=True)
    passed = target.generate(ids, num_assistant_tokens=2, **common)
    assert len(passed.stats.per_position_acceptance) == 2  # two drafts per step, not our default 5
    try:
        draft.generation_config.num_assistant_tokens = 3
        on_assistant = target.generate(ids, **common)
        assert len(on_assistant.stats.per_position_acceptance) == 3
        with pytest.raises(ValueError, match="num_assistant_tokens is 2 for this call and 3 in the assistant's"):
            target.generate(ids, num_assistant_tokens=2, **common)
    finally:
        draft.generation_config.num_assistant_tokens = None
    assert torch.equal(passed.sequences, target.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False,
                                                         pad_token_id=0))


@pytest.mark.parametrize("kwargs, named", [
    (dict(assistant_confidence_threshold=0.2), "assistant_confidence_threshold"),
    (dict(assistant_early_exit=1), "assistant_early_exit"),
    (dict(assistant_ensemble_weight=0.5), "assistant_ensemble_weight"),
    (dict(assistant_lookbehind=5), "assistant_lookbehind"),
    (dict(target_lookbehind=5), "target_lookbehind"),
    (dict(speculation_type="dflash"), "speculation_type"),
    (dict(use_mtp=True), "use_mtp"),
    (dict(penalty_alpha=0.6), "penalty_alpha"),
    (dict(dola_layers="high"), "dola_layers"),
    (dict(num_beam_groups=2), "num_beam_groups"),
    (dict(force_words_ids=[[5]]), "force_words_ids"),
    (dict(num_assistant_tokens=3), "num_assistant_tokens=3 has no counterpart in strategy 'plain'"),
    (dict(num_assistant_tokens_schedule="heuristic", strategy="lookup"), "applies to strategy 'speculative'"),
    (dict(max_matching_ngram_size=2), "max_matching_ngram_size applies to prompt lookup"),
    (dict(prompt_lookup_num_tokens=3, strategy="bild"), "runs strategy 'lookup', not 'bild'"),
    (dict(prompt_lookup_num_tokens=3, num_draft_tokens=4), "prompt_lookup_num_tokens=3 and num_draft_tokens=4"),
    (dict(prompt_lookup_num_tokens=3, draft=True), "without a model: drop assistant_model"),
    (dict(prompt_lookup_num_tokens=0), r"prompt_lookup_num_tokens must be an int >= 1 \(got 0\)"),
    (dict(prompt_lookup_num_tokens=2, max_matching_ngram_size=0), r"max_matching_ngram_size must be an int >= 1"),
    (dict(num_assistant_tokens=0, draft=True), r"num_assistant_tokens must be an int >= 1 \(got 0\)"),
])
def test_settings_without_a_counterpart_are_refused_in_one_line(pair, kwargs, named):
    target, draft = pair
    ids, _ = repeating(rows=1)
    if kwargs.pop("draft", False):
        kwargs["assistant_model"] = draft
    with pytest.raises(ValueError, match=named) as error:
        target.generate(ids, custom_generate=custom_generate, max_new_tokens=4, pad_token_id=0, **kwargs)
    assert "\n" not in str(error.value) and str(error.value).startswith("custom_generate: ")


def test_a_confidence_threshold_of_zero_is_no_stop_and_runs(pair):
    """assistant_confidence_threshold=0 turns HF's confidence stop off (as HF's own benchmarks of assisted
    generation at a constant length set it on the assistant), which is how our drafting works: accepted,
    with the assistant's constant draft length; 0.2 on the same assistant is refused."""
    target, draft = pair
    ids, _ = repeating(rows=1)
    config = draft.generation_config
    try:
        config.assistant_confidence_threshold, config.num_assistant_tokens = 0.0, 3
        out = target.generate(ids, custom_generate=custom_generate, assistant_model=draft, max_new_tokens=6,
                              pad_token_id=0, return_dict_in_generate=True)
        assert len(out.stats.per_position_acceptance) == 3
        config.assistant_confidence_threshold = 0.2
        with pytest.raises(ValueError, match="assistant_confidence_threshold=0.2"):
            target.generate(ids, custom_generate=custom_generate, assistant_model=draft, max_new_tokens=6,
                            pad_token_id=0)
    finally:
        config.assistant_confidence_threshold, config.num_assistant_tokens = None, None


def test_every_hf_generation_setting_is_classified_and_documented():
    fields = {name for name in GenerationConfig().to_dict() if not name.startswith("_")}
    missing = sorted(fields - set(settings.SETTINGS))
    assert not missing, f"classify these GenerationConfig fields in hf_generate/settings.py: {missing}"
    page = (ROOT / "docs" / "hf.md").read_text()
    undocumented = [name for name in settings.SETTINGS if f"| `{name}` |" not in page]
    assert not undocumented, f"docs/hf.md lacks a row for {undocumented}"
    assert set(settings.CHECKED) <= {name for name, (kind, _) in settings.SETTINGS.items() if kind == settings.REFUSED}
