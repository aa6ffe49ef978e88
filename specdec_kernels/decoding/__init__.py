"""Decoding strategies on HF models: one engine loop (engine.py) with one verifier (verifier.py), and one
drafter per strategy, named in one table (strategies.py).

`generate(target, input_ids, strategy=..., ...)` is the entry point (also `specdec_kernels.generate`);
drafters are usable as objects too (SpeculativeDecoder, a ChainSpeculative or TreeSpeculative; BildDecoder,
SpecDecDecoder, PPDDecoder, LookupDecoder, EagleDecoder, MtpDrafter, PlainDecoder, or a Drafter of your own);
LookupCache keeps earlier outputs for strategy "lookup" across calls. On a GPU the draft and verify steps run
as CUDA graphs kept between calls (graphs.py); clear_graph_cache() frees them.
"""

from .api import generate
from .bild import BildDecoder
from .drafter import Drafter
from .eagle import EagleDecoder
from .graphs import clear_graph_cache
from .hidden_states import FINAL_NORM
from .lookup import LookupDecoder
from .lookup_cache import LookupCache
from .mtp import MtpDrafter
from .output import GenerateOutput, Stats
from .plain import PlainDecoder
from .ppd import PPDDecoder
from .specdec import SpecDecDecoder
from .speculative import ChainSpeculative, SpeculativeDecoder, TreeSpeculative
from .step import Accepted, Proposal, StepPlan
from .strategies import STRATEGIES
from .verifier import Verification, Verifier

__all__ = ["Accepted", "BildDecoder", "ChainSpeculative", "Drafter", "EagleDecoder", "FINAL_NORM", "GenerateOutput",
           "LookupCache", "LookupDecoder", "MtpDrafter", "PPDDecoder", "PlainDecoder", "Proposal", "STRATEGIES",
           "SpecDecDecoder", "SpeculativeDecoder", "Stats", "StepPlan", "TreeSpeculative", "Verification", "Verifier",
           "clear_graph_cache", "generate"]
