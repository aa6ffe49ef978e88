"""`specdec-kernels bench NAME [ARGS...]`: run one of the benchmarks of a source checkout.

The benchmark scripts live in the repository's bench/ folder (they are not part of the installed
package), so this works from an editable install (`pip install -e .`) or with `--bench-dir PATH`.
NAME is a script's name without `bench_` and `.py` (verify, tree_attention, kv_compact,
early_exit_topk) or e2e, ppd_latency, sweep_specdec; ARGS go to the script (`--help` lists them).
"""

import argparse
import subprocess
import sys
from pathlib import Path

SOURCE_BENCH_DIR = Path(__file__).resolve().parent.parent / "bench"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="verify, tree_attention, kv_compact, early_exit_topk, e2e, ppd_latency, ...")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments of the benchmark script")
    parser.add_argument("--bench-dir", type=Path, default=SOURCE_BENCH_DIR,
                        help="the bench/ folder of a source checkout (default: the one beside this install)")


def scripts(bench_dir: Path) -> dict[str, Path]:
    """name -> script: bench_NAME.py as NAME, the other runnable scripts by their own names."""
    found = {}
    for path in sorted(bench_dir.glob("*.py")) if bench_dir.is_dir() else []:
        if path.name.startswith(("_", "test_")) or path.stem == "train_default_models":
            continue
        found[path.stem.removeprefix("bench_")] = path
    return found


def run(args) -> int:
    available = scripts(args.bench_dir)
    if not available:
        raise SystemExit(f"specdec-kernels bench: no benchmark scripts in {args.bench_dir}: they ship with the "
                         "source tree (git clone, `pip install -e .`), or pass --bench-dir PATH/bench")
    if args.name not in available:
        raise SystemExit(f"specdec-kernels bench: unknown benchmark {args.name!r}; available: "
                         f"{', '.join(available)}")
    return subprocess.call([sys.executable, str(available[args.name]), *args.script_args])
