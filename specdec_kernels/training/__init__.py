"""Training loops for the drafters the decoding strategies use (they need transformers).

train_early_exit_heads: PPD's per-layer ("Y") early-exit heads, distilled from the final layer.
train_specdec_drafter: SpecDec's block-parallel [MASK] drafter, distilled from the target's greedy output.
train_eagle3_head: an EAGLE-3 head (new_head) on the target's own states, with EAGLE-3's training-time test.
"""

from .eagle3 import new_head, train_eagle3_head
from .early_exit_heads import early_exit_kl, train_early_exit_heads
from .specdec_drafter import train_specdec_drafter

__all__ = ["early_exit_kl", "new_head", "train_eagle3_head", "train_early_exit_heads", "train_specdec_drafter"]
