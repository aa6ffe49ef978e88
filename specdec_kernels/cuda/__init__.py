"""CUDA backends of the ops (the compiled `specdec_kernels._C`); importing this package
registers them with `common.registry`. Registration needs no GPU: `ops._backend.resolve`
only picks a `cuda` backend when `_C` loads and the tensors are on a CUDA device.
"""

from . import attention  # noqa: F401  (tree_attention)
from . import block_verification  # noqa: F401  (block_verify, block_verify_logits)
from . import early_exit  # noqa: F401  (early_exit_topk)
from . import kv_cache  # noqa: F401  (kv_compact)
from . import logit_verify  # noqa: F401  (relaxed_verify, bild_verify, max_prob)
from . import logit_verify_greedy  # noqa: F401  (greedy_verify)
from . import rejection_sampling  # noqa: F401  (rejection_sample, rejection_sample_logits)
from . import tree_verify  # noqa: F401  (tree_greedy_verify, tree_rejection_sample)
