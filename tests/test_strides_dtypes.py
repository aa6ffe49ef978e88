"""Strides and dtypes, every op, every backend this machine runs.

Each op gets its index tensors (token ids, parents, counts, lengths, offsets, seeds, page
ids, accepted nodes) as int32 or int64, each either contiguous or as a non-contiguous view
(interleaved with filler values, a column of a wider matrix, column-major, from a nonzero
storage offset), and the float tensors its docs allow to be strided as padded views of a
NaN-filled allocation. Every backend must give exactly what the torch reference gives on
contiguous int64 copies. The fillers are valid-but-wrong values, so a kernel that ignores
a stride or reads the wrong width gets a wrong answer, not just a crash.

Backends: torch everywhere; triton under the interpreter on the CPU (TRITON_INTERPRET=1,
set by conftest before triton is imported) or on a GPU; cuda where `_C` loads on a GPU.
Shapes stay tiny: the interpreter runs every program in numpy.
"""

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec_kernels import ops
from gpu_support import backends_here

GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if GPU else "cpu")
INDEX_DTYPES = (torch.int64, torch.int32)
EXAMPLES = int(os.environ.get("STRIDES_DTYPES_EXAMPLES", "25"))  # per (op, backend): minutes under the interpreter


BACKENDS = backends_here()
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # interpreter NaN math


# ----------------------------------------------------------------------------- layouts

INDEX_LAYOUTS = ("contiguous", "interleaved", "column", "transposed", "offset")


def index_view(x: torch.Tensor, dtype: torch.dtype, layout: str, filler: int) -> torch.Tensor:
    """x's values as `dtype` in `layout`; the storage around the view holds `filler`."""
    x = x.to(dtype)
    if layout == "contiguous":
        return x.contiguous()
    if layout == "interleaved":  # every element followed by a filler, from storage offset 1
        big = torch.full((*x.shape[:-1], 2 * x.shape[-1] + 1), filler, dtype=dtype, device=x.device)
        view = big[..., 1::2]
    elif layout == "column":  # the middle column of [..., 3] (1-D), or of a row-padded matrix (2-D)
        big = torch.full((*x.shape, 3), filler, dtype=dtype, device=x.device)
        view = big[..., 1]
    elif layout == "transposed":  # column-major storage (a 1-D tensor: reversed-then-flipped is not a view)
        if x.dim() < 2:
            return index_view(x, dtype, "column", filler)
        big = torch.full(tuple(reversed(x.shape)), filler, dtype=dtype, device=x.device)
        view = big.t()
    else:  # "offset": a contiguous slice that starts past the allocation's first element
        big = torch.full((x.numel() + 3,), filler, dtype=dtype, device=x.device)
        view = big[3:].view(x.shape)
    view.copy_(x)
    return view


def padded_view(x: torch.Tensor, filler: float = float("nan")) -> torch.Tensor:
    """x as a view into a larger allocation (every dim padded, nonzero storage offset), last dim contiguous."""
    big = torch.full(tuple(s + 1 for s in x.shape), filler, dtype=x.dtype, device=x.device)
    view = big[tuple(slice(1, 1 + s) for s in x.shape)]
    view.copy_(x)
    return view


def strided_float_view(x: torch.Tensor, layout: str, filler: float) -> torch.Tensor:
    """For tensors the docs accept at any strides (uniforms, per-row temperatures)."""
    if layout == "contiguous":
        return x.contiguous()
    if layout == "padded":
        return padded_view(x, filler)
    big = torch.full((*x.shape, 2), filler, dtype=x.dtype, device=x.device)  # "interleaved"
    view = big[..., 1]
    view.copy_(x)
    return view


def draw_index(data, name: str, x: torch.Tensor | None, filler: int):
    """(view, contiguous int64 copy) of an index tensor in a drawn dtype and layout."""
    if x is None:
        return None, None
    dtype = data.draw(st.sampled_from(INDEX_DTYPES), label=f"{name} dtype")
    layout = data.draw(st.sampled_from(INDEX_LAYOUTS), label=f"{name} layout")
    return index_view(x, dtype, layout, filler), x.to(torch.int64).contiguous()


def draw_float(data, name: str, x: torch.Tensor | None, filler: float, layouts=("contiguous", "padded", "interleaved")):
    if x is None:
        return None, None
    layout = data.draw(st.sampled_from(layouts), label=f"{name} layout")
    return strided_float_view(x, layout, filler), x.contiguous()


def assert_same(got, want, op: str, *, atol: float = 0.0):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        if w.dtype.is_floating_point:
            assert torch.allclose(g.float().cpu(), w.float().cpu(), atol=atol, rtol=atol, equal_nan=True), (
                f"{op} output {i}: max error {(g.float() - w.float()).abs().nan_to_num(1e9).max()}")
        else:
            assert torch.equal(g.cpu().to(torch.int64), w.cpu().to(torch.int64)), f"{op} output {i}:\n{g}\n{w}"


def backends_of(op: str) -> list[str]:
    return [b for b in BACKENDS if b in ops.implemented_backends(op)]


def params(*op_names):
    return [pytest.param(op, b, id=f"{op}-{b}") for op in op_names for b in backends_of(op)]


def gen_of(data) -> torch.Generator:
    return torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1), label="seed"))


# ----------------------------------------------------------------------------- chain verification

def chain_inputs(data, gen):
    batch = data.draw(st.integers(1, 3), label="B")
    g = data.draw(st.integers(0, 4), label="g")
    vocab = data.draw(st.sampled_from((5, 37)), label="V")
    logits = torch.randn(batch, g + 1, vocab, generator=gen) * 3
    top1 = logits.argmax(-1)[:, :g]
    noise = torch.randint(0, vocab, (batch, g), generator=gen)
    drafts = torch.where(torch.rand(batch, g, generator=gen) < 0.7, top1, noise)  # long accepted runs, some misses
    counts = torch.randint(0, g + 1, (batch,), generator=gen) if data.draw(st.booleans(), label="ragged") else None
    return batch, g, vocab, logits, drafts, counts


@pytest.mark.parametrize("op, backend", params("greedy_verify", "relaxed_verify", "bild_verify"))
@given(data=st.data())
@SETTINGS
def test_chain_verify(op, backend, data):
    gen = gen_of(data)
    batch, g, vocab, logits, drafts, counts = chain_inputs(data, gen)
    rule = dict(greedy_verify={}, relaxed_verify=dict(top_beta=2, tau=1.5), bild_verify=dict(rollback_threshold=2.0))[op]
    d_view, d_ref = draw_index(data, "draft_tokens", drafts, filler=vocab - 1)
    c_view, c_ref = draw_index(data, "num_draft_tokens", counts, filler=g)
    logits = logits.to(DEVICE)
    want = getattr(ops, op)(logits, d_ref.to(DEVICE), num_draft_tokens=None if c_ref is None else c_ref.to(DEVICE),
                            backend="torch", **rule)
    got = getattr(ops, op)(padded_view(logits), d_view.to(DEVICE),
                           num_draft_tokens=None if c_view is None else c_view.to(DEVICE), backend=backend, **rule)
    assert_same(got, want, op)


def randomness(data, gen, batch: int, columns: int):
    """(view kwargs, reference kwargs): uniforms (strided), an int seed with offsets, or per-row seeds."""
    mode = data.draw(st.sampled_from(("uniforms", "seed", "row_seeds")), label="randomness")
    if mode == "uniforms":
        u_view, u_ref = draw_float(data, "uniforms", torch.rand(batch, columns, generator=gen, dtype=torch.float64), 0.5)
        return dict(uniforms=u_view), dict(uniforms=u_ref)
    offsets = torch.randint(0, 2**40, (batch,), generator=gen) if data.draw(st.booleans(), label="offsets") else None
    if offsets is not None and data.draw(st.booleans(), label="int32-range offsets"):
        offsets = offsets % 2**31  # int32 callers pass positions that fit
    o_view, o_ref = draw_index(data, "offsets", offsets, filler=12345)
    if mode == "seed":
        return dict(seed=7, offsets=o_view), dict(seed=7, offsets=o_ref)
    seeds = torch.randint(-2**31, 2**31, (batch,), generator=gen)  # any int32 value, sign-extended
    s_view, s_ref = draw_index(data, "seed", seeds, filler=999)
    return dict(seed=s_view, offsets=o_view), dict(seed=s_ref, offsets=o_ref)


def on_device(kwargs: dict) -> dict:
    return {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


@pytest.mark.parametrize("op, backend", params("rejection_sample", "rejection_sample_logits", "block_verify",
                                                "block_verify_logits"))
@given(data=st.data())
@SETTINGS
def test_rejection_sample(op, backend, data):
    gen = gen_of(data)
    batch, g, vocab, target, _, counts = chain_inputs(data, gen)
    draft = torch.randn(batch, g, vocab, generator=gen) * 2
    if op in ("rejection_sample", "block_verify"):  # probabilities in; the *_logits ops take the logits
        target, draft = target.softmax(-1), draft.softmax(-1)
    drafts = torch.multinomial(draft.softmax(-1).reshape(-1, vocab), 1, generator=gen).reshape(batch, g)
    rand_view, rand_ref = randomness(data, gen, batch, g + 1)
    d_view, d_ref = draw_index(data, "draft_tokens", drafts, filler=0)
    c_view, c_ref = draw_index(data, "num_draft_tokens", counts, filler=g)
    extra_view, extra_ref = {}, {}
    if op.endswith("_logits") and data.draw(st.booleans(), label="row temperatures"):
        temps = 0.5 + torch.rand(batch, generator=gen)
        extra_view["temperature"], extra_ref["temperature"] = draw_float(data, "temperature", temps, 1e-3)
    fn = getattr(ops, op)
    target, draft = target.to(DEVICE), draft.to(DEVICE)
    want = fn(target, draft, d_ref.to(DEVICE), backend="torch", **on_device(dict(num_draft_tokens=c_ref, **rand_ref)),
              **on_device(extra_ref))
    got = fn(padded_view(target), padded_view(draft), d_view.to(DEVICE), backend=backend,
             **on_device(dict(num_draft_tokens=c_view, **rand_view)), **on_device(extra_view))
    assert_same(got, want, op)


# ----------------------------------------------------------------------------- trees

def random_parents(gen, n: int) -> list[int]:
    """Topological parents with some unused slots (-1 after node 0)."""
    parents, used = [-1], [0]
    for i in range(1, n):
        if float(torch.rand((), generator=gen)) < 0.2:
            parents.append(-1)
            continue
        parents.append(used[int(torch.randint(0, len(used), (), generator=gen))])
        used.append(i)
    return parents


@pytest.mark.parametrize("op, backend", params("tree_greedy_verify", "tree_rejection_sample"))
@given(data=st.data())
@SETTINGS
def test_tree_verify(op, backend, data):
    gen = gen_of(data)
    batch = data.draw(st.integers(1, 3), label="B")
    n = data.draw(st.integers(1, 6), label="N")
    vocab = data.draw(st.sampled_from((5, 37)), label="V")
    parents = torch.tensor([random_parents(gen, n) for _ in range(batch)])
    target = torch.randn(batch, n, vocab, generator=gen) * 3
    # each node's token: often its parent's argmax (acceptances), else random
    at_parent = target.argmax(-1).gather(1, parents.clamp(min=0))
    tokens = torch.where(torch.rand(batch, n, generator=gen) < 0.6, at_parent,
                         torch.randint(0, vocab, (batch, n), generator=gen))
    t_view, t_ref = draw_index(data, "tree_tokens", tokens, filler=0)
    p_view, p_ref = draw_index(data, "parents", parents, filler=0)
    if op == "tree_greedy_verify":
        target = target.to(DEVICE)
        want = ops.tree_greedy_verify(target, t_ref.to(DEVICE), p_ref.to(DEVICE), backend="torch")
        got = ops.tree_greedy_verify(padded_view(target), t_view.to(DEVICE), p_view.to(DEVICE), backend=backend)
    else:
        target = target.softmax(-1).to(DEVICE)
        draft = torch.randn(batch, n, vocab, generator=gen).softmax(-1).to(DEVICE)
        rand_view, rand_ref = randomness(data, gen, batch, n)
        want = ops.tree_rejection_sample(target, draft, t_ref.to(DEVICE), p_ref.to(DEVICE), backend="torch",
                                         **on_device(rand_ref))
        got = ops.tree_rejection_sample(padded_view(target), padded_view(draft), t_view.to(DEVICE), p_view.to(DEVICE),
                                        backend=backend, **on_device(rand_view))
    assert_same(got, want, op)


# ----------------------------------------------------------------------------- attention

@pytest.mark.parametrize("op, backend", params("tree_attention"))
@given(data=st.data())
@SETTINGS
def test_tree_attention(op, backend, data):
    from specdec_kernels.reference.attention import paged_from_contiguous
    gen = gen_of(data)
    batch = data.draw(st.integers(1, 3), label="B")
    n = data.draw(st.integers(1, 5), label="N")
    hkv = data.draw(st.sampled_from((1, 2)), label="Hkv")
    hq, d = 2 * hkv, 16
    lens = torch.randint(0, 20, (batch,), generator=gen)
    s_max = int(lens.max()) + n + 2
    q = torch.randn(batch, n, hq, d, generator=gen)
    k, v = (torch.randn(batch, hkv, s_max, d, generator=gen) for _ in range(2))
    table = None
    if data.draw(st.booleans(), label="paged"):
        page_size = data.draw(st.sampled_from((4, 8)), label="page_size")
        k, table = paged_from_contiguous(k, page_size, generator=torch.Generator().manual_seed(1), spare_pages=2)
        v, _ = paged_from_contiguous(v, page_size, generator=torch.Generator().manual_seed(1), spare_pages=2)
    tree = data.draw(st.booleans(), label="tree")
    parents = torch.tensor([random_parents(gen, n) for _ in range(batch)]) if tree else None
    l_view, l_ref = draw_index(data, "seq_lens", lens, filler=0)
    p_view, p_ref = draw_index(data, "parents", parents, filler=0)
    t_view, t_ref = draw_index(data, "block_table", table, filler=0)
    q, k, v = q.to(DEVICE), k.to(DEVICE), v.to(DEVICE)
    dev = lambda x: None if x is None else x.to(DEVICE)  # noqa: E731
    want = ops.tree_attention(q, k, v, dev(l_ref), dev(p_ref), block_table=dev(t_ref), backend="torch")
    got = ops.tree_attention(padded_view(q), padded_view(k), padded_view(v), dev(l_view), dev(p_view),
                             block_table=dev(t_view), backend=backend)
    assert_same(got, want, op, atol=2e-5)


# ----------------------------------------------------------------------------- KV bookkeeping

@pytest.mark.parametrize("op, backend", params("kv_rollback"))
@given(data=st.data())
@SETTINGS
def test_kv_rollback(op, backend, data):
    gen = gen_of(data)
    batch = data.draw(st.integers(1, 4), label="B")
    lens, accepted = torch.randint(0, 100, (batch,), generator=gen), torch.randint(0, 5, (batch,), generator=gen)
    l_view, l_ref = draw_index(data, "seq_lens", lens, filler=0)
    a_view, a_ref = draw_index(data, "num_accepted", accepted, filler=0)
    got = ops.kv_rollback(l_view.to(DEVICE), a_view.to(DEVICE), backend=backend)
    assert got.dtype == l_view.dtype  # the new lengths keep seq_lens' dtype
    assert_same(got, ops.kv_rollback(l_ref.to(DEVICE), a_ref.to(DEVICE), backend="torch"), op)


@pytest.mark.parametrize("op, backend", params("kv_compact"))
@given(data=st.data())
@SETTINGS
def test_kv_compact(op, backend, data):
    gen = gen_of(data)
    batch = data.draw(st.integers(1, 3), label="B")
    n = data.draw(st.integers(1, 6), label="N")
    layers, heads, d = data.draw(st.integers(0, 2), label="L"), 2, 8
    paths = []
    for _ in range(batch):  # a root-to-node path of a random tree: increasing node ids from 0
        parents = [-1] + [int(torch.randint(0, i, (), generator=gen)) for i in range(1, n)]
        node, path = int(torch.randint(0, n, (), generator=gen)), []
        while node >= 0:
            path.append(node)
            node = parents[node]
        paths.append(path[::-1] + [-1] * (n - len(path)))
    accepted = torch.tensor(paths)
    lens = torch.randint(0, 10, (batch,), generator=gen)
    caches = [torch.randn(batch, heads, 10 + n, d, generator=gen).to(DEVICE) for _ in range(2 * layers)]
    l_view, l_ref = draw_index(data, "seq_lens", lens, filler=0)
    a_view, a_ref = draw_index(data, "accepted_nodes", accepted, filler=n - 1)
    want_caches = [c.clone() for c in caches]
    want = ops.kv_compact(want_caches[:layers], want_caches[layers:], l_ref.to(DEVICE), a_ref.to(DEVICE),
                          backend="torch")
    got = ops.kv_compact(caches[:layers], caches[layers:], l_view.to(DEVICE), a_view.to(DEVICE), backend=backend)
    assert got.dtype == l_view.dtype
    assert_same((got, *caches), (want, *want_caches), op)


def test_every_op_with_index_tensors_is_covered():
    """A new op with index tensors needs a case here (max_prob, fallback_check and
    early_exit_topk take none)."""
    covered = {"greedy_verify", "relaxed_verify", "bild_verify", "rejection_sample", "rejection_sample_logits",
               "block_verify", "block_verify_logits", "tree_greedy_verify", "tree_rejection_sample", "tree_attention", "kv_rollback", "kv_compact"}
    from specdec_kernels.common.registry import registered_ops
    assert set(registered_ops()) - covered == {"max_prob", "early_exit_topk"}


@pytest.mark.parametrize("backend", backends_of("tree_attention"))
@pytest.mark.parametrize("strided", ["seq_lens", "parents", "block_table"])
@pytest.mark.parametrize("dtype", INDEX_DTYPES, ids=["int64", "int32"])
def test_tree_attention_reads_each_index_tensor_at_its_strides(backend, strided, dtype):
    """One index tensor at a time as a column view (stride 3, offset 1), in either width: the
    Triton kernel once read seq_lens, parents and block_table as if contiguous."""
    from specdec_kernels.reference.attention import paged_from_contiguous
    gen = torch.Generator().manual_seed(3)
    batch, n, hkv, d = 3, 4, 1, 16
    lens = torch.tensor([5, 17, 9])
    q = torch.randn(batch, n, 2 * hkv, d, generator=gen)
    k, v = (torch.randn(batch, hkv, 24, d, generator=gen) for _ in range(2))
    k, table = paged_from_contiguous(k, 4, generator=torch.Generator().manual_seed(1))
    v, _ = paged_from_contiguous(v, 4, generator=torch.Generator().manual_seed(1))
    parents = torch.tensor([[-1, 0, 1, 1], [-1, 0, 0, 2], [-1, -1, 0, 2]])
    inputs = dict(seq_lens=lens, parents=parents, block_table=table)
    views = {name: index_view(x, dtype, "column" if name == strided else "contiguous", 0) for name, x in inputs.items()}
    dev = {name: x.to(DEVICE) for name, x in views.items()}
    want = ops.tree_attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), **{n_: x.to(DEVICE) for n_, x in inputs.items()},
                              backend="torch")
    got = ops.tree_attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), dev["seq_lens"], dev["parents"],
                             block_table=dev["block_table"], backend=backend)
    assert_same(got, want, "tree_attention", atol=2e-5)
