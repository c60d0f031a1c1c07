"""Every code block of README.md and docs/*.md is either run (conftest.py runs the ``python`` and
``python ranks=2`` blocks with sybil) or says what it is (``bash``, ``text``) and so is not run.

A fence without a language would be silently skipped by the docs tests; this test refuses it.
The blocks themselves are collected from the Markdown files: `pytest README.md docs/`.
"""

import pathlib
import re

import pytest
from sybil import Document
from sybil.parsers.markdown.lexers import RawFencedCodeBlockLexer

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN = {"python", "python ranks=2"}
NOT_RUN = {"bash": "shell commands", "text": "output, config lines or other text"}

_fences = RawFencedCodeBlockLexer(info_pattern=re.compile(r"(?P<info>[^\n]*)$\n", re.MULTILINE))


def fences(path):
    doc = Document(path.read_text(), str(path))
    for region in _fences(doc):
        line = doc.text.count("\n", 0, region.start) + 1
        yield line, region.lexemes["info"].strip()


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_code_block_is_run_or_says_why_not(path):
    bad = [f"{path.relative_to(ROOT)}:{line}: ```{info}" for line, info in fences(path)
           if info not in RUN and info not in NOT_RUN]
    assert not bad, (
        "code blocks whose fence names no known language (they would not be run):\n  "
        + "\n  ".join(bad) + f"\nHint: use ```python (run by the docs tests), ```python ranks=2 "
        f"(run on 2 ranks), or one of {', '.join(f'```{k} ({v})' for k, v in NOT_RUN.items())}"
    )


def test_the_docs_tests_see_python_blocks():
    # guards the collector: README.md has a run block; a rename of the fence would hide them all
    assert any(info in RUN for _, info in fences(ROOT / "README.md"))


def test_the_docs_index_links_every_page():
    index = (ROOT / "docs" / "README.md").read_text()
    missing = [p.name for p in DOCS if p.parent.name == "docs" and p.name != "README.md"
               and f"]({p.name})" not in index]
    assert not missing, f"docs/README.md does not link {missing}; add a line for each"
