"""Per-model schedules: ``apply_schedule(model, "bert", model_config=cfg, **knobs)``.

Recipes are registered explicitly by importing their modules here.
"""

from .config import ScheduleConfig, checkpoint_layer_ids
from .registry import (apply_schedule, check_knobs, list_knobs, list_model_schedules,
                       register_model_schedule, supports_sequence_parallel)

__all__ = ["apply_schedule", "list_model_schedules", "register_model_schedule", "list_knobs",
           "check_knobs", "supports_sequence_parallel", "ScheduleConfig", "checkpoint_layer_ids"]

# The recipes (explicit registration: one import per module; gpt2 also registers gpt_neo, bert
# also registers roberta).
from . import albert, auto, bert, gpt2, llama, opt, t5, wideresnet  # noqa: F401
