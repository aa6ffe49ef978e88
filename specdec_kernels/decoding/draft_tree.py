"""Token trees drafted by a small model for strategy `speculative` (tree_topk=K, tree_nodes=N,
num_draft_tokens=DEPTH): dynamic per-row trees in the manner of EAGLE-2, with static shapes.

A level expands each beam node's K most probable (or sampled) children and keeps the K of highest
cumulative log-probability; the tree is the N best candidates. A child never scores above its parent
and ties go to the earlier candidate, so the N hold all their ancestors and parents come first.
Which tokens form the tree never affects exactness, only how many are accepted.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from ..common import validate as check
from ..common import rng
from ..common.sampling import sample_weights, to_weights
from .engine import OP
from .standardize import Sampling, standardize
from .verifier import SIBLINGS
SALT_TREE_DRAFT = 3  # Philox purpose of a sampled tree child (standardize.SALT_DRAFT = 2: chain drafts)


@dataclass(frozen=True)
class TreeShape:
    """depth = num_draft_tokens, topk = tree_topk, nodes = tree_nodes (the root not counted)."""

    depth: int
    topk: int
    nodes: int

    @property
    def chain(self) -> bool:
        """K = 1 and N = DEPTH: today's chain of sampled (or argmax) drafts, not a tree."""
        return self.topk == 1 and self.nodes == self.depth

    @property
    def candidates(self) -> int:
        return self.topk + (self.depth - 1) * self.topk * self.topk

    @property
    def draft_nodes(self) -> int:
        """Tokens of the widest draft forward: the root and DEPTH - 1 beams."""
        return 1 + (self.depth - 1) * self.topk


def tree_shape(depth: int, topk, nodes) -> TreeShape:
    """Validated (DEPTH, K, N); nodes None means DEPTH (with K = 1, the chain)."""
    topk = check.positive_int(OP, "tree_topk", topk)
    nodes = depth if nodes is None else check.positive_int(OP, "tree_nodes", nodes)
    shape = TreeShape(depth, topk, nodes)
    if nodes > shape.candidates:
        check.fail(OP, f"`tree_nodes` must be <= {shape.candidates}, the nodes DEPTH={depth} levels of "
                       f"tree_topk={topk} can draft (K + (DEPTH - 1) * K^2; got {nodes})")
    return shape


def draft_log_probs(logits: Tensor, sampling: Sampling) -> Tensor:
    """float32 log-probabilities [..., V] the tree is ranked by (-inf for filtered tokens)."""
    if not sampling.do_sample:
        return torch.log_softmax(logits.float(), dim=-1)
    return torch.log(standardize(logits, sampling))


@dataclass
class Tree:
    """One step's tree per row. tokens [B, N] (the nodes after the root); parents [B, N + 1]
    (ops.tree_verify's format, node 0 = root); draft_node [B, N + 1]: each node's index in the
    draft's last forward (the root 0; -1 for leaves the draft never fed)."""

    tokens: Tensor
    parents: Tensor
    draft_node: Tensor
    # siblings="sampled": [B, N + 1, V] float32, row v the q node v's children were drawn from
    # (zeros for leaves): ops.tree_rejection_sample's draft_probs with siblings="without_replacement"
    draft_probs: Tensor | None = None


def sample_children(q: Tensor, uniforms: Tensor) -> tuple[Tensor, Tensor]:
    """K children per row of q [..., V] (float32 probabilities), drawn without replacement.

    uniforms [..., K] float64 in [0, 1): draw j takes u_j through the inverse CDF of the ops'
    fixed-point weights (to_weights(q)) with the j earlier draws zeroed, i.e. exactly from q_j,
    the q the op's without-replacement rule divides by. Returns (tokens [..., K] int64, score
    increments [..., K] float32: log(sum of q^2 off the earlier draws), clamped to <= 0 and
    non-increasing in j; -inf, with the first draw's id as token, where q has no id left).
    """
    weights = to_weights(q)
    q64 = q.double()
    mass2 = (q64 * q64).sum(dim=-1)  # sum_v q(v)^2, less each draw's q^2 as it is taken out
    tokens, increments = [], []
    for j in range(uniforms.shape[-1]):
        token, valid = sample_weights(weights, uniforms[..., j])
        token = torch.where(valid, token, tokens[0] if tokens else token)
        # the chance that the next draw meets a token drawn from q: scoring a child without looking at its
        # own token keeps whether it is kept independent of its value, which exactness needs
        value = torch.where(valid, mass2.clamp(min=0.0), 0.0)  # depends on the earlier draws only
        increments.append(torch.log(value).clamp(max=0.0))
        tokens.append(token)
        taken = valid.unsqueeze(-1) & (torch.arange(q.shape[-1], device=q.device) == token.unsqueeze(-1))
        weights = weights.masked_fill(taken, 0)
        q_x = q64.gather(-1, token.unsqueeze(-1)).squeeze(-1)
        mass2 = torch.where(valid, mass2 - q_x * q_x, mass2)
    increments = torch.cummin(torch.stack(increments, dim=-1), dim=-1).values  # guard rounding
    return torch.stack(tokens, dim=-1), increments.float()


class _SiblingDraws:
    """Uniforms for sampled children: Philox(seeds[b], cursors[b] + level - 1, 0, SALT_TREE_DRAFT,
    slot * K + j) (per-request seeds, batch-order free, graph-safe, like standardize.draw), or
    torch.rand with `generator` when no seeds are given."""

    def __init__(self, k: int, seeds, cursors, generator):
        self.k, self.seeds, self.cursors, self.generator = k, seeds, cursors, generator

    def __call__(self, batch: int, slots: int, level: int, device) -> Tensor:
        if self.seeds is None:
            return torch.rand(batch, slots, self.k, generator=self.generator, dtype=torch.float64,
                              device=device if self.generator is None else self.generator.device).to(device)
        seeds = torch.as_tensor(self.seeds, device=device).to(torch.int64).expand(batch)
        cursors = torch.as_tensor(self.cursors, device=device).to(torch.int64).expand(batch)
        extra = torch.arange(slots * self.k, device=device).view(1, slots, self.k)
        return rng.philox_uniform(seeds.view(batch, 1, 1), (cursors + level - 1).view(batch, 1, 1),
                                  torch.zeros_like(extra), SALT_TREE_DRAFT, extra)


def grow_tree(shape: TreeShape, root: Tensor, root_logprobs: Tensor, forward, log_probs, *, siblings: str = "top",
              seeds=None, cursors=None, generator: torch.Generator | None = None) -> Tree:
    """Draft the tree level by level.

    Args:
        root: [B] int64, the root tokens; root_logprobs: [B, V] the draft's log q after the root.
        forward: (tokens [B, M], parents [B, M]) -> draft logits [B, M, V] of a tree forward.
        log_probs: logits -> log-probabilities (draft_log_probs with the call's sampling).
        siblings: "top" (the K most probable children) or "sampled" (K draws without replacement
            from q = exp(log_probs), which the Tree returns as draft_probs; sampling only).
        seeds: int or int64 [B] per-request Philox keys and cursors: int64 [B] (each row's draw
            cursor, engine.cursor: level d draws at cursors + d - 1) for "sampled"; without seeds
            the draws come from torch.rand with `generator`.
    """
    if siblings not in SIBLINGS:
        check.fail(OP, f"`siblings` must be one of {SIBLINGS} (got {siblings!r})")
    if siblings == "sampled":
        if seeds is not None and cursors is None:
            check.fail(OP, "`cursors` is needed with `seeds` for sampled siblings")
        return _grow(shape, root, root_logprobs, forward, log_probs,
                     _SiblingDraws(shape.topk, seeds, cursors, generator))
    return _grow(shape, root, root_logprobs, forward, log_probs, None)


def _beam(scores: Tensor, k: int, sampled: bool) -> tuple[Tensor, Tensor]:
    """The k best (scores, indices); sampled: ties to the earlier candidate (a stable order)."""
    if not sampled:
        return torch.topk(scores, k, dim=-1)
    pick = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]
    return scores.gather(-1, pick), pick


def _grow(shape: TreeShape, root: Tensor, root_logprobs: Tensor, forward, log_probs, draws) -> Tree:
    k = shape.topk
    batch = root.shape[0]
    device = root.device
    sampled = draws is not None
    node_q = []  # sampled: q after each draft-forward node (root, beams), in node order
    if sampled:
        node_q.append(torch.exp(root_logprobs.float()).unsqueeze(1))  # THE q the op is given
        tokens, scores = sample_children(node_q[0], draws(batch, 1, 1, device))
        tokens, scores = tokens[:, 0], scores[:, 0]
    else:
        scores, tokens = torch.topk(root_logprobs, k, dim=-1)  # [B, K], best first
    cand_tokens, cand_scores = [tokens], [scores]
    cand_parent = [torch.full((batch, k), -1, dtype=torch.int64, device=device)]  # -1: the root
    beam_cand = torch.arange(k, device=device).expand(batch, k)  # candidate index of each beam node
    beam_tokens, beam_scores = tokens, scores
    node_tokens = [root.unsqueeze(1), tokens]  # the draft forwards' nodes: root, then the beams
    node_parents = [torch.full((batch, 1), -1, dtype=torch.int64, device=device),
                    torch.zeros(batch, k, dtype=torch.int64, device=device)]
    cand_node = [torch.arange(1, k + 1, device=device).expand(batch, k)]  # draft node of each candidate
    base = k  # candidates so far
    for level in range(2, shape.depth + 1):
        logits = forward(torch.cat(node_tokens, dim=1), torch.cat(node_parents, dim=1))
        first_beam_node = 1 + (level - 2) * k
        if sampled:
            node_q.append(torch.exp(log_probs(logits[:, first_beam_node:]).float()))  # [B, K, V]
            top_tokens, top_scores = sample_children(node_q[-1], draws(batch, k, level, device))
        else:
            top_scores, top_tokens = torch.topk(log_probs(logits[:, first_beam_node:]), k, dim=-1)  # [B, K, K]
        scores = (beam_scores.unsqueeze(2) + top_scores).flatten(1)  # [B, K*K]
        tokens = top_tokens.flatten(1)
        cand_tokens.append(tokens)
        cand_scores.append(scores)
        cand_parent.append(beam_cand.unsqueeze(2).expand(batch, k, k).flatten(1))
        if level < shape.depth:  # the next beam, fed to the next forward
            beam_scores, pick = _beam(scores, k, sampled)
            beam_tokens = tokens.gather(1, pick)
            beam_cand = base + pick
            node_tokens.append(beam_tokens)
            node_parents.append(first_beam_node + pick // k)
            first_new = 1 + (level - 1) * k
            cand_node.append(torch.full((batch, k * k), -1, dtype=torch.int64, device=device)
                             .scatter(1, pick, torch.arange(first_new, first_new + k, device=device).expand(batch, k)))
        else:
            cand_node.append(torch.full((batch, k * k), -1, dtype=torch.int64, device=device))
        base += k * k
    tree = select_nodes(shape, torch.cat(cand_tokens, 1), torch.cat(cand_scores, 1), torch.cat(cand_parent, 1),
                        torch.cat(cand_node, 1))
    if sampled:  # each tree node's q (its draft-forward node's; leaves have none: zeros)
        q = torch.cat(node_q, dim=1)  # [B, 1 + (DEPTH - 1) K, V], indexed by draft node
        rows = q.gather(1, tree.draft_node.clamp(min=0).unsqueeze(2).expand(-1, -1, q.shape[2]))
        tree.draft_probs = torch.where((tree.draft_node >= 0).unsqueeze(2), rows, 0.0)
    return tree


def select_nodes(shape: TreeShape, tokens: Tensor, scores: Tensor, parent: Tensor, draft_node: Tensor) -> Tree:
    """The N best candidates ([B, C] each; parent = candidate index or -1 for the root) as a Tree."""
    batch = tokens.shape[0]
    device = tokens.device
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices  # ties: earlier first
    chosen = torch.sort(order[:, :shape.nodes], dim=1).values  # candidate order: parents first
    node_of = torch.full_like(tokens, -1).scatter(
        1, chosen, torch.arange(1, shape.nodes + 1, device=device).expand(batch, shape.nodes))
    parent_cand = parent.gather(1, chosen)
    parents = torch.where(parent_cand < 0, 0, node_of.gather(1, parent_cand.clamp(min=0)))
    minus_one = torch.full((batch, 1), -1, dtype=torch.int64, device=device)
    return Tree(tokens.gather(1, chosen), torch.cat([minus_one, parents], dim=1),
                torch.cat([torch.zeros_like(minus_one), draft_node.gather(1, chosen)], dim=1))


def draft_keep(accepted_nodes: Tensor, num_accepted: Tensor, draft_node: Tensor) -> Tensor:
    """The draft cache's kv_compact path [B, DEPTH]: the root and the accepted nodes but the last,
    as draft-forward node indices (-1 padded). A row that accepted nothing keeps its root entry
    here; the caller takes it off again (kv_compact wants the root first)."""
    depth = accepted_nodes.shape[1] - 1
    path = accepted_nodes[:, :depth]
    nodes = draft_node.gather(1, path.clamp(min=0))
    j = torch.arange(depth, device=path.device).unsqueeze(0)
    keep = (j < num_accepted.unsqueeze(1)) | (j == 0)
    return torch.where(keep, nodes, -1)
