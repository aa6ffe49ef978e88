"""SpecCache: a preallocated KV cache with per-row lengths that HF models accept as `past_key_values`.

K (and V) for all layers is ONE tensor [L, B, Hkv, S_max, D]; each layer's cache is a view
[B, Hkv, S_max, D] of it (what ops.tree_attention reads, and the layout ops.kv_compact can move
for all layers at once). `seq_lens [B]` (int64, on the cache's device) counts each row's
committed tokens, so rows sit at different lengths without padding the KV.

A forward writes its N new tokens at seq_lens[b] + i and leaves the lengths alone; `commit`,
`rollback` (chains) or `compact` (trees) then says what stays (docs/hf.md, "SpecCache and the
engine's cache invariant").
"""

import torch
from torch import Tensor
from transformers.cache_utils import Cache, CacheLayerMixin

from .. import ops
from ..common import validate as check
from .attention import TreeStep, tree_positions
from .cache_keyword import MODEL_CACHE_KEYWORD


class SpecCacheLayer(CacheLayerMixin):
    """One layer's view of a SpecCache (HF calls `update` from the attention module)."""

    def __init__(self, owner: "SpecCache", layer_idx: int):
        super().__init__()
        self.owner, self.layer_idx = owner, layer_idx
        self.bind()

    def bind(self) -> None:
        """(Re)point at the owner's storage, which select_rows replaces."""
        self.keys, self.values = self.owner.keys[self.layer_idx], self.owner.values[self.layer_idx]
        self.is_initialized = True

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        pass  # preallocated by the owner

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        """Write [B, Hkv, N, D] new K/V at seq_lens[b] + i; return this layer's whole
        [B, Hkv, S_max, D] cache (tree_attention reads the rows' own lengths)."""
        self.owner.write(self.layer_idx, key_states, value_states)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.max_length, 0  # like StaticLayer; the specdec mask hook builds no causal mask

    def get_seq_length(self) -> int:
        return self.owner.get_seq_length()

    def get_max_length(self) -> int:
        return self.owner.max_length


class SpecCache(Cache):
    """KV cache for speculative decoding: [L, B, Hkv, S_max, D] storage plus per-row `seq_lens [B]`.

    Args:
        num_layers, batch_size, num_kv_heads, head_dim: the storage shape (adapters read them
            from the model config: `specdec_kernels.hf.adapt(model).new_cache(batch, max_length)`).
        max_length: S_max, the most tokens a row can hold (committed + the forward in flight).
        dtype, device: of the K/V storage (the model's); seq_lens is int64 on `device`.
        backend: "auto" | "torch" | "triton" | "cuda", the backend of the ops run on this cache
            (attention, kv_compact, kv_rollback; kv_rollback, one add with only a torch form,
            runs on "torch" under a backend that has none).

    Use only with the `specdec_tree` attention implementation (`specdec_kernels.hf.adapt` sets it):
    `update` hands the attention the whole S_max buffer, which only the tree kernel reads correctly.
    """

    def __init__(self, num_layers: int, batch_size: int, num_kv_heads: int, head_dim: int, max_length: int, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                 backend: str = "auto"):
        op = "SpecCache"
        for name, value, minimum in (("num_layers", num_layers, 1), ("batch_size", batch_size, 0),
                                     ("num_kv_heads", num_kv_heads, 1), ("head_dim", head_dim, 1),
                                     ("max_length", max_length, 1)):
            check.positive_int(op, name, value, minimum=minimum)
        if backend not in ("auto", *ops.BACKENDS):
            check.fail(op, f"`backend` must be one of 'auto', 'torch', 'triton', 'cuda' (got {backend!r})")
        self.backend = backend
        # kv_rollback is one add on the device (no kernel): where the backend has no form of it, the
        # torch form is that backend's rollback, rather than a failing call
        self._rollback_backend = (backend if backend == "auto" or backend in ops.implemented_backends("kv_rollback")
                                  else "torch")
        shape = (num_layers, batch_size, num_kv_heads, max_length, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.seq_lens = torch.zeros(batch_size, dtype=torch.int64, device=self.keys.device)
        # Host-side bookkeeping that keeps the S_max check free of device reads: an upper bound
        # of max(seq_lens), and how many slots the last forward wrote past seq_lens.
        self._length_bound = 0
        self._written = 0
        self._index_memo = None  # (seq_lens, its version + shape key, write index): see _write_index
        self.encoder = None  # encoder-decoder adapters attach the encoder side here (rows move with ours)
        super().__init__(layers=[SpecCacheLayer(self, layer) for layer in range(num_layers)])

    # ---- shape -------------------------------------------------------------------------------

    @property
    def max_length(self) -> int:
        return self.keys.shape[3]

    @property
    def batch_size(self) -> int:
        return self.keys.shape[1]

    @property
    def num_layers(self) -> int:
        return self.keys.shape[0]

    def holds(self, key: Tensor) -> bool:
        """Whether `key` is one of this cache's per-layer [B, Hkv, S_max, D] views."""
        return (key.shape == self.keys.shape[1:] and key.device == self.keys.device
                and key.untyped_storage().data_ptr() == self.keys.untyped_storage().data_ptr())

    # ---- what a forward needs ----------------------------------------------------------------

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args, **kwargs) -> tuple[Tensor, Tensor]:
        """HF's Cache.update, minus its offloading and lazy-layer machinery (none apply here)."""
        self.write(layer_idx, key_states, value_states)
        layer = self.layers[layer_idx]
        return layer.keys, layer.values

    def positions(self, num_tokens: int, parents: Tensor | None = None) -> Tensor:
        """int64 [B, N] position ids of the next forward's tokens: seq_lens[b] + depth(node)."""
        return tree_positions(self.seq_lens, num_tokens, parents)

    def step(self, parents: Tensor | None = None) -> TreeStep:
        return TreeStep(self, parents)

    def forward_kwargs(self, num_tokens: int, parents: Tensor | None = None) -> dict:
        """Keywords for a plain HF forward on this cache: `model(input_ids, **cache.forward_kwargs(N, parents))`."""
        return {MODEL_CACHE_KEYWORD: self, "use_cache": True, "position_ids": self.positions(num_tokens, parents),
                "specdec_step": self.step(parents)}

    def write(self, layer: int, key_states: Tensor, value_states: Tensor) -> None:
        """Write N new tokens' K/V ([B, Hkv, N, D]) of `layer` at seq_lens[b] + i (lengths unchanged)."""
        storage = self.keys
        shape = key_states.shape
        if not (key_states.dim() == 4 and shape == value_states.shape and shape[0] == storage.shape[1]
                and shape[1] == storage.shape[2] and shape[3] == storage.shape[4]
                and key_states.dtype == value_states.dtype == storage.dtype
                and key_states.device == value_states.device == storage.device):
            self._write_error(key_states, value_states)
        index = self._write_index(shape[2])
        if torch.is_grad_enabled():  # an inference cache: it must not chain autograd graphs across steps
            key_states, value_states = key_states.detach(), value_states.detach()
        self.keys[layer].scatter_(2, index, key_states)
        self.values[layer].scatter_(2, index, value_states)

    def _write_error(self, key_states: Tensor, value_states: Tensor) -> None:
        """The one-line error of a write whose K/V do not fit the cache."""
        op = "SpecCache.update"
        batch, heads, _, head_dim = self.keys.shape[1:]
        for name, states in (("key_states", key_states), ("value_states", value_states)):
            if states.dim() != 4 or states.shape[0] != batch or states.shape[1] != heads or states.shape[3] != head_dim:
                check.fail(op, f"`{name}` must have shape [B={batch}, Hkv={heads}, N, D={head_dim}] like the cache "
                               f"(got {list(states.shape)}); a batch of another size needs select_rows first")
            if states.dtype != self.keys.dtype or states.device != self.keys.device:
                check.fail(op, f"`{name}` must be {self.keys.dtype} on {self.keys.device} like the cache "
                               f"(got {states.dtype} on {states.device})", TypeError)
        check.fail(op, f"`key_states` {list(key_states.shape)} and `value_states` {list(value_states.shape)} differ")

    def _write_index(self, num_tokens: int) -> Tensor:
        """The scatter index [B, Hkv, N, D] of slots seq_lens[b] + i, after the S_max check. Every
        layer of a forward writes the same slots, so on the CPU it is made once per forward: kept
        until seq_lens changes (its version counter moves with every in-place update). GPU tensors
        are not kept: a replayed CUDA graph changes seq_lens without moving its version."""
        lengths = self.seq_lens
        key = (lengths._version, num_tokens, self.keys.shape)
        memo = self._index_memo
        if memo is not None and memo[0] is lengths and memo[1] == key:
            return memo[2]
        self._reserve(num_tokens)
        batch, heads, _, head_dim = self.keys.shape[1:]
        slots = lengths.unsqueeze(1) + torch.arange(num_tokens, device=lengths.device)  # [B, N]
        index = slots.view(batch, 1, num_tokens, 1).expand(batch, heads, num_tokens, head_dim)
        keep = lengths.device.type == "cpu" and not torch.compiler.is_compiling()
        self._index_memo = (lengths, key, index) if keep else None
        return index

    def _reserve(self, num_tokens: int) -> None:
        """Clear error instead of an out-of-bounds write when a row would pass S_max. Reads the
        lengths back (one sync) only when the host-side bound says the cache may be full."""
        if self._length_bound + num_tokens > self.max_length:
            self._length_bound = self._exact_max_length()
            if self._length_bound + num_tokens > self.max_length:
                check.fail("SpecCache", f"writing {num_tokens} tokens after a row of {self._length_bound} exceeds "
                                        f"max_length={self.max_length}; allocate a larger cache or stop the row")
        self._written = num_tokens

    def _exact_max_length(self) -> int:
        return int(self.seq_lens.max()) if self.batch_size else 0

    def _lengths_grew(self, at_most: int) -> None:
        """After a length update by at most `at_most` per row: the exact bound where reading it
        is free (CPU) or nothing bounds the growth (0: no forward wrote), else bound + at_most."""
        if check.can_inspect(self.seq_lens) or at_most <= 0:
            self._length_bound = self._exact_max_length()
        else:
            self._length_bound += at_most
        self._written = 0

    # ---- what stays after a forward ----------------------------------------------------------

    def commit(self, num_tokens: int | Tensor | None = None) -> Tensor:
        """Keep `num_tokens` of the tokens the last forward wrote (default: all of them); an int
        for every row or an int64 [B] tensor per row (e.g. true prompt lengths after a
        right-padded prefill: the pad slots are overwritten later). Returns seq_lens."""
        if num_tokens is None:
            num_tokens = self._written
        if isinstance(num_tokens, Tensor):
            check.tensor("SpecCache.commit", "num_tokens", num_tokens, shape=(self.batch_size,),
                         dtypes=check.INDEX_DTYPES, device=self.seq_lens.device, last_dim_contiguous=False)
            if check.can_inspect(num_tokens) and num_tokens.numel() and (int(num_tokens.min()) < 0
                                                                         or int(num_tokens.max()) > self._written):
                check.fail("SpecCache.commit", f"`num_tokens` must be in [0, {self._written}] (the tokens written)")
            self.seq_lens += num_tokens
        else:
            num_tokens = check.positive_int("SpecCache.commit", "num_tokens", num_tokens, minimum=0)
            if num_tokens > self._written:
                check.fail("SpecCache.commit", f"`num_tokens`={num_tokens} but the last forward wrote {self._written}")
            self.seq_lens += num_tokens
        self._lengths_grew(self._written)
        return self.seq_lens

    def rollback(self, num_accepted: Tensor) -> Tensor:
        """Chain verification: keep the root and num_accepted[b] drafts (ops.kv_rollback: O(1),
        nothing moves, no sync); rejected slots are overwritten by the next forward.
        num_accepted [B] int64, at most the drafts of the last forward (N - 1)."""
        if (self._written and isinstance(num_accepted, Tensor) and check.can_inspect(num_accepted)
                and num_accepted.numel() and int(num_accepted.max()) >= self._written):
            check.fail("SpecCache.rollback", f"`num_accepted` must be < {self._written}, the tokens the last forward wrote")
        self.seq_lens.copy_(ops.kv_rollback(self.seq_lens, num_accepted, backend=self._rollback_backend))
        self._lengths_grew(self._written)
        return self.seq_lens

    def compact(self, accepted_nodes: Tensor) -> Tensor:
        """Tree verification: move the accepted nodes' K/V (node i sits at seq_lens[b] + i) to
        seq_lens[b], seq_lens[b] + 1, ... in every layer with one ops.kv_compact call.
        accepted_nodes [B, M] int64: increasing node indices, root first, -1 padded."""
        # the stacked [L, B, Hkv, S_max, D] tensors themselves: a host cost that does not grow with L
        new_lens = ops.kv_compact(self.keys, self.values, self.seq_lens, accepted_nodes, backend=self.backend)
        self.seq_lens.copy_(new_lens)
        self._lengths_grew(accepted_nodes.shape[1])  # M bounds the kept entries
        return self.seq_lens

    # ---- rows --------------------------------------------------------------------------------

    def select_rows(self, indices: Tensor) -> None:
        """Keep rows `indices` (int64 [B'], any order, repeats allowed): drops finished rows,
        reorders for beams. Allocates new [L, B', Hkv, S_max, D] storage."""
        op = "SpecCache.select_rows"
        if not isinstance(indices, Tensor):
            indices = torch.as_tensor(indices, dtype=torch.int64)
        indices = indices.to(self.keys.device)
        check.tensor(op, "indices", indices, shape=("B'",), dtypes=check.INDEX_DTYPES, last_dim_contiguous=False)
        if check.can_inspect(indices) and indices.numel() and (int(indices.min()) < 0
                                                               or int(indices.max()) >= self.batch_size):
            check.fail(op, f"`indices` must be row numbers in [0, {self.batch_size})")
        self.keys = self.keys.index_select(1, indices)
        self.values = self.values.index_select(1, indices)
        self.seq_lens = self.seq_lens.index_select(0, indices)
        for layer in self.layers:
            layer.bind()
        if self.encoder is not None:
            self.encoder.select_rows(indices)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.select_rows(beam_idx)

    def batch_select_indices(self, indices: Tensor) -> None:
        self.select_rows(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.select_rows(torch.arange(self.batch_size, device=self.keys.device).repeat_interleave(repeats))

    def crop(self, tokens_to_remove: int) -> None:
        """HF's crop: forget the last `tokens_to_remove` tokens of every row (floored at 0)."""
        self.seq_lens.sub_(tokens_to_remove).clamp_(min=0)
        self._written = 0

    def reset(self) -> None:
        """Empty every row (the storage is kept; old K/V are overwritten as rows grow)."""
        self.seq_lens.zero_()
        self._length_bound = self._written = 0

    # ---- HF queries --------------------------------------------------------------------------

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """The longest row (reads the lengths back: one host sync on a GPU)."""
        return self._exact_max_length()

    def get_query_offset(self, layer_idx: int = 0) -> int:
        # Only HF's mask builders ask, and the specdec mask hook builds no mask for this cache;
        # answering without reading the lengths back keeps a plain model forward sync-free.
        return 0
