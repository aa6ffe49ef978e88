"""Slow, obviously-correct Python loops that define each op once more, independently of
specdec_kernels.reference: plain floats and ints, one row and one position at a time."""

import math

import numpy as np

SCALE = 2**40


def argmax(row) -> int:
    best, best_i = -math.inf, 0
    for i, v in enumerate(row):
        v = float(v)
        if v == v and v > best:  # NaN never wins; strict > keeps the lowest index on ties
            best, best_i = v, i
    return best_i


def weight(x) -> int:
    x = float(x)
    if x != x or x <= 0:
        return 0
    return math.floor(min(x, 1.0) * SCALE)


def draw(weights: list[int], u: float) -> int | None:
    total = sum(weights)
    if total == 0:
        return None
    threshold = min(math.floor(u * float(total)), total - 1) if u == u else 0  # bad u: stay in the row
    acc = 0
    for i, w in enumerate(weights):
        acc += w
        if acc > threshold:
            return i
    raise AssertionError("unreachable: threshold < total")


def draw_or_fallback(primary: list[int], p_row, u: float) -> int:
    fallback = [weight(v) for v in p_row]
    for candidate in (primary, fallback):
        token = draw(candidate, u)
        if token is not None:
            return token
    return max(range(len(fallback)), key=lambda i: (fallback[i], -i))


def f32_residual(p_row, q_row) -> list[int]:
    return [weight(np.float32(p) - np.float32(q)) for p, q in zip(p_row, q_row)]


def pad(tokens: list[int], length: int) -> list[int]:
    return tokens + [-1] * (length - len(tokens))


def chain_loop(g: int, n_b: int, accept_at, final_at) -> tuple[list[int], int]:
    emitted = []
    for i in range(n_b):
        ok, token = accept_at(i)
        if not ok:
            break
        emitted.append(token)
    emitted.append(final_at(len(emitted), len(emitted) < n_b))
    return pad(emitted, g + 1), len(emitted) - 1


def rejection_sample(p, q, drafts, u, n_b):
    """p [g+1][V], q [g][V] (floats), drafts [g], u [g+1] floats in [0,1)."""
    vocab, g = len(p[0]), len(drafts)

    def accept_at(i):
        x = drafts[i]
        if not 0 <= x < vocab:
            return False, x
        return float(u[i]) * float(q[i][x]) < float(p[i][x]), x

    def final_at(i, rejected):
        primary = f32_residual(p[i], q[i]) if rejected else [weight(v) for v in p[i]]
        return draw_or_fallback(primary, p[i], float(u[g]))

    return chain_loop(g, n_b, accept_at, final_at)


def greedy(logits, drafts, n_b):
    g = len(drafts)
    return chain_loop(g, n_b, lambda i: (drafts[i] == argmax(logits[i]), drafts[i]),
                      lambda i, _: argmax(logits[i]))


def relaxed(logits, drafts, n_b, beta, tau):
    g = len(drafts)

    def accept_at(i):
        row = [float(v) if v == v else -math.inf for v in logits[i]]
        x = drafts[i]
        if not 0 <= x < len(row):
            return False, x
        ahead = sum(1 for v, val in enumerate(row) if val > row[x] or (val == row[x] and v < x))
        top = argmax(row)
        return ahead < beta and (x == top or max(row) - row[x] < tau), x

    return chain_loop(g, n_b, accept_at, lambda i, _: argmax(logits[i]))


def bild(logits, drafts, n_b, threshold):
    g = len(drafts)

    def accept_at(i):
        row = [float(v) for v in logits[i]]
        x = drafts[i]
        if not 0 <= x < len(row):
            return False, x
        m = max(row)
        lse = m + math.log(sum(math.exp(v - m) for v in row))
        return lse - row[x] <= threshold, x

    return chain_loop(g, n_b, accept_at, lambda i, _: argmax(logits[i]))


def children(parents, node):
    return [c for c in range(1, len(parents)) if parents[c] == node]


def tree_greedy(logits, tokens, parents, max_depth):
    path, emitted = [0], []
    while True:
        top = argmax(logits[path[-1]])
        match = [c for c in children(parents, path[-1]) if tokens[c] == top] if len(path) <= max_depth else []
        if not match:
            emitted.append(top)
            break
        path.append(match[0])
        emitted.append(tokens[match[0]])
    return pad(emitted, max_depth + 1), len(path) - 1, pad(path, max_depth + 1)


def tree_rejection(p, q, tokens, parents, u, max_depth):
    """SpecInfer recursive rejection in exact integer fixed point, as documented in
    specdec_kernels/reference/tree_verify.py; u[c] is node c's coin, u[0] the final draw."""
    vocab = len(p[0])
    path, emitted = [0], []
    while True:
        cur = path[-1]
        residual, total = None, None
        accepted = None
        for c in (children(parents, cur) if len(path) <= max_depth else []):
            x = tokens[c]
            if 0 <= x < vocab:
                if residual is None:
                    ok = float(u[c]) * float(q[c][x]) < float(p[cur][x])
                else:
                    ok = (float(u[c]) * float(q[c][x])) * float(total) < float(residual[x])
                if ok:
                    accepted = c
                    break
            if residual is None:
                residual = f32_residual(p[cur], q[c])
            else:
                clean = [1.0 if (v != v or v == math.inf) else min(max(float(v), 0.0), 1.0) for v in q[c]]
                residual = [max(0, r - math.floor(float(total) * w)) for r, w in zip(residual, clean)]
            total = sum(residual)
        if accepted is None:
            primary = [weight(v) for v in p[cur]] if residual is None else residual
            emitted.append(draw_or_fallback(primary, p[cur], float(u[0])))
            break
        path.append(accepted)
        emitted.append(tokens[accepted])
    return pad(emitted, max_depth + 1), len(path) - 1, pad(path, max_depth + 1)


def tree_attention_node(q_heads, keys, values, scale):
    """One node: q_heads [Hq][D]; keys/values [Hkv][L][D] of the visible positions only.
    Returns (out [Hq][D], lse [Hq]) in float64."""
    hq, hkv = len(q_heads), len(keys)
    out, lses = [], []
    for h in range(hq):
        kv = h // (hq // hkv)
        scores = [scale * sum(a * b for a, b in zip(q_heads[h], k)) for k in keys[kv]]
        m = max(scores)
        exps = [math.exp(s - m) for s in scores]
        z = sum(exps)
        lses.append(m + math.log(z))
        out.append([sum(e * v[d] for e, v in zip(exps, values[kv])) / z for d in range(len(q_heads[h]))])
    return out, lses


def root_to_node_path(parents_row, node) -> list[int]:
    """The nodes on the way from the root to `node`, in increasing order; parents_row None
    is a chain (every earlier node)."""
    if parents_row is None:
        return list(range(node + 1))
    path = []
    while node >= 0:
        path.append(node)
        node = parents_row[node] if node > 0 else -1
    return sorted(path)


def cache_vectors(cache, b, positions, block_table=None):
    """[Hkv][len(positions)][D] floats of row b at logical `positions`, one lookup each:
    cache [B, Hkv, S_max, D] when block_table is None, else a page pool
    [num_pages, page_size, Hkv, D] with position s at page block_table[b][s // page_size],
    slot s % page_size."""
    if block_table is None:
        return [[cache[b, h, s].double().tolist() for s in positions] for h in range(cache.shape[1])]
    page_size = cache.shape[1]
    return [[cache[int(block_table[b][s // page_size]), s % page_size, h].double().tolist() for s in positions]
            for h in range(cache.shape[2])]


def tree_attention(q, k_cache, v_cache, seq_lens, parents, block_table, scale):
    """Branch equivalence: node i of row b is ordinary attention over the prefix plus its
    own root-to-node path. Returns (out [B][N][Hq][D], lse [B][N][Hq]) float64 lists."""
    outs, lses = [], []
    for b in range(q.shape[0]):
        prefix = int(seq_lens[b])
        row_out, row_lse = [], []
        for i in range(q.shape[1]):
            path = root_to_node_path(None if parents is None else parents[b].tolist(), i)
            visible = list(range(prefix)) + [prefix + j for j in path]
            out, lse = tree_attention_node(q[b, i].double().tolist(), cache_vectors(k_cache, b, visible, block_table),
                                           cache_vectors(v_cache, b, visible, block_table), scale)
            row_out.append(out)
            row_lse.append(lse)
        outs.append(row_out)
        lses.append(row_lse)
    return outs, lses
