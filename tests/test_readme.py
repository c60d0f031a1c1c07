"""The README's quick start must run as written."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_quick_start_runs():
    text = README.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "no python block in the README"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md quick start", "exec"), namespace)
    sch, fresh = namespace["sch"], namespace["fresh"]
    assert len(sch.history) == 4
    assert str(fresh.history) == str(sch.history)
