"""Runs one vLLM engine per configuration in its own process (engine_run.py) and collects what
it did: outputs, spec-decode metrics, the plugin's counters from the engine's workers, the log."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


class EngineRun:
    """One vLLM engine in its own process (engine_run.py): outputs, spec-decode metrics, the
    counters our plugin wrote in the engine's worker(s), and the engine's log."""

    def __init__(self, result: dict, stats: list[dict], log: str, seconds: float):
        self.runs, self.metrics, self.snapshots = result["runs"], result["metrics"], result["snapshots"]
        self.stats, self.log, self.seconds = stats, log, seconds
        self.start_s, self.generate_s = result["start_s"], result["generate_s"]

    def ours(self, key: str) -> int:
        return sum(s[key] for s in self.stats)


def run_engine(tmp_path: Path, job: dict, *, plugin: bool, extra_env: dict | None = None,
               timeout: int = 420) -> EngineRun:
    stats_dir = tmp_path / "stats"
    stats_dir.mkdir(parents=True, exist_ok=True)
    (tmp_path / "job.json").write_text(json.dumps(job))
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", SPECDEC_KERNELS_VLLM="1" if plugin else "0",
               SPECDEC_KERNELS_VLLM_STATS=str(stats_dir), **(extra_env or {}))
    start = time.time()
    proc = subprocess.run([sys.executable, str(HERE / "engine_run.py"), str(tmp_path / "job.json"),
                           str(tmp_path / "result.json")], env=env, capture_output=True, text=True, timeout=timeout)
    log = proc.stdout + proc.stderr
    (tmp_path / "engine.log").write_text(log)
    if proc.returncode != 0:
        raise AssertionError(f"vLLM engine failed (exit {proc.returncode}); log tail:\n{log[-4000:]}")
    stats = [json.loads(p.read_text()) for p in sorted(stats_dir.glob("specdec_kernels_vllm.*.json"))]
    return EngineRun(json.loads((tmp_path / "result.json").read_text()), stats, log, time.time() - start)
