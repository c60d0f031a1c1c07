"""``python -m end2end.profiling``: compare profiles of runs (:mod:`end2end.driver.profiling`);
kept as a command name."""

from end2end.driver.profiling import main

if __name__ == "__main__":
    raise SystemExit(main())
