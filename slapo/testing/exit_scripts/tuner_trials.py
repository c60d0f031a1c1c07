# launch: python
"""The tuner's trial processes: ``tune()`` evaluates two candidates, each a 2-rank torchrun run
of the gpt2 recipe at TP 2 (the trial program below, written next to this script); every trial
and the tuner itself must exit 0."""
import pathlib
import sys

from slapo.autotune import Space, tune

TRIAL = '''
import json, sys, time
import torch, torch.distributed as dist
import slapo
from slapo.model_schedule import apply_schedule
from slapo.testing import example_inputs, tiny_model

dist.init_process_group("gloo")
model = tiny_model("gpt2")
sch = apply_schedule(model, "gpt2", model_config=model.config)
model, opt = slapo.build(sch, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
batch, start = int(sys.argv[1]), time.monotonic()
for step in range(2):
    model(**example_inputs("gpt2", batch=batch, seed=step)).loss.backward()
    opt.step()
    opt.zero_grad()
if dist.get_rank() == 0:
    print(json.dumps({"status": "ok", "throughput": 2 * batch / (time.monotonic() - start)}))
'''

pathlib.Path("trial.py").write_text(TRIAL)
space = Space()
space.int("batch_size", 2, 4, step=2)
result = tune(space, [sys.executable, "-m", "torch.distributed.run", "--standalone",
                      "--nproc_per_node", "2", "trial.py", "{batch_size}"],
              strategy="grid", budget=2, timeout=240)
statuses = [(r.status, r.error[-300:]) for r in result.evaluated]
assert [s for s, _ in statuses] == ["ok", "ok"], statuses
