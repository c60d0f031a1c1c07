"""Trace-by-need: turn one module into a graph that keeps the module hierarchy, and find
patterns in such graphs.

- :mod:`~slapo.trace.tracer`: the value-propagating ``fx`` tracer (``trace_module``);
  :mod:`~slapo.trace.example_values`: which example inputs stay symbolic, copies kept for later.
- :mod:`~slapo.trace.guards`: the guards that make specialised branches and arguments fail loudly.
- :mod:`~slapo.trace.modes`: traces exact in training and evaluation mode, or refusing one.
- :mod:`~slapo.trace.compute_dtype`: traces for a mixed-precision runtime (``compute_dtype``).
- :mod:`~slapo.trace.graph_module`: the GraphModule that takes the traced module's place.
- :mod:`~slapo.trace.type_checks`: ``isinstance`` on traced values answers as for the values.
- :mod:`~slapo.trace.pattern`: subgraph patterns for ``find`` / ``fuse`` (``Subgraph``).
- :mod:`~slapo.trace.dynamo`: ``trace(tracer="dynamo")``, a flat ``torch.export`` graph for
  code the default tracer cannot follow.
"""
