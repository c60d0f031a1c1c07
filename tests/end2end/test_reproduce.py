"""``scripts/reproduce.sh`` (issue 38 item 1): a tiny plan end to end (one cheap step), the index
page and its HTML twin, resume, and one-line errors for bad options. The whole plan is never
run here (--quick takes about 15 minutes); its commands are checked by a dry run."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from end2end.reproduce.page import write_index
from end2end.reproduce.plan import PLANS, plan, step_names
from end2end.reproduce.runner import Outcome, estimate_left

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ["bash", str(ROOT / "scripts" / "reproduce.sh")]
ENV_SKIP = {"SKIP_SETUP": "1"}


def _run(*args, cwd=ROOT, timeout=300):
    import os

    return subprocess.run([*SCRIPT, *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **ENV_SKIP}, timeout=timeout)


def test_both_plans_have_every_figure_and_table():
    wanted = {"table4", "fig7", "peers", "pipelines", "fusions", "ablation", "autotune",
              "sim-fig7", "sim-fig8", "sim-fig9", "sim-fig10"}
    for name in PLANS:
        steps = plan(name)
        assert [s.name for s in steps] == step_names() and set(step_names()) == wanted
        assert all(s.commands and s.estimate_s > 0 and s.paper for s in steps)
    quick = sum(s.estimate_s for s in plan("quick"))
    assert quick <= 16 * 60, f"--quick is estimated at {quick / 60:.1f} min (promised ~15)"


def test_a_tiny_plan_writes_the_page_and_resumes(tmp_path):
    out = tmp_path / "out"
    run = _run("--steps", "table4", "--out", str(out))
    assert run.returncode == 0, run.stderr
    assert "[1/1] table4: Table 4" in run.stdout and "left" in run.stdout
    index = (out / "index.md").read_text()
    assert "| [table4](#table-4-schedule-lines-of-code) | " in index and "| ok |" in index
    assert "| bert | `slapo/model_schedule/bert.py` |" in index  # this run's Table 4, included
    assert "Status: not run." in index  # the steps left out are on the page too
    assert "| `cpu/bert` (256, 4), 2 |" in index  # the committed Figure 7 table beside them
    page = (out / "index.html").read_text()
    assert "<table>" in page and '<img src="committed/cpu-fig7.png"' in page
    state = json.loads((out / ".reproduce" / "table4.json").read_text())
    assert state["status"] == "ok" and "usability.loc" in state["commands"][0]

    again = _run("--steps", "table4", "--out", str(out))
    assert again.returncode == 0 and "table4: done already" in again.stdout, again
    assert json.loads((out / ".reproduce" / "table4.json").read_text()) == state  # not rerun
    log = (out / "table4" / "log.txt").read_text()
    assert log.count("$ ") == 1

    refused = _run("--full", "--steps", "table4", "--out", str(out))
    assert refused.returncode == 2 and refused.stderr.strip().count("\n") == 0
    assert "holds a --quick reproduction, not a --full one" in refused.stderr


@pytest.mark.parametrize("args, message", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--quick", "--full"], "argument --full: not allowed with argument --quick"),
    (["--steps", "fig11"], "--steps 'fig11': no step named fig11. Hint: steps are table4"),
])
def test_bad_options_are_one_line(tmp_path, args, message):
    run = _run(*args, "--out", str(tmp_path / "o"))
    assert run.returncode == 2 and not run.stdout, run
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("scripts/reproduce.sh: error: ") and message in line, line
    assert not (tmp_path / "o").exists()


def test_a_dry_run_names_every_command_and_runs_nothing(tmp_path):
    out = tmp_path / "dry"
    run = _run("--dry-run", "--require-quiet", "--out", str(out))
    assert run.returncode == 0, run.stderr
    assert "quick.cfg --repeat 2 --require-quiet" in run.stdout  # the sweeps wait for quiet
    assert "--scale tiny --repeat 1 --require-quiet" in run.stdout
    assert "bash autotune/run.sh --require-quiet" in run.stdout  # the tuner's measured trials
    assert "usability.loc --json" in run.stdout and "loc.md --require-quiet" not in run.stdout
    for text in ("end2end/configs/quick.cfg --repeat 2", "ablation/run.sh --scale tiny",
                 "SPACE=autotune/spaces/tiny_bert.py", "-m end2end.simulate end2end/configs/"
                 "single_node_asplos24.cfg --device v100-32gb", "--only llama-7b --only n=16",
                 "-m autotune.predicted_grid", f"RESULTS={out}/fig7/quick.tsv"):
        assert text in run.stdout, text
    assert not (out / "index.md").exists() and not list(out.glob("*/log.txt"))


def test_the_page_lays_a_figure_beside_the_committed_one(tmp_path):
    """A step that drew its figure: the page shows it inline beside the committed figure, a
    failed step says why, and a table whose file is missing says so."""
    steps = plan("quick")
    (tmp_path / "fig7").mkdir()
    shutil.copyfile(ROOT / "docs" / "figures" / "cpu-fig7.png",
                    tmp_path / "fig7" / "quick-fig7.png")
    outcomes = {"fig7": Outcome("fig7", "ok", 81.0, "2026-12-03 05:00 UTC", ["bash x"]),
                "peers": Outcome("peers", "failed", 3.0, "2026-12-03 05:01 UTC", ["bash y"],
                                 "`bash y` exited 1 (log: peers/log.txt)")}
    md, html = write_index(tmp_path, steps, outcomes, "quick", "bash scripts/reproduce.sh", 84.0)
    text = md.read_text()
    assert "| ![quick-fig7.png](fig7/quick-fig7.png) | " \
           "![docs/figures/cpu-fig7.png](committed/cpu-fig7.png) |" in text
    assert "Status: **failed** after 3s: `bash y` exited 1" in text
    assert "*Not available: index.md:0: results file quick.tsv does not exist*" in text
    assert "The paper: 2.92x (arXiv 2302.08005 v2 abstract" in text
    assert '<img src="fig7/quick-fig7.png"' in html.read_text()
    assert (tmp_path / "committed" / "cpu-fig7.png").is_file()


def test_the_readme_names_it_on_its_first_screen():
    first = "\n".join((ROOT / "README.md").read_text().splitlines()[:40])
    assert "bash scripts/reproduce.sh" in first and "bash scripts/setup.sh" in first \
        and "bash scripts/test.sh" in first
    assert sys.executable  # the script runs the venv's python (PYTHON overrides it)


def test_a_short_step_does_not_rescale_the_estimate_of_hours():
    hours = [1300.0, 940.0, 580.0, 240.0, 370.0, 470.0, 500.0, 620.0, 90.0, 900.0]
    assert estimate_left(hours, 0.0, 0.0) == sum(hours)
    # table4 took 1 s of its 15 s estimate: the rest stays within 3 % of the estimates
    assert estimate_left(hours, 15.0, 1.0) > 0.97 * sum(hours)
    # a long step twice as slow as estimated moves the rest most of the way to twice
    assert estimate_left(hours[1:], 1300.0, 2600.0) > 1.6 * sum(hours[1:])
