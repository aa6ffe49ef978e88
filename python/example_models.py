"""What the generate_*.py examples share: the model options, the models, the prompts and the greedy reference.

Models: the embedded default set (specdec_kernels.defaults), another set in its layout (--models PATH),
or the user's own local HF checkpoints (--target PATH --draft PATH; the tokenizer is read from --target).
"""

import argparse
from types import SimpleNamespace
from typing import NamedTuple

import torch

PROMPTS = ("def fibonacci(n):\n    ", "class Stack:\n    def __init__(self):\n        ")


DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def parser(doc: str, *, user_models: bool = True, draft: bool = True) -> argparse.ArgumentParser:
    out = argparse.ArgumentParser(description=doc.splitlines()[0])
    out.add_argument("--models", help="a folder in the default-models layout (default: the embedded set)")
    if user_models:
        out.add_argument("--target", help="a local HF causal LM (instead of the default set)")
    if user_models and draft:
        out.add_argument("--draft", help="a smaller local HF causal LM sharing --target's tokenizer")
    out.add_argument("--max-new-tokens", type=int, default=32)
    return out


def load(args) -> SimpleNamespace:
    """tokenizer, target, draft (+ specdec_drafter, early_exit_heads for a default set), in float32 (the dtype
    in which the lossless strategies are token-identical to greedy) on the GPU if there is one."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec_kernels.defaults import load_default_models

    if not getattr(args, "target", None):
        return load_default_models(args.models, device=DEVICE, dtype=torch.float32)
    if hasattr(args, "draft") and not args.draft:
        raise SystemExit("--target and --draft go together")

    def causal_lm(path):
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(DEVICE).eval()

    return SimpleNamespace(tokenizer=AutoTokenizer.from_pretrained(args.target), target=causal_lm(args.target),
                           draft=causal_lm(args.draft) if getattr(args, "draft", None) else None)


def encode(tokenizer, prompts=PROMPTS) -> dict:
    """Prompts of different lengths, left-padded as HF users pass them."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return {k: v.to(DEVICE) for k, v in tokenizer(list(prompts), return_tensors="pt", padding=True).items()}


def greedy(models, batch, max_new_tokens) -> torch.Tensor:
    """The target's own HF greedy decoding: what every lossless strategy must reproduce token for token."""
    return models.target.generate(**batch, do_sample=False, max_new_tokens=max_new_tokens,
                                  pad_token_id=models.tokenizer.pad_token_id)


def show(name, models, batch, out, reference) -> None:
    """Print the first row's continuation, the statistics and whether the output equals target greedy."""
    new = out.sequences[0, batch["input_ids"].shape[1]:]
    stats = out.stats
    print(f"{name}: {models.tokenizer.decode(new, skip_special_tokens=True)!r}")
    print(f"{name}: {stats.mean_accepted_tokens:.2f} tokens per target forward, acceptance rate "
          f"{stats.acceptance_rate:.2f}, {stats.steps} steps")
    print(f"{name} == target greedy: {torch.equal(out.sequences, reference)}")


class Pair(NamedTuple):
    target: torch.nn.Module
    draft: torch.nn.Module
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    pad: int


def pair_or_tiny(args, noise: float) -> Pair:
    """target, draft, input_ids, attention_mask, pad: the chosen set (load), or, when this checkout ships no
    trained set and none is given, a tiny random Llama pair whose draft is the target with weights perturbed
    by `noise` (more noise, more misses), with two prompts, the first left-padded."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specdec_kernels.defaults import default_models_available

    if args.target or args.models or default_models_available():
        models = load(args)
        batch = encode(models.tokenizer)
        return Pair(models.target, models.draft, batch["input_ids"], batch["attention_mask"],
                    models.tokenizer.pad_token_id)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2)
    target = LlamaForCausalLM(config).to(DEVICE).eval()
    draft = LlamaForCausalLM(config).to(DEVICE).eval()
    draft.load_state_dict({k: v + noise * torch.randn_like(v) for k, v in target.state_dict().items()})
    return Pair(target, draft, torch.tensor([[0, 0, 5, 17, 42, 9], [11, 23, 8, 64, 3, 30]], device=DEVICE),
                torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], device=DEVICE), pad=0)
