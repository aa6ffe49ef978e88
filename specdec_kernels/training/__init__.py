"""Training loops for the drafters the decoding strategies use (they need transformers).

train_early_exit_heads: PPD's per-layer ("Y") early-exit heads, distilled from the final layer.
train_specdec_drafter: SpecDec's block-parallel [MASK] drafter, distilled from the target's greedy output.
"""

from .early_exit_heads import early_exit_kl, train_early_exit_heads
from .specdec_drafter import train_specdec_drafter

__all__ = ["early_exit_kl", "train_early_exit_heads", "train_specdec_drafter"]
