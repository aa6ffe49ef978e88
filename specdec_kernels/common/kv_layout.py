"""Where every layer's K and V cache lives, for the one-launch `kv_compact` kernels.

The caches arrive as Python lists of per-layer [B, Hkv, S_max, D] tensors, but a kernel
that moves all layers in one launch needs every tensor's address and strides on the
device. Two ways, picked per call: the fast path, when every layer's K (and V) has the same
strides and starts a constant step after the previous one (views of one [L, B, Hkv, S_max, D]
tensor), passes two base pointers, steps and stride triples as plain arguments; anything else
uploads a [2L, 4] int64 table of (address in bytes, stride_b, stride_h, stride_s), cached by the
tensors' addresses and strides. The fast path needs no table, so it is also the one to capture.
"""

import collections
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

MAX_TABLES = 64  # cached tables not used by a graph capture; older ones are evicted
VECTOR_BYTES = 16  # the widest load/store the kernels issue


@dataclass
class _Entry:
    table: torch.Tensor  # [2L, 4] int64 on the device
    host: torch.Tensor  # its pinned source, alive as long as the non-blocking copy may run
    uploaded: object  # torch.cuda.Event recorded after the upload on its stream (None on the CPU)
    streams: set  # cuda_stream handles ordered after the upload (and recorded on the table)


_tables: "collections.OrderedDict[tuple, _Entry]" = collections.OrderedDict()
_captured: dict[tuple, _Entry] = {}  # never freed: a graph holds their address


@dataclass(frozen=True)
class CacheLayout:
    """How the kernels address the caches (see the module docstring).

    table: [2L, 4] int64 on the caches' device, or None on the fast path.
    k_step, v_step: elements from one layer's K (V) cache to the next (fast path).
    k_strides, v_strides: (stride_b, stride_h, stride_s) in elements of every K (V) cache
        (fast path).
    vector_bytes: the largest power of two <= 16 that divides every address, every
        stride and step in bytes and the row size D * element size: the widest aligned
        access the kernels may use.
    """

    num_layers: int
    table: torch.Tensor | None
    k_step: int
    v_step: int
    k_strides: tuple[int, int, int]
    v_strides: tuple[int, int, int]
    vector_bytes: int


class LayerStack(Sequence):
    """The per-layer caches of one [L, B, Hkv, S_max, D] tensor as the sequence the launchers take
    (len, [layer], iteration), without making L views per call."""

    __slots__ = ("stacked",)

    def __init__(self, stacked: torch.Tensor):
        self.stacked = stacked

    def __len__(self) -> int:
        return self.stacked.shape[0]

    def __getitem__(self, layer):
        return self.stacked[layer]

    def __iter__(self):
        return iter(self.stacked.unbind(0))


class LayoutMemo:
    """The layout of one validated set of caches, worked out on its first call (see CheckedCaches)."""

    __slots__ = ("plan",)

    def __init__(self):
        self.plan = None


class CheckedCaches(list):
    """A list of per-layer caches whose metadata (addresses, shapes, strides, dtypes, devices) the op
    has validated; `memo` is shared by every call whose tensors have the same metadata."""

    __slots__ = ("memo",)

    def __init__(self, caches, memo: LayoutMemo):
        super().__init__(caches)
        self.memo = memo


class _Hashed:
    """A table key whose (long) tuple is hashed once, so a memoised lookup costs no rehash."""

    __slots__ = ("value", "hash")

    def __init__(self, value: tuple):
        self.value, self.hash = value, hash(value)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other) -> bool:
        return isinstance(other, _Hashed) and self.hash == other.hash and self.value == other.value


@dataclass(frozen=True)
class _Plan:
    """What a set of caches' layout needs besides the table: the layout (table None), and for the
    table path the table's rows and key."""

    layout: CacheLayout
    rows: tuple | None
    key: _Hashed | None


def _uniform_group(caches: list[torch.Tensor]) -> tuple[int, tuple[int, int, int]] | None:
    """(step, strides) when the layers are equally spaced with equal strides, else None."""
    strides = caches[0].stride()[:3]
    if any(c.stride()[:3] != strides for c in caches):
        return None
    elem = caches[0].element_size()
    first = caches[0].data_ptr()
    step_bytes = caches[1].data_ptr() - first if len(caches) > 1 else 0
    if step_bytes % elem or any(c.data_ptr() - first != layer * step_bytes for layer, c in enumerate(caches)):
        return None
    return step_bytes // elem, strides


def _vector_bytes(values_in_bytes) -> int:
    common = 0
    for value in values_in_bytes:
        common = math.gcd(common, value)
    common = math.gcd(common, VECTOR_BYTES)
    return common & -common if common else VECTOR_BYTES  # largest power of two dividing it


def _table_rows(caches: list[torch.Tensor]) -> tuple[tuple, _Hashed]:
    rows = tuple((c.data_ptr(), *c.stride()[:3]) for c in caches)
    return rows, _Hashed((caches[0].device, caches[0].element_size(), rows))


def _table(device: torch.device, rows: tuple, key: _Hashed) -> torch.Tensor:
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    entry = _captured.get(key) or _tables.get(key)
    if entry is None:
        if capturing:
            raise RuntimeError(
                "kv_compact: these cache tensors are not views of one allocation with a constant layer stride, "
                "so their addresses go to the GPU in a table, and a new table cannot be uploaded during CUDA "
                "graph capture. Call kv_compact once with the same cache tensors before capturing (warm-up), "
                "or allocate the caches as one [L, B, Hkv, S_max, D] tensor.")
        host = torch.tensor(rows, dtype=torch.int64).reshape(len(rows), 4)
        if device.type == "cuda":  # pinned + non_blocking: stream-ordered, no host sync
            host = host.pin_memory()
            stream = torch.cuda.current_stream(device)
            table = host.to(device, non_blocking=True)
            uploaded = torch.cuda.Event()
            uploaded.record(stream)
            entry = _Entry(table, host, uploaded, {stream.cuda_stream})
        else:  # CPU tensors (the Triton interpreter): the table is the host tensor itself
            entry = _Entry(host, host, None, set())
    # capture needs no wait (waiting on an event recorded outside a capture is invalid): torch.cuda.graph
    # synchronises the device before capturing, so every earlier upload has landed
    elif device.type == "cuda" and not capturing:
        stream = torch.cuda.current_stream(device)
        # a device-side wait once per (table, stream); record_stream so an evicted table's memory is not
        # reused while a kernel queued on this stream may still read it
        if stream.cuda_stream not in entry.streams:
            stream.wait_event(entry.uploaded)
            entry.table.record_stream(stream)
            entry.streams.add(stream.cuda_stream)
    if capturing:
        _tables.pop(key, None)
        _captured[key] = entry
    elif key not in _captured:
        _tables[key] = entry
        _tables.move_to_end(key)
        while len(_tables) > MAX_TABLES:
            _tables.popitem(last=False)
    return entry.table


def _stacked_layout(keys: torch.Tensor, values: torch.Tensor) -> CacheLayout:
    """The layout of LayerStacks: layer l of K starts keys.stride(0) elements after layer l - 1 (the
    step and strides _uniform_group finds for their per-layer views: 0 for one layer)."""
    layers = keys.shape[0]
    k_step, v_step = (keys.stride(0), values.stride(0)) if layers > 1 else (0, 0)
    k_strides, v_strides = keys.stride()[1:4], values.stride()[1:4]
    elem = keys.element_size()
    vector = _vector_bytes([keys.data_ptr(), values.data_ptr(), keys.shape[-1] * elem,
                            *(x * elem for x in (k_step, v_step, *k_strides, *v_strides))])
    return CacheLayout(layers, None, k_step, v_step, k_strides, v_strides, vector)


def _plan(k_caches: list[torch.Tensor], v_caches: list[torch.Tensor]) -> _Plan:
    elem = k_caches[0].element_size()
    k_group, v_group = _uniform_group(k_caches), _uniform_group(v_caches)
    caches = [*k_caches, *v_caches]
    row_bytes = k_caches[0].shape[-1] * elem
    if k_group is not None and v_group is not None:
        (k_step, k_strides), (v_step, v_strides) = k_group, v_group
        vector = _vector_bytes([k_caches[0].data_ptr(), v_caches[0].data_ptr(), row_bytes,
                                *(x * elem for x in (k_step, v_step, *k_strides, *v_strides))])
        return _Plan(CacheLayout(len(k_caches), None, k_step, v_step, k_strides, v_strides, vector), None, None)
    vector = _vector_bytes([row_bytes, *(c.data_ptr() for c in caches),
                            *(x * elem for c in caches for x in c.stride()[:3])])
    rows, key = _table_rows(caches)
    return _Plan(CacheLayout(len(k_caches), None, 0, 0, (0, 0, 0), (0, 0, 0), vector), rows, key)


def cache_layout(k_caches, v_caches) -> CacheLayout:
    """The CacheLayout of validated caches (equal-length lists, equal shapes and dtype; or LayerStacks)."""
    # reading 2L tensors' addresses and strides costs more than the launch at 32 layers: LayerStack
    # computes the layout from one tensor, CheckedCaches' memo works it out once per set of tensors
    if isinstance(k_caches, LayerStack):
        return _stacked_layout(k_caches.stacked, v_caches.stacked)
    if not k_caches:
        return CacheLayout(0, None, 0, 0, (0, 0, 0), (0, 0, 0), VECTOR_BYTES)
    memo = getattr(k_caches, "memo", None)
    plan = memo.plan if memo is not None else None
    if plan is None:
        plan = _plan(k_caches, v_caches)
        if memo is not None:
            memo.plan = plan
    if plan.rows is None:
        return plan.layout
    # the table itself is looked up on every call: it orders streams and keeps captured tables
    table = _table(k_caches[0].device, plan.rows, plan.key)
    layout = plan.layout
    return CacheLayout(layout.num_layers, table, 0, 0, (0, 0, 0), (0, 0, 0), layout.vector_bytes)
