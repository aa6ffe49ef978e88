"""`specdec_kernels.build_info()`: what was built and which backend `auto` picks here."""

from importlib import metadata

import torch

from .common import cuda_module as _cuda_module
from ._version import __version__


def build_info() -> dict:
    """A dict describing this install: version, the CUDA module, library versions, backends.

    Keys: version, cuda_module {built, loaded, error, archs, cuda_runtime_version},
    torch, triton, transformers, cuda_available, device, auto_backends {op: backend on this machine},
    auto_reasons {op: why auto picks it: the record that verified the kernel, or what was passed over},
    implemented_backends {op: (backends...)}.
    """
    from . import ops
    from .common import kernel_trust

    lib = _cuda_module.load()
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    return {
        "version": __version__,
        "cuda_module": {
            "built": _cuda_module.built(),
            "loaded": lib is not None,
            "error": _cuda_module.load_error(),
            "archs": list(lib.compiled_archs()) if lib else [],
            "cuda_runtime_version": lib.cuda_runtime_version() if lib else None,
        },
        "torch": torch.__version__,
        "triton": triton_version,
        "transformers": _distribution_version("transformers"),  # read without importing transformers
        "cuda_available": torch.cuda.is_available(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "auto_backends": {op: ops.resolve(op, "auto", device) for op in ops.registered_ops()},
        "auto_reasons": {op: kernel_trust.explain(op, device) for op in ops.registered_ops()},
        "implemented_backends": {op: ops.implemented_backends(op) for op in ops.registered_ops()},
    }


def _distribution_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
