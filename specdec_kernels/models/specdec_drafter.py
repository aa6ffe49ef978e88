"""SpecDec's block-parallel drafter (Xia et al., "Speculative Decoding", Spec-Drafter) as an HF model.

The drafter reads the committed prefix and k `[MASK]` query tokens and predicts all k next tokens in
ONE forward pass, each mask with its own attention query (Eq. 7: an independent argmax per position).

Two forms, chosen by `config.encoder_layers`:
- 0 (decoder-only targets; an extension, the paper has only seq2seq targets): one transformer
  stack over [prompt ; committed ; MASK x k].
- > 0 (encoder-decoder targets; the paper's form): a deep encoder over the source, run once per
  request, and a shallow decoder over [decoder start ; committed ; MASK x k] with cross-attention
  (paper: 12 encoder + 2 decoder layers at base size).

Prefix rows never see the masks (a deviation from the paper's code, which re-encodes the whole prefix
every step), so their K/V live in a DrafterCache and a step feeds only the newly committed tokens plus
the k masks (docs/strategies/specdec.md).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.utils import ModelOutput

OP = "SpecDecDrafter"


def _fail(message: str, kind=ValueError):
    raise kind(f"{OP}: {message}")


class SpecDecDrafterConfig(PretrainedConfig):
    """Size and ids of a SpecDecDrafter.

    vocab_size: the target's vocabulary (LM-head rows); the mask id is vocab_size.
    hidden_size, num_attention_heads, intermediate_size: width of every block.
    num_layers: decoder layers (the stack that reads the prefix and the masks).
    encoder_layers: 0 for a decoder-only target; > 0 builds the seq2seq form (deep encoder).
    max_position_embeddings: longest prefix + block (decoder side); max_source_positions: encoder.
    block_size: the k it was trained for (the default k when drafting).
    position_encoding: "learned" (absolute positions added at the input; the paper's form) or
        "rope" (rotary positions in the decoder's self-attention: relative, so what the drafter
        learns at one prefix length holds at every other; the default of train_specdec_drafter).
    rope_theta: the rotary base.
    """

    model_type = "specdec_drafter"

    def __init__(self, vocab_size: int = 32000, hidden_size: int = 256, num_attention_heads: int = 4,
                 intermediate_size: int = 1024, num_layers: int = 2, encoder_layers: int = 0,
                 max_position_embeddings: int = 2048, max_source_positions: int = 1024, block_size: int = 10,
                 dropout: float = 0.1, layer_norm_eps: float = 1e-5, initializer_range: float = 0.02,
                 position_encoding: str = "learned", rope_theta: float = 10000.0, **kwargs):
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.num_attention_heads, self.intermediate_size = num_attention_heads, intermediate_size
        self.num_layers, self.encoder_layers = num_layers, encoder_layers
        self.max_position_embeddings, self.max_source_positions = max_position_embeddings, max_source_positions
        self.block_size, self.dropout = block_size, dropout
        self.layer_norm_eps, self.initializer_range = layer_norm_eps, initializer_range
        self.position_encoding, self.rope_theta = position_encoding, rope_theta
        super().__init__(**kwargs)
        if position_encoding not in ("learned", "rope"):
            _fail(f"position_encoding must be 'learned' or 'rope' (got {position_encoding!r})")
        if position_encoding == "rope" and (hidden_size // num_attention_heads) % 2:
            _fail(f"rotary positions need an even head width (got {hidden_size // num_attention_heads})")
        if hidden_size % num_attention_heads:
            _fail(f"hidden_size ({hidden_size}) must be a multiple of num_attention_heads ({num_attention_heads})")

    @property
    def mask_token_id(self) -> int:
        return self.vocab_size


@dataclass
class SpecDecDrafterOutput(ModelOutput):
    """logits [B, k, V] float32 for the k block positions; loss (scalar) when labels were given."""

    logits: Tensor | None = None
    loss: Tensor | None = None


class DrafterCache:
    """The drafter's prefix K/V: per decoder layer [B, H, S_max, D], per-row lengths seq_lens [B]
    (int64, on the device), and for the seq2seq form the encoder output [B, S_src, hidden] with its
    key mask [B, S_src] (True = token). A forward writes its N new tokens at seq_lens[b] + j and
    advances seq_lens by the row's count of real new tokens, so rows sit at different lengths."""

    def __init__(self, config: SpecDecDrafterConfig, batch_size: int, max_length: int, *, device, dtype):
        heads, width = config.num_attention_heads, config.hidden_size // config.num_attention_heads
        shape = (batch_size, heads, max_length, width)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_layers)]
        self.seq_lens = torch.zeros(batch_size, dtype=torch.int64, device=device)
        self.max_length = max_length
        self.encoder_hidden: Tensor | None = None
        self.encoder_mask: Tensor | None = None
        self._length_bound = 0  # host-side upper bound of seq_lens.max(); read back only past max_length

    def reset(self) -> None:
        """Empty every row (the storage is kept; old K/V are overwritten as rows grow)."""
        self.seq_lens.zero_()
        self._length_bound = 0

    def reserve(self, num_new: int) -> None:
        """Refuse a write past max_length (syncs only when the host-side bound says it might)."""
        self._length_bound += num_new
        if self._length_bound > self.max_length:
            self._length_bound = int(self.seq_lens.max()) + num_new if self.seq_lens.numel() else num_new
            if self._length_bound > self.max_length:
                _fail(f"the cache holds {self.max_length} positions; writing {num_new} more tokens overflows it "
                      "(create it with a larger max_length)")

    def write(self, layer: int, keys: Tensor, values: Tensor) -> None:
        """keys/values [B, H, N, D] at positions seq_lens[b] + j (lengths advance in `advance`)."""
        n = keys.shape[2]
        index = (self.seq_lens.view(-1, 1, 1, 1) + torch.arange(n, device=keys.device).view(1, 1, n, 1))
        index = index.expand_as(keys)
        self.keys[layer].scatter_(2, index, keys.to(self.keys[layer].dtype))
        self.values[layer].scatter_(2, index, values.to(self.values[layer].dtype))

    def select_rows(self, index: Tensor) -> None:
        """Keep (and reorder) rows: index [B'] int64."""
        self.keys = [k.index_select(0, index) for k in self.keys]
        self.values = [v.index_select(0, index) for v in self.values]
        self.seq_lens = self.seq_lens.index_select(0, index)
        if self.encoder_hidden is not None:
            self.encoder_hidden = self.encoder_hidden.index_select(0, index)
            self.encoder_mask = self.encoder_mask.index_select(0, index)


class _Attention(nn.Module):
    def __init__(self, config: SpecDecDrafterConfig):
        super().__init__()
        self.heads = config.num_attention_heads
        self.q, self.k, self.v, self.o = (nn.Linear(config.hidden_size, config.hidden_size) for _ in range(4))
        self.dropout = config.dropout

    def split(self, x: Tensor) -> Tensor:
        b, n, d = x.shape
        return x.view(b, n, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, x: Tensor, memory: Tensor, mask: Tensor, past: tuple[Tensor, Tensor] | None = None,
                rotary: tuple[Tensor, Tensor] | None = None):
        """x [B, Q, d] queries, memory [B, M, d] keys/values (x itself for self-attention), mask
        [B, 1, Q, P + M] bool (True = may attend), past (K, V) [B, H, P, D] prepended, rotary
        (cos, sin) [B, 1, Q, D] of the queries' positions (self-attention only: Q == M; the cached
        keys were rotated when they were written). Returns the output [B, Q, d] and this call's
        (K, V) [B, H, M, D]."""
        q, k, v = self.split(self.q(x)), self.split(self.k(memory)), self.split(self.v(memory))
        if rotary is not None:
            q, k = _rotate(q, *rotary), _rotate(k, *rotary)
        keys, values = (k, v) if past is None else (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2))
        out = F.scaled_dot_product_attention(q, keys.to(q.dtype), values.to(q.dtype), attn_mask=mask,
                                             dropout_p=self.dropout if self.training else 0.0)
        return self.o(out.transpose(1, 2).flatten(2)), (k, v)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + turned * sin


def rotary_tables(positions: Tensor, width: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """(cos, sin) [B, 1, N, width] for positions [B, N] (the rotate-half layout Llama uses)."""
    inv = 1.0 / theta ** (torch.arange(0, width, 2, device=positions.device, dtype=torch.float32) / width)
    angles = positions.unsqueeze(-1).float() * inv
    angles = torch.cat([angles, angles], dim=-1).unsqueeze(1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


class _Block(nn.Module):
    """Pre-LN transformer block; `cross` adds cross-attention to the encoder output."""

    def __init__(self, config: SpecDecDrafterConfig, cross: bool):
        super().__init__()
        eps = config.layer_norm_eps
        self.norm1, self.attn = nn.LayerNorm(config.hidden_size, eps=eps), _Attention(config)
        self.cross = cross
        if cross:
            self.norm_cross, self.cross_attn = nn.LayerNorm(config.hidden_size, eps=eps), _Attention(config)
        self.norm2 = nn.LayerNorm(config.hidden_size, eps=eps)
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x, mask, past=None, encoder_hidden=None, encoder_mask=None, rotary=None):
        h = self.norm1(x)
        attended, new_kv = self.attn(h, h, mask, past, rotary)
        x = x + self.drop(attended)
        if self.cross:
            x = x + self.drop(self.cross_attn(self.norm_cross(x), encoder_hidden, encoder_mask)[0])
        x = x + self.drop(self.fc2(self.drop(F.gelu(self.fc1(self.norm2(x))))))
        return x, new_kv


def block_attention_mask(num_new: Tensor, n: int, k: int, past_lens: Tensor | None, past_size: int) -> Tensor:
    """[B, 1, n + k, past_size + n + k] bool: query rows = n new prefix tokens then k masks; key
    columns = cached prefix (valid below past_lens[b]), new tokens, masks. New token j sees the
    cache and new tokens <= j (causal); a mask sees the cache, the row's real new tokens (j <
    num_new[b]) and every mask. Padding rows (j >= num_new[b]) keep a causal pattern so no row is
    empty (their outputs are never used)."""
    device = num_new.device
    b = num_new.shape[0]
    query = torch.arange(n + k, device=device)
    is_mask_query = (query >= n).view(1, -1, 1)
    new_key = torch.arange(n, device=device).view(1, 1, -1)
    causal = new_key <= query.view(1, -1, 1)
    real = new_key < num_new.view(-1, 1, 1)
    sees_new = torch.where(is_mask_query, real, causal)  # [B, n + k, n]
    sees_masks = is_mask_query.expand(b, n + k, k)
    parts = [sees_new, sees_masks]
    if past_size:
        valid = torch.arange(past_size, device=device).view(1, 1, -1) < past_lens.view(-1, 1, 1)
        parts.insert(0, valid.expand(b, n + k, past_size))
    return torch.cat(parts, dim=2).unsqueeze(1)


class SpecDecDrafter(PreTrainedModel):
    """`drafter.draft(new_tokens, num_new, cache, block_size=k)` -> (draft_tokens [B, k], logits
    [B, k, V]) in one forward; `forward(...)` is the same with labels/loss for training."""

    config_class = SpecDecDrafterConfig
    base_model_prefix = "drafter"
    main_input_name = "input_ids"

    def __init__(self, config: SpecDecDrafterConfig):
        super().__init__(config)
        d = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size + 1, d)  # + the mask id
        if config.position_encoding == "learned":
            self.embed_positions = nn.Embedding(config.max_position_embeddings, d)
        self.layers = nn.ModuleList(_Block(config, cross=config.encoder_layers > 0) for _ in range(config.num_layers))
        if config.encoder_layers > 0:
            self.embed_source_positions = nn.Embedding(config.max_source_positions, d)
            self.encoder_layers = nn.ModuleList(_Block(config, cross=False) for _ in range(config.encoder_layers))
            self.encoder_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.lm_head = nn.Linear(d, config.vocab_size, bias=False)
        self.drop = nn.Dropout(config.dropout)
        self.post_init()

    @torch.no_grad()
    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.normal_(0.0, std)
            if getattr(module, "bias", None) is not None:
                module.bias.zero_()
        elif isinstance(module, nn.LayerNorm):
            module.weight.fill_(1.0)
            module.bias.zero_()

    @property
    def has_encoder(self) -> bool:
        return self.config.encoder_layers > 0

    # ---- the seq2seq form's encoder ------------------------------------------------------------

    def encode(self, source_ids: Tensor, source_mask: Tensor | None = None, cache: DrafterCache | None = None):
        """Encoder output [B, S, d] over source_ids [B, S] (source_mask [B, S], 1 = token, left or
        right padding); stored in `cache` when given (once per request). Returns (hidden, mask)."""
        if not self.has_encoder:
            _fail("encode() needs the seq2seq form (config.encoder_layers > 0)")
        _check_ids("source_ids", source_ids)
        mask = (torch.ones_like(source_ids, dtype=torch.bool) if source_mask is None else source_mask != 0)
        positions = (mask.cumsum(1) - 1).clamp(min=0)  # left padding shifts nothing
        if source_ids.shape[1] > self.config.max_source_positions:
            _fail(f"source longer than config.max_source_positions ({self.config.max_source_positions})")
        x = self.drop(self.embed_tokens(source_ids) + self.embed_source_positions(positions))
        attn = mask.view(mask.shape[0], 1, 1, -1) | ~mask.any(1).view(-1, 1, 1, 1)  # an empty row sees all
        for layer in self.encoder_layers:
            x, _ = layer(x, attn)
        hidden = self.encoder_norm(x)
        if cache is not None:
            cache.encoder_hidden, cache.encoder_mask = hidden, attn
        return hidden, attn

    # ---- one forward: new prefix tokens + k masks ------------------------------------------------

    def new_cache(self, batch_size: int, max_length: int) -> DrafterCache:
        """An empty cache for `batch_size` rows and prefixes up to max_length tokens."""
        if max_length + 1 > self.config.max_position_embeddings:
            _fail(f"max_length {max_length} needs more positions than config.max_position_embeddings "
                  f"({self.config.max_position_embeddings})")
        param = self.lm_head.weight
        return DrafterCache(self.config, batch_size, max_length, device=param.device, dtype=param.dtype)

    def forward(self, input_ids: Tensor, num_new: Tensor | None = None, *, block_size: int | None = None,
                block_ids: Tensor | None = None, cache: DrafterCache | None = None,
                encoder_hidden: Tensor | None = None, encoder_mask: Tensor | None = None,
                labels: Tensor | None = None, label_smoothing: float = 0.0) -> SpecDecDrafterOutput:
        """Args:
            input_ids: [B, N] int64 prefix tokens not yet in `cache` (right-padded; N may be 0).
            num_new: [B] int64 real tokens per row (default N); the rest is padding.
            block_size: k (default config.block_size), or block_ids [B, k] int64: the block's
                input ids (mask id = config.mask_token_id; GLAT training reveals some labels).
            cache: DrafterCache; its rows' prefix precedes input_ids, and the new tokens' K/V are
                written into it (seq_lens += num_new). None: input_ids is the whole prefix.
            encoder_hidden / encoder_mask: seq2seq form without a cache (training): encode()'s output.
            labels: [B, k] int64 targets, -100 = ignored; loss = mean cross-entropy.
        Returns:
            SpecDecDrafterOutput(logits [B, k, V] float32, loss)."""
        _check_ids("input_ids", input_ids)
        b, n = input_ids.shape
        device = input_ids.device
        if block_ids is None:
            k = int(block_size or self.config.block_size)
            if k < 1:
                _fail(f"block_size must be >= 1 (got {k})")
            block_ids = torch.full((b, k), self.config.mask_token_id, dtype=torch.int64, device=device)
        else:
            _check_ids("block_ids", block_ids, rows=b)
            k = block_ids.shape[1]
        if num_new is None:
            num_new = torch.full((b,), n, dtype=torch.int64, device=device)
        elif num_new.shape != (b,) or num_new.dtype != torch.int64 or num_new.device != device:
            _fail(f"num_new must be int64 [B={b}] on {device} (got {num_new.dtype} {list(num_new.shape)} "
                  f"on {num_new.device})")
        past_lens = cache.seq_lens if cache is not None else torch.zeros(b, dtype=torch.int64, device=device)
        if cache is not None:
            if cache.seq_lens.shape[0] != b:
                _fail(f"the cache has {cache.seq_lens.shape[0]} rows, input_ids {b}")
            cache.reserve(n)
            encoder_hidden, encoder_mask = cache.encoder_hidden, cache.encoder_mask
        if self.has_encoder and encoder_hidden is None:
            _fail("the seq2seq form needs the encoder output: call encode(source_ids, mask, cache) first")
        steps = torch.arange(n + k, device=device).view(1, -1)
        offset = torch.where(steps >= n, num_new.view(-1, 1) - n, 0)  # masks follow the real new tokens
        positions = past_lens.view(-1, 1) + steps + offset
        if cache is not None and cache.max_length + k > self.config.max_position_embeddings:
            _fail(f"cache max_length {cache.max_length} + block {k} exceeds config.max_position_embeddings "
                  f"({self.config.max_position_embeddings})")
        past_size = cache.max_length if cache is not None else 0
        mask = block_attention_mask(num_new, n, k, past_lens, past_size)
        hidden = self._decode(torch.cat([input_ids, block_ids], 1), positions, mask, cache, n, num_new,
                              encoder_hidden, encoder_mask)
        logits = self.lm_head(self.norm(hidden[:, n:])).float()  # only the k block rows
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100,
                                   label_smoothing=label_smoothing)
        return SpecDecDrafterOutput(logits=logits, loss=loss)

    def _decode(self, tokens: Tensor, positions: Tensor, mask: Tensor, cache: DrafterCache | None, n: int,
                num_new: Tensor | None, encoder_hidden: Tensor | None, encoder_mask: Tensor | None) -> Tensor:
        """The decoder stack over tokens [B, T] at positions [B, T] under mask; with a cache, the
        first n tokens' K/V are written into it and its lengths advance by num_new."""
        x = self.embed_tokens(tokens)
        rotary = None
        if self.config.position_encoding == "learned":
            x = x + self.embed_positions(positions.clamp(max=self.config.max_position_embeddings - 1))
        else:
            rotary = rotary_tables(positions, self.config.hidden_size // self.config.num_attention_heads,
                                   self.config.rope_theta, x.dtype)
        x = self.drop(x)
        for i, layer in enumerate(self.layers):
            past = (cache.keys[i], cache.values[i]) if cache is not None else None
            x, (keys, values) = layer(x, mask, past, encoder_hidden, encoder_mask, rotary)
            if cache is not None and n:
                cache.write(i, keys[:, :, :n], values[:, :, :n])
        if cache is not None:
            cache.seq_lens.add_(num_new)
        return x

    def forward_blocks(self, input_ids: Tensor, lengths: Tensor, anchors: Tensor, block_ids: Tensor, *,
                       encoder_hidden: Tensor | None = None, encoder_mask: Tensor | None = None,
                       labels: Tensor | None = None, label_smoothing: float = 0.0) -> SpecDecDrafterOutput:
        """Training form: MANY blocks of one sequence in one forward, each exactly what a drafting
        step computes on its prefix (the single-block forward and the cached steps give the same
        logits, to float rounding).

        Args:
            input_ids: [B, N] int64 right-padded sequences, lengths [B] their real tokens.
            anchors: [B, A] int64 prefix length of each block (block a of row b drafts the tokens
                after input_ids[b, :anchors[b, a]]), -1 = no block (its rows are ignored).
            block_ids: [B, A, k] int64 the blocks' inputs (mask id; GLAT reveals some labels).
            labels: [B, A, k] int64 targets, -100 = ignored.
        Layout: [sequence ; block 0 ; ... ; block A-1]; the sequence is causal (so its K/V are the
        cache's), a block's rows see the sequence below its anchor and the rows of its own block;
        block a's slot i sits at position anchors[b, a] + i.
        Returns SpecDecDrafterOutput(logits [B, A, k, V] float32, loss)."""
        _check_ids("input_ids", input_ids)
        b, n = input_ids.shape
        a, k = block_ids.shape[1], block_ids.shape[2]
        device = input_ids.device
        if self.has_encoder and encoder_hidden is None:
            _fail("the seq2seq form needs the encoder output (encode(source_ids))")
        slots = torch.arange(k, device=device)
        block_pos = (anchors.clamp(min=0).unsqueeze(-1) + slots).flatten(1)  # [B, A*k]
        positions = torch.cat([torch.arange(n, device=device).expand(b, n), block_pos], 1)
        seq = torch.arange(n, device=device)
        seq_rows = torch.cat([seq.view(1, n) <= seq.view(n, 1), torch.zeros(n, a * k, dtype=torch.bool,
                                                                               device=device)], 1)
        sees_prefix = seq.view(1, 1, 1, n) < anchors.view(b, a, 1, 1)  # [B, A, 1, n]
        block_of = torch.arange(a * k, device=device) // k
        same_block = block_of.view(1, 1, a * k) == torch.arange(a, device=device).view(a, 1, 1)  # [A, 1, A*k]
        block_rows = torch.cat([sees_prefix.expand(b, a, k, n), same_block.expand(b, a, k, a * k)], 3)
        mask = torch.cat([seq_rows.expand(b, n, n + a * k), block_rows.reshape(b, a * k, n + a * k)], 1)
        hidden = self._decode(torch.cat([input_ids, block_ids.flatten(1)], 1), positions, mask.unsqueeze(1),
                              None, 0, None, encoder_hidden, encoder_mask)
        logits = self.lm_head(self.norm(hidden[:, n:])).float().view(b, a, k, -1)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 2), labels.flatten(), ignore_index=-100,
                                   label_smoothing=label_smoothing)
        return SpecDecDrafterOutput(logits=logits, loss=loss)

    @torch.no_grad()
    def draft(self, new_tokens: Tensor, num_new: Tensor | None, cache: DrafterCache,
              block_size: int | None = None) -> tuple[Tensor, Tensor]:
        """One drafting step: feed the tokens committed since the last step (new_tokens [B, N],
        num_new [B]) and k masks; returns (draft_tokens [B, k] int64, logits [B, k, V] float32)."""
        logits = self(new_tokens, num_new, block_size=block_size, cache=cache).logits
        return logits.argmax(dim=-1), logits


def _check_ids(name: str, ids: Tensor, rows: int | None = None) -> None:
    """Shape and dtype only: a range check of the ids would read them back (a sync every step)."""
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.dtype != torch.int64:
        _fail(f"{name} must be an int64 tensor [B, N] (got "
              f"{getattr(ids, 'dtype', type(ids).__name__)} {list(getattr(ids, 'shape', []))})", TypeError)
    if rows is not None and ids.shape[0] != rows:
        _fail(f"{name} has {ids.shape[0]} rows, input_ids {rows}")
