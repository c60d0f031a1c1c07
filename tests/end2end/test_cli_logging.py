"""Status and diagnostics through logging (end2end.cli): ``name: message`` lines, status to
stdout and warnings to stderr, only rank 0 unless a record is a warning or marked all-ranks,
levels, and configure_logging called many times prints each line once."""

import logging

import pytest

from end2end.cli import (ALL_RANKS, add_logging_arguments, configure_logging, get_logger,
                         is_rank_zero)


@pytest.fixture(autouse=True)
def _fresh_logging():
    configure_logging()
    yield
    configure_logging()


def test_lines_name_the_command_status_to_stdout_warnings_to_stderr(capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    log = get_logger("end2end.bench")
    log.info("cpu/bert n=2: %.3f samples/s", 12.3456)
    log.error("fail: rank 1: boom")
    log.debug("not at INFO")
    out, err = capsys.readouterr()
    assert out == "end2end.bench: cpu/bert n=2: 12.346 samples/s\n"
    assert err == "end2end.bench: fail: rank 1: boom\n"


def test_only_rank_zero_speaks_unless_a_warning_or_all_ranks(capsys, monkeypatch):
    log = get_logger("end2end.sweep")
    monkeypatch.setenv("RANK", "1")
    assert not is_rank_zero()
    log.info("status of rank 1")
    log.info("rank 1: own status", extra=ALL_RANKS)
    log.warning("warning: rank 1 is slow")
    out, err = capsys.readouterr()
    assert out == "end2end.sweep: rank 1: own status\n"
    assert err == "end2end.sweep: warning: rank 1 is slow\n"
    monkeypatch.setenv("RANK", "0")
    log.info("status of rank 0")
    assert capsys.readouterr().out == "end2end.sweep: status of rank 0\n"


def test_levels_and_repeated_configuration(capsys):
    configure_logging("warning")
    configure_logging("warning")  # idempotent: one handler, one line per record
    log = get_logger("ablation.plot")
    log.info("hidden")
    log.warning("shown once")
    assert capsys.readouterr() == ("", "ablation.plot: shown once\n")
    configure_logging("debug")
    get_logger("end2end.sweep.detail").debug("a child logger, at debug")
    assert capsys.readouterr().out == "end2end.sweep.detail: a child logger, at debug\n"
    with pytest.raises(ValueError, match="unknown log level 'loud'"):
        configure_logging("loud")
    assert not logging.getLogger("end2end").propagate  # the root logger never prints them twice


def test_log_level_option():
    import argparse

    p = argparse.ArgumentParser()
    add_logging_arguments(p)
    assert p.parse_args([]).log_level == "info"
    assert p.parse_args(["--log-level", "debug"]).log_level == "debug"
    with pytest.raises(SystemExit):
        p.parse_args(["--log-level", "loud"])
