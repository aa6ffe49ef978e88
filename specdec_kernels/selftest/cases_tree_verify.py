"""The tree_verify family's cases (tree_greedy_verify, tree_rejection_sample), built from tree_builders.py.

"tiny" (the CPU interpreter tests and the selftest's dev mode) holds the smallest shape and the crafted
cases, some run through the Triton launcher with small tiles (a `tiles` setting); "quick" and "full" add
the shapes x dtypes at production vocabularies and the GPU-size cases. An op's rows are in its cases'
order (the GPU quick tier spreads a sample over it)."""

import torch

from . import tree_builders as b
from .compare import exact, expect, with_checks
from .model import DTYPES, Row, cases
from .tree_inputs import FIRST_LEVEL, MODES, edge_rows_answer, exact_residual_row, greedy_edge_answer

OUTPUTS = ("output_tokens", "num_accepted", "accepted_nodes")
F32 = torch.float32
SMALL_SHAPES = ((1, 8, 1000), (4, 16, 32000))
# Past "tiny" every case runs the op itself: no Triton launcher tiles, no kernel split by hand.
THE_OP_ONLY = dict(tiles=False, gpu_rows=True, splits=(None,), tile_splits=(None,), edge_tile_splits=(),
                   block_vs=(None,), star_block_vs=(None,))
# The profiles' sizes, set here only. shapes (B, N, V) x shape_dtypes: the generic cases; tiles: crafted cases
# run the Triton launcher with their small tiles; splits, tile_splits, edge_tile_splits: the greedy kernels by
# hand (split True / False; None: the op); block_vs, star_block_vs: the rejection launcher's BLOCK_V (None: the
# op's); gpu_rows, gpu_batches, gpu_vocabs, sampled_shapes, repeats: the GPU-size cases (quick and full only).
TIERS = {
    # at "tiny" the generic shape is the graph case only (bfloat16): the crafted cases cover every dtype and
    # randomness mode there, and the interpreter is slow
    "tiny": dict(shapes=((2, 7, 40),), shape_dtypes=(torch.bfloat16,), tiles=True, gpu_rows=False,
                 splits=(None, True, False), tile_splits=(True, False), edge_tile_splits=(True, False),
                 block_vs=(16, None), star_block_vs=(16,)),
    "quick": dict(THE_OP_ONLY, shapes=SMALL_SHAPES, shape_dtypes=DTYPES, gpu_batches=(4,), gpu_vocabs=(32000,),
                  sampled_shapes=((4, 12, 32000),), repeats=(20,)),
    "full": dict(THE_OP_ONLY, shapes=SMALL_SHAPES + ((8, 64, 151936), (64, 16, 151936), (256, 8, 32000)),
                 shape_dtypes=DTYPES, gpu_batches=(1, 4, 16), gpu_vocabs=(32000, 128256),
                 sampled_shapes=((1, 7, 1000), (4, 12, 32000), (16, 32, 128256)), repeats=(50,)),
}
RAGGED_VOCABS = (1, 37, 300)
GPU_NODES = (1, 2, 9, 32)
STAR_MODES = ("high uniforms64", "seed", "int32 offsets")
EVERY_OTHER = ("uniforms32", "high uniforms32", "seed+offsets")  # the modes that also get a depth cut at 1


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
    """On Triton with the case's tiles: the family's launcher (unless the registered backend was replaced,
    a mutation test); unvalidated ids (>= V, < -1): the backend's implementation, past the op's checks."""
    from .. import ops, reference
    from ..common.registry import implementation

    x = dict(x)
    tiles = x.pop("triton_overrides", None)
    unvalidated = x.pop("unvalidated", False)
    if (tiles is not None and backend == "triton") or unvalidated:
        x["max_depth"] = reference.max_tree_depth(x["parents"]) if x.get("max_depth") is None else x["max_depth"]
    if tiles is not None and backend == "triton":
        from ..triton import tree_verify as triton_module

        if implementation(op, "triton") is getattr(triton_module, op):
            return getattr(triton_module, launcher)(**x, **tiles)
    if unvalidated:
        return implementation(op, backend)(**x)
    return getattr(ops, op)(**x, backend=backend)


def run_rejection(x, backend):
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


def judged(*checks):
    """Exact outputs, then the known answers `checks`."""
    return with_checks(exact(OUTPUTS), *checks)


def tiles(tier, **sizes):
    """The Triton launcher's tiles at "tiny"; None (the op's own) elsewhere or where a size is None."""
    return sizes if tier["tiles"] and None not in sizes.values() else None


def split_tiles(tier, split):
    """The greedy kernel `split` over 16-wide vocabulary tiles, one tile per program."""
    return tiles(tier, split=split, block_v=16, tiles_per_program=1)


def label(name, value):
    """An optional setting as the case names spell it: only when set."""
    return "" if value is None else f" {name}={value}"


def shape_name(shape):
    return "B={} N={} V={}".format(*shape)


def cuts(mode, cut_modes, more):
    """(None, *more) on the randomness modes `cut_modes`, else None alone."""
    return (None, *more) if mode in cut_modes else (None,)


# ---------------------------------------------------------------------------- tree_greedy_verify

def _greedy_rows(tier):
    checked = judged(STRUCTURE)
    rows = [Row(shape_name(shape), dtype, b.shape_greedy, dict(shape=shape, dtype=dtype), judged(),
                graph=shape == tier["shapes"][0] and dtype == torch.bfloat16)
            for shape in tier["shapes"] for dtype in tier["shape_dtypes"]]
    rows += [Row(f"random trees B=4 N=9 V={vocab} ragged max_depth={cut}{label('split', split)}", dtype,
                 b.ragged, dict(vocab=vocab, dtype=dtype, cut=cut, tiles=tiles(tier, split=split)), checked)
             for vocab in RAGGED_VOCABS for dtype in DTYPES for cut in (None, 0, 1) for split in tier["splits"]]
    rows += [Row(f"16-wide tiles V={vocab} one tile per program{label('split', split)}", F32, b.small_tiles,
                 dict(vocab=vocab, tiles=split_tiles(tier, split)), checked)
             for vocab in (7, 300) for split in tier["tile_splits"]]
    rows.append(Row("B=0", F32, b.empty_batch, dict(greedy=True), checked))
    rows += [Row(f"N=1 (root only){label('max_depth', cut)}", F32, b.root_only, dict(cut=cut), checked)
             for cut in (None, 2)]
    rows.append(Row("max_depth=9 past BLOCK_N", F32, b.deep_cut, {}, checked))
    for dtype in DTYPES:
        rows += [Row(f"edge rows (ties, NaN, all -inf, all NaN, +inf, -1 tokens){label('max_depth', cut)}", dtype,
                     b.edge_rows_greedy, dict(dtype=dtype, cut=cut),
                     judged(STRUCTURE, *(() if cut is not None else (GREEDY_EDGE_ANSWER,))))
                 for cut in (None, 1)]
        # BLOCK_V = 16: ties, all -inf and NaN rows over two tiles
        rows += [Row(f"edge rows over 16-wide tiles split={split}", dtype, b.edge_rows_greedy,
                     dict(dtype=dtype, cut=2, tiles=split_tiles(tier, split)), checked)
                 for split in tier["edge_tile_splits"]]
    rows += [Row(f"ids >= V and < -1{label('split', split)}", F32, b.out_of_range,
                 dict(tiles=tiles(tier, split=split)), checked) for split in tier["splits"]]
    return rows + [Row("strided inputs", dtype, b.strided, dict(dtype=dtype), checked) for dtype in DTYPES]


def _gpu_greedy_rows(tier):
    """Garbage and out-of-range ids, adversarial logits, unaligned inputs at GPU sizes."""
    rows = []
    for dtype in DTYPES:
        rows += [Row(f"B={batch} N={n} V={vocab} garbage and out-of-range ids{label('max_depth', cut)}", dtype,
                     b.garbage_greedy, dict(dtype=dtype, vocab=vocab, batch=batch, n=n, cut=cut), judged())
                 for vocab in tier["gpu_vocabs"] for batch in tier["gpu_batches"] for n in GPU_NODES
                 for cut in ((None, 0, 1, 3, n + 4) if n == 9 else (None,))]  # below and past the tree
        rows += [Row(f"adversarial rows (ties across chunks, NaN, inf, -0) V={vocab}", dtype, b.adversarial_greedy,
                     dict(dtype=dtype, vocab=vocab), judged()) for vocab in tier["gpu_vocabs"]]
    return rows + [Row("non-contiguous unaligned logits V=32001", torch.float16, b.unaligned_greedy, {}, judged()),
                   Row("out-of-range children never match", F32, b.out_of_range_children, {},
                       judged(OUT_OF_RANGE_CHILDREN))]


# ---------------------------------------------------------------------------- tree_rejection_sample

# (name, sampled siblings, per-row seeds) of the sampling shape cases; per-row seeds in float32 only
SHAPE_KINDS = (("uniforms", False, False), ("sampled siblings", True, False), ("per-row seeds", False, True),
               ("sampled siblings, per-row seeds", True, True))


def _sampling_shape_rows(tier):
    return [Row(f"{shape_name(shape)} {kind}", dtype, b.shape_sampling,
                dict(shape=shape, dtype=dtype, sampled=sampled, row_seeds=row_seeds), judged(),
                graph=shape == tier["shapes"][0] and dtype == torch.bfloat16)
            for shape in tier["shapes"] for dtype in tier["shape_dtypes"] for kind, sampled, row_seeds in SHAPE_KINDS
            if dtype == F32 or not row_seeds]


def _sampling_rows(tier):
    checked = judged(STRUCTURE)
    rows = _sampling_shape_rows(tier)
    rows += [Row(f"random trees B=4 N=9 V={vocab} ragged {mode}{label('max_depth', cut)}", dtype, b.ragged,
                 dict(vocab=vocab, dtype=dtype, mode=mode, cut=cut), checked)
             for vocab in RAGGED_VOCABS for dtype in DTYPES for mode in MODES for cut in cuts(mode, EVERY_OTHER, (1,))]
    # BLOCK_V = 16 over V in {7, 300}: the residual passes and the int64 cdf cross tiles
    rows += [Row(f"16-wide tiles V={vocab} {mode}", F32, b.small_tiles,
                 dict(vocab=vocab, mode=mode, tiles=tiles(tier, block_v=16)), checked)
             for vocab in (7, 300) for mode in MODES[1:]]
    rows += [Row(f"star of 7 siblings far from p {mode}", F32, b.star_far_from_p, dict(mode=mode), checked)
             for mode in MODES]
    for coin in ("between", "below both"):
        node = exact_residual_row(coin == "below both")[1]
        rows.append(Row(f"exact residual, coin {coin} float32(R) and R", F32, b.exact_residual, dict(coin=coin),
                        judged(STRUCTURE, expect(f"first level accepts node {node}",
                                                 lambda got, x, node=node: int(got[2][0, FIRST_LEVEL]) == node))))
    rows.append(Row("B=0", F32, b.empty_batch, dict(greedy=False), checked))
    rows += [Row(f"N=1 (root only) {mode}{label('max_depth', cut)}", torch.bfloat16, b.root_only,
                 dict(cut=cut, mode=mode), judged(STRUCTURE, ROOT_ONLY)) for cut in (None, 2) for mode in MODES]
    rows += [Row(f"max_depth=9 past BLOCK_N {mode}", F32, b.deep_cut, dict(mode=mode),
                 judged(STRUCTURE, PAST_BLOCK_N)) for mode in MODES[1:3]]
    rows += [Row(f"edge rows (zero/NaN/inf/negative/one-hot/duplicate) {mode}{label('max_depth', cut)}", dtype,
                 b.edge_rows_sampling, dict(dtype=dtype, mode=mode, cut=cut),
                 judged(STRUCTURE, *(() if cut is not None else (EDGE_ANSWER,))))
             for dtype in DTYPES for mode in b.EDGE_MODES for cut in cuts(mode, ("uniforms64", "seed+offsets"), (0, 1))]
    rows += [Row(f"ids >= V and < -1 {mode}", F32, b.out_of_range, dict(mode=mode), checked)
             for mode in MODES[1:]]
    rows += [Row(f"strided inputs {mode}", dtype, b.strided, dict(dtype=dtype, mode=mode), checked)
             for dtype in DTYPES for mode in ("uniforms", "strided seeds and offsets")]
    return rows + [Row(f"9 + 4 siblings, 7 + 4 rejected {mode}{label('block_v', block_v)}", F32, b.many_rejected,
                       dict(mode=mode, tiles=tiles(tier, block_v=block_v)), judged(STRUCTURE, MANY_REJECTED))
                   for mode in b.EDGE_MODES[:5] for block_v in tier["block_vs"]]


def _sampled_sibling_rows(tier):
    """siblings="without_replacement": children drawn without replacement from the parent's draft row."""
    checked = judged(STRUCTURE)
    rows = [Row(f"sampled siblings B=4 N=9 V=37 ragged {mode}{label('max_depth', cut)}", dtype, b.sampled_ragged,
                dict(dtype=dtype, mode=mode, cut=cut), checked)
            for dtype in DTYPES for mode in b.HIGH_MODES for cut in cuts(mode, EVERY_OTHER, (1,))]
    rows += [Row(f"sampled siblings: 7 and 3 and 2 far from p {mode}{label('block_v', block_v)}", F32, b.sampled_star,
                 dict(mode=mode, tiles=tiles(tier, block_v=block_v)), checked)
             for mode in STAR_MODES for block_v in tier["star_block_vs"]]
    rows += [Row(f"sampled siblings: NaN/inf/zero/negative rows, repeats {mode}", F32, b.sampled_odd_rows,
                 dict(mode=mode), checked) for mode in STAR_MODES[:2]]
    return rows + [Row(f"sampled siblings: strided {str(index_dtype)[6:]} indices {mode}", torch.float16,
                       b.sampled_strided, dict(index_dtype=index_dtype, mode=mode), checked)
                   for index_dtype in (torch.int32, torch.int64)
                   for mode in ("high uniforms64", "per-row seeds and offsets")]


def _gpu_sampling_rows(tier):
    """Garbage ids, adversarial probabilities, wide trees, sampled siblings, unaligned inputs at GPU sizes."""
    rows = []
    for dtype in DTYPES:
        rows += [Row(f"B={batch} N={n} V={vocab} garbage ids {mode}{label('max_depth', cut)}", dtype,
                     b.garbage_sampling, dict(dtype=dtype, vocab=vocab, batch=batch, n=n, mode=mode, cut=cut), judged())
                 for vocab in tier["gpu_vocabs"] for batch in tier["gpu_batches"] for n in GPU_NODES for mode in MODES
                 for cut in ((None, 0, 2, n + 3) if n == 9 else (None,))]
        for vocab in tier["gpu_vocabs"]:
            rows += [Row(f"adversarial rows (every fallback) V={vocab} {mode}", dtype, b.adversarial_sampling,
                         dict(dtype=dtype, vocab=vocab, mode=mode), judged()) for mode in MODES]
            rows += [Row(f"wide trees 10/8/5 siblings V=32000 {drafts} {mode}", dtype, b.wide_tree,
                         dict(dtype=dtype, mode=mode, drafts=drafts), judged())
                     for mode in MODES for drafts in b.WIDE_SIBLINGS if vocab == tier["gpu_vocabs"][0]]
    # sampled siblings (children drawn without replacement) at production vocabularies
    rows += [Row(f"sampled siblings {shape_name(shape)} {mode}{label('max_depth', cut)}", dtype, b.sampled_production,
                 dict(dtype=dtype, shape=shape, mode=mode, cut=cut), judged())
             for dtype in DTYPES for shape in tier["sampled_shapes"] for mode in MODES
             for cut in (None, 1, shape[1] + 3)]
    rows += [Row(f"non-contiguous unaligned inputs V=32000 {mode}", torch.float16, b.unaligned_sampling,
                 dict(mode=mode), judged()) for mode in ("uniforms32", "per-row seeds")]
    # back-to-back calls on long rejection chains: many stages a row, the words each call hands back zeroed
    return rows + [Row(f"repeated calls x{repeat}: wide trees V=32000 {drafts}", torch.bfloat16, b.repeated_wide_tree,
                       dict(drafts=drafts, repeat=repeat), judged())
                   for drafts in b.WIDE_SIBLINGS for repeat in tier["repeats"]]


def tree_verify_cases(profile, device):
    tier = TIERS[profile]
    greedy, sampling = _greedy_rows(tier), _sampling_rows(tier) + _sampled_sibling_rows(tier)
    if tier["gpu_rows"]:
        greedy, sampling = greedy + _gpu_greedy_rows(tier), sampling + _gpu_sampling_rows(tier)
    return (cases("tree_greedy_verify", run_greedy, greedy, device)
            + cases("tree_rejection_sample", run_rejection, sampling, device))
