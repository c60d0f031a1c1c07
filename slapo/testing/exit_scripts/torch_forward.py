"""Plain PyTorch, forward only (the issue's most frequent abort): TP 2, one forward, exit."""
import torch.distributed as dist

import slapo
from slapo.model_schedule import apply_schedule
from slapo.testing import example_inputs, tiny_model

dist.init_process_group("gloo")
model = tiny_model("gpt2")
model, _ = slapo.build(apply_schedule(model, "gpt2", model_config=model.config))
print(model(**example_inputs("gpt2")).loss.item())
dist.destroy_process_group()
