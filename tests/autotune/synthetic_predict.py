"""A predictor command for the synthetic benchmark (``synthetic.py``): prints the prediction line
``slapo.autotune``'s ``predict`` reads, from the benchmark's own memory and throughput model
(``--scale`` misstates the memory; ``--garbage`` prints no JSON; ``--status`` overrides it;
``--log FILE`` appends each predicted candidate)."""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import synthetic


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--ratio", type=float, required=True)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--status", default="sim")
    p.add_argument("--garbage", action="store_true")
    p.add_argument("--log")
    a = p.parse_args()
    if a.log:
        with open(a.log, "a") as fh:
            fh.write(f"{a.batch} {a.ratio:g}\n")
    if a.garbage:
        print("the simulator crashed before printing anything useful")
        return 0
    print(json.dumps({"status": a.status,
                      "memory_gb": synthetic.memory(a.batch, a.ratio) * a.scale,
                      "samples_per_s": synthetic.throughput(a.batch, a.ratio)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
