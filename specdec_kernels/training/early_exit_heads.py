"""`train_early_exit_heads`: PPD's per-layer ("Y") early-exit heads, distilled from the final layer.

Each head (a norm + LM head, initialised as a copy of the model's final norm + LM head) learns
to reproduce the final layer's next-token distribution from the hidden state after its layer:
loss = KL(p_final || p_head) averaged over tokens, summed over layers. The model is frozen (its
forward runs under no_grad; only the heads get gradients). The paper trains with cross-entropy
on ShareGPT (AdamW, lr 2e-5, 3 epochs, warm-up 4%, no weight decay); distilling the final
distribution is the same objective with soft labels, and needs only plain text.
"""

from pathlib import Path

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..models.early_exit_head import EarlyExitHead, EarlyExitHeads
from . import checkpoints
from .distill import token_chunks

OP = "train_early_exit_heads"


def check_layers(model, layers) -> list[int]:
    depth = model.config.num_hidden_layers
    layers = sorted({int(layer) for layer in layers})
    if not layers or not all(1 <= layer < depth for layer in layers):
        raise ValueError(f"{OP}: layers must be a non-empty list in [1, {depth - 1}] (got {layers})")
    return layers


@torch.no_grad()
def teacher(model, input_ids: Tensor, layers: list[int]) -> tuple[dict, Tensor]:
    """({layer: hidden [B, L, H]}, final log-probabilities [B, L, V] float32) of the frozen model."""
    out = model(input_ids, output_hidden_states=True)
    return {layer: out.hidden_states[layer] for layer in layers}, torch.log_softmax(out.logits.float(), dim=-1)


def kl_to_final(head: EarlyExitHead, hidden: Tensor, final_logprobs: Tensor) -> Tensor:
    """Mean over tokens of KL(p_final || p_head)."""
    logprobs = torch.log_softmax(head(hidden), dim=-1)
    return (final_logprobs.exp() * (final_logprobs - logprobs)).sum(-1).mean()


@torch.no_grad()
def early_exit_kl(model, heads, layers, input_ids: Tensor, *, batch_size: int = 16) -> dict[int, float]:
    """Held-out KL(p_final || p_head) per layer; heads: EarlyExitHeads, or None for the "N" head."""
    layers = check_layers(model, layers)
    device = next(model.parameters()).device
    plain = EarlyExitHead.from_model(model) if heads is None else None
    totals = dict.fromkeys(layers, 0.0)
    count = 0
    for start in range(0, input_ids.shape[0], batch_size):
        batch = input_ids[start:start + batch_size].to(device)
        hidden, final = teacher(model, batch, layers)
        for layer in layers:
            head = plain if heads is None else heads[layer]
            totals[layer] += kl_to_final(head, hidden[layer], final).item() * batch.shape[0]
        count += batch.shape[0]
    return {layer: total / count for layer, total in totals.items()}


def train_early_exit_heads(model, layers, texts, *, tokenizer=None, heads: EarlyExitHeads | None = None,
                           steps: int = 500, batch_size: int = 8, sequence_length: int = 64,
                           learning_rate: float = 1e-3, warmup_ratio: float = 0.04, weight_decay: float = 0.0,
                           clip_norm: float = 1.0, max_sequences: int | None = 4096, output_dir=None,
                           checkpoint_every: int = 0, keep_checkpoints: int = 2, resume: bool = False,
                           seed: int = 0, progress: bool = True) -> EarlyExitHeads:
    """Train one early-exit head per layer in `layers` for `model` (frozen).

    Args:
        model: HF decoder-only model (Llama/Mistral/Qwen2/Qwen3/GPT-2 families).
        layers: exit layers (HF output_hidden_states numbering, 1 <= layer < num_hidden_layers).
        texts: strings (needs `tokenizer`) or token-id sequences; cut into [M, sequence_length]
            chunks (at most max_sequences).
        heads: continue training these; default: copies of the model's final norm + LM head.
        steps: optimisation steps of AdamW (batch_size rows each, learning_rate after a linear
            warm-up over warmup_ratio * steps, then a linear decay; weight_decay, clip_norm).
        output_dir: checkpoints (checkpoint-<step>/) and the final heads (save_pretrained);
            checkpoint_every: steps between checkpoints (0: none); resume: continue from the
            newest checkpoint in output_dir.
        seed: batch order; progress: tqdm bar.

    Returns:
        EarlyExitHeads (eval mode, on the model's device); load again with
        EarlyExitHeads.from_pretrained(output_dir).
    """
    layers = check_layers(model, layers)
    device = next(model.parameters()).device
    data = token_chunks(texts, tokenizer, sequence_length, max_sequences)
    if heads is None:
        heads = EarlyExitHeads({layer: EarlyExitHead.from_model(model, copy=True) for layer in layers})
    missing = [layer for layer in layers if layer not in heads]
    if missing:
        raise ValueError(f"{OP}: `heads` has no head for layers {missing}")
    heads = heads.to(device=device, dtype=torch.float32).train()
    parameters = [p for layer in layers for p in heads[layer].parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=learning_rate, weight_decay=weight_decay)
    warmup = max(int(warmup_ratio * steps), 1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / warmup if s < warmup else max(steps - s, 0) / max(steps - warmup, 1))
    generator = torch.Generator().manual_seed(seed)
    step = 0
    saved = checkpoints.latest_checkpoint(output_dir) if resume else None
    if saved is not None:
        heads.load_state_dict(EarlyExitHeads.from_pretrained(saved).state_dict())
        state = checkpoints.load_state(saved)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        checkpoints.set_rng_state(state["rng"], generator)
        step = state["step"]
    bar = tqdm(total=steps, initial=step, desc=OP, disable=not progress)
    while step < steps:
        rows = torch.randint(0, data.shape[0], (batch_size,), generator=generator)
        hidden, final = teacher(model, data[rows].to(device), layers)
        loss = sum(kl_to_final(heads[layer], hidden[layer].float(), final) for layer in layers)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, clip_norm)
        optimizer.step()
        scheduler.step()
        step += 1
        bar.update(1)
        bar.set_postfix(kl=f"{loss.item() / len(layers):.4f}")
        if output_dir is not None and checkpoint_every and step % checkpoint_every == 0 and step < steps:
            checkpoints.save_checkpoint(output_dir, step, heads, {
                "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "rng": checkpoints.rng_state(generator)}, keep_checkpoints)
    bar.close()
    heads.eval()
    if output_dir is not None:
        heads.save_pretrained(Path(output_dir))
    return heads
