"""``python -m end2end.models``: list the model zoo (:mod:`end2end.models.listing`)."""

from end2end.models.listing import main

raise SystemExit(main())
