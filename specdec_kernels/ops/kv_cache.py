"""KV-cache bookkeeping after verification: chain rollback and tree compaction."""

import torch
from torch import Tensor

from .. import reference
from . import _known_caches
from ..common import validate as check
from ..common.kv_layout import CheckedCaches, LayerStack
from ..common.registry import custom_op, eager, implementation, register, resolve



@custom_op("specdec::kv_rollback", mutates_args=())
def _kv_rollback_op(seq_lens: Tensor, num_accepted: Tensor, backend: str) -> Tensor:
    return implementation("kv_rollback", backend)(seq_lens, num_accepted)


@_kv_rollback_op.register_fake
def _(seq_lens, num_accepted, backend):
    return torch.empty_like(seq_lens)


def kv_rollback(seq_lens: Tensor, num_accepted: Tensor, *, backend: str = "auto") -> Tensor:
    """New cache lengths after chain verification, in O(1) and without moving data.

    The verify pass wrote the root (last accepted token) and g drafts at seq_lens[b] ...;
    the root and the accepted drafts stay, the rejected slots are overwritten later.

    Args:
        seq_lens: [B] int64/int32, lengths before the verify pass.
        num_accepted: [B] int64/int32 from a verify op.

    Returns:
        [B] new lengths, seq_lens + num_accepted + 1, in seq_lens' dtype.
    """
    op = "kv_rollback"
    check.tensor(op, "seq_lens", seq_lens, shape=("B",), dtypes=check.OP_INDEX_DTYPES, last_dim_contiguous=False)
    check.tensor(op, "num_accepted", num_accepted, shape=(seq_lens.shape[0],), dtypes=check.OP_INDEX_DTYPES,
                 device=seq_lens.device, last_dim_contiguous=False)
    if check.can_inspect(num_accepted) and num_accepted.numel() and int(num_accepted.min()) < 0:
        check.fail(op, "`num_accepted` must be >= 0")
    return _kv_rollback_op(seq_lens, num_accepted, resolve(op, backend, seq_lens.device, sizes=dict(B=seq_lens.shape[0])))


@custom_op("specdec::kv_compact", mutates_args=("k_caches", "v_caches"))
def _kv_compact_op(k_caches: list[Tensor], v_caches: list[Tensor], seq_lens: Tensor, accepted_nodes: Tensor,
                   backend: str) -> Tensor:
    return implementation("kv_compact", backend)(k_caches, v_caches, seq_lens, accepted_nodes)


@_kv_compact_op.register_fake
def _(k_caches, v_caches, seq_lens, accepted_nodes, backend):
    return torch.empty_like(seq_lens)


def kv_compact(k_caches: list[Tensor] | Tensor, v_caches: list[Tensor] | Tensor, seq_lens: Tensor,
               accepted_nodes: Tensor, *, backend: str = "auto") -> Tensor:
    """After tree verification, move each row's accepted nodes' K/V to contiguous slots, in place.

    Node i of row b sits at seq_lens[b] + i; accepted_nodes[b, j] moves to seq_lens[b] + j
    in every layer's K and V cache at once.

    Args:
        k_caches, v_caches: equal-length lists (one entry per layer) of [B, Hkv, S_max, D]
            tensors, all of one dtype (float32/float16/bfloat16) and device, last dim
            contiguous, any other strides, no two sharing memory (modified in place); or two
            [L, B, Hkv, S_max, D] tensors holding every layer (the cheapest form to call: its
            host cost does not grow with L).
        seq_lens: [B] int64/int32 lengths before the verify pass.
        accepted_nodes: [B, M] int64/int32 (any strides), increasing node indices padded with -1 (as a tree
            verify op returns them: the root 0 first, then the accepted nodes).

    Returns:
        [B] new lengths (seq_lens + number of accepted entries, root included), in
        seq_lens' dtype, computed on the device.

    The triton and cuda backends move every layer's K and V in one launch, with no host
    sync, and copy only the entries whose slot changes (not the root, nothing for a
    chain-shaped path). Caches that are equally spaced views with equal strides (e.g. the
    layers of one [L, B, Hkv, S_max, D] allocation) are addressed from two base pointers;
    any other set goes through a small device table of addresses, cached per set of
    tensors, so steady-state calls copy nothing to the device. CUDA graphs: a new table
    cannot be uploaded during capture, so call the op once with the same cache tensors
    before capturing (or use one allocation). A list of caches is checked in full once per
    set of tensors (their addresses, shapes, strides, dtypes and devices), then recognised.
    On a GPU, values are not validated (that would sync); rows whose slots fall outside
    [0, S_max) are skipped, never written.
    """
    op = "kv_compact"
    stacked = isinstance(k_caches, Tensor) and isinstance(v_caches, Tensor)
    if not stacked and (not isinstance(k_caches, (list, tuple)) or not isinstance(v_caches, (list, tuple))
                        or len(k_caches) != len(v_caches)):
        check.fail(op, "`k_caches` and `v_caches` must be lists of equal length (one tensor per layer), or two "
                       "[L, B, Hkv, S_max, D] tensors", TypeError)
    check.tensor(op, "seq_lens", seq_lens, shape=("B",), dtypes=check.OP_INDEX_DTYPES, last_dim_contiguous=False)
    batch = seq_lens.shape[0]
    check.tensor(op, "accepted_nodes", accepted_nodes, shape=(batch, "M"), dtypes=check.OP_INDEX_DTYPES,
                 device=seq_lens.device, last_dim_contiguous=False)
    caches = (k_caches, v_caches) if stacked else (*k_caches, *v_caches)
    set_key = None if torch.compiler.is_compiling() else _known_caches.key(caches, batch, seq_lens.device)
    known = _known_caches.lookup(set_key)
    if known is None:
        (_check_stacked if stacked else _check_layers)(op, k_caches, v_caches, batch, seq_lens.device)
        known = _known_caches.remember(set_key, caches)
    layers = k_caches.shape[0] if stacked else len(k_caches)
    first = (k_caches if stacked else k_caches[0]) if layers else None
    dims = first.shape[-3:] if layers else None  # Hkv, S_max, D
    if check.can_inspect(accepted_nodes) and accepted_nodes.numel():
        valid = accepted_nodes >= 0
        increasing = (accepted_nodes[:, 1:] > accepted_nodes[:, :-1]) | ~valid[:, 1:]
        contiguous = valid[:, :-1] | ~valid[:, 1:]  # no valid entry after a -1
        if not bool(increasing.all() and contiguous.all() and (accepted_nodes >= -1).all()):
            check.fail(op, "`accepted_nodes` rows must be increasing node indices followed by -1 padding")
        if first is not None and int((seq_lens.to(torch.int64) + accepted_nodes.max(dim=1).values).max()) >= dims[1]:
            check.fail(op, f"`seq_lens + accepted_nodes` reaches past S_max={dims[1]}")
    sizes = dict(B=batch, M=accepted_nodes.shape[1], L=layers, dtype=None if first is None else first.dtype,
                 **({} if dims is None else dict(Hkv=dims[0], S_max=dims[1], D=dims[2])))
    chosen = resolve(op, backend, seq_lens.device, sizes=sizes)
    if known is not None and known.plain and eager((seq_lens, accepted_nodes)):
        # a known set of plain caches: the launchers take the stack, or the list with its layout memo
        if stacked:
            return _kv_compact_op.body(LayerStack(k_caches), LayerStack(v_caches), seq_lens, accepted_nodes, chosen)
        return _kv_compact_op.body(CheckedCaches(k_caches, known), list(v_caches), seq_lens, accepted_nodes, chosen)
    if stacked:  # the custom op's schema takes lists
        k_caches, v_caches = k_caches.unbind(0), v_caches.unbind(0)
    return _kv_compact_op(list(k_caches), list(v_caches), seq_lens, accepted_nodes, chosen)


def _check_layers(op: str, k_caches, v_caches, batch: int, device: torch.device) -> None:
    """The per-layer checks of a list of caches (run once per set of tensors: ops/_known_caches.py)."""
    first = check.tensor(op, "k_caches[0]", k_caches[0], shape=(batch, "Hkv", "S_max", "D"),
                         dtypes=check.FLOAT_DTYPES, device=device) if k_caches else None
    for name, caches in (("k_caches", k_caches), ("v_caches", v_caches)):
        for layer, cache in enumerate(caches):
            check.tensor(op, f"{name}[{layer}]", cache, shape=(batch, "Hkv", "S_max", "D"),
                         dtypes=(first.dtype,), device=device)
            if cache.shape != first.shape:
                check.fail(op, f"`{name}[{layer}]` has shape {list(cache.shape)}, expected {list(first.shape)} like k_caches[0]")
    if first is not None and first.numel() and not torch.compiler.is_compiling():  # parallel moves: no aliases
        addresses = [cache.data_ptr() for cache in (*k_caches, *v_caches)]
        if len(set(addresses)) != len(addresses):
            check.fail(op, "`k_caches` and `v_caches` must be distinct tensors: two entries share memory")


def _check_stacked(op: str, k_caches: Tensor, v_caches: Tensor, batch: int, device: torch.device) -> None:
    """The checks of two [L, B, Hkv, S_max, D] caches: those of their per-layer views, on the two tensors."""
    check.tensor(op, "k_caches", k_caches, shape=("L", batch, "Hkv", "S_max", "D"), dtypes=check.FLOAT_DTYPES,
                 device=device)
    check.tensor(op, "v_caches", v_caches, shape=("L", batch, "Hkv", "S_max", "D"), dtypes=(k_caches.dtype,),
                 device=device)
    if v_caches.shape != k_caches.shape:
        check.fail(op, f"`v_caches` has shape {list(v_caches.shape)}, expected {list(k_caches.shape)} like k_caches")
    if k_caches.numel() and not torch.compiler.is_compiling():  # parallel moves: no two layers at one address
        addresses = [x.data_ptr() + layer * x.stride(0) * x.element_size()
                     for x in (k_caches, v_caches) for layer in range(x.shape[0])]
        if len(set(addresses)) != len(addresses):
            check.fail(op, "`k_caches` and `v_caches` must hold distinct layers: two layers share memory")


register("kv_rollback", "torch", reference.kv_rollback)
register("kv_compact", "torch", reference.kv_compact)
