"""Triton backends of the ops; importing this package registers them with `ops._backend`.

Inside this package `import triton` is an absolute import and means the triton package
itself, not this subpackage. Without triton installed nothing is registered and the
`triton` backend reports itself as unavailable.
"""

try:
    from . import greedy_verify  # noqa: F401  (registers greedy_verify/triton)
    from . import rejection_sample  # noqa: F401  (registers rejection_sample/triton)
    from . import logit_verify  # noqa: F401  (registers relaxed_verify, bild_verify, max_prob /triton)
except ImportError as _error:  # triton not installed
    IMPORT_ERROR: ImportError | None = _error
else:
    IMPORT_ERROR = None
