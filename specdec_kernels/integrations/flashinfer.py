"""FlashInfer's chain speculative-sampling entry point, running `specdec_kernels.ops.rejection_sample`.

    from specdec_kernels.integrations.flashinfer import chain_speculative_sampling
    out, accepted, emitted = chain_speculative_sampling(draft_probs, draft_token_ids, target_probs)

Nothing here imports FlashInfer. Two functions:

- `chain_speculative_sampling` takes the arguments of `flashinfer.sampling.chain_speculative_sampling`
  as FlashInfer defines it since its PR #912 of 2025-03 (checked against 0.6.x sources): probabilities in,
  randomness from `generator` or from `seed` + `offset`, plus our `backend=` keyword.
- `chain_speculative_sampling_legacy` takes the uniform-samples form that PR #912 replaced (still
  the calling convention of some engines' ports of the kernel): `uniform_samples [B, g+1]` as the third
  positional argument, read with FlashInfer's layout (column i is draft i's coin, the final token
  is drawn with column min(pos + 1, g), pos being the first rejected position, g if none).

Kept from FlashInfer: the argument names, order and defaults; the int32 output [B, g+1] padded
with -1; `accepted_num` counting every draft whose own test u * q < p passes, also after the
first rejection; `emitted_num` counting the emitted drafts (bonus excluded); both added in place
into the caller's counters, which are returned; the randomness rule (seed and offset both given,
both ints or both int64/uint64 1-D tensors of length 1 or B on the inputs' device, else the
generator is used and a lone seed or offset is ignored); the acceptance test u * q < p (q = 0 < p
accepts, p = 0 never does) and the draw from norm(max(0, p - q)) at the first rejection or from
the bonus row. The distribution of every output is FlashInfer's.

Differences that remain:
 1. Random streams. The same seed/offset or generator state gives other draws than FlashInfer's
    (same distribution, other values). With seed and offset ours are the counter-based
    Philox-4x32-10 draws of `ops.rejection_sample`'s seeded mode (53-bit float64 uniforms in
    [0, 1), identical on every backend); FlashInfer's are curand's Philox (seed, subsequence = row,
    offset) with float32 uniforms in (0, 1]. Keying: with an int or length-1 seed and offset, row
    b uses the per-request seed `seed ^ (b << 32)` at positions offset .. offset + g (row b equals
    a batch of one seeded with that value); see 4 for length-B tensors and 3 for the generator.
 2. `offset` counts modulo 2**32 (our position counter has 32 bits; FlashInfer's offset has 64):
    offset and offset + 2**32 give the same draws. Advance it by at least g + 1 per call.
 3. Generator mode (seed or offset None) draws `torch.rand(B, g + 1, dtype=float64)` from
    `generator` (default: the inputs' device's default generator): coins of drafts 0..g-1, then
    the final draw. FlashInfer instead reads and bumps the generator's (seed, offset) state on the
    host; ours is one ordinary torch.rand call on the device (no host sync).
 4. Length-B seed/offset tensors are honoured per row: row b draws with (seed[b], offset[b]) as
    if sampled alone, whatever its position in the batch. FlashInfer 0.6.x's kernel reads element
    0 of each tensor only.
 5. Counters: an int32 or int64 counter is updated in place. FlashInfer converts counters with
    `.int()`, so the += of an int64 counter lands in a temporary and the caller's tensor (which
    it returns) stays unchanged.
 6. The acceptance test u * q < p is evaluated in float64 (exactly for float32 uniforms, whose
    product with a float32 probability fits 48 bits), where FlashInfer rounds u * q to float32,
    so near a tie the two can decide differently; and u < 1 always, so a draft with p == q > 0
    is always accepted (FlashInfer's curand_uniform can return 1.0 and reject it).
    `uniform_samples` must lie in [0, 1): 1.0 or NaN raise on CPU tensors.
 7. The residual (or bonus) draw is an inverse CDF over 2**-40 fixed-point weights, bit-identical
    on every backend and batch layout; FlashInfer sums float32 values with a block scan. With the
    same uniform the token differs only when u * Z falls within rounding distance of a CDF
    boundary, or for residual entries below 2**-40, which count as zero.
 8. An empty residual (an all-zero or NaN target row at the rejected position, or one whose
    residual entries are all below 2**-40) draws from the target row itself with the same
    uniform, and a row without any mass gives token 0: ids are always in [0, V). FlashInfer's
    chain kernel then returns its `last_valid_id`, left uninitialised in 0.6.x (V - 1 in older
    versions).
 9. Draft ids outside [0, V), such as -1 padding, are rejected drafts and do not count in
    `accepted_num`; on CPU tensors an id below -1 or >= V raises ValueError. FlashInfer reads
    memory at those ids (its issue #879).
10. `deterministic` changes nothing: every backend is deterministic (bit-identical from run to
    run and across the torch, triton and cuda backends).
11. Inputs: float16/bfloat16 probabilities are read natively, giving exactly what FlashInfer's
    float32 upcast of the same tensors would give, without the copy; float64 (or two different
    dtypes) are converted to float32 as FlashInfer does. Draft ids of any integer dtype, any
    strides (a strided vocabulary dimension is copied), CPU tensors too (FlashInfer needs a GPU).
    Bad shapes, dtypes or devices raise a one-line ValueError/TypeError naming the argument.
12. Cost: `accepted_num` needs each position's test, which our op does not return: it is
    recomputed beside the op from the same uniforms (two gathers per draft; in seeded mode also
    the g Philox coins: a few hundred small elementwise torch ops on [B, g], cheap on a CPU,
    launch-bound on a GPU outside a CUDA graph).

Ragged rows (a different draft count per row) are not part of FlashInfer's interface: use
`ops.rejection_sample(..., num_draft_tokens=)` directly.
"""

from typing import Optional, Union

import torch
from torch import Tensor

from .. import ops
from ..ops import _validate as check
from ..reference._sampling import gather_token_values
from ..reference.chain_verify import Coins

OP = "chain_speculative_sampling"
BACKENDS = ("auto", "torch", "triton", "cuda")
_PROB_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_NATIVE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # what ops.rejection_sample reads as is
_ID_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
_COUNTER_DTYPES = (torch.int32, torch.int64)
_RNG_DTYPES = (torch.int64, torch.uint64)
_ROW_SHIFT = 32  # broadcast seeds: row b uses seed ^ (b << 32)


# ------------------------------------------------------------------ validation

def _check_common(draft_probs, draft_token_ids, target_probs, counters, deterministic, backend) -> tuple[int, int, int]:
    """Every argument check that does not depend on the randomness mode; returns (B, g, V)."""
    check.tensor(OP, "draft_probs", draft_probs, shape=("B", "g", "V"), dtypes=_PROB_DTYPES,
                 last_dim_contiguous=False)
    batch, g, vocab = draft_probs.shape
    if vocab == 0:
        check.fail(OP, "`draft_probs` has an empty vocabulary dimension")
    device = draft_probs.device
    check.tensor(OP, "draft_token_ids", draft_token_ids, shape=(batch, g), dtypes=_ID_DTYPES, device=device,
                 last_dim_contiguous=False)
    check.tensor(OP, "target_probs", target_probs, shape=(batch, g + 1, vocab), dtypes=_PROB_DTYPES, device=device,
                 last_dim_contiguous=False)
    check.token_range(OP, "draft_token_ids", draft_token_ids, vocab, allow_padding=True)
    for name, counter in counters.items():
        check.optional_tensor(OP, name, counter, shape=(batch,), dtypes=_COUNTER_DTYPES, device=device,
                              last_dim_contiguous=False)
    if not isinstance(deterministic, bool):
        check.fail(OP, f"`deterministic` must be a bool (got {type(deterministic).__name__})", TypeError)
    if backend not in BACKENDS:
        check.fail(OP, f"`backend` must be one of {', '.join(repr(b) for b in BACKENDS)} (got {backend!r})")
    return batch, g, vocab


def _check_rng(generator, seed, offset, batch: int, device: torch.device) -> None:
    if generator is not None and not isinstance(generator, torch.Generator):
        check.fail(OP, f"`generator` must be a torch.Generator or None (got {type(generator).__name__})", TypeError)
    if seed is None or offset is None:
        return  # FlashInfer's rule: without both, the generator decides and a lone seed or offset is unused
    if isinstance(seed, Tensor) != isinstance(offset, Tensor):
        check.fail(OP, "`seed` and `offset` must both be tensors or both be ints")
    if isinstance(seed, Tensor):
        for name, x in (("seed", seed), ("offset", offset)):
            if x.dtype not in _RNG_DTYPES:
                check.fail(OP, f"`{name}` must have dtype int64 or uint64 (got {str(x.dtype).replace('torch.', '')})",
                           TypeError)
            if x.dim() != 1 or x.shape[0] not in (1, batch):
                check.fail(OP, f"`{name}` must be a 1-D tensor of length 1 or {batch} (got shape {list(x.shape)})")
            if x.device != device:
                check.fail(OP, f"`{name}` must be on {device}, like the other inputs (got {x.device})")
        return
    for name, x, low in (("seed", seed, -(2**63)), ("offset", offset, 0)):
        if isinstance(x, bool) or not isinstance(x, int):
            check.fail(OP, f"`{name}` must be an int or an int64/uint64 tensor (got {type(x).__name__})", TypeError)
        if not low <= x < 2**64:
            check.fail(OP, f"`{name}` must lie in [{low}, 2**64) (got {x})")


def _check_uniforms(uniform_samples, batch: int, g: int, device: torch.device) -> None:
    check.tensor(OP, "uniform_samples", uniform_samples, shape=(batch, g + 1), dtypes=(torch.float32, torch.float64),
                 device=device, last_dim_contiguous=False)
    if check.can_inspect(uniform_samples) and uniform_samples.numel():
        if not bool(((uniform_samples >= 0) & (uniform_samples < 1)).all()):
            check.fail(OP, "`uniform_samples` must lie in [0, 1) (no NaN)")


# ------------------------------------------------------------------ shared pieces

def _op_probs(draft_probs: Tensor, target_probs: Tensor) -> tuple[Tensor, Tensor]:
    """The probabilities as ops.rejection_sample reads them: one dtype among float32/16/bf16
    (float64 or mixed dtypes become float32, as FlashInfer's upcast), unit stride over V."""
    if draft_probs.dtype != target_probs.dtype or draft_probs.dtype not in _NATIVE_DTYPES:
        draft_probs, target_probs = draft_probs.float(), target_probs.float()

    def unit_stride(x: Tensor) -> Tensor:
        return x if x.shape[-1] <= 1 or x.stride(-1) == 1 else x.contiguous()

    return unit_stride(draft_probs), unit_stride(target_probs)


def _op_ids(draft_token_ids: Tensor) -> Tensor:
    return draft_token_ids if draft_token_ids.dtype in (torch.int64, torch.int32) else draft_token_ids.to(torch.int64)


def _passes(draft_probs: Tensor, draft_token_ids: Tensor, target_probs: Tensor, coins: Tensor) -> Tensor:
    """bool [B, g]: each draft's own test u_i * q_i(x_i) < p_i(x_i), exactly as ops.rejection_sample
    evaluates it (float32 probabilities, float64 product); out-of-range ids never pass."""
    ids = draft_token_ids.to(torch.int64)
    p, in_range = gather_token_values(target_probs[:, :ids.shape[1]], ids)
    q, _ = gather_token_values(draft_probs, ids)
    return (coins.to(torch.float64) * q.double() < p.double()) & in_range


def _to_int64_bits(x: Tensor) -> Tensor:
    return x.view(torch.int64) if x.dtype == torch.uint64 else x


def _wrap_int64(x: int) -> int:
    return x - 2**64 if x >= 2**63 else x


def _seeds_and_offsets(seed, offset, batch: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Per-row (seed, offset) int64 [B] for ops.rejection_sample's per-request seed mode (no host sync)."""
    if isinstance(seed, Tensor):
        per_row = seed.shape[0] > 1 or offset.shape[0] > 1
        seeds = _to_int64_bits(seed).expand(batch)
        offsets = _to_int64_bits(offset).expand(batch)
    else:
        per_row = False
        seeds = torch.full((batch,), _wrap_int64(seed), dtype=torch.int64, device=device)
        offsets = torch.full((batch,), _wrap_int64(offset), dtype=torch.int64, device=device)
    if not per_row:  # one stream per row, keyed by its batch index (FlashInfer: Philox subsequence = row)
        seeds = seeds ^ (torch.arange(batch, dtype=torch.int64, device=device) << _ROW_SHIFT)
    return seeds.contiguous(), offsets.contiguous()


def _accumulate(counter: Optional[Tensor], counts: Tensor) -> Tensor:
    """Add counts into the caller's counter in place (returned), or a new int32 tensor."""
    if counter is None:
        return counts.to(torch.int32)
    return counter.add_(counts.to(counter.dtype))


def _finish(output_tokens: Tensor, num_accepted: Tensor, passes: Tensor, accepted_counter, emitted_counter):
    accepted = _accumulate(accepted_counter, passes.sum(dim=1))
    emitted = _accumulate(emitted_counter, num_accepted)
    return output_tokens.to(torch.int32), accepted, emitted


# ------------------------------------------------------------------ entry points

def chain_speculative_sampling(
    draft_probs: Tensor,
    draft_token_ids: Tensor,
    target_probs: Tensor,
    maybe_output_accepted_token_num: Optional[Tensor] = None,
    maybe_output_emitted_draft_token_num: Optional[Tensor] = None,
    deterministic: bool = True,
    generator: Optional[torch.Generator] = None,
    seed: Optional[Union[int, Tensor]] = None,
    offset: Optional[Union[int, Tensor]] = None,
    *,
    backend: str = "auto",
) -> tuple[Tensor, Tensor, Tensor]:
    r"""Speculative sampling of chain drafts with FlashInfer's interface, on `ops.rejection_sample`.

    Each row holds g drafted tokens. Draft i is kept with probability min(1, p_i(x_i) / q_i(x_i))
    while all earlier ones were kept; the first rejected position emits a token drawn from
    norm(max(0, p_i - q_i)) instead, and a row that keeps all g drafts appends a bonus token
    drawn from target_probs[:, g]. The module docstring lists what differs from FlashInfer.

    Parameters
    ----------
    draft_probs: torch.Tensor
        The draft model's distributions, the ones the drafts were sampled from.
        Shape: ``(batch_size, num_speculate_tokens, vocab_size)``; float32, float16, bfloat16
        (read natively) or float64 (converted to float32).
    draft_token_ids: torch.Tensor
        The drafted token ids. Shape: ``(batch_size, num_speculate_tokens)``; int64, int32, int16,
        int8 or uint8. An id outside ``[0, vocab_size)`` (e.g. -1) is a rejected draft.
    target_probs: torch.Tensor
        The target model's distributions at each draft position plus the bonus position.
        Shape: ``(batch_size, num_speculate_tokens + 1, vocab_size)``; float dtype as above.
    maybe_output_accepted_token_num: Optional[torch.Tensor]
        Counter to which each row's number of drafts that pass their own test is added in
        place, positions after the first rejection included (a measure of draft/target
        agreement, not of output length). Shape: ``(batch_size,)``; int32 or int64.
    maybe_output_emitted_draft_token_num: Optional[torch.Tensor]
        Counter to which each row's number of emitted drafts (the bonus or correction token not
        counted) is added in place. Shape: ``(batch_size,)``; int32 or int64.
    deterministic: bool
        Accepted for compatibility; every backend is deterministic.
    generator: Optional[torch.Generator]
        Source of the uniforms when ``seed`` or ``offset`` is None (default: the default
        generator of the inputs' device); one ``torch.rand`` call of ``(batch_size,
        num_speculate_tokens + 1)`` float64 values.
    seed: Optional[Union[int, torch.Tensor]]
        Philox key, used only together with ``offset``: an int in ``[-2**63, 2**64)``, or an
        int64/uint64 tensor of shape ``(1,)`` or ``(batch_size,)`` on the inputs' device
        (tensors need no host sync, as CUDA graphs require). Length ``batch_size``: one seed per row, each
        row drawn as if alone.
    offset: Optional[Union[int, torch.Tensor]]
        Position of the first draw in the stream, counted modulo ``2**32``; same forms as
        ``seed`` (an int in ``[0, 2**64)``). Advance it by at least ``num_speculate_tokens + 1``
        between calls, or the same uniforms come back.
    backend: str
        ``"auto"`` (default), ``"torch"``, ``"triton"`` or ``"cuda"``: the backend of
        `ops.rejection_sample`.

    Returns
    -------
    output_token_ids: torch.Tensor
        The emitted drafts, then the correction or bonus token, then ``-1`` padding.
        Shape: ``(batch_size, num_speculate_tokens + 1)``; int32.
    output_accepted_token_num: torch.Tensor
        ``maybe_output_accepted_token_num`` after the in-place update, or a new int32 tensor
        with the counts. Shape: ``(batch_size,)``.
    output_emitted_draft_token_num: torch.Tensor
        ``maybe_output_emitted_draft_token_num`` after the in-place update, or a new int32
        tensor; each row emitted this many drafts plus one token. Shape: ``(batch_size,)``.

    Examples
    --------
    >>> import torch
    >>> from specdec_kernels.integrations.flashinfer import chain_speculative_sampling
    >>> draft_probs = torch.tensor([[[0.1, 0.2, 0.3, 0.4], [0.2, 0.3, 0.4, 0.1]]])
    >>> draft_token_ids = torch.tensor([[2, 1]], dtype=torch.int32)
    >>> target_probs = torch.tensor([[[0.0, 0.1, 0.6, 0.3], [1.0, 0.0, 0.0, 0.0], [0.7, 0.1, 0.1, 0.1]]])
    >>> out, accepted, emitted = chain_speculative_sampling(draft_probs, draft_token_ids, target_probs)
    >>> out  # draft 2 always passes (p >= q), draft 1 never (p = 0); the residual is all on token 0
    tensor([[ 2,  0, -1]], dtype=torch.int32)
    >>> accepted, emitted
    (tensor([1], dtype=torch.int32), tensor([1], dtype=torch.int32))
    """
    counters = {"maybe_output_accepted_token_num": maybe_output_accepted_token_num,
                "maybe_output_emitted_draft_token_num": maybe_output_emitted_draft_token_num}
    batch, g, _ = _check_common(draft_probs, draft_token_ids, target_probs, counters, deterministic, backend)
    device = draft_probs.device
    _check_rng(generator, seed, offset, batch, device)

    q, p = _op_probs(draft_probs, target_probs)
    ids = _op_ids(draft_token_ids)
    if seed is None or offset is None:
        source = generator.device if generator is not None else device
        uniforms = torch.rand((batch, g + 1), dtype=torch.float64, generator=generator, device=source).to(device)
        out, num_accepted = ops.rejection_sample(p, q, ids, uniforms=uniforms, backend=backend)
        coins = uniforms[:, :g]
    else:
        seeds, offsets = _seeds_and_offsets(seed, offset, batch, device)
        out, num_accepted = ops.rejection_sample(p, q, ids, seed=seeds, offsets=offsets, backend=backend)
        # the op's own coins (the reference's counter layout for per-request seeds), every position,
        # also past the first rejection
        coins = Coins(None, seeds, offsets, batch, g, device).accept
    passes = _passes(q, ids, p, coins)
    return _finish(out, num_accepted, passes, maybe_output_accepted_token_num, maybe_output_emitted_draft_token_num)


def chain_speculative_sampling_legacy(
    draft_probs: Tensor,
    draft_token_ids: Tensor,
    uniform_samples: Tensor,
    target_probs: Tensor,
    maybe_output_accepted_token_num: Optional[Tensor] = None,
    maybe_output_emitted_token_num: Optional[Tensor] = None,
    deterministic: bool = True,
    *,
    backend: str = "auto",
) -> tuple[Tensor, Tensor, Tensor]:
    r"""FlashInfer's earlier uniform-samples form of `chain_speculative_sampling` (before its PR #912).

    Same computation as `chain_speculative_sampling` with the caller's uniforms, read with
    FlashInfer's layout: draft i's coin is ``uniform_samples[:, i]`` (also for the
    ``accepted`` count after the first rejection) and the correction or bonus token is drawn
    with ``uniform_samples[:, min(pos + 1, num_speculate_tokens)]``, pos being the first
    rejected position (``num_speculate_tokens`` when every draft passes). Given the same
    uniforms, FlashInfer's kernel and this function accept the same drafts (up to FlashInfer's
    float32 rounding of u * q) and draw the same token (up to rounding at a CDF boundary).

    Parameters
    ----------
    draft_probs: torch.Tensor
        Shape: ``(batch_size, num_speculate_tokens, vocab_size)``; float32, float16, bfloat16 or
        float64.
    draft_token_ids: torch.Tensor
        Shape: ``(batch_size, num_speculate_tokens)``; int64, int32, int16, int8 or uint8.
    uniform_samples: torch.Tensor
        Uniforms in ``[0, 1)``. Shape: ``(batch_size, num_speculate_tokens + 1)``; float32 or
        float64.
    target_probs: torch.Tensor
        Shape: ``(batch_size, num_speculate_tokens + 1, vocab_size)``; float dtype as above.
    maybe_output_accepted_token_num: Optional[torch.Tensor]
        In-place counter of drafts passing their own test (after the first rejection too).
        Shape: ``(batch_size,)``; int32 or int64.
    maybe_output_emitted_token_num: Optional[torch.Tensor]
        In-place counter of emitted drafts. Shape: ``(batch_size,)``; int32 or int64.
    deterministic: bool
        Accepted for compatibility; every backend is deterministic.
    backend: str
        ``"auto"``, ``"torch"``, ``"triton"`` or ``"cuda"``.

    Returns
    -------
    output_token_ids: torch.Tensor
        Shape: ``(batch_size, num_speculate_tokens + 1)``; int32, padded with ``-1``.
    output_accepted_token_num: torch.Tensor
        Shape: ``(batch_size,)``; the caller's counter, or a new int32 tensor.
    output_emitted_token_num: torch.Tensor
        Shape: ``(batch_size,)``; the caller's counter, or a new int32 tensor.
    """
    counters = {"maybe_output_accepted_token_num": maybe_output_accepted_token_num,
                "maybe_output_emitted_token_num": maybe_output_emitted_token_num}
    batch, g, _ = _check_common(draft_probs, draft_token_ids, target_probs, counters, deterministic, backend)
    _check_uniforms(uniform_samples, batch, g, draft_probs.device)

    q, p = _op_probs(draft_probs, target_probs)
    ids = _op_ids(draft_token_ids)
    coins = uniform_samples[:, :g]
    passes = _passes(q, ids, p, coins)
    first_rejection = torch.cumprod(passes.to(torch.int64), dim=1).sum(dim=1)  # == the op's num_accepted
    final_column = (first_rejection + 1).clamp(max=g).unsqueeze(1)
    uniforms = torch.cat([coins, uniform_samples.gather(1, final_column)], dim=1)
    out, num_accepted = ops.rejection_sample(p, q, ids, uniforms=uniforms, backend=backend)
    return _finish(out, num_accepted, passes, maybe_output_accepted_token_num, maybe_output_emitted_token_num)


__all__ = ["chain_speculative_sampling", "chain_speculative_sampling_legacy"]
