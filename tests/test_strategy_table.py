"""Strategy names are listed once: the table of specdec_kernels/decoding/strategies.py. The docs' tables
(docs/index.md, docs/generate.md) and the index's links to the strategy pages say what the table says, each
page exists, and no other literal list of strategy names stands in the package or the tests (a list that
would go stale when a strategy is added: the CLI's choices, the selftest's checks, HF's option names were
such lists). Only one module of decoding/ calls the verification ops: the engine's one verifier."""

import ast
import re
from pathlib import Path

import pytest

from specdec_kernels.decoding import strategies
from specdec_kernels.decoding.strategies import TABLE

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# the only files that may list strategy names: the table, and the per-strategy cases of the backend-reach
# test (the ops each strategy's step must reach: knowledge of the strategy no table gives; that test
# checks its cases cover every row of the demo's, so a new strategy cannot be left out)
LISTS_ALLOWED = {"specdec_kernels/decoding/strategies.py", "tests/test_backend_reach.py"}
# a literal naming this many strategies enumerates them: in the package any two; a test's cases may pick up
# to three (e.g. the two-model strategies and plain)
WIDE = {"specdec_kernels": 2, "tests": 4}
VERIFY_OPS = {"greedy_verify", "relaxed_verify", "bild_verify", "block_verify", "block_verify_logits", "rejection_sample",
              "rejection_sample_logits", "tree_greedy_verify", "tree_rejection_sample"}


def page_link(strategy) -> str:
    return f"[{strategy.title}]({strategy.page})"


def index_rows() -> list[str]:
    return [f"| `{s.name}` | {s.paper} | {s.draft_source} | {s.rule} | {s.lossless_when} |" for s in TABLE]


def generate_rows() -> list[str]:
    return [f"| `{s.name}` | {s.example} | {'below' if s.page.startswith('generate.md#') else page_link(s)} |"
            for s in TABLE]


def table_lines(text: str, header: str) -> list[str]:
    """The body rows of the markdown table whose header line starts with `header`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    body = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        body.append(line)
    return body


def test_docs_index_table_is_the_strategy_table():
    got = table_lines((DOCS / "index.md").read_text(), "| strategy | paper |")
    assert got == index_rows(), "docs/index.md's table, as strategies.TABLE gives it:\n" + "\n".join(index_rows())


def test_docs_generate_table_is_the_strategy_table():
    got = table_lines((DOCS / "generate.md").read_text(), "| strategy | object |")
    assert got == generate_rows(), "docs/generate.md's table, as strategies.TABLE gives it:\n" + "\n".join(
        generate_rows())


def test_docs_index_links_every_strategy_page():
    line = next(line for line in (DOCS / "index.md").read_text().splitlines() if line.startswith("| decode with"))
    want = ", ".join(page_link(s) for s in TABLE if not s.page.startswith("generate.md#"))
    assert line.endswith(f"the strategy pages: {want} |")


@pytest.mark.parametrize("strategy", TABLE, ids=lambda s: s.name)
def test_every_page_exists(strategy):
    page, _, anchor = strategy.page.partition("#")
    text = (DOCS / page).read_text()
    if anchor:  # plain's section of generate.md: its paragraph starts with the name
        assert f"`{anchor}`" in text
    else:
        assert text.startswith("# ")
        # the site's navigation reaches it (mkdocs --strict, in CI's docs stage, refuses a page left out)
        assert re.search(rf":\s*{re.escape(page)}\s*$", (ROOT / "mkdocs.yml").read_text(), re.M), page


def test_names_and_drafters_agree():
    assert strategies.names() == tuple(s.name for s in TABLE) and len(set(strategies.names())) == len(TABLE)
    for strategy in TABLE:
        assert strategy.drafter.name == strategy.name
        assert set(strategy.lossless) <= set(strategy.options) and set(strategy.tree or {}) <= set(strategy.options)
        assert strategy.draft_length is None or strategy.draft_length in strategy.options


def test_unknown_strategy_and_option_are_refused_by_name():
    with pytest.raises(ValueError, match=r"unknown strategy 'nope'; available: " + ", ".join(sorted(strategies.names()))):
        strategies.strategy("nope")
    with pytest.raises(TypeError, match=r"strategy 'plain' has no option 'k'; its options: none"):
        strategies.strategy("plain").make(None, k=3)


def python_files():
    for folder in ("specdec_kernels", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(), filename=str(path))


def strays(tree: ast.AST, names: set[str], wide: int) -> list[tuple[int, list[str]]]:
    """(line, names) of each literal list, tuple, set or dict (its keys) naming `wide` or more strategies."""
    found = []
    for node in ast.walk(tree):
        items = node.keys if isinstance(node, ast.Dict) else node.elts if isinstance(node, (ast.List, ast.Tuple, ast.Set)) else None
        if items is None:
            continue
        named = {item.value for item in items if isinstance(item, ast.Constant) and item.value in names}
        if len(named) >= wide:
            found.append((node.lineno, sorted(named)))
    return found


def test_no_other_list_of_strategy_names():
    names = set(strategies.names())
    found = [f"{path}:{line} {listed}" for path, tree in python_files() if path not in LISTS_ALLOWED
             for line, listed in strays(tree, names, WIDE[path.split("/")[0]])]
    assert not found, "strategy names listed outside the table (read strategies.TABLE instead):\n" + "\n".join(found)


def test_the_stray_finder_finds_a_list():
    """Mutation: the lists this test exists to catch are found (the CLI's old choices, a dict of options)."""
    names = strategies.names()
    choices = f"CHOICES = {names[:4]!r}"
    assert strays(ast.parse(choices), set(names), 4) == [(1, sorted(names[:4]))]
    options = "OPTIONS = {" + ", ".join(f"{name!r}: {{}}" for name in names[-2:]) + "}"
    assert strays(ast.parse(options), set(names), 2) and not strays(ast.parse(options), set(names), 3)
    case = f"@pytest.mark.parametrize('s', {list(names[:2])!r})\ndef f(s): pass"
    assert not strays(ast.parse(case), set(names), 4)


def test_only_the_verifier_calls_verification_ops():
    calls = {}
    for path, tree in python_files():
        if not path.startswith("specdec_kernels/decoding/"):
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in VERIFY_OPS
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "ops"):
                calls.setdefault(path, set()).add(node.func.attr)
    assert set(calls) == {"specdec_kernels/decoding/verifier.py"}, calls
    assert calls["specdec_kernels/decoding/verifier.py"] >= VERIFY_OPS - {"block_verify_logits", "rejection_sample_logits"}


def test_strategy_names_in_prose_lists_are_not_hand_written():
    """A message naming several strategies joins them from the table (HF's num_assistant_tokens hint was
    "speculative, bild and specdec" by hand)."""
    names = "|".join(map(re.escape, strategies.names()))
    pattern = re.compile(rf"\b({names}), ({names})(,| and| or) ")
    found = []
    for path, tree in python_files():
        if path in LISTS_ALLOWED or not path.startswith("specdec_kernels/"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and pattern.search(node.value):
                found.append(f"{path}:{node.lineno} {node.value[:80]!r}")
    assert not found, "\n".join(found)
