"""Token trees from every earlier occurrence of a row's suffix (strategy `lookup` with tree_nodes > 0), in the
manner of SuffixDecoding (Oliaro et al., NeurIPS 2025), on the scan of lookup_match.py.

A node of the trie of the occurrences' continuations is ranked by the longest agreement among the
occurrences through it, then by how many of those pass through it, then by its best occurrence, then
by depth: the longest match's subtree comes first (SuffixDecoding's order), shorter matches fill the
rest of the budget. A node never outranks its parent, so the kept nodes hold all their ancestors.
Static shapes ([B, M, M, depth] comparisons), no host sync.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from .lookup_match import Scan, continuation

OCCURRENCES = 32  # the occurrences a tree is built from (longest agreement first, then most recent)


@dataclass
class Tree:
    """tokens [B, N] int64 (0 in unused slots); parents [B, N + 1] int64 (ops.tree_verify's format: node 0
    the root, -1 for unused slots); count [B] nodes per row (0: no match); depth [B] its deepest level."""

    tokens: Tensor
    parents: Tensor
    count: Tensor
    depth: Tensor


def levels(agree: Tensor, depth: int, max_ngram: int, limit: Tensor) -> Tensor:
    """Levels an occurrence agreeing on n tokens continues: ceil(depth * n / max_ngram), within `limit`."""
    return torch.minimum((depth * agree + max_ngram - 1) // max_ngram, limit.clamp(min=0))


def tree(text: Tensor, end: Tensor, found: Scan, *, nodes: int, depth: int, max_ngram: int, limit: Tensor) -> Tree:
    """The token tree of every row from the scan `found` of `text` (see lookup_match.scan)."""
    batch, width = text.shape
    device = text.device
    m = min(OCCURRENCES, width)
    positions = torch.arange(width, device=device).unsqueeze(0)
    # the occurrences: positions agreeing on min_ngram tokens or more, longest matches first, then most recent
    score = torch.where(found.agree > 0, found.agree * width + positions, -1)
    ranked, order = torch.topk(score, m, dim=1)
    occurrence_at = torch.where(ranked >= 0, order, -1)
    agree = torch.where(ranked >= 0, ranked // width, 0)  # [B, M]
    tokens, valid = continuation(text, end, occurrence_at, depth)  # [B, M, D]
    allowed = levels(agree, depth, max_ngram, limit.unsqueeze(1))  # [B, M]: longer matches draft deeper
    valid = valid & (torch.arange(depth, device=device) < allowed.unsqueeze(2))
    both = valid.unsqueeze(2) & valid.unsqueeze(1)  # [B, M, M, D]: occurrences i and j both reach level d
    same = torch.cumprod((both & (tokens.unsqueeze(2) == tokens.unsqueeze(1))).to(torch.int8), dim=-1).bool()
    through = torch.where(same, agree.view(batch, 1, m, 1), 0)  # agreement of each occurrence j through node (i, d)
    longest = through.amax(dim=2)  # [B, M, D]: the longest match through the node
    count = (same & (through == longest.unsqueeze(2))).sum(dim=2)  # occurrences of that match through it
    first = same.to(torch.int8).argmax(dim=2)  # the best-ranked occurrence reaching the node (i itself when valid)
    occurrence = torch.arange(m, device=device).view(1, m, 1)
    level = torch.arange(depth, device=device).view(1, 1, depth)
    flat_index = occurrence * depth + level
    cells = m * depth
    unique = valid & (first == occurrence)
    key = torch.where(unique, (longest * (m + 1) + count) * cells + (cells - 1 - flat_index), -1).flatten(1)
    kept = min(nodes, cells)
    ranked_nodes, pick = torch.topk(key, kept, dim=1)  # best first: parents before children
    chosen = ranked_nodes >= 0
    node_level = pick % depth
    parent_cell = first.flatten(1).gather(1, (pick - 1).clamp(min=0)) * depth + node_level - 1
    slot = torch.arange(1, kept + 1, device=device).expand(batch, kept)
    slot_of = torch.full((batch, cells), -1, dtype=torch.int64, device=device).scatter(
        1, pick, torch.where(chosen, slot, -1))
    parent = torch.where(node_level == 0, 0, slot_of.gather(1, parent_cell.clamp(min=0)))
    parents = torch.where(chosen, parent, -1)
    node_tokens = torch.where(chosen, tokens.flatten(1).gather(1, pick), 0)
    if kept < nodes:  # more nodes asked for than the trie can hold: unused slots
        parents = torch.cat([parents, parents.new_full((batch, nodes - kept), -1)], dim=1)
        node_tokens = torch.cat([node_tokens, node_tokens.new_zeros(batch, nodes - kept)], dim=1)
    root = torch.full((batch, 1), -1, dtype=torch.int64, device=device)
    return Tree(node_tokens, torch.cat([root, parents], dim=1), chosen.sum(dim=1),
                torch.where(chosen, node_level + 1, 0).amax(dim=1))
