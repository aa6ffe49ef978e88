"""Early-exit heads for PPD: a norm + LM head that reads the hidden state after decoder layer d̄.

Two kinds, as in the PPD paper's Table 2:
  "N": the model's own final norm and LM head reused at layer d̄ (the "logit lens";
       `EarlyExitHead.from_model(model)` shares the model's parameters, nothing is copied);
  "Y": a head trained for that layer (`train_early_exit_heads`), initialised as a copy of "N".
Both score candidates with ops.early_exit_topk (fused norm + LM head + top-k) at decode time;
`forward` gives the full float32 logits (training, match-rate tables).

EarlyExitHeads maps layer -> head and saves/loads itself (`save_pretrained` / `from_pretrained`).
"""

import json
from pathlib import Path

import torch
from torch import Tensor, nn

from .. import ops, reference

CONFIG_FILE = "early_exit_heads.json"
WEIGHTS_FILE = "early_exit_heads.pt"


def final_head_parts(model) -> dict:
    """The norm kind, norm weight/bias, eps and LM head weight of an HF model or its hf.adapt adapter
    (a plain model keeps its attention implementation: adapting it is only a way to find its parts)."""
    from .. import hf
    from ..decoding.engine import restored_attention
    if isinstance(model, hf.ModelAdapter):
        adapter = model
    else:
        with restored_attention(model):
            adapter = hf.adapt(model)
    norm = adapter.final_norm
    if isinstance(norm, nn.LayerNorm):
        kind, eps, bias = "layer", norm.eps, norm.bias
    elif isinstance(norm, nn.Identity):
        kind, eps, bias = "none", 0.0, None
    else:  # RMSNorm of the rotary families (Llama, Mistral, Qwen2/3)
        eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
        if eps is None or not hasattr(norm, "weight"):
            raise ValueError(f"early-exit head: unsupported final norm {type(norm).__name__}")
        kind, bias = "rms", None
    return {"norm": kind, "eps": float(eps), "norm_weight": getattr(norm, "weight", None), "norm_bias": bias,
            "lm_head_weight": adapter.lm_head.weight}


class EarlyExitHead(nn.Module):
    """norm (rms / layer / none) then a bias-free LM head [V, H].

    Args:
        hidden_size, vocab_size: H and V.
        norm: "rms" | "layer" | "none"; eps: its epsilon.
    """

    def __init__(self, hidden_size: int, vocab_size: int, *, norm: str = "rms", eps: float = 1e-6):
        super().__init__()
        if norm not in ops.early_exit.NORMS:
            raise ValueError(f"EarlyExitHead: `norm` must be one of {ops.early_exit.NORMS} (got {norm!r})")
        self.norm, self.eps = norm, float(eps)
        self.norm_weight = nn.Parameter(torch.ones(hidden_size)) if norm != "none" else None
        self.norm_bias = nn.Parameter(torch.zeros(hidden_size)) if norm == "layer" else None
        self.weight = nn.Parameter(torch.zeros(vocab_size, hidden_size))

    @classmethod
    def from_model(cls, model, *, copy: bool = False) -> "EarlyExitHead":
        """The model's final norm + LM head: shared ("N" head) or copied (the start of a "Y" head)."""
        parts = final_head_parts(model)
        weight = parts["lm_head_weight"]
        head = cls(weight.shape[1], weight.shape[0], norm=parts["norm"], eps=parts["eps"])
        for name in ("norm_weight", "norm_bias"):
            if getattr(head, name) is not None and parts[name] is not None:
                source = parts[name]
                setattr(head, name, nn.Parameter(source.detach().clone()) if copy else source)
        head.weight = nn.Parameter(weight.detach().clone()) if copy else weight
        return head

    def config(self) -> dict:
        return {"hidden_size": self.weight.shape[1], "vocab_size": self.weight.shape[0], "norm": self.norm,
                "eps": self.eps}

    def forward(self, hidden: Tensor) -> Tensor:
        """[..., V] float32 logits of hidden states [..., H] (differentiable; the reference math)."""
        normed = reference.early_exit.normalize(hidden, self.norm_weight, self.norm_bias, eps=self.eps, norm=self.norm)
        return normed @ self.weight.float().t()

    def topk(self, hidden: Tensor, k: int, *, backend: str = "auto") -> tuple[Tensor, Tensor]:
        """(values [B, k] float32, token ids [B, k] int64) of hidden [B, H], via ops.early_exit_topk."""
        weight = self.weight if self.weight.dtype == hidden.dtype else self.weight.to(hidden.dtype)
        return ops.early_exit_topk(hidden, self.norm_weight, weight, k, eps=self.eps, norm=self.norm,
                                   norm_bias=self.norm_bias, backend=backend)


class EarlyExitHeads(nn.Module):
    """Trained ("Y") heads by layer: `heads[layer]` (layer = HF output_hidden_states index)."""

    def __init__(self, heads: dict[int, EarlyExitHead]):
        super().__init__()
        self.heads = nn.ModuleDict({str(int(layer)): head for layer, head in heads.items()})

    @property
    def layers(self) -> list[int]:
        return sorted(int(layer) for layer in self.heads)

    def __getitem__(self, layer: int) -> EarlyExitHead:
        if str(int(layer)) not in self.heads:
            raise KeyError(f"no early-exit head for layer {layer} (trained layers: {self.layers})")
        return self.heads[str(int(layer))]

    def __contains__(self, layer) -> bool:
        return str(int(layer)) in self.heads

    def save_pretrained(self, directory) -> None:
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        config = {str(layer): self[layer].config() for layer in self.layers}
        (path / CONFIG_FILE).write_text(json.dumps(config, indent=2))
        torch.save({k: v.detach().cpu() for k, v in self.state_dict().items()}, path / WEIGHTS_FILE)

    @classmethod
    def from_pretrained(cls, directory, *, device=None, dtype=None) -> "EarlyExitHeads":
        path = Path(directory)
        config = json.loads((path / CONFIG_FILE).read_text())
        heads = cls({int(layer): EarlyExitHead(c["hidden_size"], c["vocab_size"], norm=c["norm"], eps=c["eps"])
                     for layer, c in config.items()})
        heads.load_state_dict(torch.load(path / WEIGHTS_FILE, weights_only=True))
        return heads.to(device=device, dtype=dtype).eval()
