"""No module of ``end2end/`` assigns into another module's attributes (issue #34).

A harness that rebinds the driver's or the library's names (``builders.pipeline_runner = ...``,
``runtimes.BUILDERS[mode] = ...``, ``slapo.op.attention._kernel = ...``) makes every change
inside them a silent change of its results; the seams are public parameters and contexts
instead (``make_runner(builders=...)``, ``slapo.op.cpu_dropout_kernel``). The scan parses every
module with :mod:`ast` and flags an ``Assign``/``AugAssign``/``AnnAssign``/``del`` whose target
is an attribute or item of a name bound by an import (``import m``, ``from p import m``,
``m = importlib.import_module(...)``), and ``setattr``/``delattr`` on such a name.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, List, Set

ROOT = Path(__file__).resolve().parents[2]

# Third-party names that have no other seam, each with its reason; never a name of this
# repository's packages (slapo, end2end), whose seams are public parameters and contexts.
ALLOWED = {
    # the process environment and matplotlib's settings: the documented ways to set them
    ("*", "os.environ"),
    ("*", "matplotlib.rcParams"),
    # The simulator's GPU attention: the autograd engine does not carry a torch-function mode
    # into torch.utils.checkpoint's recomputation, and HF's modules call this function directly.
    ("end2end/simulate/cost/kernels.py", "F.scaled_dot_product_attention"),
    # The simulator's recorder follows FSDP2's storage resizes, which are no ATen op (as
    # torch.distributed._tools.MemTracker does, by the same assignment).
    ("end2end/simulate/engine/recorder.py", "torch.UntypedStorage.resize_"),
    # Dropout as CUDA runs it (native_dropout), for the same reason as SDPA above: HF and
    # torch.nn.Dropout call the function, also when checkpointing recomputes.
    ("end2end/simulate/cost/kernels.py", "F.dropout"),
    # Megatron's fused softmax is a CUDA extension module megatron-core imports by name: its
    # stand-in on a simulated GPU can only be an importable module.
    ("end2end/simulate/cost/megatron_kernels.py", "sys.modules"),
    # DTensor's metadata propagation on global shapes (one method in torch 2.11 and 2.13): the
    # one place to tell the recorder that what runs there is no rank's work.
    ("end2end/simulate/engine/recorder.py",
     "ShardingPropagator._propagate_tensor_meta_non_cached"),
    # HF drops an all-ones padding mask unless a tensor "is tracing"; a fake tensor counts, and
    # transformers has no switch for it (the simulator's GPU profiles decide as a real run).
    ("end2end/simulate/engine/step.py", "masking.is_tracing"),
}


def _imported_names(tree: ast.AST) -> Set[str]:
    """Names bound to an imported module or object anywhere in the module."""
    names: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((a.asname or a.name.split(".")[0]) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.update((a.asname or a.name) for a in node.names if a.name != "*")
        elif isinstance(node, ast.Assign) and _is_import_call(node.value):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _is_import_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and (
        (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
        or (isinstance(node.func, ast.Name) and node.func.id in ("import_module",
                                                                   "__import__")))


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node


def _targets(node: ast.AST) -> Iterator[ast.AST]:
    if isinstance(node, ast.Assign):
        yield from node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        yield node.target
    elif isinstance(node, ast.Delete):
        yield from node.targets
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
          and node.func.id in ("setattr", "delattr") and node.args):
        yield ast.Attribute(value=node.args[0], attr="<setattr>")


def foreign_assignments(source: str, rel: str) -> List[str]:
    """``file:line: target`` for every assignment into an imported name's attributes."""
    tree = ast.parse(source)
    imported = _imported_names(tree)
    found = []
    for node in ast.walk(tree):
        for target in _targets(node):
            if not isinstance(target, (ast.Attribute, ast.Subscript)):
                continue
            root = _root(target)
            if not (isinstance(root, ast.Name) and root.id in imported) \
                    and not _is_import_call(root):
                continue
            text = ast.unparse(target.value if isinstance(target, ast.Subscript) else target)
            if ("*", text) in ALLOWED or (rel, text) in ALLOWED:
                continue
            found.append(f"{rel}:{node.lineno}: {ast.unparse(target)}")
    return found


def test_no_module_of_end2end_assigns_into_another_module():
    found = []
    for path in sorted((ROOT / "end2end").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        found += foreign_assignments(path.read_text(), rel)
    assert not found, ("assignments into another module's attributes (use a public parameter "
                       "or context instead):\n" + "\n".join(found))


def test_the_scan_sees_each_form():
    src = """
import importlib
import torch.nn.functional as F
from end2end.driver import builders, runtimes
builders.pipeline_runner = None
runtimes.BUILDERS["x"] = None
mod = importlib.import_module("slapo.op.attention")
mod._kernel = None
setattr(runtimes, "make_runner", None)
importlib.import_module("a").b = 1
F.gelu += 1
local = {}
local["x"] = 1
"""
    found = foreign_assignments(src, "x.py")
    assert sorted(f.split(": ", 1)[1] for f in found) == sorted([
        "builders.pipeline_runner", "runtimes.BUILDERS['x']", "mod._kernel",
        "runtimes.<setattr>", "importlib.import_module('a').b", "F.gelu"])
