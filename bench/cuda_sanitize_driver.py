"""Every CUDA kernel once, at the selftest's tiny shapes: the program compute-sanitizer watches.

    compute-sanitizer --tool memcheck --error-exitcode 9 python bench/cuda_sanitize_driver.py
    compute-sanitizer --tool racecheck --error-exitcode 9 python bench/cuda_sanitize_driver.py
    python bench/cuda_sanitize_driver.py --device cpu --backend torch    # the dry run's stand-in
    ... --ops tree_rejection_sample,block_verify --cases-per-op 2 --forms split,cluster   # the first call's
        memcheck: the changed kernels only, a sample of each op's cases (first and last), each tree form

Under the sanitizers a kernel runs 10-100x slower, so the selftest's tiny cases (every op, every
dtype, chains and trees, contiguous and paged KV) call each kernel once and compare nothing: the
selftest and pytest judge the answers, the sanitizers judge the memory accesses and shared-memory
races. Run with PYTORCH_NO_CUDA_MEMORY_CACHING=1 so an out-of-bounds write lands outside any
allocation instead of inside torch's cached pool, where memcheck cannot see it.
Prints one line per call; exits 1 if a call raised.
"""

import argparse
import sys

import torch

from specdec_kernels import ops
from specdec_kernels.cuda.tree_verify import forced_tree_form
from specdec_kernels.selftest import CASE_FAMILIES
from specdec_kernels.selftest.tiers import spread

TREE_FORM_REFUSAL = "the cluster form"  # the CUDA tree plan's reason where a forced form cannot run a shape


def call(case, backend: str, device: torch.device, form: str | None) -> tuple[str, bool]:
    """(what happened, whether it counts as a failure) for one call of the case, in `form` (SPECDEC_TREE_FORM)."""
    try:
        with forced_tree_form(form):
            case.run(case.build(0), backend)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return "ran", False
    except Exception as error:  # noqa: BLE001 - report and go on: the sanitizer log names the kernel
        text = str(error).splitlines()[0][:200] if str(error) else ""
        if form is not None and isinstance(error, ValueError) and TREE_FORM_REFUSAL in text:
            return f"refused by the plan: {text}", False
        return f"raised {type(error).__name__}: {text}", True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--backend", default="cuda", choices=("cuda", "triton", "torch"))
    parser.add_argument("--ops", help="only these ops, in this order (default: every op)")
    parser.add_argument("--cases-per-op", type=int, help="at most this many tiny cases per op, spread (default: all)")
    parser.add_argument("--forms", help="tree_rejection_sample once in each of these forms (SPECDEC_TREE_FORM)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    wanted = [name for name in (args.ops or "").split(",") if name]
    cases = [case for family in CASE_FAMILIES for case in family("tiny", device)
             if args.backend in ops.implemented_backends(case.op) and (not wanted or case.op in wanted)]
    by_op: dict[str, list] = {}
    for case in cases:
        by_op.setdefault(case.op, []).append(case)
    failed = 0
    for op in wanted or list(by_op):
        for case in spread(by_op.get(op, []), args.cases_per_op):
            forms = [None]
            if args.forms and op == "tree_rejection_sample":
                forms = [form for form in args.forms.split(",") if form]
            for form in forms:
                status, bad = call(case, args.backend, device, form)
                failed += bad
                label = "" if form is None else f" [{form} form]"
                print(f"{case.op} [{args.backend}] {case.name}{label}: {status}", flush=True)
    print(f"cuda_sanitize_driver: {failed} call(s) raised", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
