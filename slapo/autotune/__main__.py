"""``python -m slapo.autotune`` (see :mod:`slapo.autotune.cli`)."""

import sys

from .cli import main

sys.exit(main())
