"""The torch pipeline runner: two stages of a 4-layer GPT-2, 1F1B, teardown, then destroy."""
import torch
import torch.distributed as dist

import slapo
from slapo.testing import example_inputs, tiny_model

dist.init_process_group("gloo")
sch = slapo.create_schedule(tiny_model("gpt2", n_layer=4, use_cache=False))
sch.trace_until("transformer", example_inputs=example_inputs("gpt2", batch=4))
sch["transformer.h.1"].cut_pipeline_stage()
model, opt = slapo.build(sch, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
                         n_microbatches=2, pipeline_schedule="1f1b")
for step in range(2):
    model.train_step(example_inputs("gpt2", batch=4, seq=8, seed=step))
slapo.teardown()
dist.destroy_process_group()
