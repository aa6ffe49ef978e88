"""Fingerprints of the selftest's case catalog: every case's op, name and dtype with a hash of its inputs
(seed 0) and of its reference outputs, per profile. tests/test_catalog_fingerprint.py holds the catalog to the
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


def families() -> dict:
    """The catalog's case families by name (selftest.CASE_FAMILIES, in order)."""
    from specdec_kernels import selftest

    return {family.__name__: family for family in selftest.CASE_FAMILIES}


def fingerprints(profile: str, family: str) -> list[list]:
    """[op, name, dtype, inputs hash, reference hash] of every case of one family at `profile`, in order; one
    thread (a bfloat16 reduction split over threads rounds otherwise)."""
    rows, threads = [], torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for case in families()[family](profile, torch.device("cpu")):
            inputs = case.build(0)
            want = case.reference(inputs) if case.reference else case.run(inputs, "torch")
            rows.append([case.op, case.name, str(case.dtype).replace("torch.", ""), hashed(inputs), hashed(want)])
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
