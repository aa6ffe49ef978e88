"""Training loops for the drafters the decoding strategies use (they need transformers).

train_specdec_drafter: SpecDec's block-parallel [MASK] drafter, distilled from the target's greedy output.
"""

from .specdec_drafter import train_specdec_drafter

__all__ = ["train_specdec_drafter"]
