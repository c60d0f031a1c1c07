"""The model zoo: benchmark model names -> sizes (:mod:`.zoo`) -> HF configs, random-initialised
models and synthetic inputs (:mod:`.build`), WideResNet (:mod:`.wideresnet`), FLOP counts
(:mod:`.flops`), models by shape (``FAMILY:key=value,...`` or an HF ``config.json``:
:mod:`.shaped`). ``python -m end2end.models`` lists the zoo (:mod:`.listing`)."""

from end2end.models.build import (MODEL_CLASSES, ModelShapeError, ModelSpec, UnknownModelError,
                                  build_hf_config,
                                  build_model, count_parameters, get_model_spec, list_models,
                                  make_inputs, scale_down)

__all__ = ["ModelSpec", "UnknownModelError", "ModelShapeError", "list_models", "get_model_spec",
           "build_hf_config",
           "build_model", "make_inputs", "scale_down", "count_parameters", "MODEL_CLASSES"]
