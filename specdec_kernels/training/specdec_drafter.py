"""`train_specdec_drafter`: train SpecDec's block-parallel drafter on a target model and plain text.

Sequence-level distillation (the target's greedy continuations are the labels), a random prefix per
example, dense blocks, GLAT glancing and a cosine schedule: the recipe is in docs/strategies/specdec.md.
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
    2 decoder layers of width-64 heads, plus a 4-layer encoder for seq2seq targets (deep encoder,
    shallow decoder);
    rotary (relative) positions in the decoder, so prefix lengths unseen in training still work."""
    vocab = target.get_output_embeddings().weight.shape[0]
    hidden = target.get_input_embeddings().weight.shape[1]
    # heads of width 64 (at least 1): narrow heads (width 4 at hidden 32) barely tell positions apart
    heads = max(h for h in range(1, max(hidden // 64, 1) + 1) if hidden % h == 0)
    seq2seq = bool(getattr(target.config, "is_encoder_decoder", False))
    settings = dict(vocab_size=vocab, hidden_size=hidden, num_attention_heads=heads, intermediate_size=4 * hidden,
                    num_layers=2, encoder_layers=4 if seq2seq else 0,
                    max_position_embeddings=max(2048, max_length), max_source_positions=max(1024, max_length),
                    block_size=block_size, position_encoding="rope")
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


def left_aligned(rows: Tensor, shift: Tensor) -> Tensor:
    """rows [B, W] with row b moved shift[b] places to the left (the tail repeats the last column)."""
    index = (torch.arange(rows.shape[1]).unsqueeze(0) + shift.unsqueeze(1)).clamp(max=rows.shape[1] - 1)
    return rows.gather(1, index)


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
    head_lengths = (heads != IGNORE).sum(1)  # prompts cut short (dense recipe) are left-padded with IGNORE
    lengths = head_lengths + prefix
    width = int(lengths.max())
    full = left_aligned(torch.cat([heads, conts], 1), heads.shape[1] - head_lengths).clamp(min=0)
    j = torch.arange(width).unsqueeze(0)
    input_ids = torch.where(j < lengths.unsqueeze(1), full[:, :width], 0)
    steps = prefix.unsqueeze(1) + torch.arange(block_size).unsqueeze(0)
    padded = torch.nn.functional.pad(conts, (0, block_size), value=IGNORE)
    labels = padded.gather(1, steps)
    return input_ids, lengths, labels, sources


def sample_sequences(data: DistillData, batch_size: int, block_size: int, generator: torch.Generator):
    """Dense form: (input_ids [B, N] right-padded prompt + continuation (seq2seq: start token +
    continuation), lengths [B], anchors [B, L] prefix length of the block after each continuation
    prefix p in [0, L-1] (-1 past the continuation's real tokens), labels [B, L, k], sources)."""
    rows = torch.randint(0, data.prompts.shape[0], (batch_size,), generator=generator)
    conts = data.continuations[rows]
    width = conts.shape[1]
    real = (conts != IGNORE).sum(1)
    if data.start_token is None:
        heads, sources = data.prompts[rows], None
    else:
        heads, sources = torch.full((batch_size, 1), data.start_token, dtype=torch.int64), data.prompts[rows]
    head_lengths = (heads != IGNORE).sum(1)  # prompts cut short are left-padded with IGNORE
    full = torch.cat([heads, conts], 1)
    input_ids = left_aligned(full, heads.shape[1] - head_lengths).clamp(min=0)
    lengths = head_lengths + real
    input_ids = input_ids.masked_fill(torch.arange(full.shape[1]).unsqueeze(0) >= lengths.unsqueeze(1), 0)
    input_ids = input_ids[:, :int(lengths.max())]
    p = torch.arange(width).unsqueeze(0)
    anchors = torch.where(p < real.unsqueeze(1), head_lengths.unsqueeze(1) + p, -1)
    steps = p.unsqueeze(-1) + torch.arange(block_size).view(1, 1, -1)  # [1, L, k]
    padded = torch.nn.functional.pad(conts, (0, block_size), value=IGNORE)
    labels = padded.gather(1, steps.expand(batch_size, -1, -1).flatten(1)).view(batch_size, width, block_size)
    labels = labels.masked_fill(anchors.unsqueeze(-1) < 0, IGNORE)
    return input_ids, lengths, anchors, labels, sources


def glance_blocks(model: SpecDecDrafter, inputs: dict, labels: Tensor, ratio: float, generator: torch.Generator):
    """GLAT in the dense form: per block, reveal (wrong * ratio) random labelled positions;
    (block_ids [B, A, k], labels still masked)."""
    with torch.no_grad():
        predicted = model.forward_blocks(**inputs).logits.argmax(-1).cpu()
    b, a, k = labels.shape
    flat = labels.reshape(b * a, k)
    labelled = flat != IGNORE
    wrong = ((predicted.reshape(b * a, k) != flat) & labelled).sum(1)
    reveal_count = (wrong.float() * ratio).floor().long()
    scores = torch.rand(flat.shape, generator=generator).masked_fill(~labelled, 2.0)
    reveal = scores.argsort(1).argsort(1) < reveal_count.unsqueeze(1)
    block_ids = torch.where(reveal, flat, model.config.mask_token_id)
    return block_ids.view(b, a, k), flat.masked_fill(reveal, IGNORE).view(b, a, k)


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
                          continuation_length: int = 64, max_prompts: int | str | None = "auto", output_dir=None,
                          checkpoint_every: int = 0, keep_checkpoints: int = 2, resume: bool = False,
                          seed: int = 0, progress: bool = True, distill_batch_size: int = 32,
                          dense: bool = True, schedule: str = "cosine",
                          min_prompt_length: int | None = None) -> SpecDecDrafter:
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
            the optimisation (AdamW (0.9, 0.999, eps 1e-6), clip by norm, label-smoothed cross-entropy).
        glancing, glance_ratio: GLAT on/off and its (start, end) ratio.
        schedule: "cosine" (warm-up, then cosine to 10% of learning_rate at `steps`) or
            "inverse_sqrt" (warm-up, then sqrt(warmup / step)).
        dense: every continuation prefix of a row is a block in one forward
            (SpecDecDrafter.forward_blocks); False: one random block per row (the official code's sampling).
        continuation_length: greedy tokens generated per prompt.
        max_prompts: how many prompts are distilled: "auto" (the default) = steps * batch_size, so
            each training row is a fresh prompt (a drafter that sees its prompts many times learns
            them by heart: 2048 prompts over 1200 steps gave 0.72 first-position accuracy on them and
            0.38 on held-out text); an int caps the prompts; None takes every prompt of the texts.
        min_prompt_length: dense form, decoder-only targets: prompts are cut to lengths uniform in
            [min_prompt_length, prompt_length] (default prompt_length // 8, at least 1), so the
            first blocks after the short prompts the strategy meets are trained too.
        output_dir: checkpoints (checkpoint-<step>/), the distillation data (reused on resume)
            and the final drafter (save_pretrained). checkpoint_every: steps between checkpoints
            (0: none). resume: continue from the newest checkpoint in output_dir.
        seed: batches, glancing and initialisation; a resumed run replays the same stream.
        progress: tqdm progress bars (distillation, training).

    Returns:
        the trained SpecDecDrafter (eval mode, on the target's device).
    """
    max_prompts = _checked_options(schedule, block_size, steps, batch_size, max_prompts, resume, output_dir)
    if min_prompt_length is None:
        min_prompt_length = max(1, prompt_length // 8)
    device = next(target.parameters()).device
    out = Path(output_dir) if output_dir is not None else None
    checkpoint = checkpoints.latest_checkpoint(out) if resume else None
    target_was_training = target.training
    target.eval()

    data = load_or_distill(target, texts, tokenizer, out, prompt_length, continuation_length, max_prompts,
                           distill_batch_size, progress, min_prompt_length if dense else None, seed)
    torch.manual_seed(seed)
    drafter = _starting_drafter(target, drafter, checkpoint, drafter_config, block_size,
                                prompt_length + continuation_length + 1).to(device).train()

    optimizer, scheduler = _optimization(drafter, learning_rate, weight_decay, warmup_steps, steps, schedule)
    generator = torch.Generator().manual_seed(seed)
    first = 0 if checkpoint is None else _resume(checkpoint, optimizer, scheduler, generator)

    bar = tqdm(total=steps, initial=first, desc="specdec drafter", disable=not progress)
    for step in range(first, steps):
        ratio = glance_ratio[0] - (glance_ratio[0] - glance_ratio[1]) * min(1.0, step / max(steps, 1))
        loss = (dense_loss if dense else block_loss)(drafter, data, batch_size, block_size, generator, device,
                                                     glancing, ratio, label_smoothing)
        _update(drafter, loss, optimizer, scheduler, clip_norm)
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}" if math.isfinite(loss.item()) else "-",
                        lr=f"{scheduler.get_last_lr()[0]:.2e}")
        if out is not None and checkpoint_every and (step + 1) % checkpoint_every == 0 and step + 1 < steps:
            _save(out, step + 1, drafter, optimizer, scheduler, generator, keep_checkpoints)
    bar.close()
    drafter.eval()
    if out is not None:
        drafter.save_pretrained(out)
    target.train(target_was_training)
    return drafter


def _starting_drafter(target, drafter, checkpoint, drafter_config, block_size, positions):
    """The drafter training starts from: a checkpoint's, the caller's, or a new one (embeddings copied from
    the target where the widths match)."""
    if checkpoint is not None:
        return SpecDecDrafter.from_pretrained(checkpoint)
    if drafter is None:
        drafter = SpecDecDrafter(default_drafter_config(target, block_size, positions, **(drafter_config or {})))
        copy_target_embeddings(drafter, target)
    return drafter


def _checked_options(schedule, block_size, steps, batch_size, max_prompts, resume, output_dir):
    """train_specdec_drafter's option checks; returns max_prompts with "auto" resolved."""
    if schedule not in ("cosine", "inverse_sqrt"):
        raise ValueError(f"{OP}: schedule must be 'cosine' or 'inverse_sqrt' (got {schedule!r})")
    if block_size < 1 or steps < 0 or batch_size < 1:
        raise ValueError(f"{OP}: block_size and batch_size must be >= 1 and steps >= 0 "
                         f"(got {block_size}, {batch_size}, {steps})")
    if not (max_prompts is None or max_prompts == "auto" or (isinstance(max_prompts, int) and max_prompts >= 1)):
        raise ValueError(f"{OP}: max_prompts must be 'auto', a positive int or None (got {max_prompts!r})")
    if max_prompts == "auto":
        max_prompts = max(steps * batch_size, 1)
    if resume and output_dir is None:
        raise ValueError(f"{OP}: resume=True needs output_dir (where the checkpoints are)")
    return max_prompts


def _optimization(drafter, learning_rate, weight_decay, warmup_steps, steps, schedule):
    """AdamW (no decay on biases and norms) and the learning-rate schedule."""
    decay = [p for n, p in drafter.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in drafter.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=learning_rate, betas=(0.9, 0.999), eps=1e-6)
    factor = (cosine_schedule(warmup_steps, steps) if schedule == "cosine"
              else checkpoints.inverse_sqrt_schedule(warmup_steps))
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _resume(checkpoint, optimizer, scheduler, generator) -> int:
    """Load a checkpoint's optimiser, schedule and batch stream; returns its step."""
    state = checkpoints.load_state(checkpoint)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["schedule"])
    checkpoints.set_rng_state(state["rng"], generator)
    return state["step"]


def _save(out, step, drafter, optimizer, scheduler, generator, keep) -> None:
    """A checkpoint to resume from: the drafter, the optimiser, the schedule and the batch stream."""
    checkpoints.save_checkpoint(out, step, drafter, {
        "optimizer": optimizer.state_dict(), "schedule": scheduler.state_dict(),
        "rng": checkpoints.rng_state(generator)}, keep)


def _update(drafter, loss, optimizer, scheduler, clip_norm) -> None:
    """One optimiser step (skipped for a batch whose glancing revealed every label: no loss), then the schedule's."""
    optimizer.zero_grad(set_to_none=True)
    if torch.isfinite(loss):
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), clip_norm)
        optimizer.step()
    scheduler.step()


def cosine_schedule(warmup_steps: int, steps: int):
    """lr factor: linear warm-up to 1 over warmup_steps, then a cosine decay to 0.1 at `steps`."""
    warmup = max(int(warmup_steps), 1)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(steps - warmup, 1))))
    return factor


def dense_loss(drafter, data, batch_size, block_size, generator, device, glancing, ratio, label_smoothing):
    input_ids, lengths, anchors, labels, sources = sample_sequences(data, batch_size, block_size, generator)
    inputs = {"input_ids": input_ids.to(device), "lengths": lengths.to(device), "anchors": anchors.to(device),
              "block_ids": torch.full(labels.shape, drafter.config.mask_token_id, dtype=torch.int64, device=device)}
    return _batch_loss(drafter, drafter.forward_blocks, glance_blocks, inputs, labels, sources, generator, device,
                       glancing, ratio, label_smoothing)


def block_loss(drafter, data, batch_size, block_size, generator, device, glancing, ratio, label_smoothing):
    input_ids, lengths, labels, sources = sample_batch(data, batch_size, block_size, generator)
    inputs = {"input_ids": input_ids.to(device), "num_new": lengths.to(device), "block_size": block_size}
    return _batch_loss(drafter, drafter, glance, inputs, labels, sources, generator, device, glancing, ratio,
                       label_smoothing)


def _batch_loss(drafter, forward, glance_with, inputs, labels, sources, generator, device, glancing, ratio,
                label_smoothing):
    """The loss of `forward` (the dense or the block pass) on `inputs`, with the encoder's output of the
    seq2seq sources, if any, and with glancing the block ids `glance_with` revealed."""
    if sources is not None:
        inputs["encoder_hidden"], inputs["encoder_mask"] = drafter.encode(sources.to(device))
    if glancing:
        block_ids, labels = glance_with(drafter, inputs, labels, ratio, generator)
        inputs["block_ids"] = block_ids.to(device)
        if sources is not None:  # the encoder output of the no-grad pass must not be reused
            inputs["encoder_hidden"], inputs["encoder_mask"] = drafter.encode(sources.to(device))
    return forward(**inputs, labels=labels.to(device), label_smoothing=label_smoothing).loss


def load_or_distill(target, texts, tokenizer, out: Path | None, prompt_length: int, continuation_length: int,
                    max_prompts: int | None, batch_size: int, progress: bool,
                    min_prompt_length: int | None = None, seed: int = 0) -> DistillData:
    """The distillation data: read back from output_dir when a run already made it, else the
    target's greedy continuations (saved to output_dir). Decoder-only targets with
    min_prompt_length < prompt_length: row i's prompt keeps its last l_i tokens, l_i uniform in
    [min_prompt_length, prompt_length] (the continuation is the target's greedy output after
    exactly those tokens), stored left-padded with IGNORE, so the drafter also learns the first
    blocks after short prompts."""
    if out is not None and (out / DISTILL_FILE).is_file():
        return DistillData(**torch.load(out / DISTILL_FILE, weights_only=False))
    prompts = token_chunks(texts, tokenizer, prompt_length, max_prompts)
    seq2seq = bool(getattr(target.config, "is_encoder_decoder", False))
    shortest = prompt_length if min_prompt_length is None or seq2seq else max(1, min(min_prompt_length, prompt_length))
    with tqdm(total=prompts.shape[0], desc="distilling (target greedy)", disable=not progress) as bar:
        if shortest == prompt_length:
            data = greedy_continuations(target, prompts, continuation_length, batch_size=batch_size, progress=bar)
        else:
            generator = torch.Generator().manual_seed(seed)
            lengths = torch.randint(shortest, prompt_length + 1, (prompts.shape[0],), generator=generator)
            conts = torch.full((prompts.shape[0], continuation_length), IGNORE, dtype=torch.int64)
            for length in lengths.unique().tolist():
                rows = torch.nonzero(lengths == length).flatten()
                part = greedy_continuations(target, prompts[rows, prompt_length - length:], continuation_length,
                                            batch_size=batch_size, progress=bar)
                conts[rows] = part.continuations
            kept = torch.arange(prompt_length).unsqueeze(0) >= (prompt_length - lengths).unsqueeze(1)
            data = DistillData(prompts.masked_fill(~kept, IGNORE), conts, None)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        torch.save(data.state(), out / DISTILL_FILE)
    return data
