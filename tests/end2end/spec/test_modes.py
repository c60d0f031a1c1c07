"""The table of modes (end2end/spec/modes.py) is the one place a mode is defined: every mode has
exactly one builder and every builder a mode, the CLIs and the docs read the table, the layout
and refusals come from it, and no harness code tests a mode's name anywhere else."""

import ast
import pathlib

import pytest

from slapo.errors import ConfigError

from end2end.driver import ab, bench
from end2end.driver.pipeline_plan import check_pipeline_mode
from end2end.driver.runtimes import BUILDERS, builds
from end2end.spec.modes import MODE_TABLE, MODES, SLAPO_MODES, get_mode, modes_markdown
from end2end.spec.runspec import default_parallel_sizes

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_every_mode_has_one_builder_and_every_builder_a_mode():
    assert sorted(BUILDERS) == sorted(MODES), (
        "a mode needs an entry in end2end/spec/modes.py and a builder registered with "
        "@builds(...) in end2end/driver/builders.py")


def test_a_builder_for_a_mode_without_an_entry_is_refused():
    with pytest.raises(ConfigError, match="unknown mode 'new-mode'"):
        builds("new-mode")(lambda request: None)


def test_unknown_and_retired_modes_say_what_to_use():
    with pytest.raises(ConfigError, match="unknown mode 'megatorn'.*use one of megatron"):
        get_mode("megatorn")
    with pytest.raises(ConfigError, match="TorchScript is deprecated"):
        get_mode("torchscript")


def test_the_command_lines_offer_exactly_the_table():
    mode = next(a for a in bench.build_parser()._actions if a.dest == "mode")
    assert tuple(mode.choices) == MODES
    for name in ("mode_a", "mode_b"):
        action = next(a for a in ab.build_parser()._actions if a.dest == name)
        assert tuple(action.choices) == MODES


def test_the_docs_table_is_the_table():
    text = (ROOT / "end2end" / "README.md").read_text()
    assert modes_markdown() in text, (
        "end2end/README.md's table of modes differs from end2end/spec/modes.py; paste "
        "the output of python -c 'from end2end.spec.modes import modes_markdown as m; "
        "print(m())'")


@pytest.mark.parametrize("mode, n, sizes", [
    ("megatron", 4, (4, 1, 1)), ("slapo", 2, (2, 1, 1)), ("dtensor-tp", 2, (2, 1, 1)),
    ("deepspeed", 4, (1, 1, 4)), ("eager", 2, (1, 1, 2)), ("slapo-fsdp", 8, (1, 1, 8)),
])
def test_default_layouts_come_from_the_table(mode, n, sizes):
    assert default_parallel_sizes(mode, n) == sizes


def test_tp_and_pipeline_refusals_come_from_the_table():
    get_mode("slapo-fsdp").check_tp(2, 1, 8)  # any tp dividing n
    get_mode("slapo").check_tp(2, 1, 2)  # tp = n only
    get_mode("eager").check_tp(2, 2, 4)  # a pipeline takes any tp
    with pytest.raises(ConfigError, match="tp=2 is not available in mode 'slapo'.*"
                       "'megatron'/'slapo-megatron'/'slapo-fsdp' \\(any tp dividing n\\)"):
        get_mode("slapo").check_tp(2, 1, 4)
    with pytest.raises(ConfigError, match="tp=2 is not available in mode 'deepspeed'"):
        get_mode("deepspeed").check_tp(2, 1, 2)
    # a mode whose schedule shards over every rank cannot run TP 1 on several ranks (it used
    # to run TP = n under a row saying TP 1)
    for name in ("slapo", "slapo-auto", "dtensor-tp", "hf-tp"):
        get_mode(name).check_tp(1, 1, 1)
        with pytest.raises(ConfigError, match=f"tp=1 is not available in mode '{name}' on 2"):
            get_mode(name).check_tp(1, 1, 2)
    for name in MODES:
        if get_mode(name).pipeline_enabled:
            check_pipeline_mode(name, 2)
        else:
            with pytest.raises(ConfigError, match=f"not available in mode '{name}'"):
                check_pipeline_mode(name, 2)


def test_every_slapo_mode_is_compared_with_baselines_of_the_table():
    for name in SLAPO_MODES:
        assert get_mode(name).baselines, f"{name} has no baseline to be compared with"
    for mode in MODE_TABLE.values():
        assert all(not get_mode(b).slapo for b in mode.baselines), mode.name
        assert mode.baselines == () or mode.slapo, f"{mode.name} is a baseline"


def _mode_name_tests(source: str) -> list:
    """(line, text) of every comparison of a mode variable (a name or attribute called
    ``*mode*``, ``*impl*`` or ``*system*``: ``mode``, ``spec.mode``, ``row.impl``) with a mode's
    name, and of every ``startswith``/``endswith`` of one with a mode's name. Frameworks and
    launchers that share a name with a mode (``framework == "deepspeed"``) are not modes."""
    names = set(MODES)

    def is_name(node) -> bool:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value in names
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(is_name(e) for e in node.elts)
        return False

    def is_mode_variable(node) -> bool:
        if isinstance(node, ast.Attribute) and node.attr == "str":  # pandas: frame.System.str
            node = node.value
        ident = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
        return any(word in ident.lower() for word in ("mode", "impl", "system"))

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(map(is_name, sides)) and any(map(is_mode_variable, sides)):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("startswith", "endswith") \
                and is_mode_variable(node.func.value) and any(map(is_name, node.args)):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_name_checker_finds_string_tests():
    code = ("if mode == 'megatron': pass\nif spec.mode in ('eager', 'x'): pass\n"
            "ok = row.impl.startswith('slapo')\nfine = mode == 'other'\n"
            "framework = framework == 'deepspeed'\n"
            "bars = bars[bars.System.str.startswith('slapo')]\n")
    assert [line for line, _ in _mode_name_tests(code)] == [1, 2, 3, 6]


def test_no_string_tests_of_mode_names_outside_the_table():
    table = ROOT / "end2end" / "spec" / "modes.py"
    offenders = []
    for folder in ("end2end", "ablation", "autotune"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path != table:
                offenders += [f"{path.relative_to(ROOT)}:{line}: {text}"
                              for line, text in _mode_name_tests(path.read_text())]
    assert not offenders, ("mode names tested outside end2end/spec/modes.py (read the mode's "
                           "entry instead: get_mode(name).slapo, .framework, ...):\n"
                           + "\n".join(offenders))
