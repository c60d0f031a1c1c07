"""Per-model schedules: ``apply_schedule(model, "bert", model_config=cfg, **knobs)``.

Recipes are registered explicitly by importing their modules here.
"""

from .config import ScheduleConfig, checkpoint_layer_ids
from .registry import apply_schedule, list_model_schedules, register_model_schedule

__all__ = ["apply_schedule", "list_model_schedules", "register_model_schedule",
           "ScheduleConfig", "checkpoint_layer_ids"]

# The recipes (explicit registration: one import per family).
from . import bert  # noqa: E402,F401
from . import gpt2, llama, opt  # noqa: E402,F401
