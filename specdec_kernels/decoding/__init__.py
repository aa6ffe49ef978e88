"""Decoding strategies on HF models: one engine loop (engine.py), one file per strategy.

`generate(target, input_ids, strategy=..., ...)` is the entry point (also
`specdec_kernels.generate`); strategies are usable as objects too (SpeculativeDecoder, a ChainSpeculative or TreeSpeculative; BildDecoder, SpecDecDecoder, PPDDecoder,
LookupDecoder, PlainDecoder); LookupCache keeps earlier outputs for strategy "lookup" across calls. On a GPU
the draft and verify steps run as CUDA graphs kept between calls (graphs.py); clear_graph_cache() frees them.
"""

from .api import generate
from .bild import BildDecoder
from .graphs import clear_graph_cache
from .lookup import LookupDecoder
from .lookup_cache import LookupCache
from .output import GenerateOutput, Stats
from .plain import PlainDecoder
from .ppd import PPDDecoder
from .specdec import SpecDecDecoder
from .speculative import ChainSpeculative, SpeculativeDecoder, TreeSpeculative

__all__ = ["BildDecoder", "ChainSpeculative", "GenerateOutput", "LookupCache", "LookupDecoder", "PPDDecoder",
           "PlainDecoder", "SpecDecDecoder", "SpeculativeDecoder", "Stats", "TreeSpeculative", "clear_graph_cache",
           "generate"]
