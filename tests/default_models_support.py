"""A tiny, untrained set of default models in the layout specdec_kernels.defaults reads: lets the demo,
bench/e2e.py and the loader be tested fast and independently of the shipped (trained) weights."""

import os
from pathlib import Path

import torch


def tiny_tokenizer(vocab_size: int = 300):
    """A byte-level BPE tokenizer trained in well under a second on one standard-library file."""
    from specdec_kernels.training.tokenizer import train_bpe_tokenizer
    return train_bpe_tokenizer([(Path(os.__file__).parent / "textwrap.py").read_text()], vocab_size)


def make_tiny_default_models(seed: int = 0):
    """DefaultModels with random weights: 4-layer target, 1-layer draft (a noisy copy of the target's
    first layer, so it agrees often), 2-layer SpecDec drafter, "Y" heads at layers 2 and 3, an EAGLE-3 head
    reading layers 1, 2 and 4 (started from the target's LM head, so it agrees sometimes)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specdec_kernels.defaults import DefaultModels
    from specdec_kernels.models import EarlyExitHead, EarlyExitHeads, SpecDecDrafter
    from specdec_kernels.training.eagle3 import new_head
    from specdec_kernels.training.specdec_drafter import default_drafter_config

    tokenizer = tiny_tokenizer()
    torch.manual_seed(seed)
    eos = tokenizer.eos_token_id
    config = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=1024, initializer_range=0.2,
                  eos_token_id=eos, bos_token_id=eos, pad_token_id=eos)
    target = LlamaForCausalLM(LlamaConfig(num_hidden_layers=4, **config)).eval()
    draft = LlamaForCausalLM(LlamaConfig(num_hidden_layers=1, **config)).eval()
    draft_state = draft.state_dict()
    for name, value in target.state_dict().items():
        if name in draft_state:
            draft_state[name] = value + 0.01 * torch.randn_like(value)
    draft.load_state_dict(draft_state)
    drafter = SpecDecDrafter(default_drafter_config(target, block_size=4, max_length=1024)).eval()
    heads = EarlyExitHeads({layer: EarlyExitHead.from_model(target, copy=True) for layer in (2, 3)}).eval()
    eagle3 = new_head(target, aux_layers=(1, 2, 4), draft_ids=torch.arange(len(tokenizer))).eval()
    return DefaultModels(tokenizer=tokenizer, target=target, draft=draft, specdec_drafter=drafter,
                         early_exit_heads=heads, path=Path("."), eagle3=eagle3)


def save_tiny_default_models(path) -> Path:
    """Write make_tiny_default_models() to `path` (with a MADE.md) and return it."""
    from specdec_kernels.defaults import save_default_models

    path = Path(path)
    save_default_models(make_tiny_default_models(), path, dtype=torch.float32)
    (path / "MADE.md").write_text("untrained test set (tests/default_models_support.py)\n")
    return path
