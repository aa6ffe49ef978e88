"""Pure-PyTorch implementations of every op: the executable specification.

These functions take already-validated inputs; the public, validated API is
`specdec_kernels.ops`. Every other backend must match them (bit for bit where the
caller supplies the randomness).
"""

from .attention import tree_attention
from .block_verification import block_verify, block_verify_logits
from .logit_verify import bild_verify, fallback_check, greedy_verify, max_prob, relaxed_verify
from .rejection_sampling import rejection_sample, rejection_sample_logits
from .early_exit import early_exit_topk
from .kv_cache import kv_compact, kv_rollback
from .tree import ancestor_mask, chain_parents, max_tree_depth, tree_depths
from .traversal_verification import tree_traversal_sample
from .tree_verify import tree_greedy_verify, tree_rejection_sample

__all__ = [
    "ancestor_mask", "bild_verify", "block_verify", "block_verify_logits", "chain_parents", "early_exit_topk", "fallback_check", "greedy_verify",
    "kv_compact", "kv_rollback", "max_prob", "max_tree_depth", "rejection_sample", "rejection_sample_logits",
    "relaxed_verify",
    "tree_attention", "tree_depths", "tree_greedy_verify", "tree_rejection_sample", "tree_traversal_sample",
]
