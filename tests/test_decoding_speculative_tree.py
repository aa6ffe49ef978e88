"""Token trees for strategy `speculative` (tree_topk=K, tree_nodes=N) on tiny fp32 models (CPU):
greedy output is token-identical to HF's greedy generate (Llama, GPT-2 and BART, batch 1 and 4 left-padded,
several (DEPTH, K, N), torch and Triton-interpreter backends, per-row EOS); sampled output follows the
target's exact distribution over the first two tokens (chi-square, with temperature + top-k + top-p) and
the same test rejects siblings verified without the residual update; after tree steps both caches hold
exactly what a plain forward over the committed tokens writes; the tree is well formed; the default is
the chain; bad K / N fail with one line naming them."""

import json
import re

import pytest
import torch

import specdec_kernels
from specdec_kernels import ops
from specdec_kernels.decoding import SpeculativeDecoder
from specdec_kernels.decoding import draft_tree
from specdec_kernels.decoding.engine import Engine
from specdec_kernels.decoding.standardize import Sampling
from specdec_kernels.reference.tree import children_table, tree_depths

from decoding_support import left_padded, make_pair
from hf_support import one_thread
from sampling_support import PROMPT, ROWS, exact_joint, hf_warp, joint_pvalue, tiny_llama
from test_decoding_sampling import SETTINGS

NEW = 12
TREES = [(3, 2, 5), (2, 3, 8), (4, 3, 10), (1, 4, 3)]  # (DEPTH, K, N): wide, bushy, deep, one level


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def pair(request, tmp_path_factory):
    # noisier than the chain tests' pair: the draft's first guess misses often, so siblings get accepted
    return make_pair(request.param, tmp_path_factory.mktemp(request.param), noise=0.1)


def hf_greedy(target, ids, mask=None, **kwargs):
    return target.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0, **kwargs)


def tree_generate(target, draft, ids, mask=None, *, tree=(3, 2, 5), **kwargs):
    depth, k, n = tree
    return specdec_kernels.generate(target, ids, attention_mask=mask, strategy="speculative", draft_model=draft,
                                    num_draft_tokens=depth, tree_topk=k, tree_nodes=n, max_new_tokens=NEW,
                                    pad_token_id=0, **kwargs)


@pytest.mark.parametrize("tree", TREES, ids=lambda t: "D{}K{}N{}".format(*t))
def test_greedy_tree_equals_hf_generate(pair, tree):
    target, draft = pair
    ids, mask = left_padded([7, 3, 5, 1], seed=1)
    expected = hf_greedy(target, ids, mask)
    out = tree_generate(target, draft, ids, mask, tree=tree, backend="torch")
    assert torch.equal(out.sequences, expected)
    assert out.stats.extra["tree_topk"] == tree[1] and out.stats.extra["tree_nodes"] == tree[2]
    assert out.stats.target_forwards < 4 * NEW
    one = tree_generate(target, draft, ids[2:3, 2:], tree=tree, backend="torch")
    assert torch.equal(one.sequences, expected[2:3, 2:])  # batch 1, no padding


def test_greedy_tree_on_triton(pair):
    target, draft = pair
    ids, mask = left_padded([4, 2], seed=4)
    out = tree_generate(target, draft, ids, mask, tree=(2, 2, 4), backend="triton")
    assert torch.equal(out.sequences, hf_greedy(target, ids, mask))


def test_greedy_tree_on_an_encoder_decoder_pair(tmp_path):
    target, draft = make_pair("bart", tmp_path, noise=0.06)
    ids, mask = left_padded([6, 3, 5], seed=1, pad=1)
    expected = target.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=1,
                               forced_bos_token_id=None, forced_eos_token_id=None)  # plain argmax decoding
    out = specdec_kernels.generate(target, ids, attention_mask=mask, strategy="speculative", draft_model=draft,
                                   num_draft_tokens=2, tree_topk=3, tree_nodes=8, max_new_tokens=NEW, pad_token_id=1)
    assert torch.equal(out.sequences, expected)


def test_tree_accepts_more_than_the_chain_of_its_depth(pair):
    target, draft = pair
    ids, mask = left_padded([6, 4, 5, 3], seed=2)
    chain = tree_generate(target, draft, ids, mask, tree=(3, 1, 3))
    tree = tree_generate(target, draft, ids, mask, tree=(3, 3, 12))
    assert tree.stats.target_forwards < chain.stats.target_forwards


def test_per_row_eos_with_trees(pair):
    target, draft = pair
    ids, mask = left_padded([7, 3, 5, 2], seed=1)
    plain = hf_greedy(target, ids, mask)[:, ids.shape[1]:]
    eos = int(plain[1, 4])  # a token row 1 emits mid-way: rows stop at different steps
    expected = hf_greedy(target, ids, mask, eos_token_id=eos)
    out = tree_generate(target, draft, ids, mask, tree=(3, 3, 8), eos_token_id=eos)
    assert torch.equal(out.sequences, expected)


def committed(engine: Engine, row: int) -> list[int]:
    length = int(engine.prompt_lengths[row])
    return engine.prompts[row, :length].tolist() + engine.generated[row, :int(engine.num_generated[row])].tolist()


def assert_cache_holds(adapter, cache, rows: list[list[int]], lengths: list[int]):
    """cache's first lengths[b] entries of row b equal a plain prefill of rows[b][:lengths[b]]."""
    assert cache.seq_lens.tolist() == lengths
    fresh = adapter.new_cache(len(rows), cache.max_length)
    width = max(lengths)
    padded = torch.tensor([r[:n] + [0] * (width - n) for r, n in zip(rows, lengths)])
    adapter.prefill(padded, fresh, torch.tensor(lengths))
    for b, n in enumerate(lengths):
        torch.testing.assert_close(cache.keys[:, b, :, :n], fresh.keys[:, b, :, :n], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(cache.values[:, b, :, :n], fresh.values[:, b, :, :n], atol=1e-5, rtol=1e-5)


def test_caches_after_tree_steps_equal_a_plain_run(pair):
    """Target cache: every committed token but the root; draft cache: all but the last two (its invariant)."""
    target, draft = pair
    ids, mask = left_padded([6, 3, 5], seed=5)
    strategy = SpeculativeDecoder(target, draft, num_draft_tokens=3, tree_topk=3, tree_nodes=9)
    moved = 0
    with specdec_kernels.decoding.engine.restored_attention(target, draft):
        engine = Engine(target, strategy, ids, attention_mask=mask, max_new_tokens=NEW, sampling=Sampling(),
                        pad_token_id=0, eos_token_id=[], backend="torch", cuda_graphs=False)
        engine.setup()
        verdicts = []
        real_verifier = engine.verifier  # the engine's one verifier: each step's verdict, kept
        engine.verifier = lambda *args: verdicts.append(real_verifier(*args)) or verdicts[-1]
        for step in range(3):
            engine.plan_step(step == 0)
            proposal = strategy.propose(engine, step == 0)
            engine.verify_step(proposal.tokens, proposal.probs, proposal.num_draft, proposal.extra, proposal.parents)
            nodes = verdicts[-1].nodes
            depth = torch.arange(nodes.shape[1]).expand_as(nodes)
            moved += int(((nodes >= 0) & (nodes != depth)).sum())  # entries kv_compact had to move
            rows = [committed(engine, b) for b in range(ids.shape[0])]
            assert_cache_holds(engine.target, engine.cache, rows, [len(r) - 1 for r in rows])
            assert_cache_holds(strategy.draft.adapter, strategy.draft.cache, rows, [len(r) - 2 for r in rows])
    assert moved > 0  # some accepted path left the first-child chain


def test_tree_is_well_formed():
    """Parents precede children, ancestors of every kept node are kept, siblings are distinct, the N kept are
    the best by cumulative log-probability, and the draft-node map points at each beam node's own token."""
    gen = torch.Generator().manual_seed(0)
    batch, vocab = 3, 7
    shape = draft_tree.TreeShape(depth=3, topk=2, nodes=6)
    table = torch.randn(batch, vocab, vocab, generator=gen).log_softmax(-1)  # log q(next | last token)
    fed = []

    def forward(tokens, parents):  # a fake draft: the distribution depends on the last token only
        fed.append((tokens.clone(), parents.clone()))
        return table[torch.arange(batch).unsqueeze(1), tokens]

    root = torch.tensor([1, 4, 6])
    tree = draft_tree.grow_tree(shape, root, table[torch.arange(batch), root], forward, lambda x: x)
    assert tree.tokens.shape == (batch, 6) and tree.parents.shape == (batch, 7)
    assert [t.shape[1] for t, _ in fed] == [3, 5]  # root + one beam, root + two beams
    nodes = torch.cat([root.unsqueeze(1), tree.tokens], dim=1)
    depth = tree_depths(tree.parents)
    score = torch.zeros(batch, 7)
    for i in range(1, 7):
        parent = tree.parents[:, i]
        assert (parent >= 0).all() and (parent < i).all()
        score[:, i] = score.gather(1, parent.unsqueeze(1)).squeeze(1) + table[
            torch.arange(batch), nodes.gather(1, parent.unsqueeze(1)).squeeze(1), nodes[:, i]]
    children = children_table(tree.parents)
    for b in range(batch):
        for i in range(7):
            kids = [int(c) for c in children[b, i] if c >= 0]
            assert len({int(nodes[b, c]) for c in kids}) == len(kids)  # distinct siblings
        # best N by brute force over every path the beams could reach (beam width 2, 3 levels)
        level1 = table[b, root[b]].topk(2)
        candidates = [(float(s), 1) for s in level1.values]
        beam = [(float(s), int(t)) for s, t in zip(level1.values, level1.indices)]
        for level in (2, 3):
            children_scores = [(s + float(v), int(t)) for s, last in beam
                               for v, t in zip(*table[b, last].topk(2))]
            candidates += [(s, level) for s, _ in children_scores]
            beam = sorted(children_scores, key=lambda c: -c[0])[:2]
        best = sorted((s for s, _ in candidates), reverse=True)[:6]
        torch.testing.assert_close(score[b, 1:].sort(descending=True).values, torch.tensor(best))
        last_tokens, _ = fed[-1]
        for i in range(7):
            j = int(tree.draft_node[b, i])
            if j >= 0:
                assert int(last_tokens[b, j]) == int(nodes[b, i])
            else:
                assert depth[b, i] == shape.depth or not (tree.parents[b] == i).any()  # never fed: a leaf


# ---- sampling -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sampling_models():
    return tiny_llama(0), tiny_llama(1)  # independent weights: siblings get rejected and accepted


def first_two(target, draft, setting, decoder=SpeculativeDecoder, siblings="top"):
    ids = torch.tensor([PROMPT]).repeat(ROWS, 1)
    strategy = decoder(target, draft, num_draft_tokens=2, tree_topk=3, tree_nodes=5, tree_siblings=siblings)
    return strategy.generate(ids, max_new_tokens=2, do_sample=True, seed=321, eos_token_id=[], **setting)


@pytest.mark.parametrize("siblings", ["top", "sampled"])
@pytest.mark.parametrize("setting", SETTINGS, ids=["plain", "temp_topk_topp"])
def test_sampled_tree_follows_the_target(sampling_models, setting, siblings):
    target, draft = sampling_models
    out = first_two(target, draft, setting, siblings=siblings)
    assert 0 < out.stats.accepted_tokens < out.stats.drafted_tokens
    assert joint_pvalue(out.sequences, exact_joint(target, lambda x: hf_warp(x, **setting))) > 1e-3


def test_chi_square_rejects_sampled_siblings_verified_as_independent(sampling_models, monkeypatch):
    """Siblings drawn without replacement but verified as if each were drawn from the full q: the
    rejected sibling stays in q, and the emitted law is off."""
    target, draft = sampling_models
    real = ops.tree_rejection_sample
    monkeypatch.setattr(ops, "tree_rejection_sample", lambda *a, **k: real(*a, **{**k, "siblings": "independent"}))
    out = first_two(target, draft, SETTINGS[0], siblings="sampled")
    assert joint_pvalue(out.sequences, exact_joint(target, lambda x: hf_warp(x, **SETTINGS[0]))) < 1e-6


def test_sampled_siblings_use_the_without_replacement_rule(sampling_models, monkeypatch):
    target, draft = sampling_models
    rules = []
    real = ops.tree_rejection_sample
    monkeypatch.setattr(ops, "tree_rejection_sample",
                        lambda *a, **k: rules.append(k.get("siblings", "independent")) or real(*a, **k))
    for siblings, sample in (("sampled", True), ("top", True), ("sampled", False)):
        strategy = SpeculativeDecoder(target, draft, num_draft_tokens=2, tree_topk=2, tree_nodes=4, tree_siblings=siblings)
        strategy.generate(torch.tensor([PROMPT]), max_new_tokens=3, do_sample=sample, seed=1, eos_token_id=[])
    assert set(rules[:1]) == {"without_replacement"} and "without_replacement" not in rules[rules.index("independent"):]
    drafters = [SpeculativeDecoder(target, draft, num_draft_tokens=2, tree_topk=2, tree_siblings=s) for s in ("top", "sampled")]
    graph_keys = {(d.graph_key(), d.verification) for d in drafters}  # what kept graphs are keyed by (engine.session_key)
    assert len(graph_keys) == 2


def no_residual(target_probs, draft_probs, tokens, parents, *, max_depth, seed, offsets, backend, verification="token"):
    """A deliberately wrong tree rule: every sibling is tested against p itself (u < p(x)) and the
    final token is drawn from p, i.e. no residual update after a rejected sibling."""
    gen = torch.Generator().manual_seed(11)
    batch = tokens.shape[0]
    rows = torch.arange(batch)
    children = children_table(parents)
    cur, alive = torch.zeros(batch, dtype=torch.int64), torch.ones(batch, dtype=torch.bool)
    count = torch.zeros(batch, dtype=torch.int64)
    out = torch.full((batch, max_depth + 1), -1, dtype=torch.int64)
    nodes = out.clone()
    nodes[:, 0] = 0
    for level in range(max_depth + 1):
        p = target_probs[rows, cur]
        chosen = torch.full((batch,), -1, dtype=torch.int64)
        for rank in range(children.shape[2] if level < max_depth else 0):
            child = children[rows, cur, rank]
            x = tokens[rows, child.clamp(min=0)]
            hit = alive & (chosen < 0) & (child >= 0) & (torch.rand(batch, generator=gen) < p[rows, x])
            chosen = torch.where(hit, child, chosen)
        final = torch.multinomial(p, 1, generator=gen).squeeze(1)
        moving = alive & (chosen >= 0)
        out[rows, count] = torch.where(alive, torch.where(moving, tokens[rows, chosen.clamp(min=0)], final),
                                       out[rows, count])
        nodes[rows[moving], count[moving] + 1] = chosen[moving]
        count += moving.to(torch.int64)
        cur = torch.where(moving, chosen, cur)
        alive = moving
    return out, count, nodes


def test_chi_square_rejects_siblings_without_the_residual_update(sampling_models, monkeypatch):
    target, draft = sampling_models
    monkeypatch.setattr(ops, "tree_rejection_sample", no_residual)
    out = first_two(target, draft, SETTINGS[0])
    assert joint_pvalue(out.sequences, exact_joint(target, lambda x: hf_warp(x, **SETTINGS[0]))) < 1e-6


def test_sampling_uses_the_tree_op_on_the_requested_backend(sampling_models, monkeypatch):
    target, draft = sampling_models
    calls = []
    real = ops.tree_rejection_sample
    monkeypatch.setattr(ops, "tree_rejection_sample", lambda *a, **k: calls.append(k["backend"]) or real(*a, **k))
    out = tree_generate(target, draft, torch.tensor([PROMPT]), tree=(2, 2, 3), do_sample=True, seed=1,
                        eos_token_id=[], backend="triton")
    assert calls and set(calls) == {"triton"} and out.sequences.shape == (1, len(PROMPT) + NEW)


# ---- the default, graph keys, errors ----------------------------------------------------------------------

def test_default_is_the_chain(sampling_models, monkeypatch):
    target, draft = sampling_models
    used = []
    for name in ("tree_greedy_verify", "tree_rejection_sample", "kv_compact"):
        real = getattr(ops, name)
        monkeypatch.setattr(ops, name, lambda *a, _real=real, _name=name, **k: used.append(_name) or _real(*a, **k))
    ids = torch.tensor([PROMPT])
    for options in ({}, dict(tree_topk=1), dict(tree_topk=1, tree_nodes=3)):
        for sample in (False, True):
            out = specdec_kernels.generate(target, ids, strategy="speculative", draft_model=draft, num_draft_tokens=3,
                                           max_new_tokens=5, do_sample=sample, seed=2, eos_token_id=[], **options)
            assert "tree_topk" not in out.stats.extra
    assert used == []
    keys = {SpeculativeDecoder(target, draft, num_draft_tokens=3, tree_topk=k, tree_nodes=n).graph_key()
            for k, n in ((1, 3), (2, 3), (2, 4), (3, 4))}
    assert len(keys) == 4  # K and N are baked into captured graphs


@pytest.mark.parametrize("options, message", [
    (dict(tree_topk=0), "`tree_topk` must be an int >= 1"),
    (dict(tree_topk=2.5), "`tree_topk` must be an int >= 1"),
    (dict(tree_topk=2, tree_nodes=0), "`tree_nodes` must be an int >= 1"),
    (dict(tree_topk=2, tree_nodes=11), "`tree_nodes` must be <= 10"),
    (dict(tree_topk=2, schedule="heuristic"), "`schedule` must be 'constant' with a token tree"),
    (dict(tree_topk=2, tree_nodes=4, lenience=0.5), "`lenience` must be 1 with a token tree"),
    (dict(tree_topk=100), "`tree_topk`=100 exceeds the vocabulary"),
    (dict(tree_topk=2, tree_siblings="random"), "`tree_siblings` must be one of 'top', 'sampled'"),
    (dict(tree_siblings="sampled"), "`tree_siblings` applies to token trees"),
    (dict(tree_topk=2, verification="block"), "`verification` of a token tree must be one of 'token', 'traversal' "
                                              "(block verification is for chains)"),
    (dict(tree_topk=2, verification="traverse"), "`verification` of a token tree must be one of 'token', 'traversal' "
                                                 "(got 'traverse')"),
    (dict(tree_topk=2, verification="traversal", do_sample=True, backend="triton"),
     "generate: verification='traversal' has no kernel yet on the 'triton' backend"),
])
def test_bad_tree_options_fail_with_one_line(sampling_models, options, message):
    target, draft = sampling_models
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        specdec_kernels.generate(target, torch.tensor([PROMPT]), strategy="speculative", draft_model=draft,
                                 num_draft_tokens=3, max_new_tokens=2, **options)
    assert "\n" not in str(error.value)


@pytest.fixture(scope="module")
def tiny_set(tmp_path_factory):
    from default_models_support import save_tiny_default_models
    return save_tiny_default_models(tmp_path_factory.mktemp("tiny_default_models"))


def test_cli_option_turns_trees_on(tiny_set, tmp_path):
    """`specdec-kernels generate --option tree_topk=3 --option tree_nodes=6` goes through the generic --option path."""
    from specdec_kernels import cli
    out = tmp_path / "generate.json"
    status = cli.main(["generate", "--models", str(tiny_set), "--max-new-tokens", "6", "--json", str(out), "--prompt",
                       "def f(a, b):", "--prompt", "x = 1", "--check", "--option", "tree_topk=3", "--option",
                       "tree_nodes=6"])
    stats = json.loads(out.read_text())["stats"]
    assert status == 0 and stats["identical_to_target_generate"] is True
    assert stats["options"]["tree_topk"] == 3 and stats["tree_topk"] == 3 and stats["tree_nodes"] == 6


def test_e2e_bench_tree_rows(tmp_path, monkeypatch):
    """bench/e2e.py --trees K,N adds ours_spec_tree rows (greedy equal to HF's, tokens per forward vs the chain)."""
    from pathlib import Path
    bench = Path(__file__).resolve().parents[1] / "bench"
    monkeypatch.syspath_prepend(str(bench))
    import e2e
    e2e.main(["--smoke", "--no-default", "--noise", "0.3", "--modes", "greedy", "--trees", "2,4", "3,40",
              "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "e2e.json").read_text())["rows"]
    trees = [r for r in rows if r["method"] == "ours_spec_tree"]
    # 3,40 does not fit depth 3 (at most 3 + 2 * 9 nodes)
    assert [(r["batch"], r["tree"]) for r in trees] == [(1, "2,4"), (2, "2,4")]
    for row in trees:
        assert row["status"] == "ok" and row["matches_hf_greedy"] is True and row["vs_chain"] > 0
        assert 1 <= row["mean_accepted"] <= row["gamma"] + 1 and "theory_speedup" not in row
    assert "| ours_spec_tree | False | 3 | 2,4 | ok |" in (tmp_path / "e2e.md").read_text()


def test_trees_bench_writes_the_grid(tiny_set, tmp_path, monkeypatch):
    """bench/speculative_trees.py --smoke: chain and tree rows per mode (sampling: the chain under each
    verification rule), vs_chain against the token-wise chain, JSON + markdown."""
    from pathlib import Path
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "bench"))
    import speculative_trees
    speculative_trees.main(["--smoke", "--models", str(tiny_set), "--temperatures", "0.5", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "speculative_trees_cpu.json").read_text())
    rows = result["rows"]
    assert [(r["mode"], r["tree_topk"], r["tree_nodes"], r["rule"]) for r in rows] == [
        ("greedy", 1, 2, ""), ("greedy", 2, 4, ""), ("sampling T=0.5", 1, 2, "token"), ("sampling T=0.5", 1, 2, "block"),
        ("sampling T=0.5", 2, 4, "top")]
    for row in rows:
        chain = next(r for r in rows if r["mode"] == row["mode"] and r["tree_topk"] == 1)
        assert row["vs_chain"] == pytest.approx(row["tokens_per_forward"] / chain["tokens_per_forward"], abs=2e-3)
        assert row["tok_s_b1"] > 0 and row.get("matches_greedy", True) is True
    assert {"date", "device", "command", "best_trees"} <= set(result["meta"])
    assert "| default | greedy | 2 | 2 | 4 |" in (tmp_path / "speculative_trees_cpu.md").read_text()


def test_tree_steps_replay_kept_graphs(pair):
    """cuda_graphs=True under the CPU fake of torch.cuda graphs (tests/test_graph_sessions.py): the tree's draft
    and verify steps are captured once, a second call with other prompts replays them (reading only tensors the
    graphs hold), and both calls equal greedy; rows finish at different steps (EOS) with static shapes."""
    from specdec_kernels.decoding import clear_graph_cache, graphs
    from test_graph_sessions import FakeGraphs
    target, draft = pair
    backend = FakeGraphs()
    clear_graph_cache()
    try:
        with graphs.use_backend(backend):
            later_ids, later_mask = left_padded([2, 6, 4], seed=12)
            eos = int(hf_greedy(target, later_ids, later_mask)[0, later_ids.shape[1] + 3])  # EOS is in the key
            ids, mask = left_padded([7, 3, 5], seed=11)
            first = tree_generate(target, draft, ids, mask, tree=(3, 3, 8), cuda_graphs=True, eos_token_id=eos)
            assert torch.equal(first.sequences, hf_greedy(target, ids, mask, eos_token_id=eos))
            captured = len(backend.captures)
            assert captured >= 1 and backend.replays > 0
            ids, mask = later_ids, later_mask
            second = tree_generate(target, draft, ids, mask, tree=(3, 3, 8), cuda_graphs=True, eos_token_id=eos)
            assert len(backend.captures) == captured
            assert torch.equal(second.sequences, hf_greedy(target, ids, mask, eos_token_id=eos))
    finally:
        clear_graph_cache()
