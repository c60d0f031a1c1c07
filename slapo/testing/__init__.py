"""Helpers for testing schedules: multi-rank runs on gloo, tiny models, numerical comparison."""

from .compare import assert_same_training, grads_of, train_step
from .distributed import DistributedTimeout, RankFailure, run_distributed
from .models import FAMILIES, MLP, example_inputs, seeded, tiny_config, tiny_model

__all__ = [
    "run_distributed", "RankFailure", "DistributedTimeout",
    "FAMILIES", "tiny_config", "tiny_model", "example_inputs", "MLP", "seeded",
    "train_step", "grads_of", "assert_same_training",
]
