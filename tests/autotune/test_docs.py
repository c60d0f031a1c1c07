"""The example at the top of docs/autotune.md runs as written (in a scratch directory)."""

import pathlib
import re

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "autotune.md"


def test_docs_example_runs(tmp_path, monkeypatch):
    block = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)[0]
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"print": lambda *a, **k: None}
    exec(compile(block, "docs/autotune.md example", "exec"), namespace)
    result = namespace["result"]
    assert result.best is not None and result.best.status == "ok"
    assert any(r.status == "oom" for r in result.evaluated)
    assert (tmp_path / "study.db").exists()
