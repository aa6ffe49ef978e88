"""`target.generate(custom_generate=specdec_kernels.custom_generate, ...)`: HF's generate hook.

Greedy output equals the target's own generate, row by row (each prompt alone), for every strategy at
its lossless settings (demo.load_pair's), batch 1 and 3 left-padded; at batch 1 it also equals HF's
assisted generation. Processors / criteria the engine does not apply are refused, never ignored.
"""

import argparse

import pytest
import torch

from specdec_kernels import custom_generate
from specdec_kernels.demo import load_pair

PROMPTS = ["def fibonacci(n):\n    ", "import os\n", "class Stack:\n    def __init__(self):\n        "]
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
    strategy = "speculative" if name == "speculative tree" else name
    draft = options.pop("draft_model", None)
    if draft is not None:
        options["assistant_model"] = draft
    if strategy != "speculative" or draft is None:  # assistant_model alone means speculative
        options["strategy"] = strategy
    return options


@pytest.fixture(scope="module")
def greedy_references(pair):
    return [hf_alone(pair, prompt, do_sample=False) for prompt in PROMPTS]


@pytest.mark.parametrize("name", ["speculative", "speculative tree", "specdec", "bild", "ppd", "plain"])
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
    (dict(min_new_tokens=3), "MinNewTokensLengthLogitsProcessor|MinLengthLogitsProcessor"),
    (dict(no_repeat_ngram_size=2), "NoRepeatNGramLogitsProcessor"),
    (dict(do_sample=True, min_p=0.1), "MinPLogitsWarper"),
    (dict(max_time=30.0), "MaxTimeCriteria"),
    (dict(num_beams=2), "num_beams"),
    (dict(output_scores=True, return_dict_in_generate=True), "output_scores"),
])
def test_what_the_engine_does_not_apply_is_refused(pair, extra, named):
    alone = pair.tokenizer(PROMPTS[0], return_tensors="pt")
    with pytest.raises(ValueError, match=named) as error:
        pair.target.generate(**alone, custom_generate=custom_generate, max_new_tokens=4, **extra)
    assert "\n" not in str(error.value)


def test_custom_criteria_and_streamers_are_refused(pair):
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
    with pytest.raises(ValueError, match="streamer is not supported"):
        pair.target.generate(**alone, custom_generate=custom_generate, max_new_tokens=4, streamer=streamer)
    assert streamer.ended  # a consumer waiting on it is released


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
