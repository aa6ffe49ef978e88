"""Input validation of every public op in `specdec_kernels.ops`.

Each bad call must raise ValueError or TypeError whose message names the op and the
offending argument (`<op>: ... <argument> ...`). The cases are one table: an op name,
keyword overrides applied to a known-valid call of that op, the exception type and a
regex for the part of the message after "<op>: ".
"""

import re

import pytest
import torch

from specdec_kernels import ops

B, G, V = 2, 3, 5  # chain ops: rows, drafts per row, vocabulary
N = 4  # tree nodes (root included)
HQ, HKV, S_MAX, D = 4, 2, 10, 8  # attention / KV cache
H, V_HEAD = 8, 11  # early exit: hidden size, LM-head vocabulary
PARENTS = ((-1, 0, 0, 1), (-1, 0, 1, -1))  # row 1 has an unused slot (node 3)
NAN = float("nan")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


def probs(*shape, dtype=torch.float32):
    return torch.softmax(torch.randn(*shape), -1).to(dtype)


def ids(*shape, dtype=torch.int64, high=V):
    return torch.randint(0, high, shape).to(dtype)


def full(shape, value, dtype=torch.int64):
    return torch.full(shape, value, dtype=dtype)


def strided(*shape):
    """A float32 tensor of `shape` whose last dimension has stride 2 (not contiguous)."""
    x = torch.randn(*shape[:-1], 2 * shape[-1])[..., ::2]
    assert x.shape == shape and x.stride(-1) == 2
    return x


def tree(rows=PARENTS):
    return torch.tensor(rows, dtype=torch.int64)


def lens(*values, dtype=torch.int64):
    return torch.tensor(values, dtype=dtype)


def pages(rows=((5, 0, 2), (1, 4, 3)), dtype=torch.int64):
    return torch.tensor(rows, dtype=dtype)


def paged(**overrides):
    """A valid paged tree_attention call (6 pages of 4 slots, 3 pages per row), then `overrides`."""
    return {"k_cache": randn(6, 4, HKV, D), "v_cache": randn(6, 4, HKV, D), "block_table": pages(), **overrides}


# A valid call of each op, as keyword arguments (built fresh for every test).
VALID = {
    "rejection_sample": lambda: dict(target_probs=probs(B, G + 1, V), draft_probs=probs(B, G, V),
                                     draft_tokens=ids(B, G), uniforms=torch.rand(B, G + 1)),
    "rejection_sample_logits": lambda: dict(target_logits=randn(B, G + 1, V), draft_logits=randn(B, G, V),
                                            draft_tokens=ids(B, G), temperature=0.8, uniforms=torch.rand(B, G + 1)),
    "block_verify": lambda: dict(target_probs=probs(B, G + 1, V), draft_probs=probs(B, G, V),
                                 draft_tokens=ids(B, G), uniforms=torch.rand(B, G + 1)),
    "block_verify_logits": lambda: dict(target_logits=randn(B, G + 1, V), draft_logits=randn(B, G, V),
                                        draft_tokens=ids(B, G), temperature=0.8, seed=3),
    "greedy_verify": lambda: dict(target_logits=randn(B, G + 1, V), draft_tokens=ids(B, G)),
    "relaxed_verify": lambda: dict(target_logits=randn(B, G + 1, V), draft_tokens=ids(B, G), top_beta=2, tau=1.0),
    "bild_verify": lambda: dict(target_logits=randn(B, G + 1, V), draft_tokens=ids(B, G), rollback_threshold=1.0),
    "fallback_check": lambda: dict(draft_logits=randn(B, V), threshold=0.5),
    "max_prob": lambda: dict(logits=randn(B, V)),
    "tree_greedy_verify": lambda: dict(target_logits=randn(B, N, V), tree_tokens=ids(B, N), parents=tree()),
    "tree_rejection_sample": lambda: dict(target_probs=probs(B, N, V), draft_probs=probs(B, N, V),
                                          tree_tokens=ids(B, N), parents=tree(), uniforms=torch.rand(B, N)),
    "tree_attention": lambda: dict(q=randn(B, N, HQ, D), k_cache=randn(B, HKV, S_MAX, D),
                                   v_cache=randn(B, HKV, S_MAX, D), seq_lens=lens(3, 6), parents=tree()),
    "kv_rollback": lambda: dict(seq_lens=lens(3, 6), num_accepted=lens(1, 0)),
    "kv_compact": lambda: dict(k_caches=[randn(B, HKV, S_MAX, D) for _ in range(2)],
                               v_caches=[randn(B, HKV, S_MAX, D) for _ in range(2)],
                               seq_lens=lens(3, 6), accepted_nodes=tree(((0, 1, 3), (0, 2, -1)))),
    "early_exit_topk": lambda: dict(hidden=randn(B, H), norm_weight=randn(H), lm_head_weight=randn(V_HEAD, H), k=3),
}
OPS = {name: getattr(ops, name) for name in VALID}


def call(op: str, **overrides):
    return OPS[op](**{**VALID[op](), **overrides})


def case(op, name, exc, pattern, **overrides):
    return pytest.param(op, overrides, exc, pattern, id=f"{op}:{name}")


VE, TE = ValueError, TypeError

CASES = [
    # ------------------------------------------------------------------ rejection_sample
    case("rejection_sample", "target_probs-rank", VE, r"target_probs.*shape", target_probs=probs(B, G + 1)),
    case("rejection_sample", "target_probs-g", VE, r"target_probs.*shape \[2, 4, V\]", target_probs=probs(B, G, V)),
    case("rejection_sample", "draft_probs-g", VE, r"draft_probs.*shape \[2, 3, 5\]", draft_probs=probs(B, G + 1, V)),
    case("rejection_sample", "draft_probs-V", VE, r"draft_probs.*shape", draft_probs=probs(B, G, V + 1)),
    case("rejection_sample", "draft_tokens-rank", VE, r"draft_tokens.*shape", draft_tokens=ids(B)),
    case("rejection_sample", "draft_tokens-list", TE, r"draft_tokens.*torch\.Tensor", draft_tokens=[[0, 1, 2]] * B),
    case("rejection_sample", "float64", TE, r"target_probs.*dtype.*float64",
         target_probs=probs(B, G + 1, V, dtype=torch.float64), draft_probs=probs(B, G, V, dtype=torch.float64)),
    case("rejection_sample", "mixed-dtypes", TE, r"target_probs.*draft_probs.*one dtype",
         draft_probs=probs(B, G, V, dtype=torch.float16)),
    case("rejection_sample", "int16-tokens", TE, r"draft_tokens.*dtype int64 or int32", draft_tokens=ids(B, G, dtype=torch.int16)),
    case("rejection_sample", "target-noncontig", VE, r"target_probs.*contiguous", target_probs=strided(B, G + 1, V)),
    case("rejection_sample", "draft-noncontig", VE, r"draft_probs.*contiguous", draft_probs=strided(B, G, V)),
    case("rejection_sample", "token>=V", VE, r"draft_tokens.*outside \[-1, 5\)", draft_tokens=full((B, G), V)),
    case("rejection_sample", "token<-1", VE, r"draft_tokens.*outside", draft_tokens=full((B, G), -2)),
    case("rejection_sample", "n_draft>g", VE, r"num_draft_tokens.*\[0, 3\]", num_draft_tokens=lens(1, G + 1)),
    case("rejection_sample", "n_draft<0", VE, r"num_draft_tokens.*\[0, 3\]", num_draft_tokens=lens(-1, 0)),
    case("rejection_sample", "n_draft-shape", VE, r"num_draft_tokens.*shape", num_draft_tokens=lens(1, 1, 1)),
    case("rejection_sample", "n_draft-uint8", TE, r"num_draft_tokens.*dtype", num_draft_tokens=lens(1, 1, dtype=torch.uint8)),
    case("rejection_sample", "uniforms+seed", VE, r"exactly one of `uniforms`.*`seed`", seed=0),
    case("rejection_sample", "neither", VE, r"exactly one of `uniforms`.*`seed`", uniforms=None),
    case("rejection_sample", "uniforms-shape", VE, r"uniforms.*shape \[2, 4\]", uniforms=torch.rand(B, G)),
    case("rejection_sample", "uniforms-float16", TE, r"uniforms.*dtype", uniforms=torch.rand(B, G + 1).half()),
    case("rejection_sample", "uniforms=1", VE, r"uniforms.*\[0, 1\)", uniforms=torch.ones(B, G + 1)),
    case("rejection_sample", "uniforms<0", VE, r"uniforms.*\[0, 1\)", uniforms=torch.full((B, G + 1), -0.25)),
    case("rejection_sample", "uniforms-nan", VE, r"uniforms.*\[0, 1\)",
         uniforms=torch.full((B, G + 1), NAN)),
    case("rejection_sample", "seed-float", TE, r"seed.*int", uniforms=None, seed=1.5),
    case("rejection_sample", "seed-str", TE, r"seed.*int", uniforms=None, seed="0"),
    case("rejection_sample", "seed-bool", TE, r"seed.*int", uniforms=None, seed=True),
    case("rejection_sample", "seed-int16-tensor", TE, r"seed.*dtype int64 or int32", uniforms=None, seed=lens(1, 2, dtype=torch.int16)),
    case("rejection_sample", "seed-tensor-shape", VE, r"seed.*shape \[2\]", uniforms=None, seed=lens(1, 2, 3)),
    case("rejection_sample", "seed>int64", (VE, TE), r"seed", uniforms=None, seed=2**64),
    case("rejection_sample", "offsets+uniforms", VE, r"offsets.*seed", offsets=lens(0, 0)),
    case("rejection_sample", "offsets-shape", VE, r"offsets.*shape", uniforms=None, seed=0, offsets=lens(0)),
    case("rejection_sample", "offsets-float", TE, r"offsets.*dtype", uniforms=None, seed=0,
         offsets=lens(0, 0, dtype=torch.float32)),
    case("rejection_sample", "device", VE, r"draft_probs.*must be on cpu",
         draft_probs=torch.empty(B, G, V, device="meta")),
    case("rejection_sample", "draft_passes-shape", VE, r"draft_passes.*shape \[2, 3\]",
         draft_passes=torch.zeros(B, G + 1, dtype=torch.bool)),
    case("rejection_sample", "draft_passes-int64", TE, r"draft_passes.*dtype bool",
         draft_passes=torch.zeros(B, G, dtype=torch.int64)),
    case("rejection_sample", "draft_passes-device", VE, r"draft_passes.*must be on cpu",
         draft_passes=torch.empty(B, G, dtype=torch.bool, device="meta")),
    case("rejection_sample", "draft_passes-transposed", VE, r"draft_passes.*contiguous",
         draft_passes=torch.zeros(G, B, dtype=torch.bool).t()),
    case("rejection_sample", "draft_passes-row-stride", VE, r"draft_passes.*must be contiguous \(",
         draft_passes=torch.zeros(B, G + 2, dtype=torch.bool)[:, :G]),
    case("rejection_sample", "draft_passes-list", TE, r"draft_passes.*torch\.Tensor", draft_passes=[[True] * G] * B),
    # ------------------------------------------------------------------ greedy_verify
    case("greedy_verify", "logits-rank", VE, r"target_logits.*shape", target_logits=randn(B, V)),
    case("greedy_verify", "logits-g", VE, r"target_logits.*shape \[2, 4, V\]", target_logits=randn(B, G, V)),
    case("greedy_verify", "empty-vocab", VE, r"target_logits.*empty vocabulary", target_logits=randn(B, G + 1, 0)),
    case("greedy_verify", "draft_tokens-rank", VE, r"draft_tokens.*shape", draft_tokens=ids(B, G, 1)),
    case("greedy_verify", "float64", TE, r"target_logits.*dtype.*float64", target_logits=randn(B, G + 1, V, dtype=torch.float64)),
    case("greedy_verify", "int-logits", TE, r"target_logits.*dtype", target_logits=ids(B, G + 1, V)),
    case("greedy_verify", "int16-tokens", TE, r"draft_tokens.*dtype int64 or int32", draft_tokens=ids(B, G, dtype=torch.int16)),
    case("greedy_verify", "noncontig", VE, r"target_logits.*contiguous", target_logits=strided(B, G + 1, V)),
    case("greedy_verify", "token>=V", VE, r"draft_tokens.*outside", draft_tokens=full((B, G), V)),
    case("greedy_verify", "n_draft>g", VE, r"num_draft_tokens.*\[0, 3\]", num_draft_tokens=lens(G + 1, 0)),
    case("greedy_verify", "n_draft-shape", VE, r"num_draft_tokens.*shape", num_draft_tokens=lens(1)),
    case("greedy_verify", "device", VE, r"target_logits.*must be on cpu",
         target_logits=torch.empty(B, G + 1, V, device="meta")),
    # ------------------------------------------------------------------ relaxed_verify
    case("relaxed_verify", "logits-shape", VE, r"target_logits.*shape", target_logits=randn(B + 1, G + 1, V)),
    case("relaxed_verify", "draft_tokens-shape", VE, r"draft_tokens.*shape", draft_tokens=ids(G)),
    case("relaxed_verify", "n_draft-shape", VE, r"num_draft_tokens.*shape", num_draft_tokens=ids(B, 1)),
    case("relaxed_verify", "float64", TE, r"target_logits.*dtype", target_logits=randn(B, G + 1, V, dtype=torch.float64)),
    case("relaxed_verify", "uint8-tokens", TE, r"draft_tokens.*dtype", draft_tokens=ids(B, G, dtype=torch.uint8)),
    case("relaxed_verify", "noncontig", VE, r"target_logits.*contiguous", target_logits=strided(B, G + 1, V)),
    case("relaxed_verify", "token>=V", VE, r"draft_tokens.*outside", draft_tokens=full((B, G), 99)),
    case("relaxed_verify", "n_draft<0", VE, r"num_draft_tokens.*\[0, 3\]", num_draft_tokens=lens(-1, 2)),
    case("relaxed_verify", "top_beta=0", VE, r"top_beta.*>= 1", top_beta=0),
    case("relaxed_verify", "top_beta-float", VE, r"top_beta.*int", top_beta=1.5),
    case("relaxed_verify", "top_beta-bool", VE, r"top_beta.*int", top_beta=True),
    case("relaxed_verify", "tau<0", VE, r"tau.*>= 0", tau=-0.1),
    case("relaxed_verify", "tau-nan", VE, r"tau.*real number", tau=NAN),
    case("relaxed_verify", "tau-str", VE, r"tau.*real number", tau="1"),
    # ------------------------------------------------------------------ bild_verify
    case("bild_verify", "logits-shape", VE, r"target_logits.*shape", target_logits=randn(B, G + 2, V)),
    case("bild_verify", "draft_tokens-shape", VE, r"draft_tokens.*shape", draft_tokens=ids(B, G, 2)),
    case("bild_verify", "n_draft-shape", VE, r"num_draft_tokens.*shape", num_draft_tokens=lens(0, 0, 0)),
    case("bild_verify", "float64", TE, r"target_logits.*dtype", target_logits=randn(B, G + 1, V, dtype=torch.float64)),
    case("bild_verify", "float-tokens", TE, r"draft_tokens.*dtype", draft_tokens=ids(B, G, dtype=torch.float32)),
    case("bild_verify", "noncontig", VE, r"target_logits.*contiguous", target_logits=strided(B, G + 1, V)),
    case("bild_verify", "token>=V", VE, r"draft_tokens.*outside", draft_tokens=full((B, G), V)),
    case("bild_verify", "n_draft>g", VE, r"num_draft_tokens.*\[0, 3\]", num_draft_tokens=lens(0, 4)),
    case("bild_verify", "threshold<0", VE, r"rollback_threshold.*>= 0", rollback_threshold=-1.0),
    case("bild_verify", "threshold-nan", VE, r"rollback_threshold.*real number", rollback_threshold=NAN),
    case("bild_verify", "threshold-None", VE, r"rollback_threshold.*real number", rollback_threshold=None),
    # ------------------------------------------------------------------ fallback_check
    case("fallback_check", "rank", VE, r"draft_logits.*shape", draft_logits=randn(B, 1, V)),
    case("fallback_check", "float64", TE, r"draft_logits.*dtype", draft_logits=randn(B, V, dtype=torch.float64)),
    case("fallback_check", "noncontig", VE, r"draft_logits.*contiguous", draft_logits=strided(B, V)),
    case("fallback_check", "threshold>1", VE, r"threshold.*<= 1", threshold=1.5),
    case("fallback_check", "threshold<0", VE, r"threshold.*>= 0", threshold=-0.5),
    case("fallback_check", "threshold-nan", VE, r"threshold.*real number", threshold=NAN),
    case("fallback_check", "empty-vocab", (VE, TE), r"draft_logits",
         draft_logits=randn(B, 0)),
    # ------------------------------------------------------------------ max_prob
    case("max_prob", "0-dim", VE, r"logits.*non-empty last \(vocabulary\) dimension", logits=torch.tensor(1.0)),
    case("max_prob", "empty-vocab", VE, r"logits.*non-empty last \(vocabulary\) dimension", logits=randn(B, 0)),
    case("max_prob", "not-tensor", TE, r"logits", logits=[0.1, 0.9]),
    case("max_prob", "float64", TE, r"logits.*dtype", logits=randn(B, V, dtype=torch.float64)),
    case("max_prob", "noncontig", VE, r"logits.*contiguous", logits=strided(B, 3, V)),
    # ------------------------------------------------------------------ tree_greedy_verify
    case("tree_greedy_verify", "logits-N", VE, r"target_logits.*shape \[2, 4, V\]", target_logits=randn(B, N + 1, V)),
    case("tree_greedy_verify", "logits-rank", VE, r"target_logits.*shape", target_logits=randn(B * N, V)),
    case("tree_greedy_verify", "tree_tokens-rank", VE, r"tree_tokens.*shape", tree_tokens=ids(B)),
    case("tree_greedy_verify", "no-root", VE, r"tree_tokens.*N >= 1", tree_tokens=ids(B, 0),
         parents=ids(B, 0), target_logits=randn(B, 0, V)),
    case("tree_greedy_verify", "parents-shape", VE, r"parents.*shape \[2, 4\]", parents=tree(((-1, 0, 1),) * B)),
    case("tree_greedy_verify", "float64", TE, r"target_logits.*dtype", target_logits=randn(B, N, V, dtype=torch.float64)),
    case("tree_greedy_verify", "int16-tokens", TE, r"tree_tokens.*dtype int64 or int32", tree_tokens=ids(B, N, dtype=torch.int16)),
    case("tree_greedy_verify", "int8-parents", TE, r"parents.*dtype int64 or int32", parents=tree().to(torch.int8)),
    case("tree_greedy_verify", "noncontig", VE, r"target_logits.*contiguous", target_logits=strided(B, N, V)),
    case("tree_greedy_verify", "token>=V", VE, r"tree_tokens\[:, 1:\].*outside", tree_tokens=full((B, N), V)),
    case("tree_greedy_verify", "root-parent", VE, r"parents\[:, 0\].*-1", parents=tree(((0, 0, 0, 1), PARENTS[1]))),
    case("tree_greedy_verify", "parent>=node", VE, r"parents\[0, 2\]` = 2.*earlier node",
         parents=tree(((-1, 0, 2, 1), PARENTS[1]))),
    case("tree_greedy_verify", "parent-forward", VE, r"parents\[1, 1\]` = 3.*earlier node",
         parents=tree((PARENTS[0], (-1, 3, 1, -1)))),
    case("tree_greedy_verify", "parent<-1", VE, r"parents\[0, 3\]` = -2.*earlier node",
         parents=tree(((-1, 0, 0, -2), PARENTS[1]))),
    case("tree_greedy_verify", "child-of-unused", VE, r"parents\[1, 2\].*unused slot",
         parents=tree((PARENTS[0], (-1, -1, 1, 0)))),
    case("tree_greedy_verify", "max_depth<0", VE, r"max_depth.*>= 0", max_depth=-1),
    case("tree_greedy_verify", "max_depth-float", VE, r"max_depth.*int", max_depth=1.0),
    case("tree_greedy_verify", "device", VE, r"parents.*must be on cpu", parents=torch.empty(B, N, dtype=torch.int64, device="meta")),
    # ------------------------------------------------------------------ tree_rejection_sample
    case("tree_rejection_sample", "target-shape", VE, r"target_probs.*shape", target_probs=probs(B, N, V, 1)),
    case("tree_rejection_sample", "draft-shape", VE, r"draft_probs.*shape \[2, 4, 5\]", draft_probs=probs(B, N - 1, V)),
    case("tree_rejection_sample", "tree_tokens-shape", VE, r"tree_tokens.*shape", tree_tokens=ids(B, N, 1)),
    case("tree_rejection_sample", "parents-shape", VE, r"parents.*shape", parents=tree(PARENTS[:1])),
    case("tree_rejection_sample", "float64", TE, r"target_probs.*dtype",
         target_probs=probs(B, N, V, dtype=torch.float64), draft_probs=probs(B, N, V, dtype=torch.float64)),
    case("tree_rejection_sample", "mixed-dtypes", TE, r"target_probs.*draft_probs.*one dtype",
         target_probs=probs(B, N, V, dtype=torch.bfloat16)),
    case("tree_rejection_sample", "int16-tokens", TE, r"tree_tokens.*dtype", tree_tokens=ids(B, N, dtype=torch.int16)),
    case("tree_rejection_sample", "noncontig", VE, r"draft_probs.*contiguous", draft_probs=strided(B, N, V)),
    case("tree_rejection_sample", "token>=V", VE, r"tree_tokens\[:, 1:\].*outside", tree_tokens=full((B, N), V + 3)),
    case("tree_rejection_sample", "root-parent", VE, r"parents\[:, 0\]", parents=tree(((-1, 0, 0, 1), (1, 0, 1, -1)))),
    case("tree_rejection_sample", "parent>=node", VE, r"parents\[1, 3\].*earlier node", parents=tree((PARENTS[0], (-1, 0, 1, 3)))),
    case("tree_rejection_sample", "child-of-unused", VE, r"parents\[0, 3\].*unused slot",
         parents=tree(((-1, 0, -1, 2), PARENTS[1]))),
    case("tree_rejection_sample", "uniforms+seed", VE, r"exactly one of", seed=lens(1, 2)),
    case("tree_rejection_sample", "neither", VE, r"exactly one of", uniforms=None),
    case("tree_rejection_sample", "uniforms-shape", VE, r"uniforms.*shape \[2, 4\]", uniforms=torch.rand(B, N + 1)),
    case("tree_rejection_sample", "uniforms=1", VE, r"uniforms.*\[0, 1\)", uniforms=torch.ones(B, N, dtype=torch.float64)),
    case("tree_rejection_sample", "uniforms-nan", VE, r"uniforms.*\[0, 1\)",
         uniforms=torch.full((B, N), NAN)),
    case("tree_rejection_sample", "seed-float", TE, r"seed.*int", uniforms=None, seed=0.0),
    case("tree_rejection_sample", "seed-tensor-shape", VE, r"seed.*shape", uniforms=None, seed=lens(1)),
    case("tree_rejection_sample", "offsets+uniforms", VE, r"offsets.*seed", offsets=lens(0, 0)),
    case("tree_rejection_sample", "offsets-shape", VE, r"offsets.*shape", uniforms=None, seed=3, offsets=ids(B, 1)),
    case("tree_rejection_sample", "max_depth<0", VE, r"max_depth", max_depth=-2),
    # ------------------------------------------------------------------ tree_attention
    case("tree_attention", "q-rank", VE, r"`q`.*shape", q=randn(B, N, HQ * D)),
    case("tree_attention", "k_cache-D", VE, r"k_cache.*shape \[2, Hkv, S_max, 8\]", k_cache=randn(B, HKV, S_MAX, D + 1)),
    case("tree_attention", "k_cache-B", VE, r"k_cache.*shape", k_cache=randn(B + 1, HKV, S_MAX, D)),
    case("tree_attention", "v_cache-S", VE, r"v_cache.*shape \[2, 2, 10, 8\]", v_cache=randn(B, HKV, S_MAX + 1, D)),
    case("tree_attention", "v_cache-Hkv", VE, r"v_cache.*shape", v_cache=randn(B, 1, S_MAX, D)),
    case("tree_attention", "seq_lens-shape", VE, r"seq_lens.*shape \[2\]", seq_lens=lens(3, 6, 1)),
    case("tree_attention", "parents-shape", VE, r"parents.*shape \[2, 4\]", parents=tree(((-1, 0, 1),) * B)),
    case("tree_attention", "q-float64", TE, r"`q`.*dtype", q=randn(B, N, HQ, D, dtype=torch.float64),
         k_cache=randn(B, HKV, S_MAX, D, dtype=torch.float64), v_cache=randn(B, HKV, S_MAX, D, dtype=torch.float64)),
    case("tree_attention", "k_cache-dtype", TE, r"k_cache.*dtype float32", k_cache=randn(B, HKV, S_MAX, D, dtype=torch.float16)),
    case("tree_attention", "v_cache-dtype", TE, r"v_cache.*dtype float32", v_cache=randn(B, HKV, S_MAX, D, dtype=torch.bfloat16)),
    case("tree_attention", "seq_lens-float", TE, r"seq_lens.*dtype", seq_lens=torch.tensor([3.0, 6.0])),
    case("tree_attention", "parents-float", TE, r"parents.*dtype", parents=tree().float()),
    case("tree_attention", "q-noncontig", VE, r"`q`.*contiguous", q=strided(B, N, HQ, D)),
    case("tree_attention", "k-noncontig", VE, r"k_cache.*contiguous", k_cache=strided(B, HKV, S_MAX, D)),
    case("tree_attention", "gqa", VE, r"Hq=3 .*multiple of .*Hkv=2", q=randn(B, N, 3, D)),
    case("tree_attention", "seq_lens+N>S_max", VE, r"seq_lens.*S_max=10", seq_lens=lens(3, S_MAX - N + 1)),
    case("tree_attention", "seq_lens<0", VE, r"0 <= seq_lens", seq_lens=lens(-1, 0)),
    case("tree_attention", "root-parent", VE, r"parents\[:, 0\]", parents=tree(((-1, 0, 0, 1), (0, 0, 1, -1)))),
    case("tree_attention", "child-of-unused", VE, r"parents\[0, 3\].*unused slot", parents=tree(((-1, -1, 0, 1), PARENTS[1]))),
    case("tree_attention", "sm_scale-nan", VE, r"sm_scale.*real number", sm_scale=NAN),
    case("tree_attention", "paged-k_cache-rank", VE, r"k_cache.*shape \[num_pages, page_size, Hkv, 8\]",
         **paged(k_cache=randn(6, 4 * HKV, D))),
    case("tree_attention", "paged-v_cache-shape", VE, r"v_cache.*shape \[6, 4, 2, 8\]", **paged(v_cache=randn(6, 4, 1, D))),
    case("tree_attention", "paged-v_cache-dtype", TE, r"v_cache.*dtype float32",
         **paged(v_cache=randn(6, 4, HKV, D, dtype=torch.float16))),
    case("tree_attention", "paged-D", VE, r"k_cache.*shape", **paged(k_cache=randn(6, 4, HKV, D + 1))),
    case("tree_attention", "paged-gqa", VE, r"Hq=4 .*multiple of .*Hkv=3",
         **paged(k_cache=randn(6, 4, 3, D), v_cache=randn(6, 4, 3, D))),
    case("tree_attention", "paged-no-pages", VE, r"at least one page",
         **paged(k_cache=randn(0, 4, HKV, D), v_cache=randn(0, 4, HKV, D))),
    case("tree_attention", "block_table-shape", VE, r"block_table.*shape \[2, max_pages\]", **paged(block_table=pages()[0])),
    case("tree_attention", "block_table-float", TE, r"block_table.*dtype int64 or int32", **paged(block_table=pages().float())),
    case("tree_attention", "block_table-device", VE, r"block_table.*must be on cpu",
         **paged(block_table=torch.empty(B, 3, dtype=torch.int64, device="meta"))),
    case("tree_attention", "paged-capacity", VE, r"seq_lens.*max_pages \* page_size = 3 \* 4",
         **paged(seq_lens=lens(3, 12 - N + 1))),
    case("tree_attention", "page-id>=num_pages", VE, r"block_table\[1, 2\]. = 6 .*\[0, 6\)",
         **paged(block_table=pages(((0, 1, 2), (3, 4, 6))))),
    case("tree_attention", "page-id<0", VE, r"block_table\[0, 1\]. = -1", **paged(block_table=pages(((0, -1, 2), (3, 4, 5))))),
    case("tree_attention", "capacity<N", VE, r"S_max=3 positions per row, fewer than the N=4",
         k_cache=randn(B, HKV, 3, D), v_cache=randn(B, HKV, 3, D), seq_lens=lens(0, 0)),
    # ------------------------------------------------------------------ kv_rollback
    case("kv_rollback", "seq_lens-rank", VE, r"seq_lens.*shape \[B\]", seq_lens=ids(B, 1)),
    case("kv_rollback", "num_accepted-shape", VE, r"num_accepted.*shape \[2\]", num_accepted=lens(0, 0, 0)),
    case("kv_rollback", "seq_lens-float", TE, r"seq_lens.*dtype", seq_lens=torch.tensor([3.0, 6.0])),
    case("kv_rollback", "num_accepted-int16", TE, r"num_accepted.*dtype int64 or int32", num_accepted=lens(1, 0, dtype=torch.int16)),
    case("kv_rollback", "num_accepted<0", VE, r"num_accepted.*>= 0", num_accepted=lens(0, -1)),
    case("kv_rollback", "not-tensor", TE, r"seq_lens.*torch\.Tensor", seq_lens=[3, 6]),
    # ------------------------------------------------------------------ kv_compact
    case("kv_compact", "lengths-differ", TE, r"k_caches.*v_caches.*equal length",
         v_caches=[randn(B, HKV, S_MAX, D)]),
    case("kv_compact", "not-lists", TE, r"k_caches.*v_caches.*lists", k_caches=randn(B, HKV, S_MAX, D)),
    case("kv_compact", "seq_lens-shape", VE, r"seq_lens.*shape", seq_lens=ids(B, 1)),
    case("kv_compact", "accepted-rank", VE, r"accepted_nodes.*shape \[2, M\]", accepted_nodes=lens(0, 1)),
    case("kv_compact", "accepted-int16", TE, r"accepted_nodes.*dtype", accepted_nodes=tree(((0, 1), (0, 2))).short()),
    case("kv_compact", "k-rank", VE, r"k_caches\[0\].*shape", k_caches=[randn(B, HKV, S_MAX), randn(B, HKV, S_MAX, D)]),
    case("kv_compact", "v-mismatch", VE, r"v_caches\[1\].*shape",
         v_caches=[randn(B, HKV, S_MAX, D), randn(B, HKV, S_MAX + 2, D)]),
    case("kv_compact", "k-batch", VE, r"k_caches\[1\].*shape",
         k_caches=[randn(B, HKV, S_MAX, D), randn(B + 1, HKV, S_MAX, D)]),
    case("kv_compact", "v-dtype", TE, r"v_caches\[0\].*dtype",
         v_caches=[randn(B, HKV, S_MAX, D, dtype=torch.float16) for _ in range(2)]),
    case("kv_compact", "k-noncontig", VE, r"k_caches\[1\].*contiguous",
         k_caches=[randn(B, HKV, S_MAX, D), strided(B, HKV, S_MAX, D)]),
    case("kv_compact", "not-increasing", VE, r"accepted_nodes.*increasing", accepted_nodes=tree(((0, 2, 1), (0, 2, -1)))),
    case("kv_compact", "repeated", VE, r"accepted_nodes.*increasing", accepted_nodes=tree(((0, 1, 1), (0, 2, -1)))),
    case("kv_compact", "entry-after-pad", VE, r"accepted_nodes.*-1 padding", accepted_nodes=tree(((0, -1, 2), (0, 2, -1)))),
    case("kv_compact", "below-pad", VE, r"accepted_nodes", accepted_nodes=tree(((0, 1, -2), (0, 2, -1)))),
    case("kv_compact", "past-S_max", VE, r"seq_lens \+ accepted_nodes.*S_max=10", seq_lens=lens(3, 8)),
    case("kv_compact", "cache-not-tensor", TE, r"k_caches\[0\].*torch\.Tensor",
         k_caches=[None, None]),
    # ------------------------------------------------------------------ early_exit_topk
    case("early_exit_topk", "hidden-rank", VE, r"hidden.*shape \[B, H\]", hidden=randn(B, 1, H)),
    case("early_exit_topk", "lm_head-H", VE, r"lm_head_weight.*shape \[V, 8\]", lm_head_weight=randn(V_HEAD, H + 1)),
    case("early_exit_topk", "norm_weight-shape", VE, r"norm_weight.*shape \[8\]", norm_weight=randn(H - 1)),
    case("early_exit_topk", "norm_bias-shape", VE, r"norm_bias.*shape \[8\]", norm="layer", norm_bias=randn(1, H)),
    case("early_exit_topk", "hidden-float64", TE, r"hidden.*dtype", hidden=randn(B, H, dtype=torch.float64)),
    case("early_exit_topk", "lm_head-dtype", TE, r"lm_head_weight.*dtype float32",
         lm_head_weight=randn(V_HEAD, H, dtype=torch.float16)),
    case("early_exit_topk", "norm_weight-int", TE, r"norm_weight.*dtype", norm_weight=ids(H)),
    case("early_exit_topk", "hidden-noncontig", VE, r"hidden.*contiguous", hidden=strided(B, H)),
    case("early_exit_topk", "lm_head-noncontig", VE, r"lm_head_weight.*contiguous", lm_head_weight=strided(V_HEAD, H)),
    case("early_exit_topk", "k>V", VE, r"`k`=12 exceeds .*V=11", k=V_HEAD + 1),
    case("rejection_sample_logits", "draft_logits-g", VE, r"draft_logits.*shape \[2, 3, 5\]",
         draft_logits=randn(B, G + 1, V)),
    case("rejection_sample_logits", "dtype-mismatch", TE, r"target_logits.*draft_logits.*share one dtype",
         draft_logits=randn(B, G, V).half()),
    case("rejection_sample_logits", "temperature-0", VE, r"temperature.*> 0", temperature=0.0),
    case("rejection_sample_logits", "temperature-nan", VE, r"temperature.*real number", temperature=NAN),
    case("rejection_sample_logits", "temperature-shape", VE, r"temperature.*shape \[2\]",
         temperature=torch.ones(3)),
    case("rejection_sample_logits", "temperature-row-0", VE, r"temperature.*every row",
         temperature=torch.tensor([1.0, 0.0])),
    case("rejection_sample_logits", "no-randomness", VE, r"exactly one of `uniforms`.*`seed`", uniforms=None),
    # block_verify shares rejection_sample's checks (ops/_chain.py's check_sampling): one of each kind
    case("block_verify", "target_probs-g", VE, r"target_probs.*shape \[2, 4, V\]", target_probs=probs(B, G, V)),
    case("block_verify", "mixed-dtypes", TE, r"target_probs.*draft_probs.*one dtype", draft_probs=probs(B, G, V).half()),
    case("block_verify", "token>=V", VE, r"draft_tokens.*outside \[-1, 5\)", draft_tokens=full((B, G), V)),
    case("block_verify", "n_draft>g", VE, r"num_draft_tokens.*\[0, 3\]", num_draft_tokens=lens(1, G + 1)),
    case("block_verify", "neither", VE, r"exactly one of `uniforms`.*`seed`", uniforms=None),
    case("block_verify", "offsets-with-uniforms", VE, r"offsets.*seeded", offsets=lens(0, 0)),
    case("block_verify_logits", "draft_logits-g", VE, r"draft_logits.*shape \[2, 3, 5\]", draft_logits=randn(B, G + 1, V)),
    case("block_verify_logits", "temperature-0", VE, r"temperature.*> 0", temperature=0.0),
    case("block_verify_logits", "temperature-row-0", VE, r"temperature.*every row", temperature=torch.tensor([1.0, 0.0])),
    case("block_verify_logits", "seed-float", TE, r"seed.*int", seed=1.5),
    case("early_exit_topk", "k=0", VE, r"`k`.*>= 1", k=0),
    case("early_exit_topk", "k-float", VE, r"`k`.*int", k=2.0),
    case("early_exit_topk", "norm-name", VE, r"`norm`.*one of.*'rmsnorm'", norm="rmsnorm"),
    case("early_exit_topk", "bias-with-rms", VE, r"norm_bias.*norm='layer'", norm_bias=randn(H)),
    case("early_exit_topk", "bias-with-none", VE, r"norm_bias.*norm='layer'", norm="none", norm_bias=randn(H)),
    case("early_exit_topk", "eps<0", VE, r"eps.*>= 0", eps=-1e-6),
    case("early_exit_topk", "eps-nan", VE, r"eps.*real number", eps=NAN),
]


def test_every_op_has_cases():
    assert {p.values[0] for p in CASES} == set(OPS)
    assert set(OPS) == {n for n in ops.__all__ if n not in ("BACKENDS", "implemented_backends", "registered_ops", "resolve")}


CHAIN_VERIFY = ("rejection_sample", "rejection_sample_logits", "block_verify", "block_verify_logits", "greedy_verify",
                "relaxed_verify", "bild_verify")


def assert_chain_verdict(kwargs: dict, out) -> None:
    """Row b accepts n <= its drafts: the first n drafts as given, then one token in [0, V), then -1 padding."""
    tokens, num_accepted = out
    drafts = kwargs["draft_tokens"]
    vocab = next(kwargs[k] for k in ("target_probs", "target_logits") if k in kwargs).shape[-1]
    count = kwargs.get("num_draft_tokens")
    for b in range(drafts.shape[0]):
        n, limit = int(num_accepted[b]), drafts.shape[1] if count is None else int(count[b])
        assert 0 <= n <= limit and tokens.shape == (drafts.shape[0], drafts.shape[1] + 1)
        assert torch.equal(tokens[b, :n], drafts[b, :n].to(tokens.dtype))
        assert 0 <= int(tokens[b, n]) < vocab and bool((tokens[b, n + 1:] == -1).all())


def assert_tree_verdict(kwargs: dict, out) -> None:
    """Row b accepts a root-first path of n nodes, each the child of the one before (at most max_depth): its tokens,
    then one token in [0, V), then -1 padding."""
    tokens, num_accepted, nodes = out
    parents, tree_tokens = kwargs["parents"], kwargs["tree_tokens"]
    vocab = next(kwargs[k] for k in ("target_probs", "target_logits") if k in kwargs).shape[-1]
    depth = kwargs.get("max_depth")
    for b in range(tree_tokens.shape[0]):
        n = int(num_accepted[b])
        assert 0 <= n <= (nodes.shape[1] - 1 if depth is None else depth) and int(nodes[b, 0]) == 0
        for i in range(1, n + 1):
            assert int(parents[b, nodes[b, i]]) == int(nodes[b, i - 1])
            assert int(tokens[b, i - 1]) == int(tree_tokens[b, nodes[b, i]])
        assert bool((nodes[b, n + 1:] == -1).all()) and bool((tokens[b, n + 1:] == -1).all())
        assert 0 <= int(tokens[b, n]) < vocab


def assert_contract(op: str, kwargs: dict, out) -> None:
    """What any valid call of `op` returns, whatever the values drawn (the docstrings' Returns)."""
    if op in CHAIN_VERIFY:
        assert_chain_verdict(kwargs, out)
    elif op in ("tree_greedy_verify", "tree_rejection_sample"):
        assert_tree_verdict(kwargs, out)
    elif op in ("fallback_check", "max_prob"):
        logits = kwargs["draft_logits" if op == "fallback_check" else "logits"]
        top = torch.softmax(logits.float(), dim=-1).amax(dim=-1)
        assert torch.equal(out, top < kwargs["threshold"]) if op == "fallback_check" else torch.allclose(out, top)
    elif op == "tree_attention":
        attended, lse = out
        assert attended.shape == kwargs["q"].shape and bool(torch.isfinite(attended).all() & torch.isfinite(lse).all())
    elif op == "kv_rollback":
        assert torch.equal(out, kwargs["seq_lens"] + kwargs["num_accepted"] + 1)
    elif op == "kv_compact":
        assert torch.equal(out, kwargs["seq_lens"] + (kwargs["accepted_nodes"] >= 0).sum(-1).to(out.dtype))
    elif op == "early_exit_topk":
        values, indices = out
        assert indices.shape == (kwargs["hidden"].shape[0], kwargs["k"]) and bool(torch.isfinite(values).all())
        assert bool(((indices >= 0) & (indices < kwargs["lm_head_weight"].shape[0])).all())
        assert bool((values[:, :-1] >= values[:, 1:]).all())  # best first
    else:
        raise AssertionError(f"no contract for {op}: add one")


@pytest.mark.parametrize("op", sorted(VALID))
def test_valid_baseline_call_passes(op):
    """The base call every bad case is derived from is itself valid, and returns what the op promises."""
    kwargs = VALID[op]()
    assert_contract(op, kwargs, OPS[op](**kwargs))


def test_the_contract_check_fails_a_wrong_verdict():
    kwargs = VALID["greedy_verify"]()
    tokens, num_accepted = OPS["greedy_verify"](**kwargs)
    with pytest.raises(AssertionError):  # a token past the verdict that is not padding
        assert_contract("greedy_verify", kwargs, (tokens.fill_(0), num_accepted.clamp(max=1)))


@pytest.mark.parametrize("op, overrides, exc, pattern", CASES)
def test_bad_input_raises_clear_error(op, overrides, exc, pattern):
    with pytest.raises(exc, match=rf"^{re.escape(op)}: .*{pattern}"):
        call(op, **overrides)


# ---------------------------------------------------------------------------- backends

def _backend_param(op):
    return pytest.param(op, id=op)


@pytest.mark.parametrize("op", [_backend_param(op) for op in sorted(VALID)])
def test_unknown_backend(op):
    with pytest.raises(ValueError, match=rf"^{op}: backend must be one of 'auto', 'torch', 'triton', 'cuda' \(got 'gpu'\)"):
        call(op, backend="gpu")


@pytest.mark.parametrize("op", [_backend_param(op) for op in sorted(VALID)])
def test_cuda_backend_on_cpu_tensors(op):
    # ops with a CUDA backend refuse CPU tensors; the others say they have none yet.
    implemented = "cuda" in ops.implemented_backends("max_prob" if op == "fallback_check" else op)
    pattern = r"backend='cuda' needs CUDA tensors \(got tensors on cpu\)" if implemented \
        else r"the 'cuda' backend is not available for this op"
    with pytest.raises(ValueError, match=rf"^{op}: {pattern}"):
        call(op, backend="cuda")


@pytest.mark.parametrize("value", [None, "0"], ids=["unset", "TRITON_INTERPRET=0"])
def test_triton_backend_on_cpu_without_interpreter(monkeypatch, value):
    pytest.importorskip("triton")
    if value is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", value)
    with pytest.raises(ValueError, match=r"^greedy_verify: backend='triton' needs CUDA tensors, or TRITON_INTERPRET=1"):
        call("greedy_verify", backend="triton")


@pytest.mark.parametrize("op", [_backend_param(op) for op in sorted(VALID)])
def test_triton_backend_missing_or_interpreted(op, monkeypatch):
    """Ops without a Triton kernel say so; ops with one refuse CPU tensors unless interpreted."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    implemented = "triton" in ops.implemented_backends("max_prob" if op == "fallback_check" else op)
    message = "backend='triton' needs CUDA tensors" if implemented else "the 'triton' backend is not available for this op"
    with pytest.raises(ValueError, match=rf"^{op}: {message}"):
        call(op, backend="triton")


def test_validation_runs_before_backend_resolution():
    """A bad argument is reported even when the backend is also unusable."""
    with pytest.raises(TypeError, match=r"^greedy_verify: `draft_tokens` must have dtype int64 or int32"):
        call("greedy_verify", draft_tokens=ids(B, G, dtype=torch.int16), backend="cuda")


# ---------------------------------------------------------------------------- valid edge inputs

EDGE_CASES = [
    ("rejection_sample", dict(num_draft_tokens=lens(0, G))),
    ("rejection_sample", dict(uniforms=torch.zeros(B, G + 1, dtype=torch.float64))),
    ("rejection_sample", dict(uniforms=None, seed=lens(7, 8), offsets=lens(0, 100))),
    ("rejection_sample", dict(uniforms=None, seed=-1)),
    ("rejection_sample", dict(target_probs=probs(B, G + 1, V, dtype=torch.bfloat16),
                              draft_probs=probs(B, G, V, dtype=torch.bfloat16))),
    ("greedy_verify", dict(target_logits=randn(B, G + 1, V, dtype=torch.float16), num_draft_tokens=lens(G, 0))),
    ("greedy_verify", dict(target_logits=randn(B, G + 1, 1), draft_tokens=full((B, G), 0))),  # V = 1
    ("greedy_verify", dict(target_logits=randn(0, G + 1, V), draft_tokens=ids(0, G))),  # empty batch
    ("relaxed_verify", dict(top_beta=1, tau=0)),
    ("relaxed_verify", dict(top_beta=V + 10, tau=float("inf"))),
    ("bild_verify", dict(rollback_threshold=0)),
    ("fallback_check", dict(threshold=0)),
    ("fallback_check", dict(threshold=1)),
    ("max_prob", dict(logits=randn(2, 3, 4, V))),
    ("max_prob", dict(logits=randn(V))),
    ("tree_greedy_verify", dict(max_depth=0)),
    ("tree_greedy_verify", dict(tree_tokens=torch.cat([full((B, 1), 10**6), ids(B, N - 1)], 1))),  # root id ignored
    ("tree_rejection_sample", dict(uniforms=None, seed=5, offsets=lens(3, 4), max_depth=1)),
    ("tree_attention", dict(seq_lens=lens(0, S_MAX - N, dtype=torch.int32))),  # seq_lens + N == S_max
    ("tree_attention", dict(parents=None, sm_scale=0.5)),
    ("tree_attention", dict(q=randn(B, N, HKV, D))),  # Hq == Hkv
    ("tree_attention", paged(seq_lens=lens(0, 12 - N, dtype=torch.int32), block_table=pages(dtype=torch.int32))),
    ("tree_attention", paged(seq_lens=lens(0, 2), block_table=pages(((5, -1, 99), (1, 4, -7))))),  # unread entries
    ("tree_attention", paged(k_cache=randn(6, HKV, 4, D).transpose(1, 2), v_cache=randn(6, HKV, 4, D).transpose(1, 2))),
    ("kv_rollback", dict(seq_lens=lens(3, 6, dtype=torch.int32))),
    ("kv_rollback", dict(num_accepted=lens(1, 0, dtype=torch.int32))),
    # int32 index tensors (tests/test_strides_dtypes.py checks their results on every backend)
    ("rejection_sample", dict(draft_tokens=ids(B, G, dtype=torch.int32), num_draft_tokens=lens(1, 1, dtype=torch.int32))),
    ("rejection_sample", dict(uniforms=None, seed=lens(1, 2, dtype=torch.int32), offsets=lens(0, 5, dtype=torch.int32))),
    ("tree_greedy_verify", dict(tree_tokens=ids(B, N, dtype=torch.int32), parents=tree().int())),
    ("tree_attention", dict(parents=tree().int())),
    ("kv_compact", dict(accepted_nodes=tree(((0, -1, -1), (0, 1, 2))).int(), seq_lens=lens(0, 7, dtype=torch.int32))),
    ("kv_compact", dict(accepted_nodes=tree(((0, -1, -1), (0, 1, 2))), seq_lens=lens(0, 7))),
    ("kv_compact", dict(k_caches=[], v_caches=[])),
    ("early_exit_topk", dict(k=V_HEAD)),
    ("early_exit_topk", dict(norm_weight=None, norm="none")),
    ("early_exit_topk", dict(norm="layer", norm_bias=randn(H), norm_weight=randn(H, dtype=torch.bfloat16))),
]


@pytest.mark.parametrize("op, overrides", EDGE_CASES, ids=[f"{op}-{i}" for i, (op, _) in enumerate(EDGE_CASES)])
def test_valid_edge_inputs_pass(op, overrides):
    kwargs = {**VALID[op](), **overrides}
    assert_contract(op, kwargs, OPS[op](**kwargs))


@pytest.mark.parametrize("op", ["greedy_verify", "relaxed_verify", "bild_verify", "rejection_sample"])
def test_draft_id_minus_one_passes_validation_and_is_rejected(op):
    drafts = torch.tensor([[-1, 0, 1], [2, -1, 3]])
    out, num_accepted = call(op, draft_tokens=drafts)
    assert out.shape == (B, G + 1) and num_accepted.shape == (B,)
    assert num_accepted[0] == 0 and num_accepted[1] <= 1  # -1 is never accepted
    assert 0 <= int(out[0, 0]) < V and bool((out[0, 1:] == -1).all())


def test_greedy_verify_without_drafts():
    logits = randn(B, 1, V)
    out, num_accepted = ops.greedy_verify(logits, torch.empty(B, 0, dtype=torch.int64))
    assert out.shape == (B, 1) and out.dtype == torch.int64
    assert torch.equal(out[:, 0], logits[:, 0].argmax(-1))
    assert torch.equal(num_accepted, torch.zeros(B, dtype=torch.int64))


def test_trees_of_only_the_root():
    root = full((B, 1), -1)
    logits = randn(B, 1, V)
    out, num_accepted, nodes = ops.tree_greedy_verify(logits, ids(B, 1), root)
    assert out.shape == nodes.shape == (B, 1)
    assert torch.equal(out[:, 0], logits[:, 0].argmax(-1))
    assert torch.equal(num_accepted, torch.zeros(B, dtype=torch.int64)) and torch.equal(nodes, torch.zeros(B, 1, dtype=torch.int64))

    out, num_accepted, nodes = ops.tree_rejection_sample(probs(B, 1, V), probs(B, 1, V), ids(B, 1), root,
                                                         uniforms=torch.rand(B, 1))
    assert out.shape == nodes.shape == (B, 1) and bool(((out >= 0) & (out < V)).all())
    assert torch.equal(num_accepted, torch.zeros(B, dtype=torch.int64))

    att, lse = ops.tree_attention(randn(B, 1, HQ, D), randn(B, HKV, S_MAX, D), randn(B, HKV, S_MAX, D), lens(0, 4), root)
    assert att.shape == (B, 1, HQ, D) and lse.shape == (B, 1, HQ) and bool(torch.isfinite(att).all())
