"""Checks shared by the early_exit_topk backend tests (Triton under the interpreter, CUDA
and Triton on a GPU).

A backend's logits are float32 sums in another order than the reference's fp32 matmul,
so they equal it within float rounding. `assert_topk_matches` therefore compares values
within a tolerance scaled by sum_h |norm(h)_h * W[v, h]| (the size of the rounding
errors), and ids exactly wherever the reference's sorted logits around that rank are
farther apart than the tolerance (-inf logits are exact: their ids must match exactly,
lowest first). Everywhere else the returned id must still carry a logit within the
tolerance of the reported value.
"""

import torch

from specdec_kernels.common.sampling import nan_to_neg_inf
from specdec_kernels.reference.early_exit import normalize

REL_TOL = 3e-5  # of sum |h * w|: float32 sums of H terms plus the 16-bit hi/lo split


def reference_logits(hidden, norm_weight, lm_head_weight, *, eps=1e-6, norm="rms", norm_bias=None):
    """[B, V] float32 reference logits (NaN -> -inf) and the per-row tolerance [B, 1]."""
    if norm == "none":
        norm_weight = norm_bias = None
    h = normalize(hidden, norm_weight, norm_bias, eps=eps, norm=norm)
    w = lm_head_weight.float()
    logits = nan_to_neg_inf(h @ w.t())
    scale = torch.nan_to_num(h.abs() @ w.abs().t(), nan=0.0, posinf=0.0).amax(dim=1, keepdim=True)
    return logits, REL_TOL * scale + 1e-6


def assert_topk_matches(got, hidden, norm_weight, lm_head_weight, k, *, min_exact=0.0, **norm_kw) -> float:
    """Check (values, indices) against the reference; returns the fraction of ids compared exactly."""
    values, indices = got
    batch, vocab = hidden.shape[0], lm_head_weight.shape[0]
    assert values.shape == (batch, k) and values.dtype == torch.float32
    assert indices.shape == (batch, k) and indices.dtype == torch.int64
    assert values.device == hidden.device and indices.device == hidden.device
    logits, tol = reference_logits(hidden, norm_weight, lm_head_weight, **norm_kw)
    logits, tol, values, indices = logits.cpu(), tol.cpu(), values.cpu(), indices.cpu()
    ref_vals, ref_ids = torch.sort(logits, dim=-1, descending=True, stable=True)
    assert bool(((indices >= 0) & (indices < vocab)).all()), f"ids out of range: {indices}"
    assert all(len(set(row)) == k for row in indices.tolist()), f"repeated ids: {indices}"
    assert bool((values[:, 1:] <= values[:, :-1]).all()), f"values not descending: {values}"
    want = ref_vals[:, :k]
    finite = torch.isfinite(want)
    assert torch.equal(values[~finite], want[~finite]), f"non-finite values differ: {values} vs {want}"
    assert bool(((values - want).abs() <= tol)[finite].all()), f"values: {values} vs {want} (tol {tol.flatten()})"
    carried = logits.gather(1, indices)
    assert torch.equal(torch.isfinite(carried), finite)
    assert bool(((carried - values).abs() <= tol)[finite].all()), "an id does not carry its reported logit"
    # ids are exact where the rank is separated from both neighbours (or the logit is -inf)
    padded = torch.cat([torch.full((batch, 1), float("inf")), ref_vals, torch.full((batch, 1), float("-inf"))], 1)
    gap_before = padded[:, :k] - padded[:, 1:k + 1]
    gap_after = padded[:, 1:k + 1] - padded[:, 2:k + 2]
    exact = (want == float("-inf")) | ((gap_before > tol) & (gap_after > tol))
    assert torch.equal(indices[exact], ref_ids[:, :k][exact]), f"ids {indices} vs reference {ref_ids[:, :k]}"
    fraction = float(exact.float().mean())
    assert fraction >= min_exact, f"only {fraction:.2f} of the ids were separated enough to compare"
    return fraction


def random_inputs(batch, hidden_size, vocab, dtype, *, norm="rms", seed=0, device="cpu", weight_scale=None):
    """hidden [B, H], norm_weight [H], lm_head [V, H], norm_bias [H] or None, all of `dtype`."""
    gen = torch.Generator().manual_seed(seed)
    scale = weight_scale if weight_scale is not None else hidden_size ** -0.5
    hidden = torch.randn(batch, hidden_size, generator=gen) * 3 + 0.5
    norm_weight = 1 + 0.2 * torch.randn(hidden_size, generator=gen)
    weight = torch.randn(vocab, hidden_size, generator=gen) * scale
    bias = 0.1 * torch.randn(hidden_size, generator=gen) if norm == "layer" else None
    to = dict(dtype=dtype, device=device)
    return (hidden.to(**to), norm_weight.to(**to), weight.to(**to), None if bias is None else bias.to(**to))


def tie_inputs(batch, hidden_size, vocab, dtype, copies, *, device="cpu", seed=0):
    """Integer-valued inputs (dot products exact in any order) where the rows `copies` of
    the LM head are one repeated row that wins every logit: ties that must go to lower ids."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randint(-3, 4, (batch, hidden_size), generator=gen).float()
    weight = torch.randint(-2, 3, (vocab, hidden_size), generator=gen).float()
    weight[list(copies)] = 3 * hidden.sign()[0]  # the largest possible logit for row 0
    return hidden.to(dtype=dtype, device=device), weight.to(dtype=dtype, device=device)
