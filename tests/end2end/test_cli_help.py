"""Every end2end command line documents itself (issue 19, help): each option has a help text,
choices are listed and real defaults shown; ``python -m end2end.models`` prints the zoo with a
header and parameter counts."""

import argparse

import pytest

from end2end.driver import bench
from end2end.models import listing as models
from end2end.plan import __main__ as plan
from end2end.results import plot
from end2end.sweep import multi_node
from end2end.sweep import single_node as sweep


COMMANDS = {"end2end.sweep": sweep, "end2end.bench": bench, "end2end.plot": plot,
            "end2end.models": models, "end2end.multi_node.launch": multi_node,
            "end2end.plan": plan}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_is_documented_with_choices_and_defaults(command):
    module = COMMANDS[command]
    parser = module.build_parser()
    text = parser.format_help()
    assert parser.prog == f"python -m {command}"
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, f"{module.__name__}: {action.dest} has no help"
        if action.choices:
            assert "{" + ",".join(action.choices) + "}" in text
        real_default = (action.option_strings and action.nargs != 0 and not action.required
                        and action.default not in (None, [], argparse.SUPPRESS))
        if real_default:
            assert f"(default: {action.default})" in " ".join(text.split()), action.dest


def test_a_long_default_path_is_never_broken_across_lines(monkeypatch):
    from end2end.cli import HelpFormatter

    monkeypatch.setenv("COLUMNS", "60")
    path = "/check/work/main/docs/results/cpu_proof/a-rather-long-calibration-file-name.json"
    parser = argparse.ArgumentParser(prog="p", formatter_class=HelpFormatter)
    parser.add_argument("--calibration", default=path, help="the cpu profile's calibration file")
    lines = parser.format_help().splitlines()
    assert any(line.strip() == f"(default: {path})" or line.strip().endswith(path + ")")
               for line in lines), lines


def test_models_lists_the_zoo_with_a_header_and_parameter_counts(capsys):
    assert models.main(["--family", "wideresnet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["NAME", "FAMILY", "PAPER"] and "PARAMS" in lines[0]
    row = next(ln for ln in lines if ln.startswith("wide_resnet50_2 "))
    assert "68.88 M" in row  # torchvision's 68,883,240 parameters
