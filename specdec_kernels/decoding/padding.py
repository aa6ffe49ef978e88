"""The attention mask of a padded batch given without one: inferred from the pad id as HF does, or refused.

Without a mask every token is read as text, so the pad tokens of a padded batch would change the rows they
pad. HF's generate infers the mask as `input_ids != pad_token_id` when the pad token occurs in the prompts
and is not an EOS id; when pad and EOS share an id it cannot tell padding from text and only warns. We infer
the same mask in the first case and refuse the second when the batch is visibly padded, so a call never
returns tokens that depend on its padding.
"""

import torch
from torch import Tensor

from ..common import validate as check


def edge_runs(input_ids: Tensor, token: int) -> tuple[Tensor, Tensor]:
    """Per row, how many leading and how many trailing positions hold `token` (int64 [B] each)."""
    hits = (input_ids == token).to(torch.int64)
    leading = hits.cumprod(dim=1).sum(dim=1)
    trailing = hits.flip(1).cumprod(dim=1).sum(dim=1)
    return leading, trailing


def padded(input_ids: Tensor, pad: int) -> bool:
    """Whether the rows carry padding: a run of `pad` at one edge whose length differs between rows.
    (A run every row shares, such as one BOS that is also the pad token, is text, not padding: the
    longest prompt of a batch is never padded.)"""
    if input_ids.shape[0] < 2:
        return False
    leading, trailing = edge_runs(input_ids, pad)
    return bool(leading.min() != leading.max()) or bool(trailing.min() != trailing.max())


def attention_mask_for(op: str, input_ids: Tensor, attention_mask, pad_token_id, eos_ids: list[int]):
    """The attention mask a call runs with: the one given, else HF's inferred one, else None (no padding).

    input_ids: int [B, P]; attention_mask: the caller's [B, P] or None; pad_token_id: the pad id the caller
    or the model's generation_config names (None: unknown); eos_ids: the call's EOS ids.
    """
    if attention_mask is not None or pad_token_id is None or not isinstance(input_ids, Tensor) \
            or input_ids.dim() != 2 or input_ids.numel() == 0:
        return attention_mask  # a malformed input_ids: the engine's checks name it
    pad = int(pad_token_id)
    if not bool((input_ids == pad).any()):
        return None
    if pad not in eos_ids:
        return (input_ids != pad).to(torch.int64)  # HF's rule (GenerationMixin._prepare_attention_mask_for_generation)
    if padded(input_ids, pad):
        check.fail(op, f"input_ids look padded with token {pad}, which is also an EOS id, and no attention_mask "
                       "was given, so padding cannot be told from text: pass attention_mask (the tokenizer "
                       "returns it with padding=True)")
    return None
