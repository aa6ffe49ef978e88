"""Cache sets that passed kv_compact's checks, remembered so that a decode loop checks them once.

kv_compact's per-layer checks (type, shape, dtype, device, last-dim stride, equal shapes, no two
layers at one address) read nothing but each tensor's metadata, and a decode loop passes the same
caches on every call. So a set that passed is remembered under everything those checks read:
every tensor's address, shape, strides, dtype and device, with the batch size and the lengths'
device they were checked against. Identity alone would not do: an object can change under the
same id (`.data =`, `set_`, `resize_`, `as_strided_`), and a freed tensor's id is reused.

The addresses (and the context) are the hashed head of the key. The rest, the tensors' layout, is
compared, not hashed, through `torch._C._dynamo.guards.TensorGuards` where torch has it: the guard
torch.compile itself uses to recognise its inputs, which checks each tensor's dtype, device,
dispatch keys, sizes and strides in one native call (about 4.5 us for 64 tensors on the project's
CPU, against ~15 us to read them in Python). Where that class is missing or refuses the tensors,
the layout is read into flat tuples instead. A guard stricter than our checks (requires_grad, the
dispatch keys) only costs a full check on a miss.

Only plain torch.Tensor objects are keyed: the fake and functional tensors of tracing have no
address, and their calls keep the full checks. Values (lengths, accepted nodes) change every call
and are never remembered.
"""

import operator

import torch

from ..common.kv_layout import LayoutMemo

try:  # a private torch class, present since torch 2.1: used only if it loads and accepts the tensors
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:
    _TensorGuards = None

MAX_KNOWN = 64  # remembered sets, the oldest dropped first (a few per model and batch size)

# head of a key (the context and the addresses: ints, cheap to hash) -> (layout, record)
_known: dict[tuple, tuple[object, "Known"]] = {}
_shape, _dtype = operator.attrgetter("shape"), operator.attrgetter("dtype")


class Known(LayoutMemo):
    """A remembered set: its layout memo (common/kv_layout.py) and whether every tensor is a plain
    tensor with storage (not meta), i.e. may skip the custom-op dispatcher in eager mode."""

    __slots__ = ("plain",)

    def __init__(self, plain: bool):
        super().__init__()
        self.plain = plain


def python_layout(tensors: tuple) -> tuple:
    """Strides, shapes, dtypes and device indices as flat tuples (they compare faster than per-tensor
    records). The device is its index: the device type is the context's, which the checks held every
    tensor to."""
    return (tuple(map(torch.Tensor.stride, tensors)), tuple(map(_shape, tensors)), tuple(map(_dtype, tensors)),
            tuple(map(torch.Tensor.get_device, tensors)))


def layout_of(tensors: tuple):
    """What `same_layout` compares a later set with: a native guard, or the Python tuples."""
    if _TensorGuards is not None:
        try:
            return _TensorGuards(*tensors, dynamic_dims_sizes=None, dynamic_dims_strides=None)
        except (TypeError, RuntimeError):
            pass
    return python_layout(tensors)


def same_layout(layout, tensors: tuple) -> bool:
    if isinstance(layout, tuple):
        return layout == python_layout(tensors)
    return layout.check(*tensors)  # the head matched, so the count is the same


def key(tensors: tuple, *context) -> tuple | None:
    """(head, tensors): the head is `context` and every tensor's address; None when a tensor is not a
    plain torch.Tensor (or has no address), so its call is checked in full."""
    if set(map(type, tensors)) != {torch.Tensor}:
        return None
    try:
        addresses = tuple(map(torch.Tensor.data_ptr, tensors))
    except RuntimeError:  # e.g. a sparse tensor: no single address
        return None
    return (*context, addresses), tensors


def lookup(set_key: tuple | None) -> Known | None:
    if set_key is None:
        return None
    head, tensors = set_key
    entry = _known.get(head)
    return entry[1] if entry is not None and same_layout(entry[0], tensors) else None


def remember(set_key: tuple | None, tensors: tuple) -> Known | None:
    """Remember a set that has just passed every check; returns its record (None: not keyable)."""
    if set_key is None:
        return None
    head, _ = set_key
    known = Known(plain=not any(map(operator.attrgetter("is_meta"), tensors)))
    _known.pop(head, None)  # re-inserted last: a changed set replaces its old record
    _known[head] = layout_of(tensors), known
    while len(_known) > MAX_KNOWN:
        del _known[next(iter(_known))]
    return known
