"""CUDA backends of the ops (the compiled `specdec_kernels._C`); importing this package
registers them with `common.registry`. Registration needs no GPU: `ops._backend.resolve`
only picks a `cuda` backend when `_C` loads and the tensors are on a CUDA device.
"""

from . import block_verify  # noqa: F401
from . import early_exit_topk  # noqa: F401
from . import greedy_verify  # noqa: F401
from . import kv_compact  # noqa: F401
from . import logit_verify  # noqa: F401
from . import tree_verify  # noqa: F401
from . import rejection_sample  # noqa: F401
from . import tree_attention  # noqa: F401
