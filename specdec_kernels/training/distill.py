"""Sequence-level knowledge distillation data (Kim and Rush, 2016): the target's own greedy
continuations are the labels a drafter learns to predict."""

from dataclasses import dataclass

import torch
from torch import Tensor

IGNORE = -100


@dataclass
class DistillData:
    """prompts [M, P] int64: decoder-only prompts, or encoder sources for seq2seq targets.
    continuations [M, L] int64: the target's greedy tokens after the prompt (seq2seq: after the
    decoder start token), IGNORE after the first EOS (the EOS itself is kept).
    start_token: seq2seq decoder start token id, None for decoder-only targets."""

    prompts: Tensor
    continuations: Tensor
    start_token: int | None

    def state(self) -> dict:
        return {"prompts": self.prompts, "continuations": self.continuations, "start_token": self.start_token}


def token_chunks(texts, tokenizer, length: int, max_chunks: int | None = None) -> Tensor:
    """Cut the texts' token stream into [M, length] int64 prompts. texts: strings (tokenized with
    `tokenizer`, no special tokens) or sequences of token ids."""
    stream: list[int] = []
    for text in texts:
        if isinstance(text, str):
            if tokenizer is None:
                raise ValueError("train_specdec_drafter: texts are strings, so a tokenizer is needed "
                                 "(tokenizer=AutoTokenizer.from_pretrained(...) of the target), or pass token ids")
            stream.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        else:
            stream.extend(int(t) for t in (text.tolist() if isinstance(text, Tensor) else text))
        if max_chunks is not None and len(stream) >= max_chunks * length:
            break
    count = len(stream) // length
    if max_chunks is not None:
        count = min(count, max_chunks)
    if count == 0:
        raise ValueError(f"train_specdec_drafter: the texts hold {len(stream)} tokens, fewer than one prompt of "
                         f"{length} (lower prompt_length or pass more text)")
    return torch.tensor(stream[:count * length], dtype=torch.int64).view(count, length)


def eos_ids(target) -> list[int]:
    eos = getattr(getattr(target, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(target.config, "eos_token_id", None)
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


@torch.no_grad()
def greedy_continuations(target, prompts: Tensor, new_tokens: int, *, batch_size: int = 16,
                         progress=None) -> DistillData:
    """The target's greedy output for every prompt (HF generate, do_sample=False): up to
    new_tokens tokens, IGNORE after the first EOS."""
    device = next(target.parameters()).device
    encoder_decoder = bool(getattr(target.config, "is_encoder_decoder", False))
    eos = eos_ids(target)
    pad = eos[0] if eos else 0
    outputs = []
    for start in range(0, prompts.shape[0], batch_size):
        batch = prompts[start:start + batch_size].to(device)
        out = target.generate(batch, attention_mask=torch.ones_like(batch), max_new_tokens=new_tokens,
                              min_new_tokens=0, do_sample=False, num_beams=1, pad_token_id=pad,
                              forced_bos_token_id=None, forced_eos_token_id=None)  # plain argmax decoding
        new = out[:, 1:] if encoder_decoder else out[:, batch.shape[1]:]
        new = torch.nn.functional.pad(new, (0, new_tokens - new.shape[1]), value=pad)  # every row stopped early
        outputs.append(mask_after_eos(new, eos).cpu())
        if progress is not None:
            progress.update(batch.shape[0])
    start_token = int(target.config.decoder_start_token_id) if encoder_decoder else None
    return DistillData(prompts.cpu(), torch.cat(outputs), start_token)


def mask_after_eos(tokens: Tensor, eos: list[int]) -> Tensor:
    """tokens [M, L] with every position after a row's first EOS set to IGNORE."""
    if not eos:
        return tokens
    is_eos = torch.isin(tokens, torch.tensor(eos, device=tokens.device))
    after = (is_eos.cumsum(1) - is_eos.to(torch.int64)) > 0
    return tokens.masked_fill(after, IGNORE)
