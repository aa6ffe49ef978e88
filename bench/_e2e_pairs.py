"""The (target, draft) pairs bench/e2e.py runs: synthetic aligned pairs with a controllable acceptance
rate, the embedded default pair, and local HF folders.

Synthetic aligned pair: a random Llama draft and a target made of the draft's layers followed by extra
layers whose output projections (o_proj, down_proj) are zero. Each extra layer then adds exactly zero
to the residual stream, so the target's logits equal the draft's (acceptance 1, up to the rounding of
batched vs single-token forwards). Gaussian noise of std `noise * initializer_range` on those
projections makes the extra layers matter, which lowers the acceptance rate; the bench sweeps it.
"""

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

# The target of issue 9's H100 numbers: TinyLlama-1.1B's shape (the draft keeps its first 2 layers' shape).
TINYLLAMA_SHAPE = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_attention_heads=32,
                       num_key_value_heads=4, max_position_embeddings=2048)
SMOKE_SHAPE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=512)
CPU_SHAPE = dict(vocab_size=2048, hidden_size=256, intermediate_size=688, num_attention_heads=8,
                 num_key_value_heads=2, max_position_embeddings=1024)
# a wide init makes the random model's next-token distributions peaked, so greedy argmax is not decided
# by rounding-level near-ties and the noise sweep moves the acceptance rate smoothly
SYNTHETIC_INIT = 0.05


@dataclass
class Pair:
    """One benchmarked pair. prompts: int64 [N, P] on the CPU (rows are taken per batch size);
    noise: the synthetic pair's noise scale (None for real pairs); skip: why it cannot run."""

    name: str
    target: torch.nn.Module | None
    draft: torch.nn.Module | None
    prompts: torch.Tensor | None
    noise: float | None = None
    skip: str | None = None
    info: dict = field(default_factory=dict)


def _llama(layers: int, shape: dict, device, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(num_hidden_layers=layers, initializer_range=SYNTHETIC_INIT, eos_token_id=None,
                         bos_token_id=None, pad_token_id=0, tie_word_embeddings=False, **shape)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval()


class AlignedPair:
    """The synthetic family: one draft, one target whose extra layers' noise is set per level
    (set_noise re-draws it from a fixed seed, so each level is reproducible and levels can repeat)."""

    def __init__(self, shape: dict, draft_layers: int, target_layers: int, device, dtype, seed: int = 0):
        if target_layers <= draft_layers:
            raise ValueError(f"e2e: the aligned target needs more layers than the draft ({target_layers} <= "
                             f"{draft_layers})")
        torch.manual_seed(seed)
        self.draft = _llama(draft_layers, shape, device, dtype)
        self.target = _llama(target_layers, shape, device, dtype)
        self.draft_layers, self.seed = draft_layers, seed
        target_state = self.target.state_dict()
        # shared parts: embeddings, the draft's layers, the final norm and the LM head
        self.target.load_state_dict({**target_state, **self.draft.state_dict()})
        self.extra = [p for i, layer in enumerate(self.target.model.layers) if i >= draft_layers
                      for p in (layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight)]
        self.set_noise(0.0)

    @torch.no_grad()
    def set_noise(self, noise: float) -> None:
        generator = torch.Generator(device="cpu").manual_seed(self.seed + 1)
        for weight in self.extra:
            if noise == 0:
                weight.zero_()
            else:
                draw = torch.randn(weight.shape, generator=generator)
                weight.copy_((noise * SYNTHETIC_INIT * draw).to(weight.dtype))
        self.noise = noise

    def describe(self) -> dict:
        config = self.target.config
        return {"target_layers": config.num_hidden_layers, "draft_layers": self.draft_layers,
                "hidden": config.hidden_size, "heads": config.num_attention_heads,
                "kv_heads": config.num_key_value_heads, "intermediate": config.intermediate_size,
                "vocab": config.vocab_size}


# The 12.6 M-parameter shape of issue 18: 6 layers x 384, 6 heads over 2 KV heads, the default's vocabulary.
WIDE_SHAPE = dict(vocab_size=4096, hidden_size=384, intermediate_size=1024, num_attention_heads=6,
                  num_key_value_heads=2, max_position_embeddings=2048)


def random_prompts(vocab: int, rows: int, length: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (rows, length), generator=generator)


def text_prompts(tokenizer, rows: int, length: int) -> torch.Tensor:
    """Rows of `length` tokens from the standard library's argparse.py (text on every machine; the
    bench measures speed and acceptance, not quality, so overlap with training text does not matter)."""
    import argparse
    ids = tokenizer(Path(argparse.__file__).read_text(), add_special_tokens=False)["input_ids"]
    stride = max(len(ids) // max(rows, 1), length)
    if len(ids) < length:
        raise ValueError(f"e2e: the prompt text has {len(ids)} tokens, fewer than --prompt-length {length}")
    return torch.tensor([ids[(i * stride) % (len(ids) - length + 1):][:length] for i in range(rows)])


def no_eos(model) -> None:
    """Every method generates exactly max_new_tokens per row: EOS is switched off for the bench."""
    model.generation_config.eos_token_id = None
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = 0


def default_pair(path, rows: int, length: int, device, dtype) -> Pair:
    from specdec_kernels.defaults import default_models_available, load_default_models
    if not default_models_available(path):
        where = path or "the package (specdec_kernels/default_models)"
        return Pair("default", None, None, None, skip=f"no default model set in {where}; pass --models PATH")
    models = load_default_models(path, device=device, dtype=dtype)
    for model in (models.target, models.draft):
        no_eos(model)
    return Pair("default", models.target, models.draft, text_prompts(models.tokenizer, rows, length),
                info={"path": str(models.path)})


def local_pair(target_path: str, draft_path: str, rows: int, length: int, device, dtype) -> Pair:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    name = f"{Path(target_path).name}+{Path(draft_path).name}"
    try:
        target = AutoModelForCausalLM.from_pretrained(target_path, dtype=dtype).to(device).eval()
        draft = AutoModelForCausalLM.from_pretrained(draft_path, dtype=dtype).to(device).eval()
    except (OSError, ValueError) as error:
        return Pair(name, None, None, None, skip=f"cannot load: {error}")
    for model in (target, draft):
        no_eos(model)
    try:
        prompts = text_prompts(AutoTokenizer.from_pretrained(target_path), rows, length)
    except (OSError, ValueError, TypeError):  # a folder without a tokenizer: random ids
        prompts = random_prompts(target.config.vocab_size, rows, length)
    return Pair(name, target, draft, prompts, info={"target": os.fspath(target_path), "draft": os.fspath(draft_path)})
