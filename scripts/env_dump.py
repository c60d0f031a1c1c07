#!/usr/bin/env python
"""Print the benchmark environment (versions, git commit, device, CPU, threads).

    python scripts/env_dump.py            # key: value lines
    python scripts/env_dump.py --json     # one JSON object
    python scripts/env_dump.py --device cpu

The same dict heads every results file written by end2end/results/store.py.
"""

from __future__ import annotations

import argparse
import json
import sys

from end2end.results.environment import env_dump, format_env


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    args = parser.parse_args(argv)
    env = env_dump(args.device)
    print(json.dumps(env, sort_keys=True) if args.json else format_env(env))
    return 0


if __name__ == "__main__":
    sys.exit(main())
