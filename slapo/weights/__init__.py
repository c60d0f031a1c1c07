"""Weights of sharded models: created without memory, materialised per rank, saved and reloaded
at any tensor-parallel degree.

- :mod:`~slapo.weights.delayed_init`: ``init_empty_weights`` and ``materialize`` (meta device).
- :mod:`~slapo.weights.init_plan`: which tensors each module's initialiser writes.
- :mod:`~slapo.weights.checkpoint_io`: ``save_checkpoint`` / ``load_checkpoint`` with resharding.
- :mod:`~slapo.weights.checkpoint_format`: the on-disk format and the geometry of pieces.
"""
