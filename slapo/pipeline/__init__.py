"""Pipeline stages that keep the original parameter paths, and their training.

- :mod:`~slapo.pipeline.stages`: cut a traced model into stages (``build_pipeline_stages``).
- :mod:`~slapo.pipeline.values`: values that cross a cut always travel as tensors.
- :mod:`~slapo.pipeline.runner`: ``PipelineRunner`` (GPipe / 1F1B) and tied weights.
- :mod:`~slapo.pipeline.memory`: a rank keeps only its own stage.
"""

from ..errors import original_name, register_original_names
from .runner import PipelineRunner, tied_parameters
from .stages import build_pipeline_stages

__all__ = ["build_pipeline_stages", "tied_parameters", "PipelineRunner"]

# Names of the original Slapo's slapo.pipeline that are spelled differently here (docs/porting.md).
_ORIGINAL_NAMES = {
    "generate_pipeline_partition": "slapo.build(sch) partitions at the cut_pipeline_stage() "
                                   "cuts (slapo.pipeline.build_pipeline_stages(sch) returns the "
                                   "stage modules themselves)",
    "analyze_tie_weights": "slapo.pipeline.tied_parameters(stages) lists the parameters that "
                           "several stages share",
}


register_original_names("slapo.pipeline", _ORIGINAL_NAMES)


def __getattr__(name: str):
    raise original_name("slapo.pipeline", name, _ORIGINAL_NAMES)
