"""Triton backends of the ops; importing this package registers them with `common.registry`.

Inside this package `import triton` is an absolute import and means the triton package
itself, not this subpackage. Without triton installed nothing is registered and the
`triton` backend reports itself as unavailable.
"""

try:
    from . import attention  # noqa: F401  (tree_attention)
    from . import block_verification, block_verification_logits  # noqa: F401  (block_verify, block_verify_logits)
    from . import early_exit  # noqa: F401  (early_exit_topk)
    from . import kv_cache  # noqa: F401  (kv_compact)
    from . import logit_verify  # noqa: F401  (greedy_verify, relaxed_verify, bild_verify, max_prob)
    from . import rejection_sampling  # noqa: F401  (rejection_sample)
    from . import rejection_sampling_logits  # noqa: F401  (rejection_sample_logits)
    from . import tree_verify  # noqa: F401  (tree_greedy_verify, tree_rejection_sample)
except ImportError as _error:  # triton not installed
    IMPORT_ERROR: ImportError | None = _error
else:
    IMPORT_ERROR = None
