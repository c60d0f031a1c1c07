"""Plain PyTorch: the gpt2 recipe at TP 2, three SGD steps, destroy_process_group(), return."""
import torch
import torch.distributed as dist

import slapo
from slapo.model_schedule import apply_schedule
from slapo.testing import example_inputs, tiny_model

dist.init_process_group("gloo")
model = tiny_model("gpt2")
sch = apply_schedule(model, "gpt2", model_config=model.config)
model, opt = slapo.build(sch, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
assert opt is not None, "build() was given an optimizer: it returns it"
for step in range(3):
    loss = model(**example_inputs("gpt2", seed=step)).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
