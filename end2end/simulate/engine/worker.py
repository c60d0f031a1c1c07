"""``python -m end2end.simulate.engine.worker PROFILE [CALIBRATION]``: simulate the RunSpec read as
JSON
from stdin (:meth:`end2end.spec.runspec.RunSpec.to_json`) and print the row's fields as one JSON
line (:func:`end2end.simulate.engine.run.simulate_in_process`). Started by
:func:`end2end.simulate.engine.run.simulate_run`, one process per run."""

from __future__ import annotations

import json
import os
import sys
import warnings


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    warnings.filterwarnings("ignore")
    from end2end.simulate.cost.profiles import get_profile
    from end2end.simulate.engine.run import simulate_in_process
    from end2end.spec.runspec import RunSpec

    profile = get_profile(argv[0], argv[1] if len(argv) > 1 and argv[1] else None)
    values = simulate_in_process(RunSpec.from_json(sys.stdin.read()), profile)
    sys.stdout.write("\n" + json.dumps(values, default=str) + "\n")
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown (megatron/fake-group state can abort it)


if __name__ == "__main__":
    sys.exit(main())
