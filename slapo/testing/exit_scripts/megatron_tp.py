"""megatron-core (build(target="megatron")) at TP 2: three steps, destroy_process_group() with
megatron's parallel state still set up, return."""
import torch
import torch.distributed as dist

import slapo
from slapo.dialects.megatron import initialize_megatron
from slapo.model_schedule import apply_schedule
from slapo.testing import example_inputs, tiny_model

tp_group = initialize_megatron(2, seed=7)
model = tiny_model("gpt2", use_cache=False)
sch = apply_schedule(model, "gpt2", model_config=model.config, group=tp_group)
runtime, _ = slapo.build(sch, target="megatron", optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
for step in range(3):
    runtime.train_step(example_inputs("gpt2", batch=2, seq=8, seed=step))
dist.destroy_process_group()
