"""Find and replace the generated blocks of a Markdown file.

A block is an opening marker line ``<!-- report: NAME ARGS... -->``, the generated text, and a
closing marker line ``<!-- /report -->``. The markers stay; only the text between them is
replaced. Markers inside fenced code blocks (```) are text, not blocks, so the docs can show them.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Tuple

from slapo.errors import ConfigError

__all__ = ["Block", "ReportError", "find_blocks", "replace_blocks"]

OPEN = re.compile(r"^\s*<!--\s*report:\s*(?P<spec>.*?)\s*-->\s*$")
CLOSE = re.compile(r"^\s*<!--\s*/report\s*-->\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


class ReportError(ConfigError):
    """A malformed block, an unknown block kind, or a source a block cannot be made from."""


@dataclass(frozen=True)
class Block:
    """One generated block: where it is (``path``, 1-based ``line`` of its opening marker), what
    makes it (``name`` and ``args`` of the marker) and the text now between its markers."""

    path: Path
    line: int
    name: str
    args: Tuple[str, ...]
    body: str
    span: Tuple[int, int]  # 0-based indices of the opening and closing marker lines

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def label(self) -> str:
        return " ".join((self.name, *self.args))


def _spec(path: Path, lineno: int, text: str) -> Tuple[str, Tuple[str, ...]]:
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ReportError(f"{path}:{lineno}: cannot read the report marker: {exc}",
                          hint="e.g. <!-- report: results docs/results/cpu.tsv -->") from None
    if not words:
        raise ReportError(f"{path}:{lineno}: a report marker without a block kind",
                          hint="e.g. <!-- report: modes -->")
    return words[0], tuple(words[1:])


def find_blocks(path: Path, text: str) -> List[Block]:
    """The blocks of ``text`` (the contents of ``path``), in order.

    Raises:
        ReportError: a block that is not closed, a closing marker without an opening one, or a
            block opened inside another (each with ``file:line``).
    """
    lines = text.split("\n")
    blocks: List[Block] = []
    opened, fenced = None, False
    for i, line in enumerate(lines):
        if FENCE.match(line):
            fenced = not fenced
        if fenced or FENCE.match(line):
            continue
        if OPEN.match(line):
            if opened is not None:
                raise ReportError(f"{path}:{i + 1}: a report block opened inside the one of "
                                  f"line {opened + 1}", hint="close it with <!-- /report -->")
            opened = i
        elif CLOSE.match(line):
            if opened is None:
                raise ReportError(f"{path}:{i + 1}: <!-- /report --> without an opening marker",
                                  hint="remove it, or add <!-- report: KIND ARGS --> above")
            name, args = _spec(path, opened + 1, OPEN.match(lines[opened]).group("spec"))
            blocks.append(Block(path, opened + 1, name, args,
                                "\n".join(lines[opened + 1:i]), (opened, i)))
            opened = None
    if opened is not None:
        raise ReportError(f"{path}:{opened + 1}: the report block is never closed",
                          hint="end it with a line <!-- /report -->")
    return blocks


def replace_blocks(path: Path, text: str, make: Callable[[Block], str]) -> Tuple[str, List[Block]]:
    """``text`` with each block's body replaced by ``make(block)``; also the blocks whose body
    changed."""
    lines = text.split("\n")
    changed = []
    for block in reversed(find_blocks(path, text)):
        new = make(block).strip("\n")
        if new != block.body.strip("\n"):
            changed.append(block)
        start, end = block.span
        lines[start + 1:end] = new.split("\n") if new else []
    return "\n".join(lines), changed[::-1]
