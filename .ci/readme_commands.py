"""Print commands of README.md, one per line, so CI runs exactly what a reader pastes (no third-party imports:
the system Python runs this before any venv exists).

    python3 .ci/readme_commands.py install-cpu   # the install block for a CPU-only machine (## Install)
    python3 .ci/readme_commands.py first-test    # the first command of ## Test
"""

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
CPU_INDEX = "download.pytorch.org/whl/cpu"


def section_blocks(text: str, heading: str) -> list[list[str]]:
    """The ```bash blocks under `## heading` (up to the next ## heading), as lists of non-empty lines."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    body = text[start:end if end >= 0 else len(text)]
    blocks = re.findall(r"^```bash\n(.*?)^```", body, flags=re.M | re.S)
    return [[line for line in block.splitlines() if line.strip()] for block in blocks]


def main(what: str) -> None:
    text = README.read_text(encoding="utf-8")
    if what == "install-cpu":
        found = [block for block in section_blocks(text, "Install") if any(CPU_INDEX in line for line in block)]
        if len(found) != 1:
            sys.exit(f"README.md's Install section must have one bash block with {CPU_INDEX} (found {len(found)})")
        print("\n".join(found[0]))
    elif what == "first-test":
        blocks = section_blocks(text, "Test")
        if not blocks:
            sys.exit("README.md's Test section has no bash block")
        print(blocks[0][0])
    else:
        sys.exit(f"usage: {sys.argv[0]} install-cpu | first-test")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
