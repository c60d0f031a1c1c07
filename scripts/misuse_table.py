"""Render docs/errors.md: every misuse case of tests/misuse_cases.py (schedules, and weights in
and out) with the error it raises (single-process cases, then the two-rank ones on 2 gloo
ranks).

    .venv/bin/python -m scripts.misuse_table > docs/errors.md     # from the repository root

It runs as a module from the repository root because the cases live in the test suite
(``tests.misuse_cases``, not an installed package); the two-rank cases run in spawned processes,
which import them by that name too.
"""

from __future__ import annotations

import re
import sys
import warnings

warnings.filterwarnings("ignore")

from slapo.testing import run_distributed  # noqa: E402

try:
    from tests.misuse_cases import CASES, TP_CASES, run_case, run_tp_cases
except ModuleNotFoundError as exc:
    if exc.name != "tests":
        raise
    print("misuse_table: error: the test suite's cases are not importable. Hint: run it from "
          "the repository root: python -m scripts.misuse_table > docs/errors.md", file=sys.stderr)
    sys.exit(2)


def _row(primitive: str, description: str, result: tuple) -> str:
    kind, message, _ = result
    message = message.replace("|", "\\|").replace("\n", " ")
    message = re.sub(r"/[^' ]*slapo-misuse-[^' ]*", "DIR", message)  # the cases' temporary dirs
    return f"| `{primitive}` | {description} | `{kind}` | {message} |"


def main() -> None:
    rows = [_row(p, d, run_case(fn)) for p, d, fn in CASES]
    tp = run_distributed(run_tp_cases, 2)[0]
    rows += [_row(p, d + " (TP=2)", r) for (p, d, _), r in zip(TP_CASES, tp)]
    print("# Schedule mistakes and the errors they raise\n")
    print("Every user mistake raises a `slapo.SlapoError` subclass naming the call, the module "
          "path, what is wrong and how to fix it. This table is generated from the cases that "
          "`tests/test_misuse.py` checks (`python -m scripts.misuse_table > docs/errors.md`). "
          "Besides schedules it covers weights in and out (`load_pretrained`, "
          "`save_training_state`/`load_training_state`, `export_pretrained`: "
          "[hub_checkpoints.md](hub_checkpoints.md)); `DIR` stands for the directory given.\n")
    print(f"{len(rows)} cases.\n")
    print("| primitive | misuse | error | message |")
    print("|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
