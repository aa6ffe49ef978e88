"""The block_verification family: block_verify and block_verify_logits. They take rejection
sampling's inputs under the same contract (exact with uniforms and seeds; logits within the
documented margin), so their random shapes and edges are rejection sampling's, without its known
answers; the random shapes add per-row temperatures on every other shape."""

import functools

from .cases_rejection_sampling import logits_edges, probs_edges, random_rows
from .chain_inputs import chain_catalog
from .compare import boundary_excused, near_boundary_explains

compare_block_logits = boundary_excused(functools.partial(near_boundary_explains, block=True))


def block_verification_cases(profile, device):
    """block_verify and block_verify_logits: the random shapes, then rejection sampling's edges."""
    random = random_rows(profile, "block_verify", "block_verify_logits", compare_block_logits, block=True)
    edges = probs_edges("block_verify", profile, block=True) + logits_edges(
        "block_verify_logits", profile, compare_block_logits, block=True)
    return chain_catalog(random, edges, profile, device)
