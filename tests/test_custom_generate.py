"""`target.generate(custom_generate=specdec_kernels.custom_generate, ...)`: HF's generate hook.

Greedy output equals the target's own generate, row by row (each prompt alone), for every strategy at
its lossless settings (demo.load_pair's), batch 1 and 4 left-padded; at batch 1 it also equals HF's
assisted generation. Stop strings and max time are checked after every accepted token (equal to HF's
own generate with the same criteria), a streamer receives the tokens as steps accept them, and the
processors / criteria the engine does not apply are refused, never ignored.
"""

import argparse

import pytest
import torch

from specdec_kernels import custom_generate
from specdec_kernels.demo import load_pair, rows

PROMPTS = ["def fibonacci(n):\n    ", "import os\n", "class Stack:\n    def __init__(self):\n        ",
           "for i in range(10):\n"]
NEW = 12


@pytest.fixture(scope="module")
def pair():
    from specdec_kernels.defaults import default_models_available

    if not default_models_available():
        pytest.skip("the embedded default models are not in this install")
    pair = load_pair(argparse.Namespace(models=None, target=None, draft=None, specdec_drafter=None),
                     torch.device("cpu"), torch.float32)
    pair.tokenizer.padding_side = "left"
    return pair


def hf_alone(pair, prompt, **kwargs):
    """The target's own generate on one prompt: its new tokens."""
    alone = pair.tokenizer(prompt, return_tensors="pt")
    return pair.target.generate(**alone, max_new_tokens=NEW, **kwargs)[0, alone.input_ids.shape[1]:]


def keywords(pair, name):
    """The HF-side keywords of strategy `name` at its lossless settings: the draft as assistant_model."""
    options = dict(pair.options[name])
    strategy = rows()[name][0]  # a demo row's label -> its strategy
    draft = options.pop("draft_model", None)
    if draft is not None:
        options["assistant_model"] = draft
    if strategy != "speculative" or draft is None:  # assistant_model alone means speculative
        options["strategy"] = strategy
    return options


@pytest.fixture(scope="module")
def greedy_references(pair):
    return [hf_alone(pair, prompt, do_sample=False) for prompt in PROMPTS]


@pytest.mark.parametrize("name", list(rows()))  # every strategy of the table, and its tree form
def test_greedy_equals_the_targets_generate_row_by_row(pair, greedy_references, name):
    if name not in pair.options:
        pytest.skip(pair.skipped.get(name, "not in this set"))
    tokenizer, target = pair.tokenizer, pair.target
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    out = target.generate(**batch, custom_generate=custom_generate, max_new_tokens=NEW, do_sample=False,
                          **keywords(pair, name))
    width = batch.input_ids.shape[1]
    assert torch.equal(out[:, :width], batch.input_ids)
    for row, reference in enumerate(greedy_references):
        assert torch.equal(out[row, width:width + len(reference)], reference), (name, row)
    alone = tokenizer(PROMPTS[2], return_tensors="pt")  # batch 1, no padding (HF drops the all-ones mask)
    one = target.generate(**alone, custom_generate=custom_generate, max_new_tokens=NEW, **keywords(pair, name))
    assert torch.equal(one[0, alone.input_ids.shape[1]:], greedy_references[2]), name


def test_batch_one_equals_hf_assisted_generation(pair):
    draft = pair.options["speculative"]["draft_model"]
    alone = pair.tokenizer(PROMPTS[0], return_tensors="pt")
    hf = pair.target.generate(**alone, assistant_model=draft, do_sample=False, max_new_tokens=NEW)
    ours = pair.target.generate(**alone, assistant_model=draft, custom_generate=custom_generate, do_sample=False,
                                max_new_tokens=NEW, num_draft_tokens=3)
    assert torch.equal(ours, hf)
    by_length = pair.target.generate(**alone, draft_model=draft, custom_generate=custom_generate,
                                     max_length=alone.input_ids.shape[1] + NEW)  # max_length, draft_model=
    assert torch.equal(by_length, hf)


def test_eos_lists_stop_rows_and_pad_like_hf(pair, greedy_references):
    eos = [int(greedy_references[0][4]), int(greedy_references[2][6])]
    batch = pair.tokenizer(PROMPTS, return_tensors="pt", padding=True)
    out = pair.target.generate(**batch, custom_generate=custom_generate, assistant_model=pair.options["speculative"]
                               ["draft_model"], max_new_tokens=NEW, eos_token_id=eos, pad_token_id=7)
    width = batch.input_ids.shape[1]
    for row, prompt in enumerate(PROMPTS):
        reference = hf_alone(pair, prompt, do_sample=False, eos_token_id=eos, pad_token_id=7)
        assert torch.equal(out[row, width:width + len(reference)], reference)
        assert (out[row, width + len(reference):] == 7).all()
    assert out.shape[1] - width == max(len(hf_alone(pair, p, eos_token_id=eos, pad_token_id=7)) for p in PROMPTS)


@pytest.mark.parametrize("name", ["speculative", "speculative tree", "plain"])
def test_min_new_tokens_holds_eos_back_like_hf(pair, greedy_references, name):
    """The EOS greedy would emit early is banned until min_new_tokens (and min_length), in the target's
    distribution only: drafts of EOS are rejected there, so the output is HF's own."""
    eos = [int(greedy_references[0][2]), int(greedy_references[3][1])]
    batch = pair.tokenizer(PROMPTS, return_tensors="pt", padding=True)
    width = batch.input_ids.shape[1]
    for extra in (dict(min_new_tokens=6), dict(min_length=width + 5)):
        out = pair.target.generate(**batch, custom_generate=custom_generate, max_new_tokens=NEW, eos_token_id=eos,
                                   pad_token_id=7, **extra, **keywords(pair, name))
        for row, prompt in enumerate(PROMPTS):
            alone_extra = extra if "min_new_tokens" in extra else dict(min_length=len(pair.tokenizer(prompt).input_ids) + 5)
            reference = hf_alone(pair, prompt, do_sample=False, eos_token_id=eos, pad_token_id=7, **alone_extra)
            assert torch.equal(out[row, width:width + len(reference)], reference), (name, extra, row)
            assert (out[row, width + len(reference):] == 7).all()
    early = hf_alone(pair, PROMPTS[0], do_sample=False, eos_token_id=eos)
    assert len(early) == 3  # without the minimum, row 0 stops at its third token: the ban mattered


def test_seeded_sampling_repeats_and_dict_output(pair):
    draft = pair.options["speculative"]["draft_model"]
    batch = pair.tokenizer(PROMPTS[:2], return_tensors="pt", padding=True)
    kwargs = dict(custom_generate=custom_generate, assistant_model=draft, max_new_tokens=8, do_sample=True,
                  temperature=0.7, top_k=20, top_p=0.9)
    runs = []
    for _ in range(2):
        torch.manual_seed(3)  # HF's way; seed= is the engine's
        runs.append(pair.target.generate(**batch, **kwargs))
    assert torch.equal(*runs)
    first = pair.target.generate(**batch, seed=5, return_dict_in_generate=True, **kwargs)
    second = pair.target.generate(**batch, seed=5, **kwargs)
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    assert isinstance(first, GenerateDecoderOnlyOutput)
    assert torch.equal(first.sequences, second)
    assert first.stats.emitted_tokens > 0 and first.stats.drafted_tokens > 0


@pytest.mark.parametrize("extra, named", [
    (dict(repetition_penalty=1.2), "RepetitionPenaltyLogitsProcessor"),
    (dict(no_repeat_ngram_size=2), "NoRepeatNGramLogitsProcessor"),
    (dict(bad_words_ids=[[5]]), "NoBadWordsLogitsProcessor"),
    (dict(suppress_tokens=[5]), "SuppressTokensLogitsProcessor"),
    (dict(num_beams=2), "num_beams"),
    (dict(output_scores=True, return_dict_in_generate=True), "output_scores"),
])
def test_what_the_engine_does_not_apply_is_refused(pair, extra, named):
    alone = pair.tokenizer(PROMPTS[0], return_tensors="pt")
    with pytest.raises(ValueError, match=named) as error:
        pair.target.generate(**alone, custom_generate=custom_generate, max_new_tokens=4, **extra)
    assert "\n" not in str(error.value)


def test_custom_criteria_and_batched_streamers_are_refused(pair):
    from transformers import StoppingCriteria, StoppingCriteriaList
    from transformers.generation.streamers import BaseStreamer

    class Never(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    class Recorder(BaseStreamer):
        ended = False

        def put(self, value):
            pass

        def end(self):
            self.ended = True

    alone = pair.tokenizer(PROMPTS[0], return_tensors="pt")
    with pytest.raises(ValueError, match="stopping criterion Never"):
        pair.target.generate(**alone, custom_generate=custom_generate, max_new_tokens=4,
                             stopping_criteria=StoppingCriteriaList([Never()]))
    streamer = Recorder()
    batch = pair.tokenizer(PROMPTS[:2], return_tensors="pt", padding=True)
    with pytest.raises(ValueError, match="a streamer needs batch size 1"):  # HF's streamers take one row
        pair.target.generate(**batch, custom_generate=custom_generate, max_new_tokens=4, streamer=streamer)
    assert streamer.ended  # a consumer waiting on it is released


class Recording:
    """A streamer that keeps every put() (HF's own first put is the prompt)."""

    def __init__(self):
        self.puts, self.ends = [], 0

    def put(self, value):
        self.puts.append(value.flatten().tolist())

    def end(self):
        self.ends += 1


@pytest.mark.parametrize("name", ["speculative", "speculative tree", "plain"])
def test_streamer_gets_the_accepted_tokens_in_order(pair, greedy_references, name):
    """Nothing lost, nothing doubled, in order; several tokens per put where a step accepted drafts."""
    alone = pair.tokenizer(PROMPTS[0], return_tensors="pt")
    streamer = Recording()
    out = pair.target.generate(**alone, custom_generate=custom_generate, max_new_tokens=NEW, streamer=streamer,
                               **keywords(pair, name))
    prompt, *steps = streamer.puts
    assert prompt == alone.input_ids[0].tolist() and streamer.ends == 1
    assert sum(steps, []) == out[0, alone.input_ids.shape[1]:].tolist() == greedy_references[0].tolist()
    assert all(steps) and (max(map(len, steps)) > 1) == (name != "plain")


def test_stop_strings_end_rows_like_hfs_generate(pair, greedy_references):
    """A stop string ends its row right after the token that completes it, mid-step included, as HF's
    loop does. (transformers 5.x drops generate()'s tokenizer= for a custom_generate callable, so
    stop_strings= cannot reach it: pass StopStringCriteria yourself.)"""
    from transformers import StoppingCriteriaList, StopStringCriteria

    tokenizer = pair.tokenizer
    stops = [tokenizer.decode(greedy_references[0])[6:9], tokenizer.decode(greedy_references[3])[4:6]]
    criteria = lambda: StoppingCriteriaList([StopStringCriteria(tokenizer, stops)])  # noqa: E731
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    out = pair.target.generate(**batch, custom_generate=custom_generate, max_new_tokens=NEW, pad_token_id=7,
                               assistant_model=pair.options["speculative"]["draft_model"], stopping_criteria=criteria())
    width = batch.input_ids.shape[1]
    stopped = 0
    for row, prompt in enumerate(PROMPTS):
        reference = hf_alone(pair, prompt, do_sample=False, pad_token_id=7, stopping_criteria=criteria())
        assert torch.equal(out[row, width:width + len(reference)], reference), row
        assert (out[row, width + len(reference):] == 7).all()
        stopped += len(reference) < NEW
    assert stopped >= 2  # the stop strings fired (rows 0 and 3 at least)
    timed = pair.target.generate(**batch, custom_generate=custom_generate, max_new_tokens=NEW, max_time=60.0,
                                 assistant_model=pair.options["speculative"]["draft_model"])
    for row, reference in enumerate(greedy_references):  # a max_time criterion that does not fire changes nothing
        assert torch.equal(timed[row, width:width + len(reference)], reference), row


@pytest.mark.parametrize("with_tokenizer", [True, False])
def test_stop_strings_say_what_to_pass_instead(pair, with_tokenizer):
    """transformers drops tokenizer= before a custom_generate callable, and its own error would ask for the
    tokenizer that was passed: the hook takes stop_strings and names the criteria that work, in one line."""
    alone = pair.tokenizer(PROMPTS[0], return_tensors="pt")
    extra = {"tokenizer": pair.tokenizer} if with_tokenizer else {}
    with pytest.raises(ValueError) as error:
        pair.target.generate(**alone, custom_generate=custom_generate, max_new_tokens=4, stop_strings=["x"], **extra)
    message = str(error.value)
    assert "\n" not in message and message.startswith("custom_generate: stop_strings= cannot work here")
    assert "stopping_criteria=StoppingCriteriaList([StopStringCriteria(tokenizer, stop_strings)])" in message


def test_options_of_another_strategy_are_named(pair):
    alone = pair.tokenizer(PROMPTS[0], return_tensors="pt")
    draft = pair.options["speculative"]["draft_model"]
    with pytest.raises(TypeError, match=r"strategy 'speculative' has no option 'exit_layer'; its options: draft_model"):
        pair.target.generate(**alone, custom_generate=custom_generate, assistant_model=draft, exit_layer=3,
                             max_new_tokens=4)
    with pytest.raises(ValueError, match="unknown strategy 'beam'"):
        pair.target.generate(**alone, custom_generate=custom_generate, strategy="beam", max_new_tokens=4)
    with pytest.raises(ValueError, match="num_draft_tokenz"):  # not any strategy's: HF's own typo check names it
        pair.target.generate(**alone, custom_generate=custom_generate, num_draft_tokenz=3, max_new_tokens=4)


def test_a_call_outside_hfs_generate_warns_that_assistant_model_cannot_be_read(pair):
    """Read from the calling generate()'s frame: where there is none (a direct call, or a transformers
    whose generate() changed), the user is told to pass draft_model= instead of being silently plain."""
    from transformers import MaxLengthCriteria, StoppingCriteriaList

    ids = pair.tokenizer(PROMPTS[:1], return_tensors="pt").input_ids
    stop = StoppingCriteriaList([MaxLengthCriteria(ids.shape[1] + NEW)])
    with pytest.warns(RuntimeWarning, match="could not read assistant_model"):
        out = custom_generate(pair.target, ids, stopping_criteria=stop,
                              draft_model=pair.options["speculative"]["draft_model"])
    assert torch.equal(out[0, ids.shape[1]:], hf_alone(pair, PROMPTS[0], do_sample=False))
