"""DeepSpeed ZeRO-3 (build(target="deepspeed")): three steps, destroy_process_group(), return."""
import torch
import torch.distributed as dist

import slapo
from slapo.testing import example_inputs, tiny_model

config = {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.0,
          "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
engine, _ = slapo.build(slapo.create_schedule(tiny_model("gpt2", use_cache=False)),
                        target="deepspeed", config=config,
                        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
for step in range(3):
    loss = engine(**example_inputs("gpt2", batch=2, seq=8, seed=step)).loss
    engine.backward(loss)
    engine.step()
dist.destroy_process_group()
