"""Pipeline stages that keep the original parameter paths, and their training.

- :mod:`~slapo.pipeline.stages`: cut a traced model into stages (``build_pipeline_stages``).
- :mod:`~slapo.pipeline.values`: values that cross a cut always travel as tensors.
- :mod:`~slapo.pipeline.runner`: ``PipelineRunner`` (GPipe / 1F1B) and tied weights.
- :mod:`~slapo.pipeline.memory`: a rank keeps only its own stage.
"""

from .runner import PipelineRunner, tied_parameters
from .stages import build_pipeline_stages

__all__ = ["build_pipeline_stages", "tied_parameters", "PipelineRunner"]
