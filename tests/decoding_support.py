"""Tiny model pairs for the decoding tests: a target and a draft that agrees with it often but
not always (the target's weights plus noise), saved and loaded from disk; left-padded prompts."""

import torch

from hf_support import VOCAB, auto_class, save_tiny_model


def load(family: str, directory):
    return auto_class(family).from_pretrained(directory).eval()


def make_pair(family: str, tmp_path, *, noise: float = 0.03, seed: int = 0):
    """(target, draft): the draft is the target with Gaussian noise on every weight, so rows
    accept some drafts and reject others (both paths of every step get exercised)."""
    target_dir, draft_dir = tmp_path / f"{family}_target", tmp_path / f"{family}_draft"
    save_tiny_model(family, target_dir, seed=seed)
    target = load(family, target_dir)
    draft = load(family, target_dir)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * noise)
    draft.save_pretrained(draft_dir)
    return target, load(family, draft_dir)


def left_padded(lengths: list[int], *, seed: int = 0, pad: int = 0):
    """(input_ids, attention_mask) [B, max(lengths)] with each row's tokens at the right."""
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(3, VOCAB, (len(lengths), width), generator=gen)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        mask[row, width - length:] = 1
        ids[row, :width - length] = pad
    return ids, mask
