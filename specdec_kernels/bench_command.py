"""`specdec-kernels bench NAME [ARGS...]`: run one of the benchmarks of a source checkout.

The benchmark scripts live in the repository's bench/ folder (they are not part of the installed
package), so this works from an editable install (`pip install -e .`) or with `--bench-dir PATH`.
NAME is a script's name without `bench_` and `.py` (verify, tree_attention, kv_compact,
early_exit_topk) or e2e, ppd_latency, sweep_specdec; ARGS go to the script (`--help` lists them).
Results (JSON + markdown) go to `--out DIR` (default: bench/results under the current folder; a
`--smoke` run, whose numbers are no results, a new temporary folder), and the command says which files
it wrote there.
"""

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SOURCE_BENCH_DIR = Path(__file__).resolve().parent.parent / "bench"
DEFAULT_OUT = Path("bench") / "results"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="verify, tree_attention, kv_compact, early_exit_topk, e2e, ppd_latency, ...")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments of the benchmark script")
    parser.add_argument("--bench-dir", type=Path, default=SOURCE_BENCH_DIR,
                        help="the bench/ folder of a source checkout (default: the one beside this install)")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help=f"where the results go (default: {DEFAULT_OUT} under the current folder; with --smoke a "
                             "new temporary folder)")


def fail(message: str):
    raise SystemExit(f"specdec-kernels bench: {message}")


def scripts(bench_dir: Path) -> dict[str, Path]:
    """name -> script: bench_NAME.py as NAME, the other runnable scripts by their own names."""
    found = {}
    for path in sorted(bench_dir.glob("*.py")) if bench_dir.is_dir() else []:
        if path.name.startswith(("_", "test_")) or path.stem == "train_default_models":
            continue
        found[path.stem.removeprefix("bench_")] = path
    return found


def split_out(script_args: list[str]) -> tuple[Path | None, list[str]]:
    """(the value of an --out among the script's arguments, the other arguments)."""
    out, rest, args = None, [], iter(script_args)
    for arg in args:
        if arg == "--out":
            value = next(args, None)
            if value is None:
                fail("--out needs a folder: --out DIR")
            out = Path(value)
        elif arg.startswith("--out="):
            out = Path(arg.removeprefix("--out="))
        else:
            rest.append(arg)
    return out, rest


def written_since(folder: Path, start: float) -> list[str]:
    if not folder.is_dir():
        return []
    return sorted(path.name for path in folder.iterdir() if path.is_file() and path.stat().st_mtime >= start)


def run(args) -> int:
    available = scripts(args.bench_dir)
    if not available:
        fail(f"no benchmark scripts in {args.bench_dir}: they ship with the source tree (git clone, "
             "`pip install -e .`), or pass --bench-dir PATH/bench")
    if args.name not in available:
        fail(f"unknown benchmark {args.name!r}; available: {', '.join(available)}")
    given, script_args = split_out(args.script_args)
    out = given or args.out
    if out is None:  # a smoke run's tiny shapes are no results: keep them out of the checkout's bench/results
        out = Path(tempfile.mkdtemp(prefix="specdec-bench-smoke-")) if "--smoke" in script_args else DEFAULT_OUT
    out = out.resolve()  # every script takes --out; one folder we can report
    start = time.time() - 1  # file times may be rounded to the second
    status = subprocess.call([sys.executable, str(available[args.name]), *script_args, "--out", str(out)])
    written = written_since(out, start)
    if status == 0 and written:
        print(f"specdec-kernels bench: wrote {', '.join(written)} in {out}", file=sys.stderr)
    return status
