"""What a release publishes: PyPI's page is README.md with every relative link made absolute (to the release's
tag), and the source distribution carries every CUDA source that `_C` is built from."""

import re
from pathlib import Path

from test_build_messages import load_setup

ROOT = Path(__file__).resolve().parents[1]


def test_the_long_description_has_only_absolute_links_to_files_that_exist():
    setup = load_setup()
    text = setup.long_description()
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    assert targets and all(re.match(r"https?://", t) for t in targets), [t for t in targets if "://" not in t]
    base = f"{setup.PROJECT_URL}/blob/v{setup.version()}/"
    ours = [t[len(base):].split("#")[0] for t in targets if t.startswith(base)]
    assert len(ours) >= 20 and all((ROOT / path).exists() for path in ours), [p for p in ours if not (ROOT / p).exists()]
    assert text.replace(base, "") == (ROOT / "README.md").read_text()  # nothing else changed


def test_the_source_distribution_takes_every_cuda_source():
    patterns = re.findall(r"^recursive-include csrc (.+)$", (ROOT / "MANIFEST.in").read_text(), re.M)
    suffixes = {p.lstrip("*") for line in patterns for p in line.split()}
    missing = [p.name for p in (ROOT / "csrc").iterdir() if p.is_file() and p.suffix not in suffixes]
    assert not missing, f"MANIFEST.in leaves these out of the sdist: {missing}"
