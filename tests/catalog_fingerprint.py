"""Fingerprints of the selftest's case catalog: every case's op, name and dtype with a hash of its inputs
(seed 0) and of its reference outputs, its graph flag and backends, and a hash of its judgement (what its compare
says of the reference itself and of the reference with one output nudged), per profile. tests/test_catalog_fingerprint.py holds the catalog to the
fingerprints recorded in tests/catalog_fingerprints.json, so a restructuring of the catalog shows, case by case,
that it builds the same problems and expects the same answers.

Record them again after a deliberate change of the cases:
    python tests/catalog_fingerprint.py --write
"""

import hashlib
import json
import sys
from pathlib import Path

import torch

RECORD = Path(__file__).resolve().parent / "catalog_fingerprints.json"
PROFILES = ("tiny", "quick")


def digest(value, sha) -> None:
    """Feed a case's inputs or outputs into `sha`: tensors by dtype, shape and bytes; containers in order;
    other values by repr (Python parameters the launch takes)."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous().reshape(-1)
        sha.update(f"{value.dtype}{tuple(value.shape)}".encode())
        sha.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    elif isinstance(value, dict):
        for key in sorted(value):
            sha.update(key.encode())
            digest(value[key], sha)
    elif isinstance(value, (list, tuple)):
        sha.update(f"{type(value).__name__}{len(value)}".encode())
        for item in value:
            digest(item, sha)
    else:
        sha.update(repr(value).encode())


def hashed(value) -> str:
    sha = hashlib.sha256()
    digest(value, sha)
    return sha.hexdigest()[:16]


def nudged(value):
    """An output one step off: integers + 1, floats + 0.5 (NaN stays NaN, so compare's NaN rules show too)."""
    if value.dtype == torch.bool:
        return ~value
    return value + (1 if not value.is_floating_point() else 0.5)


def verdict(case, got, want, inputs) -> str:
    """compare's verdict on `got`, then each of its checks' (selftest.compare.with_checks) on it alone: a check
    behind a failing compare would not speak otherwise."""
    said = []
    for judge in (lambda: case.compare(got, want, inputs),
                  *(lambda check=check: check(got, inputs) for check in getattr(case.compare, "checks", ()))):
        try:
            said.append(repr(judge()))
        except Exception as error:  # noqa: BLE001 - a nudged count may index past the drafts: that is a verdict too
            said.append(f"{type(error).__name__}: {error}")
    return " | ".join(said)


def judgement(case, want, inputs) -> str:
    """A hash of the case's verdicts on the reference itself and on the reference with output i nudged, for each
    tensor output i; a row that lost a check or changed a tolerance shows here though it builds the same problem."""
    verdicts = [verdict(case, want, want, inputs)]
    for i, output in enumerate(want):
        if isinstance(output, torch.Tensor) and output.numel():
            verdicts.append(verdict(case, tuple(nudged(o) if j == i else o for j, o in enumerate(want)), want, inputs))
    return hashed(verdicts)


def families() -> dict:
    """The catalog's case families by name (selftest.CASE_FAMILIES, in order)."""
    from specdec_kernels import selftest

    return {family.__name__: family for family in selftest.CASE_FAMILIES}


def fingerprints(profile: str, family: str) -> list[list]:
    """[op, name, dtype, inputs hash, reference hash, graph, backends, judgement hash] of every case of one family at `profile`, in order; one
    thread (a bfloat16 reduction split over threads rounds otherwise)."""
    rows, threads = [], torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for case in families()[family](profile, torch.device("cpu")):
            inputs = case.build(0)
            want = case.reference(inputs) if case.reference else case.run(inputs, "torch")
            inputs_hash, want_hash = hashed(inputs), hashed(want)  # before the judgement reads them
            rows.append([case.op, case.name, str(case.dtype).replace("torch.", ""), inputs_hash, want_hash,
                         case.graph, list(case.backends), judgement(case, want, inputs)])
    finally:
        torch.set_num_threads(threads)
    return rows


def recorded() -> dict:
    """The record: torch's version it was made with, and profile -> family -> rows."""
    return json.loads(RECORD.read_text())


def main(argv) -> int:
    torch.set_num_threads(1)
    record = {"torch": torch.__version__,
              "cases": {profile: {name: fingerprints(profile, name) for name in families()} for profile in PROFILES}}
    if "--write" in argv:
        RECORD.write_text(json.dumps(record, indent=0) + "\n")
    counts = {profile: sum(map(len, by_family.values())) for profile, by_family in record["cases"].items()}
    print(("wrote " if "--write" in argv else "") + f"{RECORD.name}: torch {torch.__version__}, cases {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
