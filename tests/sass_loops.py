"""Reading a kernel's SASS (cuobjdump -sass) for spills that cost every loop trip."""

import re


def local_in_loops(sass: str) -> int:
    """How many LDL/STL instructions lie inside a loop: between a backward branch's target and the branch. A
    spill in the prologue or epilogue costs a few bytes per thread once; one in a loop costs it every trip."""
    code = [(int(address, 16), text) for address, text in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    branches = [(address, re.search(r"\bBRA\b[^;]*?0x([0-9a-f]+)", text)) for address, text in code]
    loops = [(int(m.group(1), 16), address) for address, m in branches if m and int(m.group(1), 16) <= address]
    return sum(1 for address, text in code if re.search(r"\b(LDL|STL)\b", text)
               and any(start <= address <= end for start, end in loops))
