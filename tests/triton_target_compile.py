"""Compile the Triton tree_attention launches for real GPU targets on a machine without a GPU.

CI runs the Triton kernels under the interpreter, which never compiles them; this script
does what Triton's launcher would do on a GPU for a planned call (same argument types,
the same 16-divisibility and ==1 specialisations of pointers and integers) and compiles
each kernel to a cubin for sm_80 and sm_90 with Triton's bundled ptxas. It prints one JSON
line per kernel: shared memory, registers and stack (spills) from cuobjdump, whether the
hot loop was software-pipelined with cp.async and whether Hopper warp-group MMAs were used.
Run it without TRITON_INTERPRET (tests/test_triton_tree_attention_compile.py does):

    env -u TRITON_INTERPRET python tests/triton_target_compile.py
"""

import json
import os
import re
import subprocess
import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from specdec_kernels.triton import tree_attention as ta

TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int64: "i64", torch.int32: "i32"}
LAUNCH_OPTIONS = ("num_warps", "num_stages")
# (target capability, dtype, N, Hq, Hkv, D, page size or None, tree, splits): the shapes the benchmark runs
CASES = [(90, torch.bfloat16, 32, 32, 8, 128, 16, True, 3), (90, torch.bfloat16, 8, 32, 8, 128, None, False, 1),
         (80, torch.float16, 64, 32, 8, 64, None, True, 2)]


def signature(kernel, args, meta):
    """(signature, constexprs, attrs) as Triton's launcher specialises this call."""
    sig, constexprs, attrs = {}, {}, {}
    for i, (name, value) in enumerate(zip(kernel.arg_names, args)):
        if isinstance(value, torch.Tensor):
            sig[name] = "*" + TYPES[value.dtype]
            if value.data_ptr() % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            sig[name] = "fp32"
        elif value == 1:  # Triton turns an integer argument equal to 1 into a constant
            sig[name], constexprs[name] = "constexpr", 1
        else:
            sig[name] = "i32" if -2**31 <= value < 2**31 else "i64"
            if value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    for name, value in meta.items():
        if name not in LAUNCH_OPTIONS:
            sig[name], constexprs[name] = "constexpr", value
    return sig, constexprs, attrs


def resource_usage(cubin: bytes, tag: str) -> dict:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return {}
    path = f"/tmp/specdec_{os.getpid()}_{tag}.cubin"
    with open(path, "wb") as f:
        f.write(cubin)
    try:
        usage = subprocess.run([tool, "--dump-resource-usage", path], capture_output=True, text=True).stdout
    finally:
        os.remove(path)
    found = dict(re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", usage))
    return {key.lower(): int(value) for key, value in found.items()}


def compile_case(capability, dtype, n, hq, hkv, d, page_size, tree, splits):
    gen = torch.Generator().manual_seed(0)
    batch, prefix = 2, 256
    q = torch.randn(batch, n, hq, d, generator=gen).to(dtype)
    cache = torch.randn(batch, hkv, prefix + n, d, generator=gen).to(dtype)
    block_table = None
    if page_size:
        from specdec_kernels.reference.attention import paged_from_contiguous
        cache, block_table = paged_from_contiguous(cache, page_size, generator=gen)
    parents = (torch.arange(n) - 1).expand(batch, n).contiguous() if tree else None
    _, _, launches = ta.plan(q, cache, cache, torch.full((batch,), prefix), parents, block_table, sm_scale=0.1,
                             num_splits=splits)
    for kernel, _, args, meta in launches:
        meta = {**meta, "UPCAST": False} if "UPCAST" in meta else meta  # as on a GPU
        sig, constexprs, attrs = signature(kernel, args, meta)
        compiled = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=attrs),
                                  target=GPUTarget("cuda", capability, 32),
                                  options={k: meta[k] for k in LAUNCH_OPTIONS if k in meta})
        ttgir = compiled.asm["ttgir"]
        tag = f"{kernel.__name__}-sm{capability}-{TYPES[dtype]}-N{n}-D{d}-{'paged' if page_size else 'contiguous'}"
        print(json.dumps({"case": tag, "kernel": kernel.__name__, "capability": capability, "dtype": TYPES[dtype],
                          "block_m": meta.get("BLOCK_M"), "async_copies": ttgir.count("async_copy_global_to_local"),
                          "warp_group_dots": ttgir.count("warp_group_dot"), "dynamic_shared": compiled.metadata.shared,
                          **resource_usage(compiled.asm["cubin"], tag)}),
              flush=True)


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("run without TRITON_INTERPRET", file=sys.stderr)
        return 2
    for case in CASES:
        compile_case(*case)
    return 0


if __name__ == "__main__":
    sys.exit(main())
