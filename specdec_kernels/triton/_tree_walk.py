"""A token tree as lanes, for the Triton tree kernels (greedy and sampling walks).

A row's `parents` and `tree_tokens` are held as BLOCK_N = next_power_of_2(N) lanes. Node i's
children are the lanes j > i with parents[j] == i; the next one to try is the smallest such lane
above the last one tried, so siblings go in index order without building a children table.
"""

import triton
import triton.language as tl


@triton.jit
def load_tree(tok_ptr, par_ptr, b, n, stride_tb, stride_tn, stride_pb, stride_pn, BLOCK_N: tl.constexpr):
    """(lanes, parents, tokens) of row b as BLOCK_N lanes (parents -2, tokens -1 past n)."""
    lanes = tl.arange(0, BLOCK_N).to(tl.int64)
    in_tree = lanes < n
    par = tl.load(par_ptr + b * stride_pb + lanes * stride_pn, mask=in_tree, other=-2).to(tl.int64)
    tok = tl.load(tok_ptr + b * stride_tb + lanes * stride_tn, mask=in_tree, other=-1).to(tl.int64)
    return lanes, par, tok


@triton.jit
def next_child(par, lanes, cur, after, n):
    """The smallest lane j > after with parents[j] == cur (j > cur, j > 0), or n if none."""
    is_child = (par == cur) & (lanes > cur) & (lanes > after) & (lanes > 0) & (lanes < n)
    return tl.min(tl.where(is_child, lanes, n), axis=0)
