"""Cache sets that passed kv_compact's checks, remembered so that a decode loop checks them once.

kv_compact's per-layer checks (type, shape, dtype, device, last-dim stride, equal shapes, no two
layers at one address) read nothing but each tensor's metadata, and a decode loop passes the same
caches on every call. So a set that passed is remembered under a key of everything those checks
read: every tensor's address, shape, strides, dtype and device, with the batch size and the
lengths' device they were checked against. Identity alone would not do: an object can change
under the same id (`.data =`, `set_`, `resize_`, `as_strided_`), and a freed tensor's id is
reused. Reading the key is one C-level pass per attribute over the tensors (no Python loop), a few
tenths of a microsecond per tensor, instead of the checks' few microseconds per tensor.

Only plain torch.Tensor objects are keyed: the fake and functional tensors of tracing have no
address, and their calls keep the full checks. Values (lengths, accepted nodes) change every call
and are never remembered.
"""

import operator

import torch

from ..common.kv_layout import LayoutMemo

MAX_KNOWN = 64  # remembered sets, the oldest dropped first (a few per model and batch size)

# head of a key (the context and the addresses: ints, cheap to hash) -> (the rest of the key, record)
_known: dict[tuple, tuple[tuple, "Known"]] = {}
_metadata = operator.attrgetter("shape", "dtype", "device")


class Known(LayoutMemo):
    """A remembered set: its layout memo (common/kv_layout.py) and whether every tensor is a plain
    tensor with storage (not meta), i.e. may skip the custom-op dispatcher in eager mode."""

    __slots__ = ("plain",)

    def __init__(self, plain: bool):
        super().__init__()
        self.plain = plain


def key(tensors: tuple, *context) -> tuple | None:
    """(head, rest): everything the per-layer checks read of `tensors`, plus `context`; None when a
    tensor is not a plain torch.Tensor (or has no address), so its call is checked in full. The head
    (context and addresses) is hashed, the rest (strides, shapes, dtypes, devices) only compared:
    hashing them costs more than reading them."""
    if set(map(type, tensors)) != {torch.Tensor}:
        return None
    try:
        addresses = tuple(map(torch.Tensor.data_ptr, tensors))
    except RuntimeError:  # e.g. a sparse tensor: no single address
        return None
    return (*context, addresses), (tuple(map(torch.Tensor.stride, tensors)), tuple(map(_metadata, tensors)))


def lookup(set_key: tuple | None) -> Known | None:
    if set_key is None:
        return None
    head, rest = set_key
    entry = _known.get(head)
    return entry[1] if entry is not None and entry[0] == rest else None


def remember(set_key: tuple | None, tensors: tuple) -> Known | None:
    """Remember a set that has just passed every check; returns its record (None: not keyable)."""
    if set_key is None:
        return None
    head, rest = set_key
    known = Known(plain=not any(map(operator.attrgetter("is_meta"), tensors)))
    _known.pop(head, None)  # re-inserted last: a changed set replaces its old record
    _known[head] = rest, known
    while len(_known) > MAX_KNOWN:
        del _known[next(iter(_known))]
    return known
