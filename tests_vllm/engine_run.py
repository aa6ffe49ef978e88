"""Run vLLM's offline engine once, in its own process, and write what it generated as JSON.

    python engine_run.py job.json result.json

job.json: {"model", "speculative_config" (or null), "tensor_parallel_size", "runs": [{"name",
"prompts": [[ids]], "params": [SamplingParams kwargs per prompt]}]}. result.json: {"runs":
{name: [[ids] per prompt]}, "metrics": {spec-decode counter: value}, "snapshots": {name: the
metrics after that run}, "start_s", "generate_s"}.

A process per engine keeps every test independent of the engine before it (vLLM spawns its
engine core and workers, reads the plugin switch from the environment in each of them, and
loads plugins once per process); the `__main__` guard is what spawning needs.
"""

import json
import os
import sys
import time


def main(job_path: str, result_path: str) -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default does not fit a 24 GiB machine
    from vllm import LLM, SamplingParams

    job = json.load(open(job_path))
    start = time.time()
    llm = LLM(model=job["model"], dtype="float32", max_model_len=256, seed=0, enforce_eager=True, max_num_seqs=16,
              speculative_config=job.get("speculative_config"), disable_log_stats=False,
              tensor_parallel_size=job.get("tensor_parallel_size", 1),
              distributed_executor_backend="mp" if job.get("tensor_parallel_size", 1) > 1 else None)
    started = time.time()
    runs, snapshots = {}, {}
    for run in job["runs"]:
        prompts = [{"prompt_token_ids": ids} for ids in run["prompts"]]
        params = [SamplingParams(**kwargs) for kwargs in run["params"]]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        runs[run["name"]] = [list(out.outputs[0].token_ids) for out in outputs]
        snapshots[run["name"]] = spec_metrics(llm)  # cumulative: a run's own counts are differences
    json.dump({"runs": runs, "metrics": spec_metrics(llm), "snapshots": snapshots, "start_s": started - start,
               "generate_s": time.time() - started}, open(result_path, "w"))


def spec_metrics(llm) -> dict:
    metrics = {}
    for metric in llm.get_metrics():
        if "spec_decode" in metric.name:
            values = getattr(metric, "values", None)
            metrics[metric.name] = values if values is not None else getattr(metric, "value", None)
    return metrics


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
