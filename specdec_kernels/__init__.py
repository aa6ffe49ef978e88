"""specdec-kernels: GPU kernels and thin HF wrappers for speculative decoding.

`specdec_kernels.ops` is the kernel API; `specdec_kernels.reference` its executable
specification in plain PyTorch; `build_info()` says what this install can run.
"""

from . import ops, reference
from ._build_info import build_info
from ._version import __version__

__all__ = ["LookupCache", "__version__", "build_info", "custom_generate", "generate", "ops", "reference"]


def __getattr__(name):
    # `generate` lives in decoding/, which imports transformers: load it on first use only, so
    # `import specdec_kernels` stays torch-only.
    if name == "generate":
        from .decoding import generate
        return generate
    if name == "LookupCache":  # strategy "lookup"'s store of earlier outputs, kept across calls
        from .decoding import LookupCache
        return LookupCache
    if name == "custom_generate":  # HF's model.generate(custom_generate=...) hook (hf_generate/)
        from .hf_generate import custom_generate
        return custom_generate
    raise AttributeError(f"module 'specdec_kernels' has no attribute {name!r}")
