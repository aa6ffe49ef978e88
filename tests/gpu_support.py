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


def backends_here(op: str = "rejection_sample") -> list[str]:
    """The backends a test can run `op` on here: torch always; triton on a GPU, or on CPU tensors
    under TRITON_INTERPRET=1; cuda on a GPU with `_C` loaded (and a CUDA form of `op`)."""
    from specdec_kernels import ops

    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    names = ["torch"]
    for backend in ("triton", "cuda"):
        try:
            ops.resolve(op, backend, device)
        except (ValueError, RuntimeError):
            continue
        names.append(backend)
    return names
