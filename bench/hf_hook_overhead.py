"""What going through HF's `model.generate(custom_generate=specdec_kernels.custom_generate)` costs over
calling `specdec_kernels.generate` directly: the same speculative call both ways on the embedded default
pair (greedy, batch 1 and 4, one torch thread), interleaved call by call (the order alternating per round),
at max_new_tokens 1 (the fixed cost: HF's generation config, processors, criteria, our translation) and 48.
Reports the medians and the paired difference per round (median, quartiles) in ms and as a share of the
direct call. bench/e2e.py's ours_hf_hook rows show the same beside HF's own methods.

    python bench/hf_hook_overhead.py --out bench/results        # ~2 minutes on 2 CPU cores
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import write_report  # noqa: E402

import specdec_kernels  # noqa: E402
from specdec_kernels import custom_generate  # noqa: E402
from specdec_kernels.defaults import load_default_models  # noqa: E402

PROMPTS = ["def fibonacci(n):\n    ", "import os\n", "class Stack:\n    def __init__(self):\n        ",
           "for i in range(10):\n"]
COLS = ["batch", "max_new_tokens", "direct_ms", "hook_ms", "diff_ms", "diff_ms_quartiles", "overhead"]


def paired(direct, hook, rounds: int) -> tuple[list[float], list[float]]:
    times = {"direct": [], "hook": []}
    for r in range(rounds):
        order = (("direct", direct), ("hook", hook)) if r % 2 == 0 else (("hook", hook), ("direct", direct))
        for name, fn in order:
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times["direct"], times["hook"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--stem", default="hf_hook_overhead_cpu")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    models = load_default_models(device="cpu", dtype=torch.float32)
    target, draft, tokenizer = models.target, models.draft, models.tokenizer
    tokenizer.padding_side = "left"
    for model in (target, draft):
        model.generation_config.eos_token_id = None  # EOS off: every call makes max_new_tokens per row
    rows = []
    for batch in (1, 4):
        inputs = tokenizer(PROMPTS[:batch], return_tensors="pt", padding=True)
        for new in (1, 48):
            common = dict(num_draft_tokens=4, max_new_tokens=new, pad_token_id=0)  # greedy: no seed to pass
            direct = lambda: specdec_kernels.generate(target, inputs.input_ids, attention_mask=inputs.attention_mask,  # noqa: E731
                                                      strategy="speculative", draft_model=draft, eos_token_id=[], **common)
            hook = lambda: target.generate(**inputs, custom_generate=custom_generate, assistant_model=draft,  # noqa: E731
                                           do_sample=False, **common)
            assert torch.equal(direct().sequences, hook())  # the same call, the same tokens
            d, h = paired(direct, hook, args.rounds)
            diffs = [b - a for a, b in zip(d, h)]
            q1, _, q3 = statistics.quantiles(diffs, n=4)
            row = {"batch": batch, "max_new_tokens": new, "direct_ms": round(statistics.median(d) * 1e3, 2),
                   "hook_ms": round(statistics.median(h) * 1e3, 2), "diff_ms": round(statistics.median(diffs) * 1e3, 2),
                   "diff_ms_quartiles": f"{q1 * 1e3:.2f}..{q3 * 1e3:.2f}"}
            row["overhead"] = f"{statistics.median(diffs) / statistics.median(d):+.1%}"
            rows.append(row)
            print(row, flush=True)
    command = "python " + " ".join(["bench/hf_hook_overhead.py", *(sys.argv[1:] if argv is None else argv)])
    note = (f"fp32, 1 thread, embedded default pair, speculative (4 drafts), greedy, EOS off; {args.rounds} rounds, "
            "each calling both ways back to back (order alternating). diff: hook minus direct per round.")
    write_report(rows, Path(args.out), args.stem, "HF generate hook overhead", COLS, command, {"rounds": args.rounds},
                 note)


if __name__ == "__main__":
    main()
