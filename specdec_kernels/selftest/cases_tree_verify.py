"""The tree_verify family's cases (tree_greedy_verify, tree_rejection_sample): one table per op.

A table row names a builder (tree_builders.py) and the axes it is expanded over, outermost first;
a Group shares its axes with its rows. The profiles' sizes live in TIERS only: "tiny" (the CPU
interpreter tests and the selftest's dev mode) holds the smallest shape and the crafted cases, with
some cases run through the Triton launcher with small tiles (`tiles`); "quick" and "full" add the
shapes x dtypes at production vocabularies and the GPU-size cases. The order of an op's rows is its
cases' order (the GPU quick tier spreads a sample over it)."""

from dataclasses import dataclass
from functools import partial
from itertools import chain
from typing import Callable

import torch

from . import tree_builders as b
from .compare import exact, expect, with_checks
from .model import DTYPES, Case
from .tree_inputs import MODES
from .tree_rows import FIRST_LEVEL, edge_rows_answer, exact_residual_row, greedy_edge_answer

OUTPUTS = ("output_tokens", "num_accepted", "accepted_nodes")
SMALL_SHAPES = ((1, 8, 1000), (4, 16, 32000))
# Past "tiny" every case runs the op itself: no Triton launcher tiles, no kernel split by hand.
THE_OP_ONLY = dict(tiles=False, splits=(None,), tile_splits=(None,), edge_tile_splits=(), block_vs=(None,),
                   star_block_vs=(None,))
# The profiles' sizes, set here only. shapes (B, N, V) x shape_dtypes: the generic cases; tiles: crafted cases
# run the Triton launcher with their small tiles; splits, tile_splits, edge_tile_splits: the greedy kernels by
# hand (split True / False; None: the op); block_vs, star_block_vs: the rejection launcher's BLOCK_V (None: the
# op's); gpu_batches, gpu_vocabs, sampled_shapes: the GPU-size cases (quick and full only).
TIERS = {
    # at "tiny" the generic shape is the graph case only (bfloat16): the crafted cases cover every dtype and
    # randomness mode there, and the interpreter is slow
    "tiny": dict(shapes=((2, 7, 40),), shape_dtypes=(torch.bfloat16,), tiles=True, splits=(None, True, False),
                 tile_splits=(True, False), edge_tile_splits=(True, False), block_vs=(16, None),
                 star_block_vs=(16,)),
    "quick": dict(THE_OP_ONLY, shapes=SMALL_SHAPES, shape_dtypes=DTYPES, gpu_batches=(4,), gpu_vocabs=(32000,),
                  sampled_shapes=((4, 12, 32000),), repeats=(20,)),
    "full": dict(THE_OP_ONLY, shapes=SMALL_SHAPES + ((8, 64, 151936), (64, 16, 151936), (256, 8, 32000)),
                 shape_dtypes=DTYPES, gpu_batches=(1, 4, 16), gpu_vocabs=(32000, 128256),
                 sampled_shapes=((1, 7, 1000), (4, 12, 32000), (16, 32, 128256)), repeats=(50,)),
}


# ---------------------------------------------------------------------------- running and judging

def _call(op, x, backend, launcher):
    """The op on `backend`; x["repeat"] = K: K calls back to back on the same inputs, their outputs stacked
    (the torch reference once, repeated: the stress is of the kernels' hand-offs and handed-back words)."""
    x = dict(x)
    repeat = x.pop("repeat", 1)
    calls = 1 if backend == "torch" else repeat
    outputs = [_call_once(op, x, backend, launcher) for _ in range(calls)]
    if repeat == 1:
        return outputs[0]
    return tuple(torch.stack([out[i] for out in outputs] * (repeat // calls)) for i in range(len(outputs[0])))


def _call_once(op, x, backend, launcher):
    from .. import ops, reference
    from ..common.registry import implementation

    x = dict(x)
    overrides = x.pop("triton_overrides", None)
    unvalidated = x.pop("unvalidated", False)
    if overrides is not None and backend == "triton":
        from ..triton import tree_verify as triton_module

        if implementation(op, "triton") is not getattr(triton_module, op):
            overrides = None  # the registered backend was replaced (a mutation test): judge the registered one
    if (overrides is not None and backend == "triton") or unvalidated:
        if x.get("max_depth") is None:
            x["max_depth"] = reference.max_tree_depth(x["parents"])
        if overrides is not None and backend == "triton":
            from ..triton import tree_verify as triton_module

            return getattr(triton_module, launcher)(**x, **overrides)
        return implementation(op, backend)(**x)
    return getattr(ops, op)(**x, backend=backend)


def run_rejection(x, backend):
    """tree_rejection_sample (the Triton launcher with the case's tiles, or the implementation itself
    for unvalidated ids)."""
    return _call("tree_rejection_sample", x, backend, "_launch_rejection")


def run_greedy(x, backend):
    return _call("tree_greedy_verify", x, backend, "_launch_greedy")


def structure(got, x):
    """Emitted tokens (up to num_accepted) in [0, V), -1 after; int64 outputs."""
    out, accepted, _ = got
    vocab = (x.get("target_probs") if x.get("target_probs") is not None else x["target_logits"]).shape[-1]
    if out.dtype != torch.int64 or accepted.dtype != torch.int64:
        return False
    emitted = torch.arange(out.shape[1], device=out.device).unsqueeze(0) <= accepted.unsqueeze(1)
    return bool(((out >= 0) & (out < vocab))[emitted].all()) and bool((out[~emitted] == -1).all())


STRUCTURE = expect("emitted tokens in [0, V) and -1 after them", structure)
EDGE_ANSWER = expect("the crafted rows' known answers", edge_rows_answer)
GREEDY_EDGE_ANSWER = expect("the crafted rows' known answers", greedy_edge_answer)
ROOT_ONLY = expect("nothing accepted, node 0 first", lambda got, x: got[1].tolist() == [0, 0, 0]
                   and got[2][:, 0].tolist() == [0, 0, 0])
PAST_BLOCK_N = expect("[2, 10] outputs, -1 from column 4", lambda got, x: tuple(got[0].shape) == (2, 10)
                      and bool((got[0][:, 4:] == -1).all()) and bool((got[2][:, 4:] == -1).all()))
MANY_REJECTED = expect("node 8 accepted at the first level, one accepted",
                       lambda got, x: got[2][:, FIRST_LEVEL].tolist() == [8] * 3 and got[1].tolist() == [1] * 3)
OUT_OF_RANGE_CHILDREN = expect("accepted [1, 0, 1], first nodes [3, -1, 1]",
                               lambda got, x: got[1].tolist() == [1, 0, 1]
                               and got[2][:, FIRST_LEVEL].tolist() == [3, -1, 1])


def _accepts_node(got, x, node):
    return int(got[2][0, FIRST_LEVEL]) == node


def edge_answer_unless_cut(cut, **_):
    return (EDGE_ANSWER,) if cut is None else ()


def greedy_edge_answer_unless_cut(cut, **_):
    return (GREEDY_EDGE_ANSWER,) if cut is None else ()


def exact_residual_checks(coin, **_):
    node = exact_residual_row(coin == "below both")[1]
    return (expect(f"first level accepts node {node}", partial(_accepts_node, node=node)),)


# ---------------------------------------------------------------------------- axes that depend on other axes

def every_other_mode_cuts(mode, **_):
    """A depth cut at 1 on every other randomness mode."""
    return (None, 1) if mode in ("uniforms32", "high uniforms32", "seed+offsets") else (None,)


def edge_mode_cuts(mode, **_):
    return (None, 0, 1) if mode in ("uniforms64", "seed+offsets") else (None,)


def greedy_gpu_cuts(n, **_):
    return (None, 0, 1, 3, n + 4) if n == 9 else (None,)  # below and past the tree


def sampling_gpu_cuts(n, **_):
    return (None, 0, 2, n + 3) if n == 9 else (None,)


def production_cuts(shape, **_):
    return (None, 1, shape[1] + 3)


def first_shape_bfloat16(shape, dtype, tier, **_):
    """The CUDA-graph cases: the profile's first shape, in bfloat16."""
    return shape == tier["shapes"][0] and dtype == torch.bfloat16


def is_float32(dtype, **_):
    return dtype == torch.float32


def first_gpu_vocab(vocab, tier, **_):
    return vocab == tier["gpu_vocabs"][0]


def split_tiles(split, **_):
    """Each greedy kernel by hand (split True / False); None: the op."""
    return None if split is None else dict(split=split)


def split_small_tiles(split, **_):
    return None if split is None else dict(split=split, block_v=16, tiles_per_program=1)


def block_v_16(**_):
    return dict(block_v=16)


def block_v_tiles(block_v, **_):
    return None if block_v is None else dict(block_v=block_v)


# ---------------------------------------------------------------------------- the tables

@dataclass(frozen=True)
class Row:
    """The cases of one builder: one per combination of its axes (outermost first). Axis values: a
    tuple, the name of a TIERS entry, or values(tier=, **outer axes). checks / graph / when: a value
    or fn(tier=, **axes); tiles(tier=, **axes): at "tiny", the Triton launcher's tiles (None: the op)."""
    name: str  # formatted with the axes and _labels(axes)
    build: Callable  # build(seed, device, **axes)
    axes: tuple = ()
    checks: tuple | Callable = ()
    tiles: Callable | None = None
    graph: bool | Callable = False
    when: Callable | None = None
    dtype: torch.dtype = torch.float32  # the case's dtype unless "dtype" is an axis


@dataclass(frozen=True)
class Group:
    """Rows sharing outer axes, known-answer checks, and the profiles they belong to."""
    axes: tuple
    rows: tuple
    checks: tuple = ()
    profiles: tuple = ("tiny", "quick", "full")


GPU_SIZES = ("quick", "full")
RAGGED_VOCABS = (1, 37, 300)
GPU_NODES = (1, 2, 9, 32)
STAR_MODES = ("high uniforms64", "seed", "int32 offsets")

GREEDY = (
    Row("{shape_name}", b.shape_greedy, (("shape", "shapes"), ("dtype", "shape_dtypes")), graph=first_shape_bfloat16),
    Group((), checks=(STRUCTURE,), rows=(
        Row("random trees B=4 N=9 V={vocab} ragged max_depth={cut}{split_label}", b.ragged_greedy,
            (("vocab", RAGGED_VOCABS), ("dtype", DTYPES), ("cut", (None, 0, 1)), ("split", "splits")),
            tiles=split_tiles),
        Row("16-wide tiles V={vocab} one tile per program{split_label}", b.small_tiles_greedy,
            (("vocab", (7, 300)), ("split", "tile_splits")), tiles=split_small_tiles),
        Row("B=0", b.empty_batch_greedy),
        Row("N=1 (root only){cut_label}", b.root_only_greedy, (("cut", (None, 2)),)),
        Row("max_depth=9 past BLOCK_N", b.deep_cut_greedy),
        Group((("dtype", DTYPES),), rows=(
            Row("edge rows (ties, NaN, all -inf, all NaN, +inf, -1 tokens){cut_label}", b.edge_rows_greedy,
                (("cut", (None, 1)),), checks=greedy_edge_answer_unless_cut),
            # BLOCK_V = 16: ties, all -inf and NaN rows over two tiles
            Row("edge rows over 16-wide tiles split={split}", b.edge_rows_greedy_tiles,
                (("split", "edge_tile_splits"),), tiles=split_small_tiles))),
        Row("ids >= V and < -1{split_label}", b.out_of_range_greedy, (("split", "splits"),), tiles=split_tiles),
        Row("strided inputs", b.strided_greedy, (("dtype", DTYPES),)))),
    Group((), profiles=GPU_SIZES, rows=(
        Group((("dtype", DTYPES),), rows=(
            Row("B={batch} N={n} V={vocab} garbage and out-of-range ids{cut_label}", b.garbage_greedy,
                (("vocab", "gpu_vocabs"), ("batch", "gpu_batches"), ("n", GPU_NODES), ("cut", greedy_gpu_cuts))),
            Row("adversarial rows (ties across chunks, NaN, inf, -0) V={vocab}", b.adversarial_greedy,
                (("vocab", "gpu_vocabs"),)))),
        Row("non-contiguous unaligned logits V=32001", b.unaligned_greedy, dtype=torch.float16),
        Row("out-of-range children never match", b.out_of_range_children, checks=(OUT_OF_RANGE_CHILDREN,)))),
)

SAMPLING = (
    Group((("shape", "shapes"), ("dtype", "shape_dtypes")), rows=(
        Row("{shape_name} uniforms", b.shape_uniforms, graph=first_shape_bfloat16),
        Row("{shape_name} sampled siblings", b.shape_sampled_siblings, graph=first_shape_bfloat16),
        Row("{shape_name} per-row seeds", b.shape_row_seeds, when=is_float32),
        Row("{shape_name} sampled siblings, per-row seeds", b.shape_sampled_row_seeds, when=is_float32))),
    Group((), checks=(STRUCTURE,), rows=(
        Row("random trees B=4 N=9 V={vocab} ragged {mode}{cut_label}", b.ragged_sampling,
            (("vocab", RAGGED_VOCABS), ("dtype", DTYPES), ("mode", MODES), ("cut", every_other_mode_cuts))),
        # BLOCK_V = 16 over V in {7, 300}: the residual passes and the int64 cdf cross tiles
        Row("16-wide tiles V={vocab} {mode}", b.small_tiles_sampling, (("vocab", (7, 300)), ("mode", MODES[1:])),
            tiles=block_v_16),
        Row("star of 7 siblings far from p {mode}", b.star_far_from_p, (("mode", MODES),)),
        Row("exact residual, coin {coin} float32(R) and R", b.exact_residual, (("coin", ("between", "below both")),),
            checks=exact_residual_checks),
        Row("B=0", b.empty_batch_sampling),
        Row("N=1 (root only) {mode}{cut_label}", b.root_only_sampling, (("cut", (None, 2)), ("mode", MODES)),
            checks=(ROOT_ONLY,), dtype=torch.bfloat16),
        Row("max_depth=9 past BLOCK_N {mode}", b.deep_cut_sampling, (("mode", MODES[1:3]),), checks=(PAST_BLOCK_N,)),
        Row("edge rows (zero/NaN/inf/negative/one-hot/duplicate) {mode}{cut_label}", b.edge_rows_sampling,
            (("dtype", DTYPES), ("mode", b.EDGE_MODES), ("cut", edge_mode_cuts)), checks=edge_answer_unless_cut),
        Row("ids >= V and < -1 {mode}", b.out_of_range_sampling, (("mode", MODES[1:]),)),
        Row("strided inputs {mode}", b.strided_sampling,
            (("dtype", DTYPES), ("mode", ("uniforms", "strided seeds and offsets")))),
        Row("9 + 4 siblings, 7 + 4 rejected {mode}{block_v_label}", b.many_rejected,
            (("mode", b.EDGE_MODES[:5]), ("block_v", "block_vs")), checks=(MANY_REJECTED,), tiles=block_v_tiles),
        Row("sampled siblings B=4 N=9 V=37 ragged {mode}{cut_label}", b.sampled_ragged,
            (("dtype", DTYPES), ("mode", b.HIGH_MODES), ("cut", every_other_mode_cuts))),
        Row("sampled siblings: 7 and 3 and 2 far from p {mode}{block_v_label}", b.sampled_star,
            (("mode", STAR_MODES), ("block_v", "star_block_vs")), tiles=block_v_tiles),
        Row("sampled siblings: NaN/inf/zero/negative rows, repeats {mode}", b.sampled_odd_rows,
            (("mode", STAR_MODES[:2]),)),
        Row("sampled siblings: strided {index_dtype_name} indices {mode}", b.sampled_strided,
            (("index_dtype", (torch.int32, torch.int64)), ("mode", ("high uniforms64", "per-row seeds and offsets"))),
            dtype=torch.float16))),
    Group((), profiles=GPU_SIZES, rows=(
        Group((("dtype", DTYPES),), rows=(
            Row("B={batch} N={n} V={vocab} garbage ids {mode}{cut_label}", b.garbage_sampling,
                (("vocab", "gpu_vocabs"), ("batch", "gpu_batches"), ("n", GPU_NODES), ("mode", MODES),
                 ("cut", sampling_gpu_cuts))),
            Group((("vocab", "gpu_vocabs"),), rows=(
                Row("adversarial rows (every fallback) V={vocab} {mode}", b.adversarial_sampling, (("mode", MODES),)),
                Row("wide trees 10/8/5 siblings V=32000 {drafts} {mode}", b.wide_tree,
                    (("mode", MODES), ("drafts", tuple(b.WIDE_SIBLINGS))), when=first_gpu_vocab))))),
        # sampled siblings (children drawn without replacement) at production vocabularies
        Row("sampled siblings {shape_name} {mode}{cut_label}", b.sampled_production,
            (("dtype", DTYPES), ("shape", "sampled_shapes"), ("mode", MODES), ("cut", production_cuts))),
        Row("non-contiguous unaligned inputs V=32000 {mode}", b.unaligned_sampling,
            (("mode", ("uniforms32", "per-row seeds")),), dtype=torch.float16),
        # back-to-back calls on long rejection chains: many stages a row, the words each call hands back zeroed
        Row("repeated calls x{repeat}: wide trees V=32000 {drafts}", b.repeated_wide_tree,
            (("drafts", tuple(b.WIDE_SIBLINGS)), ("repeat", "repeats")), dtype=torch.bfloat16))),
)

TABLES = (("tree_greedy_verify", run_greedy, GREEDY), ("tree_rejection_sample", run_rejection, SAMPLING))


# ---------------------------------------------------------------------------- expanding the tables

def tree_verify_cases(profile, device):
    tier = TIERS[profile]
    return list(chain.from_iterable(_expand(op, run, table, profile, tier, device, {}, ())
                                    for op, run, table in TABLES))


def _resolve(value, tier, axes):
    return value(tier=tier, **axes) if callable(value) else value


def _combinations(axes, outer, tier):
    """Every assignment of `axes` (outermost first) on top of the `outer` axes."""
    if not axes:
        yield outer
        return
    (axis, values), rest = axes[0], axes[1:]
    values = tier[values] if isinstance(values, str) else _resolve(values, tier, outer)
    for value in values:
        yield from _combinations(rest, {**outer, axis: value}, tier)


def _expand(op, run, entries, profile, tier, device, outer, checks):
    for entry in entries:
        if isinstance(entry, Group) and profile not in entry.profiles:
            continue
        for axes in _combinations(entry.axes, outer, tier):
            if isinstance(entry, Group):
                yield from _expand(op, run, entry.rows, profile, tier, device, axes, checks + entry.checks)
            elif entry.when is None or entry.when(tier=tier, **axes):
                yield _case(op, run, entry, tier, device, axes, checks)


def _case(op, run, row, tier, device, axes, checks):
    build = partial(row.build, device=device, **axes)
    tiles = _resolve(row.tiles, tier, axes) if tier["tiles"] and row.tiles is not None else None
    if tiles is not None:
        build = partial(_with_tiles, build, tiles)
    compare = with_checks(exact(OUTPUTS), *checks, *_resolve(row.checks, tier, axes))
    return Case(op, row.name.format(**_labels(axes)), axes.get("dtype", row.dtype), build, run, compare,
                _resolve(row.graph, tier, axes))


def _with_tiles(build, tiles, seed):
    return dict(build(seed), triton_overrides=tiles)


def _labels(axes):
    """The axes as the case names spell them: optional settings only when set."""
    cut, split, block_v = axes.get("cut"), axes.get("split"), axes.get("block_v")
    labels = dict(axes, cut_label="" if cut is None else f" max_depth={cut}",
                  split_label="" if split is None else f" split={split}",
                  block_v_label="" if block_v is None else f" block_v={block_v}")
    if "shape" in axes:
        labels["shape_name"] = "B={} N={} V={}".format(*axes["shape"])
    if "index_dtype" in axes:
        labels["index_dtype_name"] = str(axes["index_dtype"]).replace("torch.", "")
    return labels
