"""Which kernels changed since the newest committed GPU results: what the next GPU call checks first.

A kernel is one op on one GPU backend (triton, cuda). Its sources (specdec_kernels/common/kernel_identity.py):
the module that registers it (the backend registry says which) and the modules of its package it imports
(relative imports, followed); for cuda also csrc/<launcher>.cu and csrc/bind_<launcher>.cpp of its launcher
module, with their `#include "..."` closure and each reached header's implementation (launch_plans.cpp). The
files every kernel of a backend reads (triton/_launch.py, cuda/_launch.py, common.cuh, launch_plan.h, ...) are
that backend's shared sources: a change there is listed, and it is what the control sample of every unchanged
kernel is for, rather than a reason to call every kernel changed. Files are compared by their code (comments,
docstrings and blank lines do not count). A record also holds each kernel's fingerprint over all its files,
shared ones included: what the record of GPU-verified kernels keys on (bench/verified_kernels.py).

A GPU result records what it ran on: bench/results/<run>/kernels.json (`--record`), or the `kernels` entry
of a first look's facts.json, which bench/gpu_first_look.sh writes. The newest record (by its date) is the
baseline. The device machine gets a copy of the working tree without .git, so nothing here needs git at run
time; git made the record of the 2026-11-27 H100 run from the commit that holds its results:

    python bench/gpu_changes.py                          # what changed, in words
    python bench/gpu_changes.py --ops                    # changed ops, new ones first (selftest --ops)
    python bench/gpu_changes.py --unchanged              # ops with no changed kernel (selftest --control-ops)
    python bench/gpu_changes.py --focus                  # changed kernels as op/backend (pytest --gpu-focus)
    python bench/gpu_changes.py --shell                  # the three above as shell assignments (the first look's)
    python bench/gpu_changes.py --record DIR --commit SHA --date 2026-11-27   # DIR/kernels.json from git
    python bench/gpu_changes.py --markdown               # docs/gpu.md's lists (tests/test_gpu_changes.py checks)
Without any record every kernel counts as changed.
"""

import argparse
import hashlib
import json
import re
import shlex
import subprocess
import sys
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from specdec_kernels.common import kernel_identity  # noqa: E402  (standard library only)

RESULTS = ROOT / "bench" / "results"
PACKAGE = "specdec_kernels"
BACKENDS = ("cuda", "triton")
MISSING = "<missing>"


def working_tree(path: str) -> str | None:
    file = ROOT / path
    return file.read_text(encoding="utf-8") if file.is_file() else None


def at_commit(commit: str):
    """read(path) at a git commit (None where the file did not exist)."""
    def read(path: str) -> str | None:
        done = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, capture_output=True, text=True)
        return done.stdout if done.returncode == 0 else None
    return read


def python_closure(path: str, read) -> set[str]:
    """path and every module of its own package it imports, followed (relative imports only)."""
    return kernel_identity.python_closure(path, read)


def include_closure(paths: list[str], read) -> set[str]:
    """The C++ files and every `#include "..."` they reach in csrc/, with the headers' implementations."""
    return kernel_identity.include_closure(paths, kernel_identity.includes_of(read))


def kernel_modules() -> dict[str, str]:
    """{"op/backend": the path of the module that registers that kernel} for every GPU kernel of the package."""
    sys.path.insert(0, str(ROOT))
    from specdec_kernels import ops  # noqa: F401  (registers every backend)
    from specdec_kernels.common import registry

    modules = {}
    for op in registry.registered_ops():
        for backend in registry.implemented_backends(op):
            if backend in BACKENDS:
                module = registry.implementation(op, backend).__module__
                modules[f"{op}/{backend}"] = module.replace(".", "/") + ".py"
    return modules


def sources(modules: dict[str, str], read) -> dict[str, set[str]]:
    """{"op/backend": every source file of that kernel} (shared ones included)."""
    return {key: kernel_identity.kernel_files(module, key.split("/")[1], read) for key, module in modules.items()}


def shared_sources(files: dict[str, set[str]]) -> dict[str, set[str]]:
    """Per backend, the files every one of its kernels reads."""
    shared = {}
    for backend in BACKENDS:
        sets = [paths for key, paths in files.items() if key.endswith("/" + backend)]
        shared[backend] = set.intersection(*sets) if sets else set()
    return shared


def digest(paths, read) -> tuple[str, dict[str, str]]:
    """(sha256 over the files' paths and code hashes, {path: sha256 of its code or MISSING})."""
    each, whole = {}, hashlib.sha256()
    for path in sorted(paths):
        text = read(path)
        each[path] = MISSING if text is None else kernel_identity.file_hash(path, text)
        whole.update(f"{path}\0{each[path]}\0".encode())
    return whole.hexdigest(), each


# kernel modules renamed to their op family's name (issue 39): today's path -> the path before, so a record of
# an older version is made from that version's files (and its own paths), as it was when it was written
RENAMED = {f"specdec_kernels/{package}/{new}.py": f"specdec_kernels/{package}/{old}.py"
           for package, names in (("triton", {"rejection_sampling": "rejection_sample",
                                               "rejection_sampling_logits": "rejection_sample_logits",
                                               "block_verification": "block_verify",
                                               "block_verification_logits": "block_verify_logits",
                                               "attention": "tree_attention", "kv_cache": "kv_compact",
                                               "early_exit": "early_exit_topk"}),
                                  ("cuda", {"rejection_sampling": "rejection_sample", "logit_verify_greedy": "greedy_verify",
                                            "block_verification": "block_verify", "attention": "tree_attention",
                                            "kv_cache": "kv_compact", "early_exit": "early_exit_topk"}))
           for new, old in names.items()}


def as_of(modules: dict[str, str], read) -> dict[str, str]:
    """Today's kernel modules under the paths `read`'s version had (RENAMED), where today's path is not there."""
    return {key: RENAMED[path] if read(path) is None and path in RENAMED else path for key, path in modules.items()}


def record(read=working_tree, *, commit: str | None = None, day: str | None = None) -> dict:
    """The fingerprint of every kernel as `read` sees the sources: what a GPU result keeps of what it ran on.
    Which kernels exist, and which files are shared, is today's answer; each kernel's files are its version's."""
    today = kernel_modules()
    shared = shared_sources(sources(today, working_tree))
    modules = as_of(today, read)
    kernels, own, every, fingerprints = {}, {}, {}, {}
    for key, paths in sorted(sources(modules, read).items()):
        if read(modules[key]) is None:
            continue  # the kernel did not exist in that version
        own[key] = sorted(paths - shared[key.split("/")[1]])
        kernels[key], hashes = digest(own[key], read)
        every.update(hashes)
        fingerprints[key] = kernel_identity.fingerprint(digest(paths, read)[1].values())
    for paths in shared.values():
        every.update(digest(paths, read)[1])
    return {"commit": commit, "date": day or date.today().isoformat(), "kernels": kernels, "sources": own,
            "shared": {backend: sorted(paths) for backend, paths in shared.items()}, "files": every,
            "fingerprints": fingerprints}


def records(results: Path = RESULTS) -> list[tuple[str, Path, dict]]:
    """(date, path, record) of every committed record: kernels.json, or facts.json with a "kernels" entry."""
    found = []
    for path in sorted([*results.glob("*/kernels.json"), *results.glob("*/facts.json"),
                        *results.glob("*/*/facts.json")]):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        data = data if path.name == "kernels.json" else data.get("kernels_record")
        if isinstance(data, dict) and "kernels" in data:
            match = re.search(r"\d{4}-\d{2}-\d{2}", str(path.relative_to(results)))
            found.append((data.get("date") or (match.group(0) if match else ""), path, data))
    return sorted(found, key=lambda item: (item[0], str(item[1])))


def compare(now: dict, baseline: dict | None) -> dict:
    """What changed between a baseline record and now: kernels new or changed, per backend, new ones first."""
    if baseline is None:
        changed = sorted(now["kernels"])
        return {"baseline": None, "new": changed, "changed": changed, "unchanged": [], "shared_changed": []}
    old = baseline["kernels"]
    new = sorted(key for key in now["kernels"] if key not in old)
    changed = [key for key in now["kernels"] if key in old and old[key] != now["kernels"][key]]
    old_files = baseline.get("files", {})
    both = {op for op in ops_of(changed) if all(f"{op}/{backend}" in changed for backend in BACKENDS)}
    touched = {key: sum(old_files.get(path) != now["files"].get(path) for path in now["sources"][key])
               for key in changed}
    # the order of value: never on a GPU, then changed on both backends, then the most of its sources changed
    changed = new + sorted(changed, key=lambda key: (key.split("/")[0] not in both, -touched[key], key))
    shared = sorted({path for paths in now["shared"].values() for path in paths
                     if old_files.get(path) != now["files"].get(path)})
    return {"baseline": baseline.get("commit"), "baseline_date": baseline.get("date"), "new": new,
            "changed": changed, "unchanged": sorted(set(now["kernels"]) - set(changed)), "shared_changed": shared}


def head_commit() -> str | None:
    """The checkout's commit, where git and .git are at hand (not on a device machine's copy of the tree)."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def baseline(since: Path | None = None) -> tuple[dict | None, Path | None]:
    """(the baseline record, its file): `since`, or the newest committed record, or (None, None)."""
    if since is not None:
        loaded = json.loads(since.read_text())
        return loaded.get("kernels_record", loaded), since
    found = records()
    return (found[-1][2], found[-1][1]) if found else (None, None)


def facts() -> dict:
    """What a GPU call keeps in its facts.json: the record of the kernels it ran (the next call's baseline once
    its files are committed) and what had changed since the last baseline."""
    old, where = baseline()
    now = record(commit=head_commit())
    return {"kernels_record": now, "changes": {"since": shown(where), **compare(now, old)}}


def shown(path: Path | None) -> str | None:
    """A path as the summaries print it: relative to the checkout where it is inside it."""
    if path is None:
        return None
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def ops_of(keys: list[str], backend: str | None = None) -> list[str]:
    """The ops of "op/backend" keys (of one backend, or any), in order, once each."""
    return list(dict.fromkeys(key.split("/")[0] for key in keys if backend is None or key.endswith("/" + backend)))


DOCS = ROOT / "docs" / "gpu.md"
DOCS_BEGIN = "<!-- generated by `python bench/gpu_changes.py --markdown`: do not edit by hand -->"
DOCS_END = "<!-- end of the generated lists -->"


def by_op(keys: list[str]) -> str:
    """"`op` (cuda, triton), ..." of "op/backend" keys, in their order; "none" for none."""
    backends: dict[str, list[str]] = {}
    for key in keys:
        op, backend = key.split("/")
        backends.setdefault(op, []).append(backend)
    return ", ".join(f"`{op}` ({', '.join(names)})" for op, names in backends.items()) or "none"


def markdown(now: dict, diff: dict, where: Path | None, shipped: dict) -> str:
    """docs/gpu.md's lists: what changed since the newest GPU results, and what a GPU verified as it is now."""
    lines = [DOCS_BEGIN]
    if where is None:
        lines.append("No GPU results are committed: every kernel counts as changed.")
    else:
        lines.append(f"Against the GPU results of {diff['baseline_date']} (`{shown(where)}`, commit "
                     f"{str(diff['baseline'])[:7]}):")
    changed = [key for key in diff["changed"] if key not in diff["new"]]
    lines += ["", f"- new, never on a GPU: {by_op(diff['new'])}", f"- changed: {by_op(changed)}",
              f"- unchanged: {by_op(diff['unchanged'])}",
              f"- shared sources changed (the control samples cover them): "
              f"{', '.join(f'`{path}`' for path in diff['shared_changed']) or 'none'}", ""]
    verified = sorted({(e["kernel"], e["arch"], e["device"], e["date"]) for e in shipped.get("kernels", [])
                       if now["fingerprints"].get(e["kernel"]) == e["fingerprint"]})
    lines.append("Verified by a GPU as they are now (the shipped record, `specdec_kernels/common/verified_kernels.json`, "
                 "which `backend=\"auto\"` reads): "
                 + ("; ".join(f"`{kernel}` on {arch} ({device}, {day})" for kernel, arch, device, day in verified)
                    or "none. Until a GPU run's results are committed (or a user's `specdec-kernels selftest` "
                       "records its own), `auto` runs the torch reference on every GPU."))
    lines.append(DOCS_END)
    return "\n".join(lines)


def docs_block(text: str) -> str | None:
    """The generated lists as docs/gpu.md holds them, or None where the markers are missing."""
    if DOCS_BEGIN not in text or DOCS_END not in text:
        return None
    return text[text.index(DOCS_BEGIN):text.index(DOCS_END) + len(DOCS_END)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--ops", action="store_true", help="changed ops, comma-separated, new ones first")
    what.add_argument("--unchanged", action="store_true", help="ops none of whose kernels changed, comma-separated")
    what.add_argument("--focus", action="store_true", help="changed kernels as op/backend, comma-separated")
    what.add_argument("--shell", action="store_true",
                      help="changed_ops=..., control_ops=... (--unchanged), focus=... (--focus), for eval in bash")
    what.add_argument("--json", action="store_true", help="the record of now and the comparison, as JSON")
    what.add_argument("--record", type=Path, metavar="DIR", help="write DIR/kernels.json")
    what.add_argument("--markdown", action="store_true",
                      help="docs/gpu.md's generated lists (changes since the baseline, what a GPU verified)")
    parser.add_argument("--backend", choices=BACKENDS, help="with --ops: only this backend's changed kernels")
    parser.add_argument("--commit", help="with --record: the sources at this git commit (default: the working tree)")
    parser.add_argument("--date", help="with --record: the run's date (default: today)")
    parser.add_argument("--since", type=Path, help="the baseline record (default: the newest under bench/results)")
    args = parser.parse_args(argv)
    if args.record:
        if not args.record.is_dir():
            parser.error(f"--record {args.record}: no such folder")
        data = record(at_commit(args.commit) if args.commit else working_tree, commit=args.commit, day=args.date)
        (args.record / "kernels.json").write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {args.record / 'kernels.json'}: {len(data['kernels'])} kernels")
        return 0
    if args.since is not None and not args.since.is_file():
        parser.error(f"--since {args.since}: no such file")
    old, where = baseline(args.since)
    now = record(commit=None)
    diff = compare(now, old)
    changed = set(ops_of(diff["changed"]))
    lists = {"changed_ops": ",".join(ops_of(diff["changed"], args.backend)),
             "control_ops": ",".join(op for op in ops_of(diff["unchanged"]) if op not in changed),
             "focus": ",".join(diff["changed"])}
    if args.ops:
        print(lists["changed_ops"])
    elif args.unchanged:
        print(lists["control_ops"])
    elif args.focus:
        print(lists["focus"])
    elif args.shell:
        print("\n".join(f"{name}={shlex.quote(value)}" for name, value in lists.items()))
    elif args.json:
        print(json.dumps({"kernels_record": now, "changes": {"since": shown(where), **diff}}, indent=1))
    elif args.markdown:
        shipped = json.loads((ROOT / "specdec_kernels" / "common" / "verified_kernels.json").read_text())
        print(markdown(now, diff, where, shipped))
    else:
        print(f"baseline: {shown(where) or 'none (every kernel counts as changed)'}"
              + (f", commit {diff['baseline']}, {diff['baseline_date']}" if where else ""))
        for label, keys in (("new (never on a GPU)", diff["new"]),
                            ("changed", [k for k in diff["changed"] if k not in diff["new"]]),
                            ("unchanged", diff["unchanged"])):
            print(f"{label}: {', '.join(keys) or '-'}")
        print(f"shared sources changed (the control samples cover them): {', '.join(diff['shared_changed']) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
