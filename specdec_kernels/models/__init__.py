"""Models this package defines (HF PreTrainedModels, and the EAGLE-3 head: a torch module; they need transformers).

SpecDecDrafter: SpecDec's block-parallel [MASK] drafter. Eagle3Drafter: an EAGLE-3 head, loaded from a published
folder. EarlyExitHead(s): PPD's early-exit heads. Importing this package registers SpecDecDrafter's config with
AutoConfig/AutoModel, so `AutoModel.from_pretrained(saved_dir)` works too.
"""

from transformers import AutoConfig, AutoModel

from .eagle3 import Eagle3Drafter
from .early_exit_head import EarlyExitHead, EarlyExitHeads
from .specdec_drafter import DrafterCache, SpecDecDrafter, SpecDecDrafterConfig, SpecDecDrafterOutput

AutoConfig.register(SpecDecDrafterConfig.model_type, SpecDecDrafterConfig, exist_ok=True)
AutoModel.register(SpecDecDrafterConfig, SpecDecDrafter, exist_ok=True)

__all__ = ["DrafterCache", "Eagle3Drafter", "EarlyExitHead", "EarlyExitHeads", "SpecDecDrafter", "SpecDecDrafterConfig",
           "SpecDecDrafterOutput"]
