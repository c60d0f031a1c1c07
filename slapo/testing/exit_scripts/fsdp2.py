"""FSDP2 (build(target="fsdp")) over 2 ranks: three AdamW steps, slapo.teardown(), return."""
import torch

import slapo
from slapo.testing import example_inputs, tiny_model

model, opt = slapo.build(slapo.create_schedule(tiny_model("gpt2", use_cache=False)),
                         target="fsdp", optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3))
assert opt is not None, "build() was given an optimizer: it returns it"
for step in range(3):
    loss = model(**example_inputs("gpt2", batch=2, seq=8, seed=step)).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
slapo.teardown()
