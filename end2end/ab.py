"""``python -m end2end.ab``: a paired A/B check of two modes (:mod:`end2end.driver.ab`);
kept as a command name."""

from end2end.driver.ab import main

if __name__ == "__main__":
    raise SystemExit(main())
