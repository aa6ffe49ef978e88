"""Record the compile key of every Triton launch the decoding loop makes, over a sweep of the
batch size B and the draft length g, on a machine without a GPU (nothing is compiled or run).

Triton compiles one kernel variant per distinct key: the constexpr values, each
non-constexpr argument's specialisation (an int equal to 1 becomes a constant, ints and
pointers divisible by 16 are marked so, unless the parameter is in `do_not_specialize`) and
the launch options (num_warps, num_stages). A value that changes with B or g in any of these
recompiles the kernel (hundreds of ms, on the CPU) in the middle of decoding, when rows
finish or the draft length adapts. Under TRITON_INTERPRET nothing is specialised, so this
script runs without it and goes through Triton's own launch path with:
- Triton's active driver the stand-in of tests/triton_compile_targets.py (an sm_90 target),
  so the arguments are specialised exactly as on an H100;
- `specdec_kernels.triton._launch` planning for a GPU with an H100's SM count;
- `knobs.runtime.jit_cache_hook` (called by JITFunction with the key before each compile,
  in triton 3.6 and 3.8 alike) recording the key and answering "skip": nothing compiles,
  nothing runs, the launcher returns garbage outputs.

Large tensors are `torch.empty` (never touched, so never paged in); model constants (V, H,
heads, head dim, layers) are real sizes so the launch plans are the GPU's.

Output, one JSON line each (tests/test_triton_recompiles.py reads them):
  {"variant": hash, "kernel": module.name, "constexprs": {...}, "specialised": {...}, "options": {...}}
      once per distinct key, `specialised` the non-constexpr arguments' attributes;
  {"point": true, "op": ..., "config": ..., "B": ..., "g": ...}
      before each call of an op;
  {"op": ..., "config": ..., "B": ..., "g": ..., "kernel": ..., "variant": hash}
      once per launch.

    env -u TRITON_INTERPRET python tests/triton_compile_keys.py [--ops greedy_verify ...]
"""

import argparse
import hashlib
import json
import os
import sys

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("run without TRITON_INTERPRET: the kernels must be JIT functions, not interpreted ones")

import torch  # noqa: E402
from triton import knobs  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from triton_compile_targets import SM_COUNTS, TargetDriver, plain  # noqa: E402

from specdec_kernels.common.limits import FUSED_MAX_K  # noqa: E402

CAPABILITY = 90
B_VALUES = (1, 2, 3, 5, 8, 16, 17, 33, 64, 100)
# draft lengths, tree sizes N, top-k widths: 15, 16 and 17 put g, g + 1 or N on a multiple of 16
G_VALUES = (1, 2, 3, 4, 5, 7, 8, 15, 16, 17)
VOCAB = 151936  # Qwen2's: the large split plans (a multiple of 16, like Llama's 32000 and 128256)


class KeyRecorder:
    """jit_cache_hook: record each launch's key and its parts, skip the compile."""

    def __init__(self, out=sys.stdout):
        self.out = out
        self.point: dict = {}
        self.seen: set = set()

    def __call__(self, *, key, fn, compile, **_):
        jit = fn.jit_function
        kernel = f"{jit.fn.__module__.rsplit('.', 1)[-1]}.{jit.fn.__name__}"
        variant = hashlib.sha1(f"{kernel}|{key}".encode()).hexdigest()[:12]
        if variant not in self.seen:
            self.seen.add(variant)
            declared = {p.name for p in jit.params if p.is_constexpr}
            names = jit.arg_names
            constexprs, specialised = {}, {}
            for path, attrs in compile["configs"][0].items():
                if attrs:  # e.g. tt.divisibility=16: a pointer or int known to be a multiple of 16
                    specialised[names[path[0]]] = ",".join(f"{a}={v}" for a, v in attrs)
            for path, value in compile["constants"].items():
                name = names[path[0]]
                if name in declared:
                    constexprs[name] = plain(value)
                else:  # an int argument equal to 1 (or a None) folded into the kernel as a constant
                    specialised[name] = f"=={plain(value)}"
            options = {name: compile[name] for name in ("num_warps", "num_stages", "num_ctas")}
            self.emit(variant=variant, kernel=kernel, constexprs=constexprs, specialised=specialised, options=options)
        self.emit(**self.point, kernel=kernel, variant=variant)
        return True  # "already handled": JITFunction.run returns without compiling or launching

    def emit(self, **row):
        self.out.write(json.dumps(row) + "\n")


# ---------------------------------------------------------------------------------------------- sweeps
# Each yields (config, B, g, call). One config is one engine setting (mode flags, dtypes,
# layouts): it stays fixed while B and g move, so its keys are compared with each other.

def empty(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype)


def chain_cases(op, ops):
    for batch in B_VALUES:
        for g in G_VALUES:
            logits = empty(batch, g + 1, VOCAB)
            drafts = torch.zeros(batch, g, dtype=torch.int64)
            counts = torch.arange(batch) % (g + 1)
            if op == "greedy_verify":
                yield "plain", batch, g, lambda: ops.greedy_verify(logits, drafts, backend="triton")
                yield "ragged", batch, g, lambda: ops.greedy_verify(logits, drafts, num_draft_tokens=counts,
                                                                    backend="triton")
            elif op == "relaxed_verify":
                yield "plain", batch, g, lambda: ops.relaxed_verify(logits, drafts, top_beta=3, tau=2.0,
                                                                    backend="triton")
            elif op == "bild_verify":
                yield "ragged", batch, g, lambda: ops.bild_verify(logits, drafts, rollback_threshold=2.0,
                                                                  num_draft_tokens=counts, backend="triton")
            elif op == "max_prob":
                yield "B-V", batch, g, lambda: ops.max_prob(empty(batch, VOCAB), backend="triton")
                yield "B-g+1-V", batch, g, lambda: ops.max_prob(logits, backend="triton")


def sampling_cases(op, ops):
    for batch in B_VALUES:
        for g in G_VALUES:
            drafts = torch.zeros(batch, g, dtype=torch.int64)
            counts = torch.arange(batch) % (g + 1)
            seeds = torch.arange(batch)
            offsets = torch.full((batch,), 7)
            uniforms = torch.full((batch, g + 1), 0.5)
            if op == "rejection_sample":
                p, q = empty(batch, g + 1, VOCAB, dtype=torch.float32), empty(batch, g, VOCAB, dtype=torch.float32)
                call = ops.rejection_sample
                extra = {}
            else:
                p, q = empty(batch, g + 1, VOCAB), empty(batch, g, VOCAB)
                call = ops.rejection_sample_logits
                extra = dict(temperature=0.7)
            yield "seed", batch, g, lambda: call(p, q, drafts, seed=3, backend="triton", **extra)
            yield "uniforms", batch, g, lambda: call(p, q, drafts, uniforms=uniforms, backend="triton", **extra)
            if op == "rejection_sample_logits":
                extra = dict(temperature=torch.full((batch,), 0.8))
            yield "row-seeds-offsets-ragged", batch, g, lambda: call(
                p, q, drafts, seed=seeds, offsets=offsets, num_draft_tokens=counts, backend="triton", **extra)


def block_cases(op, ops):
    """block_verify (probs) and block_verify_logits, in the configurations of sampling_cases."""
    for batch in B_VALUES:
        for g in G_VALUES:
            drafts = torch.zeros(batch, g, dtype=torch.int64)
            counts = torch.arange(batch) % (g + 1)
            seeds, offsets = torch.arange(batch), torch.full((batch,), 7)
            uniforms = torch.full((batch, g + 1), 0.5)
            if op == "block_verify":
                p, q = empty(batch, g + 1, VOCAB, dtype=torch.float32), empty(batch, g, VOCAB, dtype=torch.float32)
                call, extra, row_extra = ops.block_verify, {}, {}
            else:
                p, q = empty(batch, g + 1, VOCAB), empty(batch, g, VOCAB)
                call, extra = ops.block_verify_logits, dict(temperature=0.7)
                row_extra = dict(temperature=torch.full((batch,), 0.8))
            yield "seed", batch, g, lambda: call(p, q, drafts, seed=3, backend="triton", **extra)
            yield "uniforms", batch, g, lambda: call(p, q, drafts, uniforms=uniforms, backend="triton", **extra)
            yield "row-seeds-offsets-ragged", batch, g, lambda: call(
                p, q, drafts, seed=seeds, offsets=offsets, num_draft_tokens=counts, backend="triton", **row_extra)


def tree_parents(batch, n, shape):
    nodes = torch.arange(n)
    parents = (nodes - 1) // 2 if shape == "binary" else nodes - 1  # node 0: -1 either way
    return parents.expand(batch, n).contiguous()


# tree_greedy_verify's walk kernel runs once B * N > SPLIT_ROWS_PER_LEVEL * (depth + 1) (640 per level):
# every tree from B = 650 on (the logits are never touched: virtual memory only)
WALK_B_VALUES = (650, 700)


def tree_verify_cases(op, ops):
    for batch in B_VALUES + (WALK_B_VALUES if op == "tree_greedy_verify" else ()):
        for n in G_VALUES:
            tokens = torch.zeros(batch, n, dtype=torch.int64)
            if op == "tree_greedy_verify":
                logits = empty(batch, n, VOCAB)
                for shape in ("binary", "chain"):
                    parents = tree_parents(batch, n, shape)
                    yield shape, batch, n, lambda: ops.tree_greedy_verify(logits, tokens, parents, backend="triton")
            else:
                p, q = empty(batch, n, VOCAB, dtype=torch.float32), empty(batch, n, VOCAB, dtype=torch.float32)
                parents = tree_parents(batch, n, "binary")
                yield "seed", batch, n, lambda: ops.tree_rejection_sample(p, q, tokens, parents, seed=5,
                                                                          backend="triton")
                yield "uniforms", batch, n, lambda: ops.tree_rejection_sample(
                    p, q, tokens, parents, uniforms=torch.full((batch, n), 0.5), backend="triton")
                yield "row-seeds-offsets", batch, n, lambda: ops.tree_rejection_sample(
                    p, q, tokens, parents, seed=torch.arange(batch), offsets=torch.zeros(batch, dtype=torch.int64),
                    backend="triton")
                yield "sampled-siblings", batch, n, lambda: ops.tree_rejection_sample(
                    p, q, tokens, parents, seed=5, siblings="without_replacement", backend="triton")


def tree_attention_cases(op, ops):
    hq, hkv, d, capacity, page_size = 32, 8, 128, 4096, 16
    num_pages = 100 * capacity // page_size  # one pool for the largest batch: the pool does not shrink with B
    pool = empty(num_pages, page_size, hkv, d)
    for batch in B_VALUES:
        cache = empty(batch, hkv, capacity, d)
        table = torch.zeros(batch, capacity // page_size, dtype=torch.int32)
        lens = torch.full((batch,), 1000)
        for n in G_VALUES:
            q = empty(batch, n, hq, d)
            parents = tree_parents(batch, n, "binary")
            yield "chain", batch, n, lambda: ops.tree_attention(q, cache, cache, lens, None, backend="triton")
            yield "tree", batch, n, lambda: ops.tree_attention(q, cache, cache, lens, parents, backend="triton")
            yield "tree-paged", batch, n, lambda: ops.tree_attention(q, pool, pool, lens, parents, block_table=table,
                                                                     backend="triton")


def kv_compact_cases(op, ops):
    layers, heads, seq, d = 4, 8, 512, 128
    for batch in B_VALUES:
        stacked = empty(layers, 2, batch, heads, seq, d)
        # unevenly spaced layers (the device-table path), deterministically so: separate
        # allocations would be evenly spaced (the fast path) by the allocator's chance
        size = batch * heads * seq * d
        flat = empty(2 * layers * (size + 128 * 2 * layers))
        separate = [flat[i * size + 128 * i * i:][:size].view(batch, heads, seq, d) for i in range(2 * layers)]
        lens = torch.full((batch,), 300)
        for g in G_VALUES:
            accepted = torch.arange(g + 1).expand(batch, g + 1).contiguous()  # a path of the root and g nodes
            yield "one-allocation", batch, g, lambda: ops.kv_compact(list(stacked[:, 0]), list(stacked[:, 1]), lens,
                                                                     accepted, backend="triton")
            yield "table-layout", batch, g, lambda: ops.kv_compact(separate[:layers], separate[layers:], lens,
                                                                       accepted, backend="triton")
            yield "lengths-only", batch, g, lambda: ops.kv_compact([], [], lens, accepted, backend="triton")


def early_exit_cases(op, ops):
    hidden_size, vocab = 2048, 32000
    weight, norm_weight = empty(vocab, hidden_size), empty(hidden_size)
    for batch in B_VALUES:
        hidden = empty(batch, hidden_size)
        for k in (k for k in G_VALUES if k <= FUSED_MAX_K):  # the candidates per step: PPD drafts k of them
            yield "rms-bf16", batch, k, lambda: ops.early_exit_topk(hidden, norm_weight, weight, k, norm="rms",
                                                                    backend="triton")


CASES = {"greedy_verify": chain_cases, "relaxed_verify": chain_cases, "bild_verify": chain_cases,
         "max_prob": chain_cases, "rejection_sample": sampling_cases, "rejection_sample_logits": sampling_cases,
         "tree_greedy_verify": tree_verify_cases, "tree_rejection_sample": tree_verify_cases,
         "tree_attention": tree_attention_cases, "kv_compact": kv_compact_cases, "early_exit_topk": early_exit_cases,
         "block_verify": block_cases, "block_verify_logits": block_cases}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", nargs="*", choices=sorted(CASES), default=sorted(CASES))
    args = parser.parse_args()

    from specdec_kernels import ops
    from specdec_kernels.common import registry as _backend
    from specdec_kernels.triton import _launch
    _backend.triton_interpreting = lambda: True  # let CPU tensors through to the triton backend
    _launch.plans_for_gpu = lambda device: True
    _launch.sm_count = lambda device: SM_COUNTS[CAPABILITY]
    driver.set_active(TargetDriver(CAPABILITY))
    recorder = KeyRecorder()
    knobs.runtime.jit_cache_hook = recorder
    torch.set_num_threads(1)
    for op in args.ops:
        for config, batch, g, call in CASES[op](op, ops):
            recorder.point = dict(op=op, config=config, B=batch, g=g)
            recorder.emit(point=True, **recorder.point)  # the test checks every point launched something
            call()
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
