"""What every GPU test file of the CUDA kernels starts with: the loaded `_C` module (or
None) and the marks that make the file skip cleanly without CUDA or without a built `_C`."""

import pytest
import torch

from specdec_kernels.common import cuda_module as _cuda_module

_C = _cuda_module.load()  # None when not built or not importable: skip, never error at collection

CUDA_KERNEL_MARKS = [
    pytest.mark.gpu,
    pytest.mark.skipif(_C is None or not torch.cuda.is_available(),
                       reason="needs a CUDA GPU and the built specdec_kernels._C extension"),
]
