"""A synthetic benchmark with a known optimum and an out-of-memory region, for the tuner's tests.

As a function (:func:`objective`) and as a command (``python synthetic.py --batch B --ratio R``,
printing the JSON result line a command objective reads). Memory grows with the batch and
shrinks with the checkpoint ratio; throughput grows with the batch (saturating) and loses up to
20 % to recomputation: the best candidate lies on the edge of the OOM region, as on real
machines. ``--log FILE`` appends each evaluated candidate; ``--kill-parent-at N`` kills the
calling tuner with SIGKILL while evaluating its N-th logged candidate (a crash mid-study).
"""

import argparse
import json
import os
import signal
import sys

LIMIT = 48.0
FAIL_BATCH = 28  # with ratio 1.0: not an OOM, a crash (fail status)


def space():
    from slapo.autotune import Space

    s = Space("synthetic")
    s.int("batch_size", 4, 32, step=4)
    s.float("ckpt_ratio", 0.0, 1.0, step=0.2)
    return s


def memory(batch, ratio):
    return batch * (1 + 2 * (1 - ratio))


def throughput(batch, ratio):
    return 100 * batch / (batch + 4) * (1 - 0.2 * ratio)


def objective(values):
    """Throughput, or MemoryError in the OOM region."""
    b, r = values["batch_size"], values["ckpt_ratio"]
    if memory(b, r) > LIMIT:
        raise MemoryError(f"synthetic OOM: {memory(b, r):g} > {LIMIT:g}")
    return {"status": "ok", "throughput": throughput(b, r), "memory_gb": memory(b, r)}


def optimum():
    """The best candidate by brute force over the space (the ground truth of the tests)."""
    best = None
    for c in space().candidates():
        if memory(c["batch_size"], c["ckpt_ratio"]) <= LIMIT:
            t = throughput(c["batch_size"], c["ckpt_ratio"])
            best = max(best or (t, c), (t, c), key=lambda x: x[0])
    return best


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--ratio", type=float, required=True)
    p.add_argument("--log")
    p.add_argument("--kill-parent-at", type=int, default=0)
    p.add_argument("--result-file")
    a = p.parse_args()
    if a.log:
        with open(a.log, "a") as fh:
            fh.write(f"{a.batch} {a.ratio:g}\n")
        with open(a.log) as fh:
            n = len(fh.readlines())
        if n == a.kill_parent_at:
            os.kill(os.getppid(), signal.SIGKILL)
    if a.batch == FAIL_BATCH and a.ratio == 1.0:
        print("synthetic crash", file=sys.stderr)
        return 3
    if memory(a.batch, a.ratio) > LIMIT:
        result = {"status": "oom", "error": "synthetic OOM"}
    else:
        result = {"throughput": throughput(a.batch, a.ratio),
                  "memory_gb": memory(a.batch, a.ratio),
                  "config_line": f"synthetic {a.batch} {a.ratio:g}"}
    if a.result_file:
        with open(a.result_file, "w") as fh:
            json.dump(result, fh)
    else:
        print("some log line")
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
