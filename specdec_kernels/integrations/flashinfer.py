"""FlashInfer's chain speculative-sampling entry point, running `specdec_kernels.ops.rejection_sample`.

    from specdec_kernels.integrations.flashinfer import chain_speculative_sampling
    out, accepted, emitted = chain_speculative_sampling(draft_probs, draft_token_ids, target_probs)

`chain_speculative_sampling` takes the arguments of `flashinfer.sampling.chain_speculative_sampling` (its
form since FlashInfer's PR #912; `TRACKS`), `chain_speculative_sampling_legacy` the uniform-samples form it
replaced. Kept from FlashInfer: argument names, order and defaults, the int32 output padded with -1, the
in-place counters, the randomness rule and the distribution of every output. `accepted_num` counts the
drafts whose own test passed, as the op reports them in its per-draft output (`draft_passes`: the test it
accepts a prefix of, on its own coins). Nothing here imports FlashInfer. What still differs, random
streams first: docs/flashinfer-sglang.md.
"""

from typing import Optional, Union

import torch
from torch import Tensor

from .. import ops
from ..common import rng
from ..common import validate as check
from ..common.draws import draft_passes

OP = "chain_speculative_sampling"
# the upstream this adapter tracks: FlashInfer's main branch at commit 17ab765, where seed/offset tensors
# (length 1 too) are request keys; 0.6.x keyed a length-1 tensor like an int, by batch row
TRACKS = "flashinfer main@17ab765: flashinfer.sampling.chain_speculative_sampling"
BACKENDS = ("auto", "torch", "triton", "cuda")
_PROB_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_NATIVE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # what ops.rejection_sample reads as is
_ID_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
_COUNTER_DTYPES = (torch.int32, torch.int64)
_RNG_DTYPES = (torch.int64, torch.uint64)
_ROW_SHIFT = 32  # int seed: row b uses seed ^ (b << 32), FlashInfer's scalar rule (Philox subsequence = row)
_REQUEST_KEY_SALT = 0x5EED  # Philox purpose word of a tensor pair's request key; the ops use 0..3


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


def _to_int64_bits(x: Tensor) -> Tensor:
    return x.view(torch.int64) if x.dtype == torch.uint64 else x


def _wrap_int64(x: int) -> int:
    return x - 2**64 if x >= 2**63 else x


def _request_keys(seed: Tensor, offset: Tensor) -> Tensor:
    """int64 Philox key of each (seed, offset) pair: Philox-4x32-10 of the offset's two words under the
    seed, in its own purpose word. Distinct offsets give unrelated streams, not shifted views of one."""
    x0, x1, _, _ = rng.philox4x32(offset & rng.MASK32, (offset >> 32) & rng.MASK32, _REQUEST_KEY_SALT, 0,
                                  seed & rng.MASK32, (seed >> 32) & rng.MASK32)
    return (x1 - ((x1 >> 31) << 32)) * 2**32 + x0  # the 64-bit word x1:x0 as int64, without overflow


def _seeds_and_offsets(seed, offset, batch: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Per-row (seed, offset) int64 [B] for ops.rejection_sample's per-request seed mode (no host sync)."""
    if isinstance(seed, Tensor):
        # FlashInfer's tensor rule: the pair (seed[b], offset[b]) names row b's request, length 1 included,
        # so each row draws as if sampled alone and the offset picks a stream, not a start position
        keys = _request_keys(_to_int64_bits(seed), _to_int64_bits(offset))  # [1] or [B]
        return keys.expand(batch).contiguous(), torch.zeros(batch, dtype=torch.int64, device=device)
    # FlashInfer's scalar rule: one stream per batch row (its Philox subsequence = row), offset = first position
    rows = torch.arange(batch, dtype=torch.int64, device=device) << _ROW_SHIFT
    seeds = torch.full((batch,), _wrap_int64(seed), dtype=torch.int64, device=device) ^ rows
    offsets = torch.full((batch,), _wrap_int64(offset), dtype=torch.int64, device=device)
    return seeds, offsets


def _accumulate(counter: Optional[Tensor], counts: Tensor) -> Tensor:
    """Add counts into the caller's counter in place (returned), or a new int32 tensor."""
    if counter is None:
        return counts.to(torch.int32)
    return counter.add_(counts.to(counter.dtype))


def _new_passes(batch: int, g: int, device: torch.device) -> Tensor:
    """The buffer ops.rejection_sample fills with each draft's own test: bool [B, g]."""
    return torch.empty((batch, g), dtype=torch.bool, device=device)


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

    Draft i is kept with probability min(1, p_i(x_i) / q_i(x_i)) while all earlier ones were kept; the
    first rejected position emits a token drawn from norm(max(0, p_i - q_i)) instead, and a row that keeps
    all g drafts appends a bonus token drawn from target_probs[:, g]. Shapes: B rows, g drafts, V tokens.

    Args:
        draft_probs: [B, g, V] float32, float16, bfloat16 (read natively) or float64 (converted to
            float32): the draft distributions the drafts were sampled from.
        draft_token_ids: [B, g] int64, int32, int16, int8 or uint8; an id outside [0, V) (e.g. -1) is
            a rejected draft.
        target_probs: [B, g + 1, V], float dtype as above: the target's distribution at each draft
            position plus the bonus position.
        maybe_output_accepted_token_num: [B] int32 or int64 counter to which each row's number of drafts
            passing their own test is added in place, positions after the first rejection included
            (draft/target agreement, not output length).
        maybe_output_emitted_draft_token_num: [B] int32 or int64 counter to which each row's emitted
            drafts (the final token not counted) are added in place.
        deterministic: accepted for compatibility; every backend is deterministic.
        generator: the uniforms' source when `seed` or `offset` is None (default: the inputs' device's
            default generator): one `torch.rand` of [B, g + 1] float64.
        seed: Philox key, used only together with `offset`: an int in [-2**63, 2**64), or an int64/uint64
            tensor of shape [1] or [B] on the inputs' device (no host sync). Tensors, as in FlashInfer,
            are request keys: row b draws from the stream of the pair (seed[b], offset[b]) alone, a
            length-1 tensor serving every row, so each row equals itself sampled alone with that pair
            and equal pairs give equal draws. An int gives each row its own stream (seed ^ (b << 32)).
        offset: same forms as `seed` (an int in [0, 2**64)). A tensor offset is part of the request key:
            change it (by 1 is enough) between calls for new draws. An int offset is the first draw's
            position, counted modulo 2**32: advance it by at least g + 1 between calls, or the same
            uniforms come back.
        backend: "auto", "torch", "triton" or "cuda": the backend of `ops.rejection_sample`.

    Returns:
        (output_token_ids [B, g + 1] int32: the emitted drafts, the correction or bonus token, then -1;
        output_accepted_token_num [B]: the caller's counter after the update, or a new int32 tensor;
        output_emitted_draft_token_num [B]: likewise; each row emitted this many drafts plus one token).

    Example:
        >>> draft_probs = torch.tensor([[[0.1, 0.2, 0.3, 0.4], [0.2, 0.3, 0.4, 0.1]]])
        >>> target_probs = torch.tensor([[[0.0, 0.1, 0.6, 0.3], [1.0, 0.0, 0.0, 0.0], [0.7, 0.1, 0.1, 0.1]]])
        >>> out, accepted, emitted = chain_speculative_sampling(draft_probs, torch.tensor([[2, 1]]), target_probs)
        >>> out  # draft 2 always passes (p >= q), draft 1 never (p = 0); the residual is all on token 0
        tensor([[ 2,  0, -1]], dtype=torch.int32)
    """
    counters = {"maybe_output_accepted_token_num": maybe_output_accepted_token_num,
                "maybe_output_emitted_draft_token_num": maybe_output_emitted_draft_token_num}
    batch, g, _ = _check_common(draft_probs, draft_token_ids, target_probs, counters, deterministic, backend)
    device = draft_probs.device
    _check_rng(generator, seed, offset, batch, device)

    q, p = _op_probs(draft_probs, target_probs)
    ids = _op_ids(draft_token_ids)
    passes = _new_passes(batch, g, device)  # every draft's own test, also past the first rejection
    if seed is None or offset is None:
        source = generator.device if generator is not None else device
        uniforms = torch.rand((batch, g + 1), dtype=torch.float64, generator=generator, device=source).to(device)
        out, num_accepted = ops.rejection_sample(p, q, ids, uniforms=uniforms, draft_passes=passes, backend=backend)
    else:
        seeds, offsets = _seeds_and_offsets(seed, offset, batch, device)
        out, num_accepted = ops.rejection_sample(p, q, ids, seed=seeds, offsets=offsets, draft_passes=passes,
                                                 backend=backend)
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

    The same computation with the caller's uniforms, read with FlashInfer's layout: draft i's coin is
    `uniform_samples[:, i]` (also for the accepted count after the first rejection) and the final token
    is drawn with `uniform_samples[:, min(pos + 1, g)]`, pos being the first rejected position (g when
    every draft passes). Given the same uniforms, FlashInfer's kernel and this function accept the same
    drafts (up to FlashInfer's float32 rounding of u * q) and draw the same token (up to rounding at a
    CDF boundary).

    Args:
        draft_probs: [B, g, V] float32, float16, bfloat16 or float64.
        draft_token_ids: [B, g] int64, int32, int16, int8 or uint8.
        uniform_samples: [B, g + 1] float32 or float64 uniforms in [0, 1).
        target_probs: [B, g + 1, V], float dtype as above.
        maybe_output_accepted_token_num: [B] int32 or int64 in-place counter of drafts passing their own
            test (after the first rejection too).
        maybe_output_emitted_token_num: [B] int32 or int64 in-place counter of emitted drafts.
        deterministic: accepted for compatibility; every backend is deterministic.
        backend: "auto", "torch", "triton" or "cuda".

    Returns:
        (output_token_ids [B, g + 1] int32 padded with -1, output_accepted_token_num [B],
        output_emitted_token_num [B]: the caller's counters, or new int32 tensors).
    """
    counters = {"maybe_output_accepted_token_num": maybe_output_accepted_token_num,
                "maybe_output_emitted_token_num": maybe_output_emitted_token_num}
    batch, g, _ = _check_common(draft_probs, draft_token_ids, target_probs, counters, deterministic, backend)
    _check_uniforms(uniform_samples, batch, g, draft_probs.device)

    q, p = _op_probs(draft_probs, target_probs)
    ids = _op_ids(draft_token_ids)
    coins = uniform_samples[:, :g]
    # FlashInfer's layout puts the final draw's uniform after the first rejection, which the op's uniforms
    # must hold before the call: only that column needs the tests here; the counts come from the op
    first_rejection = torch.cumprod(draft_passes(p, q, ids, coins).to(torch.int64), dim=1).sum(dim=1)
    final_column = (first_rejection + 1).clamp(max=g).unsqueeze(1)
    uniforms = torch.cat([coins, uniform_samples.gather(1, final_column)], dim=1)
    passes = _new_passes(batch, g, draft_probs.device)
    out, num_accepted = ops.rejection_sample(p, q, ids, uniforms=uniforms, draft_passes=passes, backend=backend)
    return _finish(out, num_accepted, passes, maybe_output_accepted_token_num, maybe_output_emitted_token_num)


__all__ = ["chain_speculative_sampling", "chain_speculative_sampling_legacy"]
