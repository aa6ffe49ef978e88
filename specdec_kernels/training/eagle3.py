"""Training an EAGLE-3 head (specdec_kernels.models.Eagle3Drafter) on a target's own hidden states, with
EAGLE-3's training-time test: the head is unrolled `ttt_steps` times over each chunk, step j reading the
states step j - 1 produced (shifted one position right), as drafting feeds them at inference.

Step j at position t reads (state, token x_{t+1}) and is trained toward the target's next-token distribution
at position t + 1 (KL), for every j: at inference the j-th draft past the last committed position sits at
that position with that token when the drafts before it were right. Its attention sees what the draft's
would: step 0's entries at positions <= t - j (the committed ones) and step i's entry at t - j + i (the drafts
before it, i <= j).
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from ..models.eagle3 import Eagle3Drafter, head_config
from .specdec_drafter import cosine_schedule


def new_head(target, *, aux_layers: tuple, draft_ids: Tensor) -> Eagle3Drafter:
    """A fresh head for a Llama-like `target`, as wide as the target, over the target ids `draft_ids`
    (sorted, [draft_vocab]); its final norm and LM head start as the target's (their draft-vocab rows)."""
    text = target.config.get_text_config()
    keys = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "rms_norm_eps", "max_position_embeddings", "hidden_act", "vocab_size")
    config = {key: getattr(text, key) for key in keys if getattr(text, key, None) is not None}
    config["rope_parameters"] = getattr(text, "rope_parameters", None)
    head = Eagle3Drafter(head_config(config), target_hidden=text.hidden_size, aux_layers=aux_layers,
                         draft_vocab=draft_ids.numel(), embed_tokens=target.get_input_embeddings())
    with torch.no_grad():
        head.d2t.copy_(draft_ids - torch.arange(draft_ids.numel()))
        head.lm_head.weight.copy_(target.get_output_embeddings().weight[draft_ids])
        head.norm.weight.copy_(target.get_decoder().norm.weight)
    return head.to(target.get_output_embeddings().weight.device)


def frequent_ids(chunks: Tensor, count: int) -> Tensor:
    """The `count` most frequent ids of chunks, sorted (EAGLE-3's reduced draft vocabulary)."""
    frequency = torch.bincount(chunks.flatten())
    return torch.sort(torch.topk(frequency, min(count, frequency.numel())).indices).values


class _StepKeys:
    """The keys and values of the unrolled steps so far: the attention module's cache for one chunk."""

    def __init__(self):
        self.keys = self.values = None

    def update(self, keys, values, layer_idx, *args, **kwargs):
        self.keys = keys if self.keys is None else torch.cat([self.keys, keys], dim=2)
        self.values = values if self.values is None else torch.cat([self.values, values], dim=2)
        return self.keys, self.values


def ttt_mask(length: int, step: int, device) -> Tensor:
    """bool [1, 1, T, (step + 1) T]: what step `step`'s query at position t sees (module docstring)."""
    t = torch.arange(length, device=device).view(-1, 1)
    s = torch.arange(length, device=device).view(1, -1)
    blocks = [s <= t - step] + [s == t - step + i for i in range(1, step + 1)]
    return torch.cat(blocks, dim=1).view(1, 1, length, -1)


@torch.no_grad()
def target_pass(target, rows: Tensor, layers: tuple) -> tuple[list, Tensor]:
    """The target's states entering `layers` (aux ids; the output of layer i - 1) and its log-probabilities."""
    decoder_layers, kept = target.get_decoder().layers, {}
    hooks = [decoder_layers[i - 1].register_forward_hook(
        lambda module, args, out, i=i: kept.__setitem__(i, out[0] if isinstance(out, tuple) else out)) for i in layers]
    try:
        logprobs = target(rows).logits.float().log_softmax(-1)
    finally:
        for hook in hooks:
            hook.remove()
    return [kept[i] for i in layers], logprobs


def ttt_loss(head: Eagle3Drafter, states: list, rows: Tensor, logprobs: Tensor, ttt_steps: int) -> Tensor:
    """Mean over steps (weights 0.8^j, as EAGLE-3 decays later steps) of KL(target || head) at every position."""
    length = rows.shape[1] - 1  # position t reads x_{t+1}: the last position has no token to its right
    state = head.combine([s[:, :length] for s in states])
    tokens, positions = rows[:, 1:], torch.arange(length, device=rows.device).expand(rows.shape[0], -1)
    keys, total, weights = _StepKeys(), 0.0, 0.0
    draft_ids = head.target_ids(torch.arange(head.draft_vocab, device=rows.device))  # the draft vocabulary's target ids
    for step in range(ttt_steps):
        out = head(state, tokens, positions, cache=keys, attention_mask=ttt_mask(length, step, rows.device))
        valid = slice(step, length)  # t >= step: a chain of `step` drafts stands behind position t
        draft = head.draft_logits(out[:, valid]).float().log_softmax(-1)
        # the target's law at t + 1, restricted to the draft vocabulary (mass off it is unreachable)
        target = logprobs[:, step + 1:length + 1].index_select(-1, draft_ids)
        loss = F.kl_div(draft.flatten(0, 1), target.log_softmax(-1).flatten(0, 1), log_target=True,
                        reduction="batchmean")
        total, weights = total + 0.8 ** step * loss, weights + 0.8 ** step
        state = torch.cat([state[:, :1], out[:, :-1]], dim=1)  # step j + 1 at t reads step j's out at t - 1
    return total / weights


def train_eagle3_head(head: Eagle3Drafter, target, chunks: Tensor, *, steps: int, batch: int, lr: float = 2e-3,
                      ttt_steps: int = 3, seed: int = 0, progress=None) -> float:
    """AdamW on random rows of chunks [M, L] (token ids) against the target's distributions; returns the
    last step's loss. progress: an optional callable(step, loss)."""
    head.set_attn_implementation("sdpa")
    target.requires_grad_(False)  # the shared embedding stays the target's
    parameters = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    device = head.lm_head.weight.device
    head.train()
    loss = torch.tensor(float("nan"))
    factor = cosine_schedule(steps // 20, steps)
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr * factor(step)
        rows = chunks[torch.randint(0, chunks.shape[0], (batch,), generator=generator)].to(device)
        states, logprobs = target_pass(target, rows, head.aux_layers)
        loss = ttt_loss(head, states, rows, logprobs, ttt_steps)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        if progress is not None:
            progress(step, loss.item())
    head.eval()
    return loss.item()
