"""Every CUDA kernel once, at the selftest's tiny shapes: the program compute-sanitizer watches.

    compute-sanitizer --tool memcheck --error-exitcode 9 python bench/cuda_sanitize_driver.py
    compute-sanitizer --tool racecheck --error-exitcode 9 python bench/cuda_sanitize_driver.py
    python bench/cuda_sanitize_driver.py --device cpu --backend torch    # the dry run's stand-in

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
from specdec_kernels.selftest import CASE_FAMILIES


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--backend", default="cuda", choices=("cuda", "triton", "torch"))
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    failed = 0
    for family in CASE_FAMILIES:
        for case in family("tiny", device):
            if args.backend not in ops.implemented_backends(case.op):
                continue
            try:
                case.run(case.build(0), args.backend)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                status = "ran"
            except Exception as error:  # noqa: BLE001 - report and go on: the sanitizer log names the kernel
                failed += 1
                status = f"raised {type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
            print(f"{case.op} [{args.backend}] {case.name}: {status}", flush=True)
    print(f"cuda_sanitize_driver: {failed} call(s) raised", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
