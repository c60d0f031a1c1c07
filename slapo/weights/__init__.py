"""Weights of sharded models: created without memory, materialised per rank or loaded from a
HuggingFace checkpoint, saved and reloaded at any tensor-parallel degree, exported back.

- :mod:`~slapo.weights.delayed_init`: ``init_empty_weights`` and ``materialize`` (meta device).
- :mod:`~slapo.weights.init_plan`: which tensors each module's initialiser writes.
- :mod:`~slapo.weights.checkpoint_io`: ``load_checkpoint`` (DCP or the older format) and the
  deprecated ``save_checkpoint`` wrapper.
- :mod:`~slapo.weights.checkpoint_format`: the on-disk format and the geometry of pieces.
- :mod:`~slapo.weights.hub_load` (with :mod:`~slapo.weights.hub_plan`,
  :mod:`~slapo.weights.hub_files`): ``load_pretrained``, HF safetensors into a sharded model.
- :mod:`~slapo.weights.hub_export`: ``export_pretrained``, back to a HF checkpoint.
- :mod:`~slapo.weights.training_state`: ``save_training_state`` / ``load_training_state`` on
  torch.distributed.checkpoint; :mod:`~slapo.weights.convert` converts the older format to it.
"""
