"""DeepSpeed's pipeline engine: two stages of a 4-layer GPT-2, train_batch, exit without
teardown or destroy_process_group()."""
import torch

import slapo
from slapo.dialects.deepspeed_pipeline import pipeline_items
from slapo.testing import example_inputs, tiny_model

config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
          "gradient_clipping": 0.0, "steps_per_print": 1000}
sch = slapo.create_schedule(tiny_model("gpt2", n_layer=4, use_cache=False))
sch.trace_until("transformer", example_inputs=example_inputs("gpt2", batch=4))
sch["transformer.h.1"].cut_pipeline_stage()
engine, _ = slapo.build(sch, target="deepspeed", config=config,
                        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
for step in range(2):
    engine.train_batch(pipeline_items(engine, example_inputs("gpt2", batch=4, seq=8, seed=step)))
