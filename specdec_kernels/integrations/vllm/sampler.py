"""vLLM V1's rejection-sampling functions re-implemented over `specdec_kernels.ops` (torch only).

Nothing here imports vLLM: the functions take vLLM's arguments (tensors, lists and its
`SamplingMetadata`, read by attribute) and are installed into
`vllm.v1.sample.rejection_sampler` by `specdec_kernels.integrations.vllm.register()`.

vLLM's layout: the drafts of all requests are flattened (`draft_token_ids [T]`, row b owns
`num_draft_tokens[b]` of them, ending at `cu_num_draft_tokens[b]`), `target_logits [T, V]` holds
the target's (processed) logits at each draft position, and the bonus token of every row was
already sampled by vLLM's own sampler (`bonus_token_ids [B, 1]`). The result is int32
`[B, max_spec_len + 1]`: accepted drafts, then the correction or bonus token, then -1.

What each function keeps of vLLM and what differs: docs/vllm.md.
"""

import json
import os
from typing import Optional

import torch
from torch import Tensor

from ... import ops

PLACEHOLDER_TOKEN_ID = -1  # vLLM's padding id in the output (checked against vLLM's at registration)
GREEDY_TEMPERATURE = 0  # vLLM marks greedy requests with temperature 0 (checked likewise)
_INT64 = torch.iinfo(torch.int64)

# What our ops did in this process (the proof, in tests, that the worker verified with them).
# block_rows: random rows verified by block verification (the rest of random_rows: token-wise).
STATS = {"calls": 0, "greedy_rows": 0, "random_rows": 0, "block_rows": 0, "draft_tokens": 0, "accepted_tokens": 0,
         "calls_with_drafts": 0, "one_hot_calls": 0, "seeded_rows": 0}
STATS_DIR_ENV = "SPECDEC_KERNELS_VLLM_STATS"
BACKEND_ENV = "SPECDEC_KERNELS_VLLM_BACKEND"
VERIFICATION_ENV = "SPECDEC_KERNELS_VLLM_VERIFICATION"
VERIFICATIONS = ("token", "block")  # the first is the default


def expand_batch_to_tokens(x: Tensor, cu_num_tokens: Tensor, num_tokens: int, replace_from: int = 0,
                           replace_to: int = 0) -> Tensor:
    """vLLM's `expand_batch_to_tokens`: [B] -> [num_tokens], x[b] repeated for each of row b's tokens.

    Replaces vLLM's version because its CPU kernel (vllm.utils.cpu_triton_utils._expand_kernel_impl,
    0.32.0) writes into an int64 temporary that is never copied back: the temperatures that
    `apply_sampling_constraints` divides the target logits by are uninitialised memory.
    """
    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1, dtype=torch.int64))
    expanded = torch.repeat_interleave(x, counts, output_size=num_tokens)
    if replace_from != replace_to:
        expanded = expanded.masked_fill(expanded == replace_from, replace_to)
    return expanded


def _backend() -> str:
    return os.environ.get(BACKEND_ENV, "auto")


def verification() -> str:
    """How random rows are verified, from SPECDEC_KERNELS_VLLM_VERIFICATION: "token" (unset or
    empty: the default; `ops.rejection_sample`, vLLM's own rule) or "block" (`ops.block_verify`,
    Sun et al.'s block verification: the same target distribution, at least as many accepted
    drafts in expectation). Any other value raises ValueError; `register()` calls this first, so
    a misspelt value stops vLLM at start-up instead of silently verifying token by token."""
    value = os.environ.get(VERIFICATION_ENV) or VERIFICATIONS[0]
    if value not in VERIFICATIONS:
        raise ValueError(f"{VERIFICATION_ENV}={value!r} is not one of {', '.join(VERIFICATIONS)} "
                         f"(default {VERIFICATIONS[0]})")
    return value


def _pack(draft_token_ids: Tensor, num_draft_tokens: list[int], max_spec_len: int, cu_num_draft_tokens: Tensor,
          vocab: int):
    """Flattened ragged drafts -> (flat index [B, g] into the T draft positions, valid [B, g],
    counts [B] int64, padded drafts [B, g] int64 with 0 in unused slots).

    A draft outside [0, V) becomes PLACEHOLDER_TOKEN_ID: vLLM pads drafts that structured output
    rejected with -1 (scheduler, async scheduler), and its kernels reject any negative draft;
    our ops reject -1 too (and would refuse other out-of-range ids), so every such draft is a
    rejected draft, never an index."""
    device = draft_token_ids.device
    counts = torch.tensor(num_draft_tokens, dtype=torch.int64).to(device, non_blocking=True)
    starts = cu_num_draft_tokens.to(torch.int64) - counts
    positions = torch.arange(max_spec_len, device=device)
    valid = positions.unsqueeze(0) < counts.unsqueeze(1)
    total = draft_token_ids.shape[0]
    flat = (starts.unsqueeze(1) + positions.unsqueeze(0)).clamp(0, max(total - 1, 0))
    if total == 0:
        drafts = torch.zeros(len(num_draft_tokens), max_spec_len, dtype=torch.int64, device=device)
    else:
        drafts = torch.where(valid, draft_token_ids.to(torch.int64)[flat], 0)
        drafts = drafts.masked_fill((drafts < 0) | (drafts >= vocab), PLACEHOLDER_TOKEN_ID)
    return flat, valid, counts, drafts


def _scores_with_bonus(rows: Optional[Tensor], flat: Tensor, valid: Tensor, counts: Tensor, bonus: Tensor,
                       vocab: int) -> Tensor:
    """[B, g+1, V] float32: rows[flat] at the draft positions, a one-hot of the bonus token at
    position n_b (our ops take the bonus from there), zeros elsewhere."""
    batch, g = flat.shape
    out = torch.zeros(batch, g + 1, vocab, dtype=torch.float32, device=bonus.device)
    if rows is not None and rows.shape[0] and g:
        out[:, :g] = torch.where(valid.unsqueeze(-1), rows.to(torch.float32)[flat], 0.0)
    bonus = bonus.to(torch.int64)
    in_vocab = (bonus >= 0) & (bonus < vocab)  # an id outside [0, V) never indexes (rejection_sample copies it)
    out[torch.arange(batch, device=bonus.device), counts, bonus.clamp(0, vocab - 1)] = in_vocab.to(torch.float32)
    return out


def _one_hot_drafts(drafts: Tensor, vocab: int) -> Tensor:
    """[B, g, V] float32 draft "distributions" of drafts without probabilities (n-gram, greedy
    drafting): a one-hot of each draft, and all zeros for a rejected (-1) draft. The zeros give
    vLLM's semantics: for a -1 draft its recovered token is drawn from the whole target p (its
    `sample_recovered_tokens_kernel` masks only `vocab_offset != draft_token_id`, i.e. nothing),
    and our residual max(0, p - 0) is p."""
    is_token = drafts >= 0
    q = torch.nn.functional.one_hot(drafts.clamp(min=0), vocab).to(torch.float32)
    return q * is_token.unsqueeze(-1)


def _request_seeds(batch: int, num_draft_tokens: list[int], generators: dict, device: torch.device) -> Tensor:
    """One Philox seed per row and step. A seeded request draws its seed from its own
    torch.Generator (so it advances the generator once per step and replays exactly with the same
    seed, whatever the batch around it); the others from torch's global generator. vLLM itself
    draws uniform_ coins and exponential_ noise from that generator instead, so the same seed
    gives other tokens than plain vLLM (and leaves the generator elsewhere)."""
    seeds = torch.randint(_INT64.min, _INT64.max, (batch,), dtype=torch.int64, device=device)
    for index, generator in generators.items():
        # Like vLLM, rows without drafts draw nothing: their generator stays where it was.
        if index < batch and num_draft_tokens[index] > 0:
            seeds[index] = torch.randint(_INT64.min, _INT64.max, (1,), dtype=torch.int64, generator=generator,
                                         device=generator.device).to(device)
    return seeds


def _record(num_draft_tokens: list[int], draft_probs, sampling_metadata, is_greedy, accepted: Tensor,
            block: bool) -> None:
    """Count what our ops did, only when SPECDEC_KERNELS_VLLM_STATS names a folder (the counts
    cost host syncs). One file per process: the engine's worker is not the test's process."""
    directory = os.environ.get(STATS_DIR_ENV)
    if not directory:
        return
    batch = len(num_draft_tokens)
    num_greedy = batch if is_greedy is True else (0 if is_greedy is False else int(is_greedy.sum()))
    for key, value in {"calls": 1, "greedy_rows": num_greedy, "random_rows": batch - num_greedy,
                       "block_rows": (batch - num_greedy) if block else 0,
                       "draft_tokens": int(sum(num_draft_tokens)), "calls_with_drafts": int(sum(num_draft_tokens) > 0),
                       # calls that had drafts but no draft probabilities (n-gram, greedy drafting)
                       "one_hot_calls": int(draft_probs is None and sum(num_draft_tokens) > 0),
                       "seeded_rows": len(sampling_metadata.generators),
                       "accepted_tokens": int(accepted.sum())}.items():
        STATS[key] += value
    path = os.path.join(directory, f"specdec_kernels_vllm.{os.getpid()}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(STATS, f)
    os.replace(path + ".tmp", path)


def rejection_sample(draft_token_ids: Tensor, num_draft_tokens: list[int], max_spec_len: int,
                     cu_num_draft_tokens: Tensor, draft_probs: Optional[Tensor], target_logits: Tensor,
                     bonus_token_ids: Tensor, sampling_metadata, synthetic_mode: bool = False,
                     synthetic_conditional_rates: Optional[Tensor] = None, use_fp64_gumbel: bool = False,
                     *, _vllm_original=None) -> Tensor:
    """vLLM's `rejection_sample` (vllm/v1/sample/rejection_sampler.py, 0.32) on our ops.

    Greedy rows (temperature 0) go through `ops.greedy_verify` on the target logits; random
    rows through `ops.rejection_sample` (or `ops.block_verify` with
    SPECDEC_KERNELS_VLLM_VERIFICATION=block) on softmax(target_logits), which vLLM has already
    divided by the temperature and masked with top-k/top-p (`apply_sampling_constraints`).
    Drafts without probabilities (n-gram) count as one-hot draft distributions, for both rules.
    Synthetic acceptance (a benchmarking mode that ignores the models) stays vLLM's own.

    A -1 draft (vLLM's padding for drafts that structured output rejected; any id outside
    [0, V) likewise) is a rejected draft, as in vLLM's Triton kernels: never accepted, the row
    stops there and emits the greedy row's argmax, or a random row's draw from norm(max(0, p - q))
    with draft probabilities and from p without them (vLLM masks only the draft's own id).
    Seeded rows are exact and reproducible, but their random stream is not vLLM's for the
    same seed (see `_request_seeds`).
    """
    if synthetic_mode:
        return _vllm_original(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                              target_logits, bonus_token_ids, sampling_metadata, synthetic_mode=synthetic_mode,
                              synthetic_conditional_rates=synthetic_conditional_rates,
                              use_fp64_gumbel=use_fp64_gumbel)
    batch = len(num_draft_tokens)
    vocab = target_logits.shape[-1]
    device = target_logits.device
    backend = _backend()
    block = verification() == "block"
    flat, valid, counts, drafts = _pack(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, vocab)
    bonus = bonus_token_ids.reshape(batch)
    all_greedy, all_random = bool(sampling_metadata.all_greedy), bool(sampling_metadata.all_random)
    is_greedy = None if all_greedy else (sampling_metadata.temperature == GREEDY_TEMPERATURE)

    greedy_out = random_out = None
    if not all_random:
        scores = _scores_with_bonus(target_logits, flat, valid, counts, bonus, vocab)
        greedy_out, greedy_accepted = ops.greedy_verify(scores, drafts, num_draft_tokens=counts, backend=backend)
    if not all_greedy:
        probs = target_logits.softmax(dim=-1, dtype=torch.float32)
        target_probs = _scores_with_bonus(probs, flat, valid, counts, bonus, vocab)
        if draft_probs is None:  # n-gram drafts: the draft "distribution" is the token itself
            q = _one_hot_drafts(drafts, vocab)
        else:
            q = torch.where(valid.unsqueeze(-1), draft_probs.to(torch.float32)[flat], 0.0)
        seeds = _request_seeds(batch, num_draft_tokens, sampling_metadata.generators, device)
        verify = ops.block_verify if block else ops.rejection_sample  # same layout, same seeds
        random_out, random_accepted = verify(target_probs, q, drafts, seed=seeds, num_draft_tokens=counts,
                                             backend=backend)

    if random_out is None:
        out, accepted = greedy_out, greedy_accepted
    elif greedy_out is None:
        out, accepted = random_out, random_accepted
    else:
        out = torch.where(is_greedy.unsqueeze(1), greedy_out, random_out)
        accepted = torch.where(is_greedy, greedy_accepted, random_accepted)
    # A row that accepted every draft ends with vLLM's bonus token, copied as vLLM's kernels copy
    # it (our ops emit the same id from its one-hot; this also covers an id outside [0, V)).
    all_accepted = (accepted == counts).unsqueeze(1)
    at_bonus = torch.arange(max_spec_len + 1, device=device).unsqueeze(0) == counts.unsqueeze(1)
    out = torch.where(all_accepted & at_bonus, bonus.to(out.dtype).unsqueeze(1), out)
    _record(num_draft_tokens, draft_probs, sampling_metadata,
            True if all_greedy else (False if all_random else is_greedy), accepted, block)
    return out.to(torch.int32)
