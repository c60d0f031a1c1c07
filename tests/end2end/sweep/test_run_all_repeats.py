"""run_all_single_node.sh: interleaved repeats by default on CPU (3), ``--repeat``/``REPEAT``
override it; a dry run prints the rounds and draws nothing."""

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _dry_run(tmp_path, *args, **env_extra):
    cfg = tmp_path / "c.cfg"
    cfg.write_text("eager tiny/bert 1 16 0 2 0\nslapo tiny/bert 1 16 0 2 0\n")
    results = tmp_path / "r.tsv"
    env = dict(os.environ, SKIP_SETUP="1", PYTHON=str(ROOT / ".venv" / "bin" / "python"),
               RESULTS=str(results), DEVICE="cpu", **env_extra)
    proc = subprocess.run(["bash", str(ROOT / "end2end" / "run_all_single_node.sh"), str(cfg),
                           "--dry-run", *args], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not list(tmp_path.glob("*fig7*")) and not results.exists()
    runs = [ln for ln in proc.stdout.splitlines() if "-m end2end.bench" in ln]
    return [(re.search(r"--mode (\S+)", ln).group(1),
             int(m.group(1)) if (m := re.search(r"--repeat (\d+)", ln)) else 0) for ln in runs]


@pytest.mark.parametrize("args,env,rounds", [((), {}, 3), (("--repeat", "1"), {}, 1),
                                             ((), {"REPEAT": "2"}, 2)])
def test_rounds_are_interleaved_with_a_cpu_default_of_three(tmp_path, args, env, rounds):
    expected = [(mode, r) for r in range(rounds) for mode in ("eager", "slapo")]
    assert _dry_run(tmp_path, *args, **env) == expected
