"""HuggingFace integration: a KV cache with per-row lengths, rollback and tree compaction (SpecCache),
an attention implementation that runs ops.tree_attention inside HF models (`specdec_tree`), and
model adapters that expose what the decoding strategies need (`adapt(model)`).

Importing this package registers the attention implementation with transformers. `ops/` never
imports transformers; this package is where the dependency lives.
"""

from .adapter_base import DecoderState, ModelAdapter
from .adapters import SUPPORTED_MODEL_TYPES, adapt
from .attention import ATTENTION_NAME, TreeStep, register, tree_attention_forward, tree_positions
from .cache import SpecCache, SpecCacheLayer
from .seq2seq import EncoderState

register()

__all__ = [
    "ATTENTION_NAME", "DecoderState", "EncoderState", "ModelAdapter", "SUPPORTED_MODEL_TYPES", "SpecCache",
    "SpecCacheLayer", "TreeStep", "adapt", "register", "tree_attention_forward", "tree_positions",
]
