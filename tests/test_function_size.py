"""Functions a reader can hold: no function or method over 80 body lines or 12 parameters.

The body is counted from its first statement after the docstring to its last line (comments and
blank lines inside included); parameters are every name in the signature (``*args`` and
``**kwargs`` included) except a leading ``self``/``cls``. ``__init__`` methods of classes are
exempt from the parameter limit only: a module constructor mirrors its configuration.
"""

import ast
from pathlib import Path
from typing import Iterator, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("slapo", "end2end", "ablation", "autotune", "usability", "scripts")
MAX_BODY_LINES = 80
MAX_PARAMETERS = 12
# Functions allowed over the limits while being split (``path:name``); none now.
KNOWN: set = set()

_Function = (ast.FunctionDef, ast.AsyncFunctionDef)


def _functions(tree: ast.AST) -> Iterator[Tuple[ast.AST, bool]]:
    """Every function and method of ``tree``, with whether it is a method of a class."""
    stack: List[Tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, in_class = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _Function):
                yield child, in_class
            stack.append((child, isinstance(child, ast.ClassDef)))


def body_lines(fn: ast.AST) -> int:
    """Lines from the first statement after the docstring to the end of the function."""
    body = fn.body
    if (len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)):
        body = body[1:]
    first = body[0]
    start = min([first.lineno] + [d.lineno for d in getattr(first, "decorator_list", [])])
    return fn.end_lineno - start + 1


def parameter_count(fn: ast.AST, is_method: bool) -> int:
    """Parameters of ``fn``, without the ``self``/``cls`` of a method."""
    a = fn.args
    names = [p.arg for p in a.posonlyargs + a.args]
    if is_method and names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)


def oversized(source: str, path: str = "<string>") -> List[str]:
    """``path:line name (N body lines / M parameters)`` for each function over a limit."""
    found = []
    for fn, is_method in _functions(ast.parse(source, filename=path)):
        lines = body_lines(fn)
        params = parameter_count(fn, is_method)
        too_many = params > MAX_PARAMETERS and not (is_method and fn.name == "__init__")
        if lines > MAX_BODY_LINES or too_many:
            found.append(f"{path}:{fn.lineno} {fn.name} ({lines} body lines / {params} "
                         "parameters)")
    return found


def _sources() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def test_no_function_is_too_long_or_takes_too_many_parameters():
    found = []
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        found += [f for f in oversized(path.read_text(), rel)
                  if f"{rel}:{f.split()[1]}" not in KNOWN]
    assert not found, (f"functions over {MAX_BODY_LINES} body lines or {MAX_PARAMETERS} "
                       "parameters (split them; see the issue 'functions a reader can hold'):\n"
                       + "\n".join(found))


def _function(name: str, params: int, lines: int, indent: str = "") -> str:
    args = ", ".join(f"a{i}" for i in range(params))
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(lines))
    return f'{indent}def {name}({args}):\n{indent}    """Doc."""\n{body}'


def test_the_checker_reports_long_functions_and_long_parameter_lists():
    source = (_function("long_body", 0, MAX_BODY_LINES + 1)
              + _function("fits", MAX_PARAMETERS, MAX_BODY_LINES)
              + _function("many_params", MAX_PARAMETERS + 1, 1)
              + "class Module:\n"
              + _function("__init__", MAX_PARAMETERS + 2, 1, indent="    ").replace(
                  "(a0", "(self, a0")
              + _function("method", MAX_PARAMETERS + 1, 1, indent="    ").replace(
                  "(a0", "(self, a0")
              + "    def fits(self, *args, **kwargs):\n        pass\n")
    found = oversized(source, "m.py")
    assert found == [
        "m.py:1 long_body (81 body lines / 0 parameters)",
        "m.py:166 many_params (1 body lines / 13 parameters)",
        "m.py:173 method (1 body lines / 13 parameters)",
    ], found
