"""`train_specdec_drafter`: train SpecDec's block-parallel drafter on a target model and plain text.

Recipe (Xia et al., Sec. 3.1.3, and the official code's details):
- sequence-level distillation: the target's greedy continuations of prompts cut from the texts are
  the labels (distill.py);
- per example a random prefix length p, uniform over [0, L-1] of the continuation's L real tokens
  (EOS included): the drafter reads prompt + continuation[:p] and k masks, and learns
  continuation[p:p+k]; positions past the continuation's end are not trained;
- label-smoothed cross-entropy (0.1) on the block positions;
- optional GLAT glancing: a no-grad pass counts the wrong predictions in the block, (wrong * ratio)
  random block positions get their true token as input instead of [MASK], and the loss covers
  only the positions still masked; the ratio anneals linearly from 0.5 to 0.3;
- AdamW (0.9, 0.999, eps 1e-6), weight decay 0.01, clip norm 5.0, linear warm-up then inverse
  square root.
"""

import math
from pathlib import Path

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..models import SpecDecDrafter, SpecDecDrafterConfig
from . import checkpoints
from .distill import IGNORE, DistillData, greedy_continuations, token_chunks

OP = "train_specdec_drafter"
DISTILL_FILE = "distillation.pt"


def default_drafter_config(target, block_size: int, max_length: int, **overrides) -> SpecDecDrafterConfig:
    """A small drafter for `target`: its vocabulary and hidden size (so embeddings can be copied),
    2 decoder layers, plus a 4-layer encoder for seq2seq targets (deep encoder, shallow decoder)."""
    vocab = target.get_output_embeddings().weight.shape[0]
    hidden = target.get_input_embeddings().weight.shape[1]
    heads = next(h for h in (8, 4, 2, 1) if hidden % h == 0)
    seq2seq = bool(getattr(target.config, "is_encoder_decoder", False))
    settings = dict(vocab_size=vocab, hidden_size=hidden, num_attention_heads=heads, intermediate_size=4 * hidden,
                    num_layers=2, encoder_layers=4 if seq2seq else 0,
                    max_position_embeddings=max(2048, max_length), max_source_positions=max(1024, max_length),
                    block_size=block_size)
    for name in ("pad_token_id", "eos_token_id", "bos_token_id", "decoder_start_token_id"):
        if getattr(target.config, name, None) is not None:
            settings[name] = getattr(target.config, name)
    settings.update(overrides)
    return SpecDecDrafterConfig(**settings)


@torch.no_grad()
def copy_target_embeddings(drafter: SpecDecDrafter, target) -> bool:
    """Start from the target's token embeddings and LM head where the widths match (the paper
    initialises the drafter's encoder from the target's). Returns whether anything was copied."""
    source_in, source_out = target.get_input_embeddings().weight, target.get_output_embeddings().weight
    if source_in.shape[1] != drafter.config.hidden_size:
        return False
    vocab = min(source_in.shape[0], drafter.config.vocab_size)
    drafter.embed_tokens.weight[:vocab].copy_(source_in[:vocab])
    drafter.lm_head.weight[:vocab].copy_(source_out[:vocab])
    return True


def sample_batch(data: DistillData, batch_size: int, block_size: int, generator: torch.Generator):
    """(input_ids [B, N] right-padded prefixes, num_new [B], labels [B, k], sources [B, S] or None)."""
    rows = torch.randint(0, data.prompts.shape[0], (batch_size,), generator=generator)
    conts = data.continuations[rows]
    real = (conts != IGNORE).sum(1).clamp(min=1)
    prefix = (torch.rand(batch_size, generator=generator) * real).long()  # uniform in [0, real - 1]
    if data.start_token is None:
        heads = data.prompts[rows]
        sources = None
    else:
        heads = torch.full((batch_size, 1), data.start_token, dtype=torch.int64)
        sources = data.prompts[rows]
    lengths = heads.shape[1] + prefix
    width = int(lengths.max())
    full = torch.cat([heads, conts.clamp(min=0)], 1)
    j = torch.arange(width).unsqueeze(0)
    input_ids = torch.where(j < lengths.unsqueeze(1), full[:, :width], 0)
    steps = prefix.unsqueeze(1) + torch.arange(block_size).unsqueeze(0)
    padded = torch.nn.functional.pad(conts, (0, block_size), value=IGNORE)
    labels = padded.gather(1, steps)
    return input_ids, lengths, labels, sources


def glance(model: SpecDecDrafter, inputs: dict, labels: Tensor, ratio: float, generator: torch.Generator):
    """GLAT: reveal (wrong * ratio) random labelled block positions; (block_ids, labels still masked)."""
    with torch.no_grad():
        predicted = model(**inputs).logits.argmax(-1).cpu()
    labelled = labels != IGNORE
    wrong = ((predicted != labels) & labelled).sum(1)
    reveal_count = (wrong.float() * ratio).floor().long()
    scores = torch.rand(labels.shape, generator=generator).masked_fill(~labelled, 2.0)
    rank = scores.argsort(1).argsort(1)
    reveal = rank < reveal_count.unsqueeze(1)
    block_ids = torch.where(reveal, labels, model.config.mask_token_id)
    return block_ids, labels.masked_fill(reveal, IGNORE)


@torch.no_grad()
def expected_tokens_per_step(drafter: SpecDecDrafter, data: DistillData, block_size: int, *, samples: int = 256,
                             seed: int = 0) -> float:
    """Offline estimate of SpecDec's tokens per iteration with exact (top-1) verification: over
    random prefixes of the distillation data, 1 + the number of leading drafts equal to the
    target's greedy tokens (a block past the continuation's end counts its real tokens only)."""
    was_training = drafter.training
    drafter.eval()
    device = drafter.lm_head.weight.device
    generator = torch.Generator().manual_seed(seed)
    input_ids, lengths, labels, sources = sample_batch(data, samples, block_size, generator)
    inputs = {"input_ids": input_ids.to(device), "num_new": lengths.to(device), "block_size": block_size}
    if sources is not None:
        inputs["encoder_hidden"], inputs["encoder_mask"] = drafter.encode(sources.to(device))
    predicted = drafter(**inputs).logits.argmax(-1).cpu()
    leading = ((predicted == labels) & (labels != IGNORE)).long().cumprod(1).sum(1)
    drafter.train(was_training)
    return 1.0 + leading.float().mean().item()


def train_specdec_drafter(target, texts, *, tokenizer=None, block_size: int = 10, drafter: SpecDecDrafter | None = None,
                          drafter_config: dict | None = None, steps: int = 2000, batch_size: int = 16,
                          learning_rate: float = 5e-4, warmup_steps: int = 100, weight_decay: float = 0.01,
                          clip_norm: float = 5.0, label_smoothing: float = 0.1, glancing: bool = True,
                          glance_ratio: tuple[float, float] = (0.5, 0.3), prompt_length: int = 32,
                          continuation_length: int = 64, max_prompts: int | None = 2048, output_dir=None,
                          checkpoint_every: int = 0, keep_checkpoints: int = 2, resume: bool = False,
                          seed: int = 0, progress: bool = True, distill_batch_size: int = 32) -> SpecDecDrafter:
    """Train a SpecDecDrafter that drafts `block_size` tokens at once for `target`.

    Args:
        target: HF causal LM or seq2seq model (its greedy outputs are the labels; never updated).
        texts: iterable of strings (needs `tokenizer`) or of token-id sequences. Decoder-only
            targets: prompts of prompt_length tokens cut from them. Seq2seq targets: the same
            chunks are the encoder sources.
        block_size: k, the number of [MASK] queries per step.
        drafter / drafter_config: continue training a drafter, or build one (default_drafter_config
            with these overrides; embeddings copied from the target when the widths match).
        steps, batch_size, learning_rate, warmup_steps, weight_decay, clip_norm, label_smoothing:
            the optimisation (see the module docstring).
        glancing, glance_ratio: GLAT on/off and its (start, end) ratio.
        continuation_length: greedy tokens generated per prompt; max_prompts caps the prompts.
        output_dir: checkpoints (checkpoint-<step>/), the distillation data (reused on resume)
            and the final drafter (save_pretrained). checkpoint_every: steps between checkpoints
            (0: none). resume: continue from the newest checkpoint in output_dir.
        seed: batches, glancing and initialisation; a resumed run replays the same stream.
        progress: tqdm progress bars (distillation, training).

    Returns:
        the trained SpecDecDrafter (eval mode, on the target's device).
    """
    if block_size < 1 or steps < 0 or batch_size < 1:
        raise ValueError(f"{OP}: block_size and batch_size must be >= 1 and steps >= 0 "
                         f"(got {block_size}, {batch_size}, {steps})")
    if resume and output_dir is None:
        raise ValueError(f"{OP}: resume=True needs output_dir (where the checkpoints are)")
    device = next(target.parameters()).device
    out = Path(output_dir) if output_dir is not None else None
    checkpoint = checkpoints.latest_checkpoint(out) if resume else None
    target_was_training = target.training
    target.eval()

    data = load_or_distill(target, texts, tokenizer, out, prompt_length, continuation_length, max_prompts,
                           distill_batch_size, progress)
    torch.manual_seed(seed)
    if checkpoint is not None:
        drafter = SpecDecDrafter.from_pretrained(checkpoint)
    elif drafter is None:
        drafter = SpecDecDrafter(default_drafter_config(target, block_size, prompt_length + continuation_length + 1,
                                                        **(drafter_config or {})))
        copy_target_embeddings(drafter, target)
    drafter.to(device).train()

    decay = [p for n, p in drafter.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in drafter.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=learning_rate, betas=(0.9, 0.999), eps=1e-6)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, checkpoints.inverse_sqrt_schedule(warmup_steps))
    generator = torch.Generator().manual_seed(seed)
    first = 0
    if checkpoint is not None:
        state = checkpoints.load_state(checkpoint)
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        checkpoints.set_rng_state(state["rng"], generator)
        first = state["step"]

    bar = tqdm(total=steps, initial=first, desc="specdec drafter", disable=not progress)
    for step in range(first, steps):
        input_ids, lengths, labels, sources = sample_batch(data, batch_size, block_size, generator)
        inputs = {"input_ids": input_ids.to(device), "num_new": lengths.to(device), "block_size": block_size}
        if sources is not None:
            inputs["encoder_hidden"], inputs["encoder_mask"] = drafter.encode(sources.to(device))
        if glancing:
            start, end = glance_ratio
            ratio = start - (start - end) * min(1.0, step / max(steps, 1))
            block_ids, labels = glance(drafter, inputs, labels, ratio, generator)
            inputs["block_ids"] = block_ids.to(device)
            if sources is not None:  # the encoder output of the no-grad pass must not be reused
                inputs["encoder_hidden"], inputs["encoder_mask"] = drafter.encode(sources.to(device))
        loss = drafter(**inputs, labels=labels.to(device), label_smoothing=label_smoothing).loss
        optimizer.zero_grad(set_to_none=True)
        if torch.isfinite(loss):  # a batch whose glancing revealed every label has no loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(drafter.parameters(), clip_norm)
            optimizer.step()
        schedule.step()
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}" if math.isfinite(loss.item()) else "-",
                        lr=f"{schedule.get_last_lr()[0]:.2e}")
        if out is not None and checkpoint_every and (step + 1) % checkpoint_every == 0 and step + 1 < steps:
            checkpoints.save_checkpoint(out, step + 1, drafter, {
                "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(),
                "rng": checkpoints.rng_state(generator)}, keep_checkpoints)
    bar.close()
    drafter.eval()
    if out is not None:
        drafter.save_pretrained(out)
    target.train(target_was_training)
    return drafter


def load_or_distill(target, texts, tokenizer, out: Path | None, prompt_length: int, continuation_length: int,
                    max_prompts: int | None, batch_size: int, progress: bool) -> DistillData:
    """The distillation data: read back from output_dir when a run already made it, else the
    target's greedy continuations (saved to output_dir)."""
    if out is not None and (out / DISTILL_FILE).is_file():
        return DistillData(**torch.load(out / DISTILL_FILE, weights_only=False))
    prompts = token_chunks(texts, tokenizer, prompt_length, max_prompts)
    with tqdm(total=prompts.shape[0], desc="distilling (target greedy)", disable=not progress) as bar:
        data = greedy_continuations(target, prompts, continuation_length, batch_size=batch_size, progress=bar)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        torch.save(data.state(), out / DISTILL_FILE)
    return data
