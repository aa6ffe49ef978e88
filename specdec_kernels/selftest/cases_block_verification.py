"""The block_verification family: block_verify and block_verify_logits. They take rejection
sampling's inputs under the same contract (exact with uniforms and seeds; logits within the
documented margin), so their edges are rejection sampling's without its known answers; the random
shapes add per-row temperatures on every other shape."""

import functools

import torch

from .cases_rejection_sampling import logits_edges, probs_edges
from .chain_inputs import (CHAIN_OUTPUTS, chain_catalog, probs_inputs, random_shapes, sampling_logits_inputs,
                           seeded_probs_inputs)
from .compare import boundary_excused, exact, near_boundary_explains
from .model import Row

EXACT = exact(CHAIN_OUTPUTS)
compare_block_logits = boundary_excused(functools.partial(near_boundary_explains, block=True))


def block_logits_inputs(seed, *, device, batch, g, vocab, dtype, use_ragged, index):
    """sampling_logits_inputs, per-row temperatures (all 0.8) on every other shape."""
    x = sampling_logits_inputs(seed, device=device, batch=batch, g=g, vocab=vocab, dtype=dtype, use_ragged=use_ragged)
    if index % 2:
        x["temperature"] = torch.full((batch,), 0.8, device=device)
    return x


def run_block_verify(x, be):
    from .. import ops

    return ops.block_verify(**x, backend=be)


def run_seeded_block_verify(x, be):
    from .. import ops

    return ops.block_verify(**x, seed=1234, backend=be)


def run_block_verify_logits(x, be):
    from .. import ops

    return ops.block_verify_logits(**x, backend=be)


def _random_rows(profile):
    entries = []
    for s in random_shapes(profile):
        entries += [("block_verify", run_block_verify,
                     Row(f"{s.name} uniforms{s.suffix}", s.dtype, probs_inputs, s.settings, EXACT, s.graph)),
                    ("block_verify", run_seeded_block_verify,
                     Row(f"{s.name} seed+offsets{s.suffix}", s.dtype, seeded_probs_inputs, s.settings, EXACT, s.graph)),
                    ("block_verify_logits", run_block_verify_logits,
                     Row(f"{s.name} T=0.8 uniforms{s.suffix}", s.dtype, block_logits_inputs,
                         dict(s.settings, index=s.index), compare_block_logits, s.graph))]
    return entries


def block_verification_cases(profile, device):
    """block_verify and block_verify_logits: the random shapes, then rejection sampling's edges."""
    edges = probs_edges("block_verify", profile, block=True) + logits_edges(
        "block_verify_logits", profile, compare_block_logits, block=True)
    return chain_catalog(_random_rows(profile), edges, profile, device)
