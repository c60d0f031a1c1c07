"""``python -m slapo.testing.stress_exit``: the docs' 2-rank examples and each runtime's smallest
training script exit 0 when run as a user runs them (torchrun, no ``os._exit``).

The suite runs the two scripts that aborted most often before the fix, once each (about a
minute; ``SLAPO_STRESS_RUNS=N`` for more); the docs examples themselves run once each in the
docs tests (conftest.py). The long run is ``python -m slapo.testing.stress_exit --runs 50``.
"""

import json
import os
import re

import pytest

from slapo.errors import ConfigError
from slapo.testing import stress_exit

RUNTIMES = ["torch_tp", "torch_forward", "torch_pipeline", "deepspeed_zero3",
            "deepspeed_pipeline", "megatron_tp", "fsdp2", "verify_tp", "tuner_trials"]
SUITE = ["torch_forward", "torch_tp"]


def test_the_examples_are_the_text_of_the_docs_and_every_runtime_has_a_script():
    found = stress_exit.examples()
    for page in [stress_exit.REPO_ROOT / "README.md",
                 *sorted((stress_exit.REPO_ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        blocks = re.findall(r"^```python ranks=2\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
        for k, block in enumerate(blocks, start=1):
            assert found[f"{page.relative_to(stress_exit.REPO_ROOT)}#{k}"] == block
    assert "docs/tensor_parallel.md#1" in found and "README.md#1" in found
    assert [n for n in RUNTIMES if n not in found] == []
    for name in RUNTIMES:  # scripts as a user writes them: no os._exit
        assert "_exit" not in found[name], name


def test_unknown_script_or_no_runs_is_an_error():
    with pytest.raises(ConfigError, match="unknown script.*'nope'.*Hint: choose from"):
        stress_exit.stress(["nope"], runs=1)
    with pytest.raises(ConfigError, match="runs=0"):
        stress_exit.stress(["torch_tp"], runs=0)


def test_a_run_that_aborts_is_counted(monkeypatch, capsys):
    monkeypatch.setattr(stress_exit, "examples", lambda: {"aborts": "import os\nos.abort()\n"})
    assert stress_exit.main(["--runs", "1", "--only", "aborts"]) == 1
    assert "aborts: 1 of 1" in capsys.readouterr().out


def test_training_scripts_exit_zero_as_a_user_runs_them():
    runs = int(os.environ.get("SLAPO_STRESS_RUNS", "1"))
    log = []
    codes = stress_exit.stress(SUITE, runs, timeout_s=240, log=log.append)
    failed = {n: rcs for n, rcs in codes.items() if any(rc != 0 for rc in rcs)}
    assert not failed, f"non-zero exits {failed}:\n" + "\n".join(log)[-6000:]


def _plain_scripts(ok_text: str = "pass\n") -> dict:
    return {"ok": stress_exit.PLAIN_PYTHON + ok_text,
            "bad": stress_exit.PLAIN_PYTHON + "raise SystemExit(3)\n"}


def test_the_record_accumulates_runs_of_each_scripts_current_text(monkeypatch, tmp_path, capsys):
    record = tmp_path / "runs.jsonl"
    monkeypatch.setattr(stress_exit, "examples", _plain_scripts)
    assert stress_exit.main(["--record", str(record), "--until", "2"]) == 1
    assert len(record.read_text().splitlines()) == 4
    # a later sitting runs only what is missing
    assert stress_exit.main(["--record", str(record), "--until", "3"]) == 1
    runs = [json.loads(line) for line in record.read_text().splitlines()]
    assert [r["script"] for r in runs].count("ok") == 3 and len(runs) == 6
    assert {r["rc"] for r in runs if r["script"] == "bad"} == {3}
    capsys.readouterr()
    assert stress_exit.main(["--record", str(record), "--summary"]) == 1
    out = capsys.readouterr().out
    assert "ok: 0 non-zero of 3" in out and "bad: 3 non-zero of 3 (exit codes [3, 3, 3])" in out
    # runs of an older text of a script no longer count
    monkeypatch.setattr(stress_exit, "examples", lambda: _plain_scripts("x = 1\n"))
    assert stress_exit.main(["--record", str(record), "--summary", "--only", "ok"]) == 0
    assert "ok: 0 non-zero of 0" in capsys.readouterr().out


def test_record_options_need_a_record_and_a_broken_record_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        stress_exit.main(["--until", "5"])
    assert "give --record FILE" in capsys.readouterr().err
    record = tmp_path / "runs.jsonl"
    record.write_text('{"script": "torch_tp"}\n')
    with pytest.raises(SystemExit):
        stress_exit.main(["--record", str(record), "--summary"])
    assert f"{record}:1: not a stress run record" in capsys.readouterr().err
