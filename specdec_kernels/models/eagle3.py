"""EAGLE-3 draft heads (Li et al., 2025) loaded from the folders their authors publish, as vLLM and SGLang
load them: `Eagle3Drafter.from_pretrained(folder, target)`.

The layout (the EAGLE authors' `LlamaForCausalLMEagle3` releases; vLLM's llama_eagle3.py reads the same):
  config.json    architectures ["LlamaForCausalLMEagle3"]; Llama sizes (hidden_size h, heads, kv heads,
                 intermediate_size, rms_norm_eps, rope settings); vocab_size (the target's), draft_vocab_size;
                 optional target_hidden_size (default h), norm_before_residual, and eagle_config with
                 eagle_aux_hidden_state_layer_ids (default 2, L//2, L-3 for an L-layer target) and
                 use_aux_hidden_state (default true)
  weights        (model.safetensors or pytorch_model.bin)
    fc.weight                            [h, 3 h_target]  the three target states, concatenated, to h
    midlayer.input_layernorm.weight      [h]              on the token's embedding
    midlayer.hidden_norm.weight          [h]              on the state
    midlayer.self_attn.{q,k,v}_proj.weight  [heads * d, 2h], [kv * d, 2h] x2: attention reads [embedding ; state]
    midlayer.self_attn.o_proj.weight     [h, heads * d]
    midlayer.post_attention_layernorm.weight [h]
    midlayer.mlp.{gate,up}_proj.weight   [intermediate, h];  midlayer.mlp.down_proj.weight [h, intermediate]
    norm.weight                          [h]
    lm_head.weight                       [draft_vocab, h]
    d2t                                  [draft_vocab] int64: draft id i is target id i + d2t[i]
    t2d                                  [vocab] bool (which target ids the draft has; not needed to draft)
    embed_tokens.weight                  [vocab, h], optional: else the target's embedding is shared

Aux layer id i is the state entering the target's decoder layer i (vLLM's and the authors' reading), i.e.
the output of layer i - 1: engine.hidden's layer index i - 1.

One step of the head at position t reads (state s_t, token x_{t+1}) and predicts x_{t+2}:
  a = input_layernorm(embed(x_{t+1})), b = hidden_norm(s_t)
  r = s_t (b with norm_before_residual), y = o_proj(attention(q, k, v of [a ; b])) + r
  out = mlp(post_attention_layernorm(y)) + y        (fed back as the next step's s)
  logits = lm_head(norm(out)), placed at the target ids d2t names (-inf at the others).
s_t is fc([target states]) for committed positions, a previous step's `out` for drafted ones.
"""

import json
from pathlib import Path

import torch
from torch import Tensor, nn

ARCHITECTURE = "LlamaForCausalLMEagle3"
OP = "Eagle3Drafter.from_pretrained"


def _fail(message: str, error=ValueError):
    raise error(f"{OP}: {message}")


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's default target layers: low, middle and high (2, L // 2, L - 3)."""
    return (2, num_layers // 2, num_layers - 3)


def _read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        _fail(f"{folder} has no config.json (an EAGLE-3 head's folder holds config.json and its weights)",
              FileNotFoundError)
    config = json.loads(path.read_text())
    if ARCHITECTURE not in (config.get("architectures") or []):
        _fail(f"config.json's architectures must name {ARCHITECTURE!r} (got {config.get('architectures')!r})")
    return config


def _read_weights(folder: Path) -> dict:
    """The state dict of model.safetensors, else pytorch_model.bin (tensors only, no pickled code)."""
    if (folder / "model.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(str(folder / "model.safetensors"))
    if (folder / "pytorch_model.bin").is_file():
        return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    _fail(f"{folder} has neither model.safetensors nor pytorch_model.bin", FileNotFoundError)


def head_config(config: dict):
    """The head's decoder-layer config: a LlamaConfig of the folder's sizes (rope settings in either the
    old rope_theta / rope_scaling keys or transformers 5's rope_parameters), one layer."""
    from transformers import LlamaConfig

    keys = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "rms_norm_eps", "max_position_embeddings", "rope_theta", "rope_scaling", "rope_parameters",
            "hidden_act", "attention_bias", "mlp_bias", "vocab_size")
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size"):
        if not isinstance(config.get(key), int) or config[key] < 1:
            _fail(f"config.json's {key} must be a positive int (got {config.get(key)!r})")
    llama = LlamaConfig(**{key: config[key] for key in keys if config.get(key) is not None}, num_hidden_layers=1)
    if llama.hidden_size % llama.num_attention_heads and config.get("head_dim") is None:
        _fail(f"hidden_size {llama.hidden_size} is not a multiple of num_attention_heads "
              f"{llama.num_attention_heads}: config.json needs head_dim")
    return llama


class Eagle3Drafter(nn.Module):
    """An EAGLE-3 draft head for one target: `Eagle3Drafter.from_pretrained(folder, target)`, then
    `specdec_kernels.generate(target, ids, strategy="eagle", draft_model=head)` (see the module docstring
    for the layout and the step).

    Attributes: aux_layers (the aux layer ids, the states entering those target layers; empty when the
    head reads the target's final-norm output instead: use_aux_hidden_state false), draft_vocab, vocab.
    """

    def __init__(self, llama_config, *, target_hidden: int, aux_layers: tuple, draft_vocab: int,
                 norm_before_residual: bool = False, embed_tokens: nn.Module | None = None):
        super().__init__()
        from transformers.models.llama.modeling_llama import (LlamaAttention, LlamaMLP, LlamaRMSNorm,
                                                              LlamaRotaryEmbedding)

        self.config = llama_config
        self.set_attn_implementation("sdpa")  # strategy eagle switches it to ours for a call, then back
        h, eps = llama_config.hidden_size, llama_config.rms_norm_eps
        self.aux_layers, self.draft_vocab, self.vocab = tuple(aux_layers), draft_vocab, llama_config.vocab_size
        self.norm_before_residual = norm_before_residual
        self.fc = nn.Linear(len(self.aux_layers) * target_hidden, h, bias=False) if self.aux_layers else None
        self.input_layernorm = LlamaRMSNorm(h, eps=eps)
        self.hidden_norm = LlamaRMSNorm(h, eps=eps)
        attention = LlamaAttention(llama_config, layer_idx=0)
        bias = bool(getattr(llama_config, "attention_bias", False))
        for name in ("q_proj", "k_proj", "v_proj"):  # the attention reads [embedding ; state]: 2h wide
            setattr(attention, name, nn.Linear(2 * h, getattr(attention, name).out_features, bias=bias))
        self.self_attn = attention
        # the attention forward's cache keyword: `cache` in recent transformers, `past_key_values` before
        from ..hf.cache_keyword import cache_keyword

        self.cache_keyword = cache_keyword(type(attention).forward)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=eps)
        self.mlp = LlamaMLP(llama_config)
        self.norm = LlamaRMSNorm(h, eps=eps)
        self.lm_head = nn.Linear(h, draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.int64))
        self.rotary = LlamaRotaryEmbedding(llama_config)
        self.own_embed = embed_tokens is None
        if self.own_embed:
            self.embed_tokens = nn.Embedding(self.vocab, h)
        else:  # the target's, shared: not a parameter of the head (not saved, moved or counted with it)
            object.__setattr__(self, "shared_embed", embed_tokens)

    def embed(self, tokens: Tensor) -> Tensor:
        return (self.embed_tokens if self.own_embed else self.shared_embed)(tokens)

    def set_attn_implementation(self, name: str) -> None:
        """The attention function of the head's layer (HF's names, or specdec_tree on a SpecCache)."""
        self.config._attn_implementation = name

    # ---- loading -------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, folder, target) -> "Eagle3Drafter":
        """The head in `folder` (the layout above) for `target` (the HF causal LM it drafts for: its
        layer count fixes the default aux layers, its embedding is shared when the folder has none), on
        the target's device and dtype, in eval mode. Every missing or misshapen tensor, and every size
        that does not fit the target, is a one-line error naming it."""
        folder = Path(folder)
        config = _read_config(folder)
        llama = head_config(config)
        weights = _read_weights(folder)
        text = target.config.get_text_config()
        num_layers, target_hidden_size = int(text.num_hidden_layers), int(text.hidden_size)
        embedding = target.get_input_embeddings()
        if config["vocab_size"] != embedding.weight.shape[0]:
            _fail(f"config.json's vocab_size {config['vocab_size']} is not the target's ({embedding.weight.shape[0]} "
                  "ids): the head drafts target ids")
        target_hidden = int(config.get("target_hidden_size") or llama.hidden_size)
        if target_hidden != target_hidden_size:
            _fail(f"the head reads target states of width {target_hidden} (target_hidden_size, default hidden_size) "
                  f"but the target's hidden_size is {target_hidden_size}")
        eagle = config.get("eagle_config") or {}
        aux = eagle.get("eagle_aux_hidden_state_layer_ids") or default_aux_layers(num_layers)
        if not eagle.get("use_aux_hidden_state", True):
            aux = ()
        elif (len(aux) != 3 or any(isinstance(i, bool) or not isinstance(i, int) or not 1 <= i <= num_layers
                                   for i in aux)):
            _fail(f"eagle_aux_hidden_state_layer_ids must be three target layer ids in [1, {num_layers}] (the states "
                  f"entering those layers of the {num_layers}-layer target; got {list(aux)})")
        if "embed_tokens.weight" not in weights and llama.hidden_size != embedding.weight.shape[1]:
            _fail(f"the folder has no embed_tokens.weight and the target's embedding is {embedding.weight.shape[1]} "
                  f"wide, not the head's hidden_size {llama.hidden_size}")
        draft_vocab = int(config.get("draft_vocab_size") or config["vocab_size"])
        head = cls(llama, target_hidden=target_hidden, aux_layers=tuple(aux), draft_vocab=draft_vocab,
                   norm_before_residual=bool(config.get("norm_before_residual", False)),
                   embed_tokens=None if "embed_tokens.weight" in weights else embedding)
        head.load_layout(weights)
        weight = target.get_output_embeddings().weight
        return head.to(device=weight.device, dtype=weight.dtype).eval()

    def layout(self) -> dict:
        """name -> (shape, dtype kind) of every tensor the folder must hold ("float" or "int")."""
        shapes = {f"midlayer.{name}": (tuple(p.shape), "float") for name, p in self.named_parameters()
                  if not name.startswith(("fc.", "norm.", "lm_head.", "embed_tokens."))}
        if self.fc is not None:
            shapes["fc.weight"] = (tuple(self.fc.weight.shape), "float")
        shapes["norm.weight"] = (tuple(self.norm.weight.shape), "float")
        shapes["lm_head.weight"] = (tuple(self.lm_head.weight.shape), "float")
        shapes["d2t"] = ((self.draft_vocab,), "int")
        return shapes

    def load_layout(self, weights: dict) -> None:
        """Copy the published names' tensors in, each checked (missing, shape, kind), then the d2t range."""
        for name, (shape, kind) in self.layout().items():
            if name == "d2t" and name not in weights and self.draft_vocab == self.vocab:
                continue  # a head over the target's whole vocabulary may leave the identity map out
            if name not in weights:
                _fail(f"the weights lack {name} (expected shape {list(shape)})")
            tensor = weights[name]
            if tuple(tensor.shape) != shape:
                _fail(f"{name} has shape {list(tensor.shape)}, expected {list(shape)}")
            if (kind == "int") == tensor.dtype.is_floating_point:
                wanted = "an integer" if kind == "int" else "a floating-point"
                _fail(f"{name} must be {wanted} tensor (got {tensor.dtype})")
        own = {name: weights[name] for name in self.layout() if name in weights}
        if self.own_embed:
            embed = weights["embed_tokens.weight"]
            if tuple(embed.shape) != tuple(self.embed_tokens.weight.shape):
                _fail(f"embed_tokens.weight has shape {list(embed.shape)}, expected "
                      f"{list(self.embed_tokens.weight.shape)}")
            own["embed_tokens.weight"] = embed
        t2d = weights.get("t2d")
        if t2d is not None and tuple(t2d.shape) != (self.vocab,):
            _fail(f"t2d has shape {list(t2d.shape)}, expected [{self.vocab}]")
        state = {name.replace("midlayer.", "", 1): value for name, value in own.items()}
        missing = set(self.load_state_dict(state, strict=False).missing_keys) - {"d2t"}
        if missing:  # the layout above names every parameter: a head this fails on is a bug here
            raise RuntimeError(f"{OP}: parameters left unloaded: {sorted(missing)}")
        ids = torch.arange(self.draft_vocab) + self.d2t
        if self.draft_vocab and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab):
            _fail(f"d2t maps draft ids outside the target's [0, {self.vocab}) (draft id i is target id i + d2t[i])")

    # ---- the step ------------------------------------------------------------------------------

    def combine(self, states: list[Tensor]) -> Tensor:
        """[B, N, h] from the target's states at the aux layers, in order ([B, N, h_target] each; the one
        final-norm state when the head reads no aux layers)."""
        return self.fc(torch.cat(states, dim=-1)) if self.fc is not None else states[0]

    def forward(self, states: Tensor, tokens: Tensor, position_ids: Tensor, cache=None, **attention) -> Tensor:
        """states [B, N, h] (s of each position), tokens [B, N] int64 (the token right of it), position_ids
        [B, N] -> out [B, N, h], the state the next step reads. cache: the attention's KV cache (a SpecCache
        with specdec_step in `attention`, or training's unrolled steps), passed under the installed
        transformers' keyword; `attention`: the attention module's other keywords (attention_mask)."""
        if cache is not None:
            attention[self.cache_keyword] = cache
        residual = self.hidden_norm(states) if self.norm_before_residual else states
        joined = torch.cat([self.input_layernorm(self.embed(tokens)), self.hidden_norm(states)], dim=-1)
        cos_sin = self.rotary(states, position_ids)
        attended, _ = self.self_attn(joined, position_embeddings=cos_sin, **attention)
        hidden = attended + residual
        return self.mlp(self.post_attention_layernorm(hidden)) + hidden

    def draft_logits(self, out: Tensor) -> Tensor:
        """[..., draft_vocab] logits of out [..., h]."""
        return self.lm_head(self.norm(out))

    def target_ids(self, draft_ids: Tensor) -> Tensor:
        """Draft ids -> target ids (d2t)."""
        return draft_ids + self.d2t[draft_ids]

    def logits(self, out: Tensor) -> Tensor:
        """[..., vocab] float32 logits over the target's ids: the draft's at the ids d2t names, -inf elsewhere
        (what sampling and top-k over target ids read)."""
        draft = self.draft_logits(out).float()  # placed by d2t even when it is the identity: no host sync
        full = draft.new_full((*draft.shape[:-1], self.vocab), float("-inf"))
        return full.index_copy(-1, self.target_ids(torch.arange(self.draft_vocab, device=draft.device)), draft)

    # ---- saving --------------------------------------------------------------------------------

    def save_pretrained(self, folder, *, dtype: torch.dtype = torch.float16) -> None:
        """Write the head in the published layout: config.json and model.safetensors (floats as `dtype`;
        d2t int64 and t2d bool as published). A shared embedding is not saved (the target supplies it)."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        c = self.config
        rope = getattr(c, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0}
        config = {"architectures": [ARCHITECTURE], "model_type": "llama", "hidden_size": c.hidden_size,
                  "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_attention_heads,
                  "num_key_value_heads": c.num_key_value_heads, "head_dim": self.self_attn.head_dim,
                  "num_hidden_layers": 1, "hidden_act": c.hidden_act, "rms_norm_eps": c.rms_norm_eps,
                  "max_position_embeddings": c.max_position_embeddings, "rope_theta": rope.get("rope_theta"),
                  "vocab_size": self.vocab, "draft_vocab_size": self.draft_vocab,
                  "target_hidden_size": self.fc.in_features // 3 if self.fc is not None else c.hidden_size,
                  "norm_before_residual": self.norm_before_residual, "tie_word_embeddings": False,
                  "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.aux_layers),
                                   "use_aux_hidden_state": bool(self.aux_layers)}}
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        tensors = {name if name.split(".")[0] in ("fc", "norm", "lm_head", "embed_tokens") else f"midlayer.{name}":
                   value.detach().to("cpu", dtype).contiguous() for name, value in self.named_parameters()}
        tensors["d2t"] = self.d2t.cpu().contiguous()
        t2d = torch.zeros(self.vocab, dtype=torch.bool)
        t2d[self.target_ids(torch.arange(self.draft_vocab, device=self.d2t.device)).cpu()] = True
        tensors["t2d"] = t2d
        save_file(tensors, str(folder / "model.safetensors"))
