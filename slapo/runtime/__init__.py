"""What a built model and its trainer use at run time, below every other layer of Slapo.

- :mod:`~slapo.runtime.distributed`: process groups, device and backend, collective timeouts,
  ``teardown`` (public as ``slapo.teardown``).
- :mod:`~slapo.runtime.lifecycle`: why a finished run could abort at interpreter exit, and the
  exit hook that drains the collective back-end's worker threads first.
- :mod:`~slapo.runtime.rng`: named RNG streams (``fork_rng``, tensor-parallel dropout).
- :mod:`~slapo.runtime.activation_checkpoint`: RNG-exact activation checkpointing.
- :mod:`~slapo.runtime.checkpoint_policy`: selective checkpointing's ``SavePolicy`` (which ops'
  outputs a checkpointed module keeps).
- :mod:`~slapo.runtime.forward_wrap`: wrappers that change how a module runs, not its path.
- :mod:`~slapo.runtime.cpu_allocator`: ``keep_freed_memory`` for CPU training.
- :mod:`~slapo.runtime.owner_lock`: one owner at a time for a file (one tuner per study
  database, one sweep per results file), the kernel's ``flock`` through ``filelock``.

These modules import nothing from Slapo but :mod:`slapo.errors`.
"""
