"""Prose numbers that do not say where they come from (issue 38 item 4).

A number in the docs is either generated (inside a ``<!-- report: ... -->`` block, from a
committed results file) or written by hand. A hand-written measurement — a speedup (``1.8x``), a
percentage, a duration, a size, a decimal — must name its source in the same sentence (or table
row): a committed file (a path under ``docs/results/``, a results/config/log file, a test that
checks it), the paper, a vendor's datasheet, or a published repository's file named by
``owner/name`` and path (``pytorch/torchtitan docs/performance.md``). This module finds those
that do not:

    python -m end2end.report.prose [FILE ...]     # default: README.md and docs/*.md

prints ``file:line: 'NUMBER' in "...context..."`` per offender and exits 1 when there is one.
Skipped: generated blocks, fenced code, inline code, HTML comments, link targets, version
numbers (``torch 2.13.0``, ``Python >= 3.11``), section numbers (``§1.7``), and plain integers
(counts such as "4 layers").
``tests/test_prose_numbers.py`` holds README.md to none and each page of ``docs/`` to at most
its present count, so the list only shrinks.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Iterator, List, NamedTuple, Optional, Sequence

from .blocks import CLOSE, FENCE, OPEN

__all__ = ["Offender", "offenders", "SOURCE", "MEASURE"]

ROOT = Path(__file__).resolve().parents[2]
# a measurement: a ratio, a percentage, a duration, a size or rate, or any decimal
MEASURE = re.compile(
    r"(?<![\w.\-/=#'])(?:~|≈)?(\d+(?:\.\d+)?(?:\s?(?:x|×|%|ms|s|min|minutes|seconds|h|hours|GB|"
    r"MB|GiB|TB|samples/s|TFLOP/s|TFLOPS|GFLOP/s)\b|\s?[x×%](?!\w))|\d+\.\d+(?![.\d]))")
# words before a number that make it a version or an identifier (a section: §1.7), not a
# measurement
VERSION = re.compile(r"(?:torch|python|transformers|deepspeed|megatron-core|numpy|pandas|"
                     r"optuna|cuda|v|version|>=|<=|==|>|<|arxiv|issue|#|§|"
                     r"straddles?|below|above)\s*$", re.I)
# a file of a public repository, named by owner/name and its path ("pytorch/torchtitan
# docs/performance.md", "stas00/ml-engineering, `compute/accelerator/README.md`")
REPOSITORY_FILE = (r"\b[\w.-]+/[\w.-]+,?\s+`?(?:[\w.-]+/)+[\w.-]+"
                   r"\.(?:md|rst|txt|py|cc|cpp|cu|h)\b")
# what names a source: a committed file, a test, the paper, a vendor's datasheet or a
# published repository's file
SOURCE = re.compile(r"docs/results/|\.tsv\b|\.jsonl\b|\.db\b|\.cmd\b|results file|tests/|"
                    r"measurement_log|commands\.src\.tsv|the paper|paper's|arxiv|artifact's|"
                    r"table of commands|setup\.sh|--list|\bgenerated\b|report:|"
                    r"\bdatasheets?\b|" + REPOSITORY_FILE, re.I)
SENTENCE = re.compile(r"(?<=[.;!?])\s+(?=[A-Z(`*\[])")
INLINE = re.compile(r"`[^`]*`|<!--.*?-->|\]\([^)]*\)|https?://\S+")


class Offender(NamedTuple):
    path: str
    line: int
    number: str
    context: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.number!r} in \"{self.context}\""


def _units(text: str) -> Iterator[List[tuple]]:
    """Paragraphs (and single table rows) as lists of ``(line number, text)``, outside
    generated blocks, fenced code and HTML comments."""
    unit: List[tuple] = []
    in_block = in_fence = in_comment = False
    for number, line in enumerate(text.splitlines(), start=1):
        if in_block:
            in_block = not CLOSE.match(line)
            continue
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        if in_comment or line.lstrip().startswith("<!--"):
            if OPEN.match(line):
                in_block = True
            in_comment = "-->" not in line
            continue
        if not line.strip() or line.lstrip().startswith(("|", "#")):
            if unit:
                yield unit
            unit = [(number, line)] if line.lstrip().startswith("|") else []
            if unit:
                yield unit
                unit = []
            continue
        unit.append((number, line))
    if unit:
        yield unit


def _sentence(text: str, at: int) -> str:
    """The sentence of ``text`` around offset ``at`` (a table row is one sentence)."""
    if text.lstrip().startswith("|"):
        return text
    starts = [0] + [m.end() for m in SENTENCE.finditer(text) if m.end() <= at]
    end = next((m.start() for m in SENTENCE.finditer(text) if m.start() >= at), len(text))
    return text[starts[-1]:end + 1]


def offenders(path: Path, root: Path = ROOT) -> List[Offender]:
    """The hand-written measurements of ``path`` whose sentence names no source."""
    rel = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
    found = []
    for unit in _units(path.read_text()):
        whole = " ".join(line for _, line in unit)
        offset = 0
        for number, line in unit:
            plain = INLINE.sub(lambda m: " " * len(m.group(0)), line)  # offsets kept
            for match in MEASURE.finditer(plain):
                if VERSION.search(plain[:match.start()]):
                    continue
                if SOURCE.search(_sentence(whole, offset + match.start())):
                    continue
                start = max(0, match.start() - 40)
                found.append(Offender(rel, number, match.group(0).strip(),
                                      " ".join(plain[start:match.end() + 30].split())))
            offset += len(line) + 1
    return found


#: The artifact's folders whose README.md the rule covers besides the top one and docs/.
ARTIFACT_FOLDERS = ("end2end", "ablation", "autotune", "usability", "docker", "3rdparty")


def documents(root: Path = ROOT) -> List[Path]:
    """README.md, every page of docs/ and the README.md of each of :data:`ARTIFACT_FOLDERS`
    (what the rule covers)."""
    folders = [root / f / "README.md" for f in ARTIFACT_FOLDERS
               if (root / f / "README.md").is_file()]
    return [root / "README.md", *sorted((root / "docs").glob("*.md")), *folders]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """List the offenders of the files given (default: :func:`documents`); 1 when any."""
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a.startswith("-") for a in args):
        print("usage: python -m end2end.report.prose [FILE ...]  (lists prose numbers that "
              "name no source; exit 1 when there is one)", file=sys.stderr)
        return 2
    paths = [Path(a).resolve() for a in args] or documents()
    found = [o for path in paths for o in offenders(path)]
    for offender in found:
        print(offender)
    print(f"{len(found)} prose number(s) without a source in {len(paths)} file(s)",
          file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
