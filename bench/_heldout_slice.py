"""Prompts with their true continuations, cut from text the embedded default models never saw.

The default set (tokenizer, target, draft, SpecDec drafter, early-exit heads) was trained on every
top-level *.py file of the standard library except _stdlib_text.HELD_OUT (bench/train_default_models.py
and bench/retrain_specdec_drafter.py pass exclude=HELD_OUT), so windows of those four files are held
out for all of its parts. Each file is tokenized whole, so a prompt and its continuation are tokenized
as the model would see them inside the file.
"""

from dataclasses import dataclass

from _stdlib_text import HELD_OUT, stdlib_files


@dataclass
class Example:
    source: str            # "<file>@<token offset>"
    prompt: list[int]      # prompt_tokens ids
    continuation: list[int]  # the file's next new_tokens ids (the true continuation)


def heldout_examples(tokenizer, count: int, prompt_tokens: int, new_tokens: int,
                     files=HELD_OUT) -> list[Example]:
    """`count` windows of prompt_tokens + new_tokens ids, spread round-robin over `files` and evenly
    over each file (the first window of a file starts at its beginning)."""
    streams = {name: tokenizer(text, add_special_tokens=False)["input_ids"] for name, text in stdlib_files(files).items()}
    width = prompt_tokens + new_tokens
    streams = {name: ids for name, ids in streams.items() if len(ids) >= width}
    if not streams:
        raise ValueError(f"no held-out file has {width} tokens (prompt {prompt_tokens} + new {new_tokens})")
    names = sorted(streams)
    per_file = {name: len(range(i, count, len(names))) for i, name in enumerate(names)}
    examples = []
    for i in range(count):
        name = names[i % len(names)]
        ids, slot, slots = streams[name], i // len(names), per_file[name]
        start = slot * ((len(ids) - width) // max(slots - 1, 1)) if slots > 1 else 0
        window = ids[start:start + width]
        examples.append(Example(f"{name}@{start}", window[:prompt_tokens], window[prompt_tokens:]))
    return examples
