"""The embedded default models: what `specdec-kernels demo` and `bench/e2e.py` run with no arguments.

A small Llama target, a smaller Llama draft sharing its tokenizer, a SpecDec drafter and trained
("Y") early-exit heads, all trained on the Python standard library's source by
`bench/train_default_models.py`, and an EAGLE-3 head for the target (`bench/train_eagle.py`, optional
in a set: eagle3/ has its own MADE.md), shipped inside the package (folder `default_models/`, its
MADE.md says how they were made). One folder holds one set.

The folder layout and the models' sizes: docs/default-models.md.
"""

from dataclasses import dataclass
from pathlib import Path

import torch

DEFAULT_MODELS_DIR = Path(__file__).resolve().parent / "default_models"
PARTS = ("tokenizer", "target", "draft", "specdec_drafter", "early_exit_heads")
OPTIONAL_PARTS = ("eagle3",)  # loaded where the set has the folder (sets made before it lack it)


@dataclass
class DefaultModels:
    """One set of default models (all in eval mode, on one device, one dtype)."""

    tokenizer: object  # transformers.PreTrainedTokenizerFast
    target: torch.nn.Module  # LlamaForCausalLM
    draft: torch.nn.Module  # LlamaForCausalLM
    specdec_drafter: torch.nn.Module  # specdec_kernels.models.SpecDecDrafter
    early_exit_heads: torch.nn.Module  # specdec_kernels.models.EarlyExitHeads
    path: Path
    eagle3: torch.nn.Module | None = None  # specdec_kernels.models.Eagle3Drafter for the target, if the set has one

    def strategy_options(self) -> dict:
        """Keyword arguments of specdec_kernels.generate for each strategy on this set: the models of this
        set its second model takes (the strategy table's partner), {} for one that needs none."""
        from .decoding.strategies import TABLE

        return {s.name: s.partner.options_for(getattr(self, s.partner.part), self.target) if s.partner else {}
                for s in TABLE if not s.partner or getattr(self, s.partner.part) is not None}


def default_models_available(path=None) -> bool:
    """True if `path` (default: the embedded folder) holds every part of a set."""
    root = Path(path) if path is not None else DEFAULT_MODELS_DIR
    return all((root / part).is_dir() for part in PARTS)


def load_default_models(path=None, *, device="cpu", dtype: torch.dtype | None = None) -> DefaultModels:
    """Load a set of default models (default: the one shipped in the package).

    Args:
        path: a folder laid out as this module's docstring says; None = the embedded set.
        device: where to put the models.
        dtype: their parameter dtype (default: float32 on the CPU, bfloat16 on a GPU).
    """
    root = Path(path) if path is not None else DEFAULT_MODELS_DIR
    missing = [part for part in PARTS if not (root / part).is_dir()]
    if missing:
        raise FileNotFoundError(f"load_default_models: {root} lacks {', '.join(missing)} (expected the folders "
                                f"{', '.join(PARTS)}; `python bench/train_default_models.py --out {root}` makes them)")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .models import Eagle3Drafter, EarlyExitHeads, SpecDecDrafter

    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():  # else torch's bare AssertionError, deep in .to()
        raise ValueError(f"load_default_models: device={str(device)!r} needs CUDA, which this torch "
                         f"({torch.__version__}) does not see: pass device='cpu'")
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    def causal_lm(part):
        return AutoModelForCausalLM.from_pretrained(root / part, dtype=dtype).to(device).eval()

    target = causal_lm("target")
    return DefaultModels(
        tokenizer=AutoTokenizer.from_pretrained(root / "tokenizer"),
        target=target,
        draft=causal_lm("draft"),
        specdec_drafter=SpecDecDrafter.from_pretrained(root / "specdec_drafter", dtype=dtype).to(device).eval(),
        early_exit_heads=EarlyExitHeads.from_pretrained(root / "early_exit_heads", device=device, dtype=dtype),
        path=root,
        eagle3=Eagle3Drafter.from_pretrained(root / "eagle3", target) if (root / "eagle3").is_dir() else None,
    )


def save_default_models(models: DefaultModels, path, *, dtype: torch.dtype = torch.float16) -> None:
    """Write a set in the layout load_default_models reads, parameters stored as `dtype`."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    models.tokenizer.save_pretrained(root / "tokenizer")
    for part in ("target", "draft", "specdec_drafter"):
        module = getattr(models, part)
        original = next(module.parameters()).dtype
        module.to(dtype).save_pretrained(root / part)
        module.to(original)
    heads = models.early_exit_heads
    original = next(heads.parameters()).dtype
    heads.to(dtype).save_pretrained(root / "early_exit_heads")
    heads.to(original)
    if models.eagle3 is not None:
        models.eagle3.save_pretrained(root / "eagle3", dtype=dtype)
