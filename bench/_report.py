"""Benchmark results as JSON + a markdown table, stamped with the run's device, date,
library versions and command line (shared by the bench_*.py scripts)."""

import json
import platform
from datetime import date
from pathlib import Path

from specdec_kernels import build_info


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
