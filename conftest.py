"""The Python examples of README.md and docs/*.md run as tests (sybil), so the docs cannot rot.

Each Markdown file is one test module; its blocks run top to bottom in one namespace, in a
fresh temporary working directory, on CPU. Fences:

- ```python               runs in this process;
- ```python ranks=2       runs as a script on 2 gloo ranks (torchrun --standalone), each rank
                          executing the whole block, which initialises torch.distributed itself;
- ```bash / ```text ...   shell commands and output: never run (tests/test_docs.py checks that
                          every fence names its language);
- <!-- skip: next "why" -->  skips the next block, with the reason shown by pytest;
- <!-- invisible-code-block: python ... -->  set-up code a reader does not need to see.

Run only the docs: `.venv/bin/python -m pytest README.md docs/`.
"""

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile

from sybil import Sybil
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser

ROOT = pathlib.Path(__file__).resolve().parent
DOC_DIRS = (ROOT, ROOT / "docs")          # README.md and docs/*.md; other READMEs are not run
RANKS_TIMEOUT_S = 240


def _enter_tmp_dir(namespace):
    import torch

    namespace["_doc_cwd"] = os.getcwd()
    namespace["_doc_tmp"] = tempfile.mkdtemp(prefix="slapo-doc-")
    os.chdir(namespace["_doc_tmp"])
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)


def _leave_tmp_dir(namespace):
    os.chdir(namespace["_doc_cwd"])
    shutil.rmtree(namespace["_doc_tmp"], ignore_errors=True)


def _run_on_two_ranks(example):
    """Run the block as a script under torchrun on 2 ranks; fail with both ranks' output."""
    # Leading blank lines keep the document's line numbers in tracebacks.
    source = "\n" * example.line + example.parsed
    script = pathlib.Path(example.namespace["_doc_tmp"], f"example_line{example.line}.py")
    script.write_text(source)
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(script)]
    # Own session: on a timeout the whole process group (launcher and ranks) is stopped.
    proc = subprocess.Popen(cmd, cwd=script.parent, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=RANKS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"{example.path}:{example.line}: the 2-rank example did not finish "
                             f"within {RANKS_TIMEOUT_S} s; output:\n{out[-6000:]}") from None
    if proc.returncode != 0:
        # the ranks' own tracebacks (torchrun prefixes them with [rankN]), else the output's end
        ranks = "\n".join(line for line in out.splitlines() if line.startswith("[rank"))
        raise AssertionError(f"{example.path}:{example.line}: the 2-rank example exited "
                             f"{proc.returncode}; output:\n{ranks[-8000:] or out[-6000:]}")
    print(out)


_sybil = Sybil(
    parsers=[
        PythonCodeBlockParser(),
        CodeBlockParser(language="python ranks=2", evaluator=_run_on_two_ranks),
        SkipParser(),
    ],
    patterns=["*.md"],
    setup=_enter_tmp_dir,
    teardown=_leave_tmp_dir,
)
_collect_markdown = _sybil.pytest()


def pytest_collect_file(file_path, parent):
    if file_path.suffix == ".md" and file_path.parent in DOC_DIRS:
        return _collect_markdown(file_path, parent)
    return None
