"""Compile every Triton kernel of the package for a real GPU target on a machine without a GPU.

CI runs the Triton kernels under the interpreter, which never compiles them, so a kernel that
the interpreter accepts but Triton's compiler rejects (or that spills, or asks for more shared
memory than an SM has) would only show on a GPU. This script calls every op's `triton`
backend on CPU tensors at the benchmarks' shapes with Triton's own launch path doing the work,
but with three things swapped:
- Triton's active driver is a stand-in that reports the chosen target (sm_80 or sm_90), so
  Triton specialises arguments (16-byte alignment, integers equal to 1) exactly as on a GPU;
- every launch is a warm-up: compiled to a cubin, never run (outputs stay garbage);
- `specdec_kernels.triton._launch` plans for a GPU (tile sizes, dot modes, split counts
  from the target's SM count) instead of the interpreter.

It prints one JSON line per compiled kernel variant: the op and case that launched it, its
constexprs, launch options, shared memory, and from the cubin (cuobjdump, shipped with
Triton) registers, stack and local memory (spills); from the TTGIR, cp.async copies and
Hopper warp-group MMAs. Run it without TRITON_INTERPRET, once per target
(tests/test_triton_compile_targets.py does, for 80 and 90):

    env -u TRITON_INTERPRET python tests/triton_compile_targets.py --capability 90
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("run without TRITON_INTERPRET: the kernels must be JIT functions, not interpreted ones")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from sass_loops import local_in_loops  # noqa: E402

SM_COUNTS = {80: 108, 90: 132}  # A100, H100 SXM: the split counts are planned for these
CASE_NAMES = ("verify", "sampling", "tree_verify", "tree_attention", "kv_compact", "early_exit", "block")


class TargetDriver:
    """The part of Triton's driver interface a warm-up launch uses, for a GPU that is not here."""

    def __init__(self, capability: int):
        self.capability = capability

    def get_current_device(self) -> int:
        return self.capability  # one device per target: Triton keeps a kernel cache per device

    def get_current_stream(self, device=None) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", self.capability, 32)

    def is_active(self) -> bool:
        return True


def cubin_usage(cubin: bytes) -> dict:
    """REG / STACK / SHARED / LOCAL of the cubin's kernel, from Triton's bundled cuobjdump, and `local_in_loops`:
    the local-memory loads and stores (spills) that sit inside a loop of its SASS."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
    found = {key.lower(): int(value) for key, value in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", usage)}
    return {**found, "local_in_loops": local_in_loops(sass)}


def plain(value):
    """A constexpr as JSON (dtypes and other objects by name)."""
    return value if isinstance(value, (bool, int, float, str, type(None))) else str(value)


class Recorder:
    """Swaps JITFunction.run for a warm-up that records what each launch compiled."""

    def __init__(self):
        self.case = ("", "")
        self.seen: set = set()

    def install(self):
        original = JITFunction.run
        recorder = self

        def warm_up(fn, *args, grid, warmup, **kwargs):
            start = time.perf_counter()
            kernel = original(fn, *args, grid=grid, warmup=True, **kwargs)
            recorder.report(fn, kernel, time.perf_counter() - start)
            return kernel

        JITFunction.run = warm_up

    def report(self, fn, kernel, seconds: float):
        key = (fn.__name__, kernel.hash)
        if key in self.seen:  # the same variant from another case: compiled (and reported) once
            return
        self.seen.add(key)
        constexprs = {fn.arg_names[path[0]]: plain(value) for path, value in kernel.src.constants.items()
                      if len(path) == 1}
        ttgir = kernel.asm.get("ttgir", "")
        module = fn.fn.__module__.rsplit(".", 1)[-1]
        row = {"op": self.case[0], "case": self.case[1], "kernel": f"{module}.{fn.__name__}",
               "capability": kernel.metadata.target.arch, "num_warps": kernel.metadata.num_warps,
               "num_stages": kernel.metadata.num_stages, "dynamic_shared": kernel.metadata.shared,
               "async_copies": ttgir.count("async_copy_global_to_local"),
               "warp_group_dots": ttgir.count("warp_group_dot"), "seconds": round(seconds, 2),
               "constexprs": constexprs, **cubin_usage(kernel.asm["cubin"])}
        print(json.dumps(row), flush=True)


# ---------------------------------------------------------------------------------------------- cases
# Each case calls an op's triton backend at a shape the benchmarks or the decoding loop use;
# between them they reach every kernel and every constexpr branch that changes the code a lot.

def rand(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(dtype)


def verify_cases(ops, gen):
    for vocab, dtype in ((32000, torch.bfloat16), (128256, torch.float16), (50257, torch.float32)):
        logits = rand(gen, 4, 5, vocab, dtype=dtype)
        drafts = torch.randint(0, vocab, (4, 4), generator=gen)
        counts = torch.tensor([4, 2, 0, 3])
        tag = f"V{vocab}-{str(dtype)[6:]}"
        yield "greedy_verify", tag, lambda: ops.greedy_verify(logits, drafts, backend="triton")
        yield "greedy_verify", tag + "-ragged", lambda: ops.greedy_verify(logits, drafts, num_draft_tokens=counts,
                                                                            backend="triton")
        yield "relaxed_verify", tag, lambda: ops.relaxed_verify(logits, drafts, top_beta=3, tau=2.0, backend="triton")
        yield "bild_verify", tag, lambda: ops.bild_verify(logits, drafts, rollback_threshold=2.0,
                                                          num_draft_tokens=counts, backend="triton")
        yield "max_prob", tag, lambda: ops.max_prob(logits[:, 0], backend="triton")
    # int32 index tensors as column views: the kernels read them at their strides and width
    logits = rand(gen, 4, 5, 32000, dtype=torch.bfloat16)
    drafts = torch.randint(0, 32000, (4, 4, 2), generator=gen, dtype=torch.int32)[..., 0]
    counts = torch.tensor([[4, 0], [2, 0], [0, 0], [3, 0]], dtype=torch.int32)[:, 0]
    yield "greedy_verify", "int32-strided-ids", lambda: ops.greedy_verify(logits, drafts, num_draft_tokens=counts,
                                                                          backend="triton")


def sampling_cases(ops, gen):
    vocab, batch, g = 32000, 4, 4
    p = torch.softmax(rand(gen, batch, g + 1, vocab), -1)
    q = torch.softmax(rand(gen, batch, g, vocab), -1)
    drafts = torch.randint(0, vocab, (batch, g), generator=gen)
    counts = torch.tensor([4, 1, 0, 2])
    seeds = torch.arange(batch, dtype=torch.int64)
    offsets = torch.full((batch,), 7, dtype=torch.int64)
    uniforms = torch.rand(batch, g + 1, generator=gen)
    yield "rejection_sample", "seed", lambda: ops.rejection_sample(p, q, drafts, seed=3, backend="triton")
    yield "rejection_sample", "row-seeds-offsets-ragged", lambda: ops.rejection_sample(
        p, q, drafts, seed=seeds, offsets=offsets, num_draft_tokens=counts, backend="triton")
    yield "rejection_sample", "uniforms-bf16", lambda: ops.rejection_sample(
        p.bfloat16(), q.bfloat16(), drafts, uniforms=uniforms, backend="triton")
    for dtype in (torch.bfloat16, torch.float32):
        target, draft = rand(gen, batch, g + 1, vocab, dtype=dtype), rand(gen, batch, g, vocab, dtype=dtype)
        tag = str(dtype)[6:]
        yield "rejection_sample_logits", tag + "-seed", lambda: ops.rejection_sample_logits(
            target, draft, drafts, temperature=0.7, seed=3, backend="triton")
        yield "rejection_sample_logits", tag + "-row-temperatures", lambda: ops.rejection_sample_logits(
            target, draft, drafts, temperature=torch.full((batch,), 0.8), seed=seeds, offsets=offsets,
            num_draft_tokens=counts, backend="triton")
        yield "rejection_sample_logits", tag + "-uniforms", lambda: ops.rejection_sample_logits(
            target, draft, drafts, uniforms=uniforms, backend="triton")


def tree_verify_cases(ops, gen):
    vocab, batch, n = 32000, 2, 16
    parents = torch.tensor([-1] + [(i - 1) // 2 for i in range(1, n)]).expand(batch, n).contiguous()
    tokens = torch.randint(0, vocab, (batch, n), generator=gen)
    for nodes, dtype in ((n, torch.bfloat16), (4, torch.float32)):  # few rows per level: the split-V kernel
        logits = rand(gen, batch, nodes, vocab, dtype=dtype)
        yield "tree_greedy_verify", f"N{nodes}-{str(dtype)[6:]}", lambda: ops.tree_greedy_verify(
            logits, tokens[:, :nodes], parents[:, :nodes].contiguous(), backend="triton")
    # 96 rows of a 16-node tree of depth 1: B * N = 1536 > SPLIT_ROWS_PER_LEVEL * 2, one program per row
    # (compiled, never run: the logits need no values)
    wide = 96
    star = torch.tensor([-1] + [0] * (n - 1)).expand(wide, n).contiguous()
    logits = torch.empty(wide, n, vocab, dtype=torch.bfloat16)
    yield "tree_greedy_verify", "B16-star", lambda: ops.tree_greedy_verify(
        logits, torch.randint(0, vocab, (wide, n), generator=gen), star, backend="triton")
    p = torch.softmax(rand(gen, batch, n, vocab), -1)
    q = torch.softmax(rand(gen, batch, n, vocab), -1)
    yield "tree_rejection_sample", "seed", lambda: ops.tree_rejection_sample(p, q, tokens, parents, seed=5,
                                                                             backend="triton")
    yield "tree_rejection_sample", "uniforms", lambda: ops.tree_rejection_sample(
        p, q, tokens, parents, uniforms=torch.rand(batch, n, generator=gen), backend="triton")
    tokens32, parents32 = tokens.int().t().contiguous().t(), parents.int().t().contiguous().t()  # column-major int32
    yield "tree_rejection_sample", "int32-strided-seeds", lambda: ops.tree_rejection_sample(
        p, q, tokens32, parents32, seed=torch.arange(batch, dtype=torch.int32),
        offsets=torch.zeros(batch, 2, dtype=torch.int32)[:, 0], backend="triton")
    yield "tree_rejection_sample", "sampled-siblings", lambda: ops.tree_rejection_sample(
        p, q, tokens, parents, uniforms=torch.rand(batch, n, generator=gen), siblings="without_replacement",
        backend="triton")


def tree_attention_cases(ops, gen):
    from specdec_kernels.reference.attention import paged_from_contiguous
    hq, hkv = 32, 8
    for batch, prefix, n, d, dtype, page_size, tree in (
            (8, 4096, 32, 128, torch.bfloat16, None, True),  # the 70%-of-HBM target shape
            (8, 4096, 8, 128, torch.bfloat16, None, False),  # short chain: 64-row tiles
            (1, 512, 64, 128, torch.bfloat16, 16, True),  # paged, 64 nodes: 256 rows, two M blocks
            (2, 4096, 16, 64, torch.float16, 64, False),  # D 64, pages of whole tiles
            (1, 256, 8, 128, torch.float32, None, True)):  # the fp32 correctness path
        q = rand(gen, batch, n, hq, d, dtype=dtype)
        cache = rand(gen, batch, hkv, prefix + n, d, dtype=dtype)
        table = None
        if page_size:
            cache, table = paged_from_contiguous(cache, page_size, generator=gen)
        parents = (torch.arange(n) - 1).expand(batch, n).contiguous() if tree else None
        lens = torch.full((batch,), prefix)
        tag = (f"B{batch}-P{prefix}-N{n}-D{d}-{str(dtype)[6:]}-{'paged' if page_size else 'contiguous'}-"
               f"{'tree' if tree else 'chain'}")
        yield "tree_attention", tag, lambda: ops.tree_attention(q, cache, cache, lens, parents, block_table=table,
                                                                backend="triton")
    # int32 index tensors as views (column, interleaved): read at their strides and width
    batch, prefix, n, d, page_size = 2, 1024, 16, 128, 16
    q = rand(gen, batch, n, hq, d, dtype=torch.bfloat16)
    cache, table = paged_from_contiguous(rand(gen, batch, hkv, prefix + n, d, dtype=torch.bfloat16), page_size,
                                         generator=gen)
    table = torch.stack([table, table], -1)[..., 0].to(torch.int32)
    lens = torch.full((batch, 3), prefix, dtype=torch.int32)[:, 1]
    parents = (torch.arange(n, dtype=torch.int32) - 1).expand(batch, n).t().contiguous().t()
    yield "tree_attention", "int32-strided-indices-paged-tree-bfloat16", lambda: ops.tree_attention(
        q, cache, cache, lens, parents, block_table=table, backend="triton")


def kv_compact_cases(ops, gen):
    layers, batch, heads, seq, d = 4, 8, 8, 512, 128
    accepted = torch.tensor([[0, 1, 3, -1]] * batch)
    lens = torch.full((batch,), 300)
    stacked = rand(gen, layers, 2, batch, heads, seq, d, dtype=torch.bfloat16)
    yield "kv_compact", "one-allocation", lambda: ops.kv_compact(list(stacked[:, 0]), list(stacked[:, 1]), lens,
                                                                 accepted, backend="triton")
    k = [rand(gen, batch, heads, seq, d, dtype=torch.float16) for _ in range(layers)]
    v = [rand(gen, batch, heads, seq, d, dtype=torch.float16) for _ in range(layers)]
    yield "kv_compact", "separate-tensors", lambda: ops.kv_compact(k, v, lens, accepted, backend="triton")
    yield "kv_compact", "lengths-only", lambda: ops.kv_compact([], [], lens, accepted, backend="triton")


def early_exit_cases(ops, gen):
    hidden_size, vocab = 2048, 32000
    for batch, dtype, norm, k in ((1, torch.bfloat16, "rms", 1), (64, torch.bfloat16, "layer", 5),
                                  (8, torch.float16, "none", 16), (4, torch.float32, "rms", 2)):
        hidden = rand(gen, batch, hidden_size, dtype=dtype)
        weight = rand(gen, vocab, hidden_size, dtype=dtype)
        norm_weight = None if norm == "none" else rand(gen, hidden_size, dtype=dtype)
        norm_bias = rand(gen, hidden_size, dtype=dtype) if norm == "layer" else None
        yield "early_exit_topk", f"B{batch}-{str(dtype)[6:]}-{norm}-k{k}", lambda: ops.early_exit_topk(
            hidden, norm_weight, weight, k, norm="rms" if norm == "none" else norm, norm_bias=norm_bias,
            backend="triton")


def block_cases(ops, gen):
    """block_verify (probs, both randomness modes, ragged int32 rows) and block_verify_logits (both launches)."""
    vocab, batch, g = 151936, 2, 4
    p = torch.softmax(rand(gen, batch, g + 1, vocab), -1)
    q = torch.softmax(rand(gen, batch, g, vocab), -1)
    drafts = torch.randint(0, vocab, (batch, g), generator=gen)
    counts = torch.tensor([4, 1], dtype=torch.int32)
    uniforms = torch.rand(batch, g + 1, generator=gen)
    yield "block_verify", "seed", lambda: ops.block_verify(p, q, drafts, seed=3, backend="triton")
    yield "block_verify", "uniforms-bf16-ragged", lambda: ops.block_verify(
        p.bfloat16(), q.bfloat16(), drafts, uniforms=uniforms, num_draft_tokens=counts, backend="triton")
    target = rand(gen, batch, g + 1, vocab, dtype=torch.bfloat16)
    draft = rand(gen, batch, g, vocab, dtype=torch.bfloat16)
    yield "block_verify_logits", "bfloat16-row-temperatures", lambda: ops.block_verify_logits(
        target, draft, drafts, temperature=torch.full((batch,), 0.8), seed=torch.arange(batch),
        num_draft_tokens=counts, backend="triton")


CASES = {"verify": verify_cases, "sampling": sampling_cases, "tree_verify": tree_verify_cases,
         "tree_attention": tree_attention_cases, "kv_compact": kv_compact_cases, "early_exit": early_exit_cases,
         "block": block_cases}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--capability", type=int, choices=sorted(SM_COUNTS), default=90)
    parser.add_argument("--cases", nargs="*", choices=CASE_NAMES, default=list(CASE_NAMES))
    args = parser.parse_args()

    from specdec_kernels import ops
    from specdec_kernels.common import registry as _backend
    from specdec_kernels.triton import _launch
    _backend.triton_interpreting = lambda: True  # let CPU tensors through to the triton backend
    _launch.plans_for_gpu = lambda device: True
    _launch.sm_count = lambda device: SM_COUNTS[args.capability]
    driver.set_active(TargetDriver(args.capability))
    recorder = Recorder()
    recorder.install()
    gen = torch.Generator().manual_seed(0)
    for name in args.cases:
        for op, case, call in CASES[name](ops, gen):
            recorder.case = (op, case)
            call()
    return 0


if __name__ == "__main__":
    sys.exit(main())
