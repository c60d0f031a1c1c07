"""Answer a candidate from another study's measurements: ``python -m autotune.replay --db DB
--study grid --param batch_size={batch_size} --param ckpt_ratio={ckpt_ratio}``.

``autotune/run.sh`` measures the grid once (the ground truth) and then runs the original search
and TPE over the grid's measurements through this command objective (``REPLAY=1``, the
default): every strategy sees the same number for the same candidate, so the comparison is free
of the run-to-run noise of a shared machine, and the study costs one measurement per candidate.
Prints the stored outcome as the JSON line a command objective reads (``fail`` when the
candidate was not measured there).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, Optional, Sequence

__all__ = ["lookup", "main"]


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def lookup(db: str, study: str, params: Dict[str, Any]) -> Dict[str, Any]:
    """The outcome that ``study`` in ``db`` stored for ``params`` (a JSON-able dict). Reads the
    Optuna study directly (the user attributes of ``slapo.autotune.study``): one call per
    candidate, so it does not pay for importing slapo and torch."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials = optuna.load_study(study_name=study, storage=f"sqlite:///{db}").get_trials(
        deepcopy=False)
    for t in trials:
        a = t.user_attrs
        if a.get("status") in ("ok", "oom", "fail", "timeout") and a.get("params") == params:
            out = {"status": a["status"], "error": a.get("error", ""), **a.get("extra", {}),
                   "replayed_from": study}
            if a["status"] == "ok":
                out.update(throughput=a["throughput"], memory_gb=a.get("memory_gb"))
            return out
    return {"status": "fail", "error": f"{params} was not measured in study {study!r} of {db}"}


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autotune.replay", description=__doc__.split(
        "\n\n")[0])
    p.add_argument("--db", required=True)
    p.add_argument("--study", default="grid")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    args = p.parse_args(argv)
    params = {}
    for item in args.param:
        name, _, value = item.partition("=")
        params[name] = _value(value)
    print(json.dumps(lookup(args.db, args.study, params)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
