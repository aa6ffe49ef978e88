"""Host side of the chain sampling launches (`rejection_sampling`, `block_verification` and their
logits ops).

The chain kernel (a program per batch row) and the block kernel (a program per position) take
the same arguments in the same order, so one launcher plans and launches either: only the kernel,
its programs on grid x and its ticket counters (taken by the kernel's module, where the tests
watch them) differ. The logits ops run the softmax statistics first and then the same launch.
"""

import torch
import triton

from ._launch import chain_outputs, device_scope, grid_x_refusal, randomness_mode, temperature_args
from ._philox import UNIFORMS
from ._softmax_stats import launch_softmax_stats
from ._split_plans import (BLOCK_V, MAX_TILES, MIN_TILES, STATS_MAX_SPLITS, STATS_TILES, TARGET_PROGRAMS,
                           most_sampling_splits, sampling_plan)


def _optional(tensor, placeholder: torch.Tensor, *dims: int) -> tuple:
    """(pointer, strides along dims) of an optional input: `placeholder` (any tensor on the device,
    never read because the input's flag is off) and zero strides when it is None."""
    if tensor is None:
        return (placeholder, *(0 for _ in dims))
    return (tensor, *(tensor.stride(d) for d in dims))


def launch_split_v(kernel, programs: int, tickets: torch.Tensor, target, draft, draft_tokens, out_tokens,
                   num_accepted, *, uniforms=None, seed=None, offsets=None, num_draft_tokens=None, temperature=1.0,
                   stats=None, block_v: int = BLOCK_V, min_tiles: int = MIN_TILES, max_tiles: int = MAX_TILES,
                   target_programs: int = TARGET_PROGRAMS, kernel_args: dict | None = None) -> None:
    """Launch `kernel` (B >= 1) on grid (programs, V-splits), the split plan made for `programs`
    rows. `stats` = (part_max, part_sum) [B * (2g + 1), splits] float32 softmax statistics when
    target/draft hold logits (LOGITS), else None. `kernel_args`: keyword arguments of one kernel's
    own trailing parameters (the chain kernel's optional per-draft output)."""
    batch, g = draft_tokens.shape
    vocab = target.shape[-1]
    block_v, tiles, num_splits = sampling_plan(programs, vocab, block_v, min_tiles, max_tiles, target_programs)
    # the plan follows B, so the chunk length and split count are runtime ints and BLOCK_S covers the most
    # splits V can have (at B = 1): nothing recompiles as rows finish (tests/test_triton_recompiles.py)
    most_splits = most_sampling_splits(vocab, block_v, min_tiles, max_tiles, target_programs)
    mode, seed_int, seeds = randomness_mode(uniforms, seed)
    placeholder = draft_tokens  # any tensor on the device; never read when its flag is off
    if g == 0:
        draft = target  # [B, 0, V] has nothing to read; keep a valid pointer
    logits = stats is not None
    part_max, part_sum = stats if logits else (placeholder, placeholder)
    stat_splits = part_max.shape[1] if logits else 1
    per_row_temp, temps_t, temp_value, stride_temp = temperature_args(temperature, placeholder)
    uniforms_t, stride_ub, stride_up = _optional(uniforms, placeholder, 0, 1)
    seeds_t, stride_s = _optional(seeds, placeholder, 0)
    offsets_t, stride_o = _optional(offsets, placeholder, 0)
    counts_t, stride_c = _optional(num_draft_tokens, placeholder, 0)
    chunk_totals = torch.empty(programs, num_splits, 2, dtype=torch.int64, device=draft_tokens.device)  # (residual, p)
    with device_scope(draft_tokens.device):
        kernel[(programs, num_splits)](
            target, draft, draft_tokens, uniforms_t, seeds_t, offsets_t, counts_t, temps_t, part_max, part_sum,
            chunk_totals, tickets, out_tokens, num_accepted,
            temp_value, seed_int, g, vocab, num_splits, tiles, stat_splits, batch * (g + 1),
            target.stride(0), target.stride(1), draft.stride(0), draft.stride(1),
            draft_tokens.stride(0), draft_tokens.stride(1), stride_ub, stride_up, stride_s, stride_o, stride_c,
            stride_temp, out_tokens.stride(0),
            RANDOM=mode, HAS_OFFSETS=offsets is not None and mode != UNIFORMS.value,
            HAS_COUNTS=num_draft_tokens is not None, LOGITS=logits, PER_ROW_TEMP=per_row_temp,
            BLOCK_G=max(2, triton.next_power_of_2(g + 1)), BLOCK_V=block_v,
            BLOCK_S=max(2, triton.next_power_of_2(most_splits)), BLOCK_SS=max(2, triton.next_power_of_2(stat_splits)),
            **(kernel_args or {}))


def launch_on_probs(launch, target_probs, draft_probs, draft_tokens, **options) -> tuple:
    """(output_tokens, num_accepted) of a probabilities op: `launch` (launch_chain or launch_block)
    with `options` (randomness, ragged rows, the split plan), skipped for an empty batch."""
    out_tokens, num_accepted = chain_outputs(draft_tokens)
    if draft_tokens.shape[0]:
        launch(target_probs, draft_probs, draft_tokens, out_tokens, num_accepted, **options)
    return out_tokens, num_accepted


def launch_on_logits(launch, target_logits, draft_logits, draft_tokens, *, temperature=1.0, num_draft_tokens=None,
                     stats_block_v: int = BLOCK_V, tiles_per_program: int = STATS_TILES,
                     max_splits: int = STATS_MAX_SPLITS, **options) -> tuple:
    """(output_tokens, num_accepted) of a logits op: the softmax statistics (stats_block_v,
    tiles_per_program and max_splits plan them), then `launch` on them with `options`."""
    out_tokens, num_accepted = chain_outputs(draft_tokens)
    if draft_tokens.shape[0] == 0:
        return out_tokens, num_accepted
    stats = launch_softmax_stats(target_logits, draft_logits, draft_tokens, num_draft_tokens, temperature,
                                 block_v=stats_block_v, tiles_per_program=tiles_per_program, max_splits=max_splits)
    launch(target_logits, draft_logits, draft_tokens, out_tokens, num_accepted, num_draft_tokens=num_draft_tokens,
           temperature=temperature, stats=stats, **options)
    return out_tokens, num_accepted


def logits_launch_limits(sizes: dict) -> str | None:
    """The registry's `limits` of a logits op: the statistics launch has a program per target and
    draft row, B * (2g + 1)."""
    return grid_x_refusal(sizes["B"] * (2 * sizes["G"] + 1), "B * (2g + 1)")
