"""The ops as `torch.library` custom ops: registration, opcheck, torch.compile, build_info."""

import pytest
import torch

import specdec_kernels
from specdec_kernels import ops

REGISTERED = {
    "bild_verify", "block_verify", "block_verify_logits", "early_exit_topk", "greedy_verify", "kv_compact", "kv_rollback", "max_prob", "rejection_sample",
    "rejection_sample_logits",
    "relaxed_verify", "tree_attention", "tree_greedy_verify", "tree_rejection_sample",
}
B, G, V = 2, 3, 7
PARENTS = [[-1, 0, 0, 1], [-1, 0, 1, -1]]


def _gen():
    return torch.Generator().manual_seed(0)


def _probs(gen, *shape):
    return torch.softmax(torch.randn(*shape, generator=gen), -1)


def _opcheck_cases():
    """(op name, positional args of torch.ops.specdec.<name>.default) with small valid CPU inputs."""
    g = _gen()
    tokens = torch.randint(0, V, (B, G), generator=g)
    tree_tokens = torch.randint(0, V, (B, 4), generator=g)
    parents = torch.tensor(PARENTS)
    caches = lambda: [torch.randn(B, 2, 10, 8, generator=g) for _ in range(2)]  # noqa: E731
    return [
        ("rejection_sample", "uniforms", (_probs(g, B, G + 1, V), _probs(g, B, G, V), tokens, torch.rand(B, G + 1, generator=g),
                                          None, None, None, torch.tensor([3, 1]), None, "torch")),
        ("rejection_sample", "seed", (_probs(g, B, G + 1, V), _probs(g, B, G, V), tokens, None, 7, None,
                                      torch.tensor([0, 5]), None, None, "torch")),
        ("rejection_sample", "seeds", (_probs(g, B, G + 1, V), _probs(g, B, G, V), tokens, None, None,
                                       torch.tensor([1, 2]), None, None, None, "torch")),
        # the optional per-draft output is a declared mutated argument
        ("rejection_sample", "draft_passes", (_probs(g, B, G + 1, V), _probs(g, B, G, V), tokens,
                                              torch.rand(B, G + 1, generator=g), None, None, None, torch.tensor([3, 1]),
                                              torch.zeros(B, G, dtype=torch.bool), "torch")),
        ("rejection_sample_logits", "temperature", (torch.randn(B, G + 1, V, generator=g), torch.randn(B, G, V, generator=g),
                                                    tokens, 0.7, None, torch.rand(B, G + 1, generator=g), None, None, None,
                                                    None, "torch")),
        ("rejection_sample_logits", "per-row", (torch.randn(B, G + 1, V, generator=g), torch.randn(B, G, V, generator=g),
                                                tokens, 1.0, torch.tensor([0.5, 2.0]), None, 5, None, torch.tensor([0, 3]),
                                                torch.tensor([1, 3]), "torch")),
        ("block_verify", "uniforms", (_probs(g, B, G + 1, V), _probs(g, B, G, V), tokens, torch.rand(B, G + 1, generator=g),
                                      None, None, None, torch.tensor([3, 1]), "torch")),
        ("block_verify", "seeds", (_probs(g, B, G + 1, V), _probs(g, B, G, V), tokens, None, None,
                                   torch.tensor([1, 2]), torch.tensor([0, 5]), None, "torch")),
        ("block_verify_logits", "per-row", (torch.randn(B, G + 1, V, generator=g), torch.randn(B, G, V, generator=g),
                                            tokens, 1.0, torch.tensor([0.5, 2.0]), None, 5, None, torch.tensor([0, 3]),
                                            torch.tensor([1, 3]), "torch")),
        ("greedy_verify", "", (torch.randn(B, G + 1, V, generator=g), tokens, None, "torch")),
        ("greedy_verify", "ragged", (torch.randn(B, G + 1, V, generator=g), tokens, torch.tensor([0, 2]), "torch")),
        ("relaxed_verify", "", (torch.randn(B, G + 1, V, generator=g), tokens, 2, 0.5, torch.tensor([2, 3]), "torch")),
        ("bild_verify", "", (torch.randn(B, G + 1, V, generator=g), tokens, 1.0, None, "torch")),
        ("max_prob", "", (torch.randn(B, 3, V, generator=g), "torch")),
        ("tree_greedy_verify", "", (torch.randn(B, 4, V, generator=g), tree_tokens, parents, 2, "torch")),
        ("tree_rejection_sample", "uniforms", (_probs(g, B, 4, V), _probs(g, B, 4, V), tree_tokens, parents, 2,
                                               torch.rand(B, 4, generator=g), None, None, None, "torch")),
        ("tree_rejection_sample", "seed", (_probs(g, B, 4, V), _probs(g, B, 4, V), tree_tokens, parents, 2,
                                           None, 3, None, torch.tensor([4, 9]), "torch")),
        ("tree_attention", "tree", (torch.randn(B, 4, 4, 8, generator=g), *caches(), torch.tensor([3, 6]), parents,
                                    None, 0.3, "torch")),
        ("tree_attention", "chain", (torch.randn(B, 4, 2, 8, generator=g), *caches(), torch.tensor([0, 6], dtype=torch.int32),
                                     None, None, 0.35, "torch")),
        ("tree_attention", "paged", (torch.randn(B, 4, 4, 8, generator=g), *[torch.randn(7, 3, 2, 8, generator=g)
                                                                              for _ in range(2)],
                                     torch.tensor([3, 5]), parents, torch.tensor([[6, 0, 2], [1, 4, 3]]), 0.3, "torch")),
        ("kv_rollback", "", (torch.tensor([3, 6], dtype=torch.int32), torch.tensor([1, 0]), "torch")),
        # kv_compact mutates k_caches / v_caches in place: opcheck verifies the declared mutates_args.
        ("kv_compact", "", (caches(), caches(), torch.tensor([3, 6]), torch.tensor([[0, 1, 3], [0, 2, -1]]), "torch")),
        ("early_exit_topk", "rms", (torch.randn(B, 8, generator=g), torch.randn(8, generator=g), None,
                                    torch.randn(11, 8, generator=g), 3, 1e-6, "rms", "torch")),
        ("early_exit_topk", "layer", (torch.randn(B, 8, generator=g), torch.randn(8, generator=g), torch.randn(8, generator=g),
                                      torch.randn(11, 8, generator=g), 4, 1e-5, "layer", "torch")),
    ]


OPCHECK_CASES = _opcheck_cases()


def test_registered_ops():
    assert set(ops.registered_ops()) == REGISTERED
    assert "fallback_check" not in ops.registered_ops()  # a composition of max_prob, not a custom op
    in_dispatcher = {n.split("::", 1)[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("specdec::")}
    assert in_dispatcher == REGISTERED
    for name in REGISTERED:
        assert isinstance(getattr(torch.ops.specdec, name).default, torch._ops.OpOverload)
        assert "torch" in ops.implemented_backends(name)


def test_opcheck_covers_every_op():
    assert {name for name, _, _ in OPCHECK_CASES} == REGISTERED


# Every op passes the default opcheck suite (test_schema, test_autograd_registration,
# test_faketensor, test_aot_dispatch_dynamic): the torch backends' python loops and
# int(tensor) calls run inside the opaque custom op, never in a traced graph.
@pytest.mark.parametrize("name, variant, args", OPCHECK_CASES,
                         ids=[f"{n}-{v}" if v else n for n, v, _ in OPCHECK_CASES])
def test_opcheck(name, variant, args):
    torch.library.opcheck(getattr(torch.ops.specdec, name).default, args)


def test_kv_compact_custom_op_mutates_in_place():
    g = _gen()
    k = [torch.randn(1, 1, 6, 2, generator=g)]
    v = [torch.randn(1, 1, 6, 2, generator=g)]
    before_k, before_v = k[0].clone(), v[0].clone()
    new_lens = torch.ops.specdec.kv_compact.default(k, v, torch.tensor([1]), torch.tensor([[0, 2, 3]]), "torch")
    assert new_lens.tolist() == [4]
    for new, old in ((k[0], before_k), (v[0], before_v)):
        assert torch.equal(new[0, 0, [1, 2, 3]], old[0, 0, [1, 3, 4]])
        assert torch.equal(new[0, 0, [0, 4, 5]], old[0, 0, [0, 4, 5]])


# ---------------------------------------------------------------------------- torch.compile

def _compile_inputs(batch: int):
    g = _gen()
    return dict(
        logits=torch.randn(batch, G + 1, V, generator=g),
        drafts=torch.randint(0, V, (batch, G), generator=g),
        target_probs=_probs(g, batch, G + 1, V),
        draft_probs=_probs(g, batch, G, V),
        uniforms=torch.rand(batch, G + 1, generator=g),
        q=torch.randn(batch, 4, 4, 8, generator=g),
        k_cache=torch.randn(batch, 2, 10, 8, generator=g),
        v_cache=torch.randn(batch, 2, 10, 8, generator=g),
        seq_lens=torch.arange(batch) + 2,
        parents=torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, -1], [-1, -1, 0, 2]][:batch]),
        hidden=torch.randn(batch, 8, generator=g),
        norm_weight=torch.randn(8, generator=g),
        lm_head=torch.randn(11, 8, generator=g),
    )


def _all_ops(logits, drafts, target_probs, draft_probs, uniforms, q, k_cache, v_cache, seq_lens, parents, hidden,
             norm_weight, lm_head):
    return (*ops.greedy_verify(logits, drafts),
            *ops.rejection_sample(target_probs, draft_probs, drafts, uniforms=uniforms),
            *ops.tree_attention(q, k_cache, v_cache, seq_lens, parents),
            *ops.early_exit_topk(hidden, norm_weight, lm_head, 3))


def _assert_same(got, want):
    assert len(got) == len(want)
    for x, y in zip(got, want):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert torch.equal(x, y)


# Measured on this CPU machine: first compile ~0.7 s with aot_eager, ~2.4 s with inductor.
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_matches_eager(backend):
    torch._dynamo.reset()
    inputs = _compile_inputs(2)
    compiled = torch.compile(_all_ops, fullgraph=True, backend=backend)
    _assert_same(compiled(**inputs), _all_ops(**inputs))


DYNAMIC_CALLS = {
    "greedy_verify": lambda x: ops.greedy_verify(x["logits"], x["drafts"]),
    "rejection_sample": lambda x: ops.rejection_sample(x["target_probs"], x["draft_probs"], x["drafts"],
                                                       uniforms=x["uniforms"]),
    "tree_attention": lambda x: ops.tree_attention(x["q"], x["k_cache"], x["v_cache"], x["seq_lens"], x["parents"]),
    "early_exit_topk": lambda x: ops.early_exit_topk(x["hidden"], x["norm_weight"], x["lm_head"], 3),
}


def test_compile_fullgraph_writes_draft_passes():
    """rejection_sample's mutated output argument survives functionalisation: the compiled call fills
    the caller's tensor as eager does."""
    torch._dynamo.reset()
    inputs = _compile_inputs(2)

    def sample(passes):
        return ops.rejection_sample(inputs["target_probs"], inputs["draft_probs"], inputs["drafts"],
                                    uniforms=inputs["uniforms"], draft_passes=passes)

    want_passes, got_passes = torch.zeros(2, G, dtype=torch.bool), torch.ones(2, G, dtype=torch.bool)
    want = sample(want_passes)
    _assert_same(torch.compile(sample, fullgraph=True, backend="aot_eager")(got_passes), want)
    assert torch.equal(got_passes, want_passes)


@pytest.mark.parametrize("name", list(DYNAMIC_CALLS))
def test_compile_fullgraph_batch_size_change(name):
    """A second batch size recompiles with a symbolic batch dimension; results still match eager."""
    torch._dynamo.reset()
    fn = DYNAMIC_CALLS[name]
    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    for batch in (2, 3):
        inputs = _compile_inputs(batch)
        _assert_same(compiled(inputs), fn(inputs))


# ---------------------------------------------------------------------------- build_info

def test_build_info():
    info = specdec_kernels.build_info()
    assert set(info) == {"version", "cuda_module", "torch", "triton", "transformers", "cuda_available", "device",
                         "auto_backends", "auto_reasons", "implemented_backends"}
    assert set(info["cuda_module"]) == {"built", "loaded", "error", "archs", "cuda_runtime_version"}
    assert info["version"] == specdec_kernels.__version__ and info["torch"] == torch.__version__
    import transformers
    assert info["transformers"] == transformers.__version__
    assert info["cuda_available"] == torch.cuda.is_available()
    module = info["cuda_module"]
    assert isinstance(module["built"], bool) and isinstance(module["loaded"], bool) and isinstance(module["archs"], list)
    assert module["loaded"] == (module["error"] is None)
    if not module["loaded"]:
        assert module["archs"] == [] and module["cuda_runtime_version"] is None
    assert set(info["auto_backends"]) == set(info["implemented_backends"]) == REGISTERED
    for name, backends in info["implemented_backends"].items():
        assert "torch" in backends and set(backends) <= set(ops.BACKENDS)
        assert info["auto_backends"][name] in backends


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only choice of `auto`")
def test_build_info_auto_backends_on_cpu():
    info = specdec_kernels.build_info()
    assert info["device"] == "cpu"
    assert info["auto_backends"] == {name: "torch" for name in REGISTERED}
    assert info["auto_reasons"] == {name: "torch: no GPU" for name in REGISTERED}
    for name in REGISTERED:
        assert ops.resolve(name, "auto", torch.device("cpu")) == "torch"
