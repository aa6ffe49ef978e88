"""The public kernel API of specdec-kernels.

Every op validates its inputs, picks a backend (`backend="auto"`: on a GPU the kernel backend
the measurements rank first for the op and batch, common/auto_table.py; the torch reference on
a CPU) and runs as a `torch.library` custom op (namespace
`specdec`) with a fake implementation, so it works under torch.compile. This package
never imports transformers: frameworks can use the kernels with torch alone.
"""

from .. import cuda as _cuda_backends  # noqa: F401  (registers the CUDA backends)
from .. import triton as _triton_backends  # noqa: F401  (registers the Triton backends)
from ..common.registry import BACKENDS, implemented_backends, registered_ops, resolve
from .attention import tree_attention
from .block_verification import block_verify, block_verify_logits
from .logit_verify import bild_verify, fallback_check, greedy_verify, max_prob, relaxed_verify
from .rejection_sampling import rejection_sample, rejection_sample_logits
from .early_exit import early_exit_topk
from .kv_cache import kv_compact, kv_rollback
from .tree_verify import tree_greedy_verify, tree_rejection_sample

__all__ = [
    "BACKENDS", "bild_verify", "block_verify", "block_verify_logits", "early_exit_topk", "fallback_check", "greedy_verify", "implemented_backends",
    "kv_compact", "kv_rollback", "max_prob", "registered_ops", "rejection_sample", "rejection_sample_logits",
    "relaxed_verify", "resolve", "tree_attention", "tree_greedy_verify", "tree_rejection_sample",
]
