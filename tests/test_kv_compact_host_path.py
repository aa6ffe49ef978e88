"""kv_compact's host path: cache sets checked once and recognised by their metadata, and the stacked form.

A set of per-layer caches that passed the checks is remembered under every tensor's address, shape,
strides, dtype and device (the layout through torch's native guard, or Python tuples); any change to one of them (on the same tensor objects) must bring the full
checks back, with today's errors. Two [L, B, Hkv, S_max, D] tensors are the other form of the caches:
the same results and layout as their per-layer views, checked as two tensors.
"""

import contextlib

import pytest
import torch

from specdec_kernels import ops
from specdec_kernels.common import kv_layout
from specdec_kernels.cuda import kv_cache as cuda_kv_compact
from specdec_kernels.ops import _known_caches
from specdec_kernels.ops import kv_cache

B, HKV, S, D, L = 2, 2, 10, 4, 3


def lens():
    return torch.tensor([3, 6])


def accepted():
    return torch.tensor([[0, 1, 3], [0, 2, -1]])


def separate_caches():
    gen = torch.Generator().manual_seed(0)
    return ([torch.randn(B, HKV, S, D, generator=gen) for _ in range(L)],
            [torch.randn(B, HKV, S, D, generator=gen) for _ in range(L)])


@pytest.fixture
def checks(monkeypatch):
    """Counts the full per-layer checks (list form) and the stacked form's checks."""
    calls = []
    for name in ("_check_layers", "_check_stacked"):
        real = getattr(kv_cache, name)

        def counted(*args, real=real, name=name):
            calls.append(name)
            return real(*args)

        monkeypatch.setattr(kv_cache, name, counted)
    monkeypatch.setattr(_known_caches, "_known", {})
    return calls


def test_a_known_set_is_checked_once_whatever_list_holds_it(checks):
    k, v = separate_caches()
    for _ in range(3):
        ops.kv_compact(list(k), tuple(v), lens(), accepted())  # new list objects, the same tensors
    assert checks == ["_check_layers"]
    ops.kv_compact([*k[:2], k[2].clone()], v, lens(), accepted())  # one new tensor: a new set
    assert checks == ["_check_layers"] * 2


# each change keeps every other field of the key: the address, shape, strides and dtype alone
def _resize(caches):
    caches[1].resize_(B - 1, HKV, S, D)  # smaller: same storage, same strides


def _restride(caches):
    caches[1].as_strided_((B, HKV, S, D), (HKV * S * D, S * D, D, 0))


def _retype(caches):
    caches[0].data = caches[0].data.view(torch.int32)


def _alias(caches):
    caches[2].set_(caches[0])


@pytest.mark.parametrize("change, error, pattern", [
    (_resize, ValueError, r"`v_caches\[1\]` must have shape \[2, Hkv, S_max, D\]"),
    (_restride, ValueError, r"`v_caches\[1\]` must be contiguous in its last dimension \(stride 0\)"),
    (_retype, TypeError, r"`v_caches\[0\]` must have dtype float32 \(got int32\)"),
    (_alias, ValueError, r"must be distinct tensors: two entries share memory"),
], ids=["shape", "strides", "dtype", "address"])
def test_a_tensor_changed_in_place_is_checked_again(checks, change, error, pattern):
    """The same tensor objects, remembered after a passing call, then changed in place: the next call
    runs the full checks and fails as it would have without the memo."""
    k, v = separate_caches()
    ops.kv_compact(k, v, lens(), accepted())
    before = [(x.data_ptr(), x.shape, x.stride(), x.dtype) for x in v]
    change(v)
    after = [(x.data_ptr(), x.shape, x.stride(), x.dtype) for x in v]
    assert sum(a != b for x, y in zip(before, after) for a, b in zip(x, y)) == 1  # one field of one tensor
    with pytest.raises(error, match=pattern):
        ops.kv_compact(k, v, lens(), accepted())
    assert checks == ["_check_layers"] * 2


def test_a_moved_tensor_that_is_still_valid_is_checked_and_remembered_again(checks):
    k, v = separate_caches()
    ops.kv_compact(k, v, lens(), accepted())
    k[1].set_(torch.zeros(B, HKV, S, D))  # a new address, the same object
    ops.kv_compact(k, v, lens(), accepted())
    ops.kv_compact(k, v, lens(), accepted())
    assert checks == ["_check_layers"] * 2


def test_the_batch_and_the_lengths_device_are_part_of_the_key(checks):
    k, v = separate_caches()
    ops.kv_compact(k, v, lens(), accepted())
    with pytest.raises(ValueError, match=r"`k_caches\[0\]` must have shape \[1, Hkv, S_max, D\]"):
        ops.kv_compact(k, v, lens()[:1], accepted()[:1])


@pytest.fixture(params=["native", "python"])
def layout_kind(request, monkeypatch):
    """Both ways of comparing a remembered set's layout: torch's native guard and the Python tuples."""
    if request.param == "native" and _known_caches._TensorGuards is None:
        pytest.skip("torch has no TensorGuards here")
    if request.param == "python":
        monkeypatch.setattr(_known_caches, "_TensorGuards", None)
    monkeypatch.setattr(_known_caches, "_known", {})
    return request.param


def test_the_layout_is_compared_natively_where_torch_can(layout_kind):
    k, v = separate_caches()
    tensors = (*k, *v)
    layout = _known_caches.layout_of(tensors)
    assert isinstance(layout, tuple) == (layout_kind == "python")
    assert _known_caches.same_layout(layout, tensors)


@pytest.mark.parametrize("change", [_resize, _restride, _retype], ids=["shape", "strides", "dtype"])
def test_either_layout_misses_a_tensor_changed_in_place(layout_kind, change):
    """The key's head (the addresses) still matches: the layout comparison alone must miss."""
    k, v = separate_caches()
    tensors = (*k, *v)
    set_key = _known_caches.key(tensors, B, torch.device("cpu"))
    assert _known_caches.remember(set_key, tensors) is _known_caches.lookup(set_key)
    change(v)
    assert _known_caches.key(tensors, B, torch.device("cpu"))[0] == set_key[0]
    assert _known_caches.lookup(_known_caches.key(tensors, B, torch.device("cpu"))) is None


def test_a_device_change_misses(layout_kind, monkeypatch):
    """Only possible between devices of one type (cuda:0 -> cuda:1 through `.data`): shown here with the
    device index the Python layout reads, and with a meta tensor for the native guard (its dispatch keys)."""
    k, v = separate_caches()
    tensors = (*k, *v)
    set_key = _known_caches.key(tensors, B, torch.device("cpu"))
    assert _known_caches.remember(set_key, tensors) is _known_caches.lookup(set_key)
    if layout_kind == "python":
        monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 1)
        assert _known_caches.lookup(set_key) is None
    else:
        moved = (*tensors[:-1], torch.empty_like(tensors[-1], device="meta"))
        assert _known_caches.lookup((set_key[0], moved)) is None


def test_traced_tensors_are_not_keyed():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.empty(B, HKV, S, D)
    assert _known_caches.key((fake,), B) is None
    assert _known_caches.key((torch.nn.Parameter(torch.zeros(2)),), B) is None  # a subclass: full checks


def test_the_memo_is_bounded(monkeypatch):
    monkeypatch.setattr(_known_caches, "_known", {})
    monkeypatch.setattr(_known_caches, "MAX_KNOWN", 2)
    for _ in range(4):
        k, v = separate_caches()
        ops.kv_compact(k, v, lens(), accepted())
    assert len(_known_caches._known) == 2


# ---------------------------------------------------------------- two [L, B, Hkv, S_max, D] tensors

def stacked_forms():
    """(name, K, V, owners): [L, B, Hkv, S, D] tensors as one allocation each, K and V interleaved in one
    [L, 2, ...] allocation, and an NHD storage seen through a transpose; one layer too."""
    gen = torch.Generator().manual_seed(1)
    k, v = torch.randn(L, B, HKV, S, D, generator=gen), torch.randn(L, B, HKV, S, D, generator=gen)
    kv = torch.randn(L, 2, B, HKV, S, D, generator=gen)
    nk, nv = torch.randn(L, B, S, HKV, D, generator=gen), torch.randn(L, B, S, HKV, D, generator=gen)
    one_k, one_v = torch.randn(1, B, HKV, S, D, generator=gen), torch.randn(1, B, HKV, S, D, generator=gen)
    return [("stacked", k, v, [k, v]), ("interleaved", kv[:, 0], kv[:, 1], [kv]),
            ("nhd", nk.transpose(2, 3), nv.transpose(2, 3), [nk, nv]), ("one layer", one_k, one_v, [one_k, one_v])]


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("form", range(4), ids=[f[0] for f in stacked_forms()])
def test_stacked_tensors_compact_like_their_layers(form, backend):
    _, k, v, owners = stacked_forms()[form]
    pristine = [o.clone() for o in owners]
    want_lens = ops.kv_compact(list(k.unbind(0)), list(v.unbind(0)), lens(), accepted(), backend="torch")
    want = [o.clone() for o in owners]
    for owner, saved in zip(owners, pristine):
        owner.copy_(saved)
    got_lens = ops.kv_compact(k, v, lens(), accepted(), backend=backend)
    assert torch.equal(got_lens, want_lens)
    assert all(torch.equal(o, w) for o, w in zip(owners, want))
    assert not torch.equal(want[0], pristine[0])  # something moved


@pytest.mark.parametrize("form", range(4), ids=[f[0] for f in stacked_forms()])
def test_a_layer_stack_has_the_layout_of_its_views(form):
    _, k, v, _ = stacked_forms()[form]
    stacked = kv_layout.cache_layout(kv_layout.LayerStack(k), kv_layout.LayerStack(v))
    assert stacked == kv_layout.cache_layout(list(k.unbind(0)), list(v.unbind(0)))
    assert stacked.table is None and len(kv_layout.LayerStack(k)) == k.shape[0]


def test_the_cuda_launcher_gets_the_same_arguments_from_a_stack_and_from_views(monkeypatch):
    """The CUDA launcher reads len, [0] and the layout of what it is given: a LayerStack must give the
    same launch as the list of its views (shown with a recording stand-in for `_C`)."""
    launches = []

    class Library:
        def kv_compact(self, *args):
            launches.append(args[:-4] + args[-3:])  # all but the output's address

    monkeypatch.setattr(cuda_kv_compact, "library", Library)
    monkeypatch.setattr(cuda_kv_compact, "on_device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(cuda_kv_compact, "stream_handle", lambda device: 0)
    _, k, v, _ = stacked_forms()[2]
    seq_lens, nodes = lens(), accepted()
    cuda_kv_compact.kv_compact(kv_layout.LayerStack(k), kv_layout.LayerStack(v), seq_lens, nodes)
    cuda_kv_compact.kv_compact(list(k.unbind(0)), list(v.unbind(0)), seq_lens, nodes)
    assert len(launches) == 2 and launches[0] == launches[1]


@pytest.mark.parametrize("k, v, error, pattern", [
    (torch.zeros(L, B, HKV, S), torch.zeros(L, B, HKV, S), ValueError, r"`k_caches` must have shape \[L, 2, Hkv"),
    (torch.zeros(L, B, HKV, S, D), torch.zeros(L, B, HKV, S + 1, D), ValueError,
     r"`v_caches` has shape \[3, 2, 2, 11, 4\], expected \[3, 2, 2, 10, 4\] like k_caches"),
    (torch.zeros(L, B, HKV, S, D), torch.zeros(L, B, HKV, S, D, dtype=torch.float16), TypeError,
     r"`v_caches` must have dtype float32"),
    (torch.zeros(L, B, HKV, S, D, dtype=torch.int32), torch.zeros(L, B, HKV, S, D), TypeError,
     r"`k_caches` must have dtype float32 or float16 or bfloat16"),
    (torch.zeros(1, B, HKV, S, D).expand(L, -1, -1, -1, -1), torch.zeros(L, B, HKV, S, D), ValueError,
     r"must hold distinct layers: two layers share memory"),
    (torch.zeros(L, B, HKV, S, D), None, ValueError, r"two layers share memory"),  # V is K
    (torch.zeros(L, B, HKV, S, D), [torch.zeros(B, HKV, S, D)] * L, TypeError, r"lists of equal length.*or two"),
], ids=["rank", "shapes", "v-dtype", "k-dtype", "expanded", "same", "mixed"])
def test_stacked_tensors_are_checked(k, v, error, pattern):
    with pytest.raises(error, match=pattern):
        ops.kv_compact(k, k if v is None else v, lens(), accepted())


def test_a_stacked_tensor_changed_in_place_is_checked_again(checks):
    k, v = torch.zeros(L, B, HKV, S, D), torch.zeros(L, B, HKV, S, D)
    ops.kv_compact(k, v, lens(), accepted())
    ops.kv_compact(k, v, lens(), accepted())
    assert checks == ["_check_stacked"]
    v.data = v.data.half()
    with pytest.raises(TypeError, match=r"`v_caches` must have dtype float32"):
        ops.kv_compact(k, v, lens(), accepted())


def test_stacked_tensors_under_torch_compile_move_like_eager():
    """Traced calls are not keyed: the stacked form goes through the custom op as the list of its layers,
    whose in-place moves must still land in the two tensors."""
    torch._dynamo.reset()
    _, k, v, _ = stacked_forms()[0]
    want_k, want_v = k.clone(), v.clone()
    want = ops.kv_compact(want_k, want_v, lens(), accepted())
    compiled = torch.compile(lambda *args: ops.kv_compact(*args), fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(k, v, lens(), accepted()), want)
    assert torch.equal(k, want_k) and torch.equal(v, want_v) and not torch.equal(k, stacked_forms()[0][1])
