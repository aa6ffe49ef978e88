"""The block_verification family's catalog: block_verify and block_verify_logits. They take
rejection sampling's inputs under the same contract (exact with uniforms and seeds; logits within
the documented margin), so their edges are rejection sampling's (cases_rejection_sampling.py:
PROBS_EDGES, LOGITS_EDGES), without its known answers; the random shapes add per-row temperatures
on every other shape."""

import functools

import torch

from .chain_inputs import (CHAIN_OUTPUTS, Row, Section, catalog, probs_inputs, random_shape_variants,
                           sampling_logits_inputs, seeded_probs_inputs)
from .cases_rejection_sampling import LOGITS_EDGES, PROBS_EDGES, logits_rows, probs_rows
from .compare import boundary_excused, exact, near_boundary_explains

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


RANDOM = [((None,), [Section(variants=random_shape_variants, rows=(
    Row("block_verify", "{shape} uniforms{suffix}", probs_inputs, run_block_verify, EXACT),
    Row("block_verify", "{shape} seed+offsets{suffix}", seeded_probs_inputs, run_seeded_block_verify, EXACT),
    Row("block_verify_logits", "{shape} T=0.8 uniforms{suffix}", block_logits_inputs, run_block_verify_logits,
        compare_block_logits)))])]


def block_verification_cases(profile, device):
    """block_verify and block_verify_logits: the random shapes, then rejection sampling's edges."""
    edges = probs_rows("block_verify", PROBS_EDGES, block=True) + logits_rows(
        "block_verify_logits", LOGITS_EDGES, compare_block_logits, block=True)
    return catalog(RANDOM, edges, profile, device)
