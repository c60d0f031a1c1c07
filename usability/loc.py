"""Table 4: how many lines each model's Slapo schedule takes.

    python -m usability.loc [--json PATH]

Counts the *code lines* of every registered model schedule (``slapo.model_schedule``): lines
holding Python tokens, without blank lines, comments, docstrings and imports. A recipe module
may register two families (``bert.py``: bert and roberta; ``gpt2.py``: gpt2 and gpt_neo); their
lines are counted once and both families list the module. The shared helpers (``common.py``
with the ``replacements.py`` and ``pipeline_cuts.py`` it re-exports, ``checkpointing.py``) are
counted once, in rows of their own (``SHARED_HELPERS``), since the recipes call them the way the
paper's schedules call primitives. The ``auto`` schedule (``auto.py``: a schedule derived from
the model's own tensor-parallel plan, for any family that declares one) is a generator, not a
recipe of one family: its row counts ``auto.py``, and the plan interpreter it alone calls
(``auto_checks.py``: the decisions made before any change; ``tp_plan/``: plan styles ->
primitives, a package counted as one row; ``moe.py``: experts and routers; ``moe_dense.py``:
Llama 4's dense-routed experts) has rows of its own (``AUTO_HELPERS``). What a user writes
for it is one line, ``apply_schedule(model, "auto")``. The paper's counts (Table 4) are listed
beside; they count condensed ``.schedule`` pseudo-code with another rule (every line minus
those containing "for"), so they are a reference, not the same measurement.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import io
import json
import sys
import tokenize
from pathlib import Path
from typing import Dict, List, Set

__all__ = ["code_lines", "table", "PAPER_LOC", "AUTO_HELPERS", "SHARED_HELPERS"]

# Table 4 of the paper (artifact README; ``wrn`` = wideresnet, ``gpt`` = GPT-Neo's schedule).
PAPER_LOC = {"bert": 21, "roberta": 21, "t5": 11, "wideresnet": 12, "llama": 11, "opt": 10,
             "gpt_neo": 10}

# Modules the recipes share (counted once each, in rows of their own).
SHARED_HELPERS = ("common", "replacements", "pipeline_cuts", "checkpointing")

# Modules only the ``auto`` schedule calls: its plan interpreter (counted once, beside it).
AUTO_HELPERS = ("auto_checks", "tp_plan", "moe", "moe_dense")

_SKIP_TOKENS = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER}


def _excluded_lines(tree: ast.Module) -> Set[int]:
    """Lines of docstrings and import statements."""
    out: Set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update(range(node.lineno, node.end_lineno + 1))
        if not isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        first = node.body[0] if node.body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                and isinstance(first.value.value, str):
            out.update(range(first.lineno, first.end_lineno + 1))
    return out


def code_lines(source: str) -> int:
    """Lines of ``source`` that hold code (module docs)."""
    excluded = _excluded_lines(ast.parse(source))
    lines: Set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in _SKIP_TOKENS:
            lines.update(ln for ln in range(tok.start[0], tok.end[0] + 1) if ln not in excluded)
    return len(lines)


def table() -> List[Dict[str, object]]:
    """One row per built-in family (module, code lines, families sharing the module, the
    paper's count), then the shared helpers, then the auto schedule's plan interpreter."""
    from slapo.model_schedule import common, registry

    package = Path(inspect.getsourcefile(common)).parent
    by_module: Dict[str, List[str]] = {}
    for name in registry.list_model_schedules():
        path = inspect.getsourcefile(registry._SCHEDULES[name].recipe)
        if Path(path).parent == package:  # the built-in recipes (not ones a user registered)
            by_module.setdefault(path, []).append(name)
    rows = []
    for path, names in sorted(by_module.items(), key=lambda kv: kv[1][0]):
        lines = code_lines(Path(path).read_text())
        for name in names:
            rows.append(dict(family=name, module=f"slapo/model_schedule/{Path(path).name}",
                             lines=lines, shared_with=[n for n in names if n != name],
                             paper=PAPER_LOC.get(name)))
    for name in SHARED_HELPERS:
        path = package / f"{name}.py"
        rows.append(dict(family="(shared helpers)", module=f"slapo/model_schedule/{path.name}",
                         lines=code_lines(path.read_text()), shared_with=["all"], paper=None))
    for name in AUTO_HELPERS:
        path = package / f"{name}.py"
        if not path.exists():  # a sub-package: the code lines of all its modules
            path = package / name
        files = sorted(path.glob("*.py")) if path.is_dir() else [path]
        module = f"slapo/model_schedule/{path.name}" + ("/" if path.is_dir() else "")
        rows.append(dict(family="(auto's plan interpreter)", module=module,
                         lines=sum(code_lines(f.read_text()) for f in files), shared_with=["auto"],
                         paper=None))
    return rows


def markdown(rows: List[Dict[str, object]]) -> str:
    out = ["| family | recipe module | code lines | module shared with | paper (Table 4) |",
           "|---|---|---:|---|---:|"]
    for r in rows:
        out.append(f"| {r['family']} | `{r['module']}` | {r['lines']} | "
                   f"{', '.join(r['shared_with']) or '-'} | "
                   f"{'-' if r['paper'] is None else r['paper']} |")
    return "\n".join(out)


README = Path(__file__).resolve().parent / "README.md"


def update_readme(text: str, new_table: str) -> str:
    """``text`` (usability/README.md) with its line-count table replaced by ``new_table``.

    Raises:
        ValueError: the README holds no table starting with the header :func:`markdown` writes.
    """
    header = new_table.splitlines()[0]
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.rstrip("\n") == header]
    if len(starts) != 1:
        raise ValueError(f"{README}: expected one table starting with '{header}', "
                         f"found {len(starts)}; put one back and re-run with --readme")
    end = starts[0]
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "".join(lines[:starts[0]]) + new_table + "\n" + "".join(lines[end:])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="also write the rows as JSON here")
    p.add_argument("--readme", action="store_true",
                   help="also rewrite the table in usability/README.md in place")
    args = p.parse_args(argv)
    rows = table()
    print(markdown(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.readme:
        README.write_text(update_readme(README.read_text(), markdown(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
