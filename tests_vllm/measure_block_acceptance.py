"""Accepted drafts per step in vLLM's CPU engine with our plugin: token-wise vs block verification
(SPECDEC_KERNELS_VLLM_VERIFICATION), the embedded default pair, draft-model speculation. Not a test
(pytest does not collect it); run it in the vLLM venv from this folder:

    cd tests_vllm && python measure_block_acceptance.py [--copies 8] [--tokens 128] \
        [--draft-sample-method probabilistic] [--temperature 1.0] [--out result.json]

One engine per rule (about a minute each to start on 2 cores), each running the same unseeded
requests (the conftest's five prompts, `--copies` times each). Prints and writes, per rule,
vLLM's spec-decode counts for those requests, accepted drafts per step with a standard error
from the distribution of accepted lengths (steps treated as independent), and the difference.
"""

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from conftest import PROMPTS, copy_model_dirs
from engine_support import run_engine
from test_engine import G, acceptance, draft_config, job, sampled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--copies", type=int, default=8, help="requests per prompt")
    parser.add_argument("--tokens", type=int, default=128, help="max_tokens per request")
    parser.add_argument("--draft-sample-method", default="probabilistic", choices=["probabilistic", "greedy"])
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--out", default=None, help="JSON file for the result")
    args = parser.parse_args()
    from transformers import AutoTokenizer
    root = Path(tempfile.mkdtemp())
    dirs = copy_model_dirs(root)
    tokenizer = AutoTokenizer.from_pretrained(dirs[0])
    ids = [tokenizer(text)["input_ids"] for text in PROMPTS]
    prompts = ids * args.copies
    spec = draft_config(dirs, draft_sample_method=args.draft_sample_method)
    runs = [("warm", ids[:1], [sampled(None, n=4)]),  # the measured run's counts: its snapshot minus this one's
            ("sampled", prompts, [sampled(None, n=args.tokens, temperature=args.temperature)] * len(prompts))]
    result = {"model_pair": "embedded default (6-layer target, 1-layer draft, V=4096)", "num_speculative_tokens": G,
              "draft_sample_method": args.draft_sample_method, "temperature": args.temperature,
              "requests": len(prompts), "max_tokens": args.tokens}
    for rule in ("token", "block"):
        engine = run_engine(root / rule, job(dirs, spec, runs), plugin=True,
                            extra_env={"SPECDEC_KERNELS_VLLM_VERIFICATION": rule})
        assert engine.ours("block_rows") == (engine.ours("random_rows") if rule == "block" else 0)
        result[rule] = acceptance(engine, "sampled", "warm")
        print(rule, result[rule], flush=True)
    token, block = result["token"], result["block"]
    result["difference_per_step"] = block["accepted_per_step"] - token["accepted_per_step"]
    result["standard_error_of_difference"] = (token["standard_error"] ** 2 + block["standard_error"] ** 2) ** 0.5
    print(f"accepted drafts per step: token {token['accepted_per_step']:.3f}, "
          f"block {block['accepted_per_step']:.3f}, difference {result['difference_per_step']:+.3f} (standard error {result['standard_error_of_difference']:.3f})")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
