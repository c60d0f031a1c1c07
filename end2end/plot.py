"""``python -m end2end.plot``: Figure 7 from results files (:mod:`end2end.results.plot`);
kept as a command name."""

from end2end.results.plot import main

if __name__ == "__main__":
    raise SystemExit(main())
