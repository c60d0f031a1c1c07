"""usability/loc.py (Table 4): the counting rule, and a row for every registered schedule."""

from slapo.model_schedule import list_model_schedules
from usability.loc import code_lines, main, table

SOURCE = '''"""Module docs,
two lines."""
import torch
from typing import (Any,
                    List)

# a comment


def recipe(sch, cfg):
    """Docs of the recipe."""
    for layer in sch.layers:  # a loop counts: it is code
        sch[layer].checkpoint()
    x = dict(a=1,
             b=2)
    return x
'''


def test_code_lines_skip_docstrings_comments_blanks_and_imports():
    # def, for, checkpoint, two lines of dict(...), return
    assert code_lines(SOURCE) == 6
    assert code_lines("x = 1\n\n\n# c\ny = 2  # c\n") == 2


def test_every_registered_schedule_has_a_row():
    rows = table()
    recipes = [r for r in rows if not r["family"].startswith("(")]
    builtin = {"albert", "bert", "roberta", "gpt2", "gpt_neo", "opt", "t5", "llama", "wideresnet",
               "auto"}
    assert builtin <= set(list_model_schedules())  # (tests may register more)
    assert sorted(r["family"] for r in recipes) == sorted(builtin)
    shared = [r["module"] for r in rows if r["family"] == "(shared helpers)"]
    assert shared == ["slapo/model_schedule/common.py", "slapo/model_schedule/replacements.py",
                      "slapo/model_schedule/pipeline_cuts.py",
                      "slapo/model_schedule/checkpointing.py"]
    by = {r["family"]: r for r in rows}
    assert by["bert"]["module"] == by["roberta"]["module"]
    assert by["bert"]["shared_with"] == ["roberta"]
    # short recipes, not whole modules (auto is a generator for every family with a plan)
    assert all(0 < r["lines"] <= 80 for r in recipes if r["family"] != "auto")
    auto = [r["module"] for r in rows if r["shared_with"] == ["auto"]]
    assert auto == ["slapo/model_schedule/auto_checks.py", "slapo/model_schedule/tp_plan/",
                    "slapo/model_schedule/moe.py", "slapo/model_schedule/moe_dense.py"]
    assert by["auto"]["module"] == "slapo/model_schedule/auto.py" and by["auto"]["lines"] > 0
    assert by["gpt_neo"]["paper"] == 10 and by["albert"]["paper"] is None


def test_cli_prints_the_markdown_table(capsys, tmp_path):
    assert main(["--json", str(tmp_path / "t.json")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| family | recipe module | code lines")
    assert "| opt | `slapo/model_schedule/opt.py` |" in out
    assert (tmp_path / "t.json").read_text().startswith("[")


def test_readme_table_is_current():
    """usability/README.md shows what loc.py prints now (regenerate it after changing a recipe:
    python -m usability.loc)."""
    from pathlib import Path

    from usability.loc import markdown

    readme = (Path(__file__).resolve().parents[2] / "usability" / "README.md").read_text()
    assert markdown(table()) in readme


def test_readme_update_replaces_only_the_table():
    import pytest

    from usability.loc import markdown, update_readme

    new = markdown(table())
    text = "intro\n\n" + new.splitlines()[0] + "\n|---|\n| x |\n\nafter\n"
    out = update_readme(text, new)
    assert out == "intro\n\n" + new + "\n\nafter\n"
    with pytest.raises(ValueError, match="expected one table"):
        update_readme("no table here\n", new)
