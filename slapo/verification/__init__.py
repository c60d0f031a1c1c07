"""Checking a schedule: rules without running it, numbers against the original, what changed.

- :mod:`~slapo.verification.rules`: rule checks (``slapo.check_schedule``).
- :mod:`~slapo.verification.verify`: numerical verification (``slapo.verify``, ``slapo.Verify``).
- :mod:`~slapo.verification.options`: how it compares (``slapo.VerifyOptions``).
- :mod:`~slapo.verification.tools`: the report, tolerances, gathering shards, first divergence.
- :mod:`~slapo.verification.explain`: what a schedule changed, module by module
  (``slapo.explain``).

The package is called ``verification`` so that ``slapo.verify`` stays the function.
"""

from .options import VerifyOptions

__all__ = ["VerifyOptions"]
