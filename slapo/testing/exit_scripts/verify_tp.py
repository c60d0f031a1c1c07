"""slapo.verify over 2 ranks: the gpt2 recipe at TP 2 checked against the original (forward,
gradients, SGD steps), then the interpreter exits without slapo.teardown() (the exit hook
drains)."""
import copy

import torch.distributed as dist

import slapo
from slapo.model_schedule import apply_schedule
from slapo.testing import example_inputs, tiny_model

dist.init_process_group("gloo")
model = tiny_model("gpt2")
original = copy.deepcopy(model)
sch = apply_schedule(model, "gpt2", model_config=model.config)
report = slapo.verify(sch, example_inputs("gpt2"), reference=original)
assert report.ok, report
