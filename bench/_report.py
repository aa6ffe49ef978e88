"""What the bench_*.py scripts share: their common command-line options, and results as JSON +
a markdown table stamped with the run's device, date, library versions and command line."""

import argparse
import json
import platform
from datetime import date
from pathlib import Path

from specdec_kernels import build_info


def base_parser(doc: str, *, default_dtype: str | None = "bfloat16") -> argparse.ArgumentParser:
    """--out, --smoke, --dtype, --repeats and --batch, as every microbenchmark takes them."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--smoke", action="store_true", help="tiny shapes and few repeats (CPU-friendly)")
    parser.add_argument("--dtype", default=default_dtype, choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--batch", nargs="+", type=int, default=None, help="override the B axis")
    return parser


def write_report(rows: list[dict], out: Path, stem: str, title: str, cols: list[str], command: str,
                 extra_meta: dict, note: str) -> dict:
    """Write out/<stem>.json ({"meta", "rows"}) and out/<stem>.md (title, command, versions,
    `note`, then one table row per result with `cols`); return the meta dict."""
    info = build_info()
    meta = {"date": date.today().isoformat(), "device": info["device"], "command": command, "torch": info["torch"],
            "triton": info["triton"], "cuda_module": info["cuda_module"]["loaded"], "python": platform.python_version(),
            **extra_meta}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"# {title} ({meta['device']}, {meta['date']})", "", f"`{command}`", "",
             f"torch {meta['torch']}, triton {meta['triton']}, {note}", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    return meta
