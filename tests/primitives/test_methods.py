"""The primitives are real, typed methods of ``Schedule`` (issue 34 item 4): declared on the class
(slapo/primitives/methods.py) with their ``apply``'s signature and docstring, so that
``inspect.signature``, ``help()`` and a type checker see them; ones registered at run time are
bound the same way and still record and replay."""

import inspect
import os
import pydoc
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import slapo
from slapo.primitives.methods import PrimitiveMethods
from slapo.primitives.registry import PrimitiveMethod, primitive_method
from slapo.testing import MLP

ROOT = Path(__file__).resolve().parents[2]

BUILTINS = ["replace", "replace_all", "shard", "sync", "all_reduce_grads", "checkpoint",
            "fork_rng", "annotate", "trace", "trace_until", "find", "fuse", "decompose",
            "cut_pipeline_stage"]


def test_every_builtin_primitive_is_declared_on_the_class():
    registered = slapo.list_primitives(name_only=False)
    builtins = {n for n, c in registered.items() if c.__module__.startswith("slapo.")}
    assert builtins == set(BUILTINS)
    for name in BUILTINS:
        declared = PrimitiveMethods.__dict__[name]
        assert isinstance(declared, PrimitiveMethod) and declared.primitive is registered[name]
        assert name not in slapo.Schedule.__dict__  # inherited, not set on the class later


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_method_has_the_signature_and_docstring_of_apply(name):
    apply = slapo.list_primitives(name_only=False)[name].apply
    method = getattr(slapo.Schedule, name)
    assert inspect.isfunction(method) and method.__qualname__ == f"Schedule.{name}"
    assert method.__doc__ == apply.__doc__ and "Raises:" in method.__doc__
    params = list(inspect.signature(apply).parameters.values())
    sig = inspect.signature(method)
    assert list(sig.parameters) == ["self"] + [p.name for p in params[1:]]
    assert list(sig.parameters.values())[1:] == params[1:]
    assert sig.return_annotation == inspect.signature(apply).return_annotation
    bound = getattr(slapo.create_schedule(MLP()), name)
    assert list(inspect.signature(bound).parameters.values()) == params[1:]


def test_help_shows_the_primitives():
    text = pydoc.render_doc(slapo.Schedule, renderer=pydoc.plaintext)
    assert "shard(self, names: 'Union[str, Sequence[str]]', axis: 'int', *, fused: 'int' = 1)" \
        in text
    for name in BUILTINS:
        first_line = getattr(slapo.Schedule, name).__doc__.strip().splitlines()[0]
        assert f"{name}(self" in text and first_line in text


def test_a_registered_primitive_is_a_method_that_records_and_replays():
    @slapo.register_primitive
    class Scale(slapo.Primitive):
        name = "scale_weights_for_test"

        @staticmethod
        def apply(sch, factor: float, *, bias: bool = False) -> int:
            """Multiply the module's weight (and bias) by ``factor``; returns the count."""
            names = ["weight"] + (["bias"] if bias else [])
            with torch.no_grad():
                for n in names:
                    getattr(sch.mod, n).mul_(factor)
            return len(names)

    assert isinstance(slapo.Schedule.__dict__[Scale.name], PrimitiveMethod)
    sig = inspect.signature(slapo.Schedule.scale_weights_for_test)
    assert str(sig) == "(self, factor: float, *, bias: bool = False) -> int"
    assert "Multiply the module's weight" in pydoc.render_doc(
        slapo.Schedule.scale_weights_for_test, renderer=pydoc.plaintext)
    torch.manual_seed(0)
    model = MLP()
    weight = model.fc1.weight.detach().clone()
    sch = slapo.create_schedule(model)
    assert sch["fc1"].scale_weights_for_test(2.0, bias=True) == 2
    torch.testing.assert_close(model.fc1.weight, 2 * weight)
    assert "sch['fc1'].scale_weights_for_test(2.0, bias=True)" in str(sch.history)
    torch.manual_seed(0)
    fresh = sch.history.replay(MLP())
    torch.testing.assert_close(fresh.mod.fc1.weight, 2 * weight)


def test_builtin_names_cannot_be_taken_and_declarations_are_checked():
    class Shadow(slapo.Primitive):
        name = "shard"

        @staticmethod
        def apply(sch) -> None:
            """Not the real shard."""

    with pytest.raises(slapo.RegistryError, match="already registered"):
        slapo.register_primitive(Shadow)
    assert slapo.Schedule.shard.__doc__ != "Not the real shard."
    with pytest.raises(slapo.RegistryError, match="not the apply"):
        primitive_method(Shadow.apply)
    with pytest.raises(Exception) as info:  # Python < 3.12 wraps it in a RuntimeError

        class Misnamed:
            sharding = primitive_method(slapo.list_primitives(name_only=False)["shard"].apply)

    errors = [info.value, info.value.__cause__]
    assert any(isinstance(e, slapo.RegistryError) and "declared as 'sharding'" in str(e)
               for e in errors)


SNIPPET = """\
import slapo
from torch import nn

sch = slapo.create_schedule(nn.Linear(2, 2))
sch.shard("weight", axis=0)
sch.shard("weight", axis="0")
sch.shrad("weight", 0)
count: int = sch.find("x")
"""


def test_a_type_checker_checks_primitive_calls(tmp_path):
    """mypy (pyproject.toml's settings) reports a wrong argument type, a misspelt primitive and
    a wrong use of a result. Runs where scripts/test.sh's type check left mypy's cache (cold,
    mypy would spend minutes reading torch)."""
    if not (ROOT / ".mypy_cache").is_dir():
        pytest.skip("no .mypy_cache: run `mypy` (scripts/test.sh does) first")
    pytest.importorskip("mypy")
    (tmp_path / "snippet.py").write_text(SNIPPET)
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(ROOT / ".mypy_cache"), str(tmp_path / "snippet.py")],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
        env={**os.environ, "MYPYPATH": str(ROOT)})
    errors = [line.split(": error: ")[1] for line in run.stdout.splitlines()
              if ": error: " in line]
    assert [line.split(":")[1] for line in run.stdout.splitlines() if ": error: " in line] == \
        ["6", "7", "8"], run.stdout
    assert 'Argument "axis" has incompatible type "str"; expected "int"' in errors[0]
    assert '"Schedule" has no attribute "shrad"' in errors[1]
    assert '"SubgraphList", variable has type "int"' in errors[2]
