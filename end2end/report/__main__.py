"""``python -m end2end.report [--check] [FILE ...]``: rewrite the generated blocks of the docs from
the committed results (see :mod:`end2end.report`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from end2end.cli import HelpFormatter, get_logger, report_errors

from .blocks import find_blocks, replace_blocks
from .generators import render

ROOT = Path(__file__).resolve().parents[2]
#: The documents searched for blocks when no FILE is given (relative to the repository root).
DOCUMENTS = ("README.md", "docs/*.md", "*/README.md")


def documents(root: Path = ROOT) -> List[Path]:
    """Every Markdown file of :data:`DOCUMENTS` under ``root``, sorted."""
    found = {p for pattern in DOCUMENTS for p in root.glob(pattern)}
    return sorted(p for p in found if p.is_file() and ".venv" not in p.parts)


def update(paths: Sequence[Path], root: Path = ROOT, check: bool = False) -> int:
    """Regenerate the blocks of ``paths`` (write them back unless ``check``); the exit status:
    0, or 1 when ``check`` finds a block that differs (named on stderr)."""
    log = get_logger("end2end.report")
    total = 0
    for path in paths:
        text = path.read_text()
        rel = path.relative_to(root) if path.is_relative_to(root) else path
        new, changed = replace_blocks(rel, text, lambda block: render(root, block))
        total += len(find_blocks(rel, text))
        if check and changed:
            first = changed[0]
            log.error("%s: the generated block '%s' differs from what its source gives; "
                      "run python -m end2end.report (and commit), or fix the source",
                      first.where, first.label)
            return 1
        if changed and not check:
            path.write_text(new)
            for block in changed:
                log.info("%s: rewrote '%s'", block.where, block.label)
    log.info("%d generated block(s) in %d file(s) %s", total, len(paths),
             "up to date" if check else "written")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line (every option documented)."""
    p = argparse.ArgumentParser(
        prog="python -m end2end.report", formatter_class=HelpFormatter,
        description="Rewrite the generated blocks (<!-- report: KIND ARGS --> ... "
                    "<!-- /report -->) of the docs from the committed results in docs/results/. "
                    "Exit status 1 with --check when a block differs, 2 (one line) on a "
                    "malformed block or a missing source.")
    p.add_argument("files", nargs="*", type=Path,
                   help=f"Markdown files (default: {', '.join(DOCUMENTS)})")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 naming the first block that differs")
    p.add_argument("--debug", action="store_true", help="full traceback of an error")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    paths = [p.resolve() for p in args.files] or documents()
    return report_errors("python -m end2end.report",
                         lambda: update(paths, check=args.check), args.debug)


if __name__ == "__main__":
    sys.exit(main())
