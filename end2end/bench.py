"""``python -m end2end.bench``: the training driver (:mod:`end2end.driver.bench`);
kept as a command name."""

from end2end.driver.bench import main

if __name__ == "__main__":
    raise SystemExit(main())
