"""``python -m end2end.simulate.check CONFIG [--device PROFILE]``: before a real run, simulate
every line of a config for its device and list the runs predicted to fail or run out of memory
(``bash end2end/run_all_single_node.sh CONFIG --check`` calls it).

The device: ``--device`` if given; else the GPU the config's opening comment names (``V100``,
``A100``, ``H100``, ``H200``: the first of :data:`CONFIG_DEVICES` found in the comment lines
before the first run line, e.g. "8x V100 32 GB" in single_node_asplos24.cfg); else this machine
(its CUDA device's name, or ``cpu``). The simulated rows go to
``results/<config>.<device>.sim.tsv`` (resumed, as ``python -m end2end.simulate``). Exit status
0 when every run is predicted to fit, 1 when some is not (each listed with its reason), 2 for a
bad config or device.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional, Sequence

__all__ = ["main", "config_device", "predicted_problems", "CONFIG_DEVICES"]

# word in a config's opening comment -> profile (first match wins)
CONFIG_DEVICES = (("H200", "h200"), ("H100", "h100-80gb"), ("A100", "a100-80gb"),
                  ("V100", "v100-32gb"))


def _local_device() -> str:
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    name = torch.cuda.get_device_name(0).upper()
    return next((p for word, p in CONFIG_DEVICES if word in name), "cpu")


def config_device(config: str) -> str:
    """The profile a config is for (module docstring): its opening comment, else this machine."""
    head: List[str] = []
    for line in Path(config).read_text().splitlines():
        text = line.strip()
        if text and not text.startswith("#"):
            break
        head.append(text.upper())
    comment = " ".join(head)
    return next((p for word, p in CONFIG_DEVICES if word in comment), None) or _local_device()


def predicted_problems(results: Path) -> List[str]:
    """One line per simulated run not predicted to fit: status, run, reason."""
    from end2end.results.store import read_results

    return [f"{r.status:8s} {r.impl} {r.model} n={r.ngpu} seq={r.seq} batch={r.batch} "
            f"ckpt={r.ckpt}: {r.error.splitlines()[0] if r.error else ''}"[:300]
            for r in read_results(results).rows if r.status != "sim"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    from end2end.simulate.__main__ import main as simulate

    p = argparse.ArgumentParser(prog="python -m end2end.simulate.check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config")
    p.add_argument("--device", default=None, help="the profile (default: see above)")
    p.add_argument("--results", default=None, help="simulated rows (default: see above)")
    args = p.parse_args(argv)
    if not Path(args.config).is_file():
        print(f"end2end.simulate.check: no config file {args.config!r}", file=sys.stderr)
        return 2
    device = args.device or config_device(args.config)
    results = Path(args.results or f"results/{Path(args.config).stem}.{device}.sim.tsv")
    print(f"end2end.simulate.check: {args.config} simulated for {device} -> {results}")
    status = simulate([args.config, "--device", device, "--results", str(results)])
    if status != 0:
        return 2
    problems = predicted_problems(results)
    for line in problems:
        print(line)
    print(f"end2end.simulate.check: {len(problems)} run(s) predicted to fail or run out of "
          f"memory on {device}" if problems else
          f"end2end.simulate.check: every run is predicted to fit on {device}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
