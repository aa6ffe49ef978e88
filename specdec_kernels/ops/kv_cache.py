"""KV-cache bookkeeping after verification: chain rollback and tree compaction."""

import torch
from torch import Tensor

from .. import reference
from . import _validate as check
from ..common.registry import custom_op, implementation, register, resolve



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


def kv_compact(k_caches: list[Tensor], v_caches: list[Tensor], seq_lens: Tensor, accepted_nodes: Tensor, *,
               backend: str = "auto") -> Tensor:
    """After tree verification, move each row's accepted nodes' K/V to contiguous slots, in place.

    Node i of row b sits at seq_lens[b] + i; accepted_nodes[b, j] moves to seq_lens[b] + j
    in every layer's K and V cache at once.

    Args:
        k_caches, v_caches: equal-length lists (one entry per layer) of [B, Hkv, S_max, D]
            tensors, all of one dtype (float32/float16/bfloat16) and device, last dim
            contiguous, any other strides, no two sharing memory (modified in place).
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
    before capturing (or use one allocation). On a GPU, values are not validated (that
    would sync); rows whose slots fall outside [0, S_max) are skipped, never written.
    """
    op = "kv_compact"
    if not isinstance(k_caches, (list, tuple)) or not isinstance(v_caches, (list, tuple)) or len(k_caches) != len(v_caches):
        check.fail(op, "`k_caches` and `v_caches` must be lists of equal length (one tensor per layer)", TypeError)
    check.tensor(op, "seq_lens", seq_lens, shape=("B",), dtypes=check.OP_INDEX_DTYPES, last_dim_contiguous=False)
    batch = seq_lens.shape[0]
    check.tensor(op, "accepted_nodes", accepted_nodes, shape=(batch, "M"), dtypes=check.OP_INDEX_DTYPES,
                 device=seq_lens.device, last_dim_contiguous=False)
    first = check.tensor(op, "k_caches[0]", k_caches[0], shape=(batch, "Hkv", "S_max", "D"),
                         dtypes=check.FLOAT_DTYPES, device=seq_lens.device) if k_caches else None
    for name, caches in (("k_caches", k_caches), ("v_caches", v_caches)):
        for layer, cache in enumerate(caches):
            check.tensor(op, f"{name}[{layer}]", cache, shape=(batch, "Hkv", "S_max", "D"),
                         dtypes=(first.dtype,), device=seq_lens.device)
            if cache.shape != first.shape:
                check.fail(op, f"`{name}[{layer}]` has shape {list(cache.shape)}, expected {list(first.shape)} like k_caches[0]")
    if first is not None and first.numel() and not torch.compiler.is_compiling():  # parallel moves: no aliases
        addresses = [cache.data_ptr() for cache in (*k_caches, *v_caches)]
        if len(set(addresses)) != len(addresses):
            check.fail(op, "`k_caches` and `v_caches` must be distinct tensors: two entries share memory")
    if check.can_inspect(accepted_nodes) and accepted_nodes.numel():
        valid = accepted_nodes >= 0
        increasing = (accepted_nodes[:, 1:] > accepted_nodes[:, :-1]) | ~valid[:, 1:]
        contiguous = valid[:, :-1] | ~valid[:, 1:]  # no valid entry after a -1
        if not bool(increasing.all() and contiguous.all() and (accepted_nodes >= -1).all()):
            check.fail(op, "`accepted_nodes` rows must be increasing node indices followed by -1 padding")
        if first is not None and int((seq_lens.to(torch.int64) + accepted_nodes.max(dim=1).values).max()) >= first.shape[2]:
            check.fail(op, f"`seq_lens + accepted_nodes` reaches past S_max={first.shape[2]}")
    sizes = dict(B=batch, M=accepted_nodes.shape[1], L=len(k_caches), dtype=None if first is None else first.dtype,
                 **({} if first is None else dict(Hkv=first.shape[1], S_max=first.shape[2], D=first.shape[3])))
    return _kv_compact_op(list(k_caches), list(v_caches), seq_lens, accepted_nodes,
                          resolve(op, backend, seq_lens.device, sizes=sizes))


register("kv_rollback", "torch", reference.kv_rollback)
register("kv_compact", "torch", reference.kv_compact)
