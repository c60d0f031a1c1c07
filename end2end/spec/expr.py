"""A small, safe evaluator for BATCH_SIZE expressions such as ``"min(8*n, 48)"``.

The artifact evaluated ``eval("lambda n: " + expr)``; any Python ran. Here the expression is
parsed with :mod:`ast` and only a whitelist is interpreted (nothing is ever passed to
``eval``/``exec``):

* numbers (int / float), the name ``n`` (the GPU / rank count), ``True``/``False``;
* ``+ - * / // % **`` and unary ``- +``; comparisons (chains too); ``and``/``or``/``not``;
  conditional expressions ``a if cond else b``;
* calls of ``min max int round abs`` and the math helpers ``log2 log ceil floor sqrt``, also
  spelled ``math.log2(n)`` etc. (the artifact made ``math`` available).

Anything else (attribute access other than ``math.<helper>``, other names, strings,
subscripts, lambdas, comprehensions, keyword arguments, ...) is rejected with
:class:`ExprError`. Exponents are limited to ``|e| <= 64`` and every intermediate value to
``|x| <= 1e15`` so that ``9**9**9`` cannot hang the parser.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Callable, Dict, Union

from slapo.errors import ConfigError

__all__ = ["ExprError", "check_expression", "evaluate", "evaluate_batch_size"]

Number = Union[int, float]

MAX_LENGTH = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 10**15
MAX_NODES = 100


class ExprError(ConfigError):
    """A BATCH_SIZE expression is not allowed or does not evaluate to a batch size."""


_BINOPS: Dict[type, Callable[[Number, Number], Number]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_CMPOPS: Dict[type, Callable[[Number, Number], bool]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
}


def _log2(x: Number) -> float:
    if x <= 0:
        raise ExprError(f"log2({x}) is undefined", hint="the argument must be positive")
    return math.log2(x)


def _log(x: Number, base: Number = math.e) -> float:
    if x <= 0 or base <= 0 or base == 1:
        raise ExprError(f"log({x}, {base}) is undefined", hint="use positive arguments")
    return math.log(x, base)


def _sqrt(x: Number) -> float:
    if x < 0:
        raise ExprError(f"sqrt({x}) is undefined", hint="the argument must be >= 0")
    return math.sqrt(x)


_FUNCS: Dict[str, Callable[..., Number]] = {
    "min": min, "max": max, "int": int, "round": round, "abs": abs,
    "log2": _log2, "log": _log, "ceil": math.ceil, "floor": math.floor, "sqrt": _sqrt,
}
_MATH_FUNCS = ("log2", "log", "ceil", "floor", "sqrt")


def _fail(expr: str, what: str, hint: str = "") -> ExprError:
    return ExprError(
        f"BATCH_SIZE expression {expr!r}: {what}",
        hint=hint or "use numbers, n, + - * / // % **, comparisons, and/or/not, "
                     "'a if cond else b' and min/max/int/round/abs/log2/ceil/floor",
    )


def _func_name(node: ast.expr, expr: str) -> str:
    """The whitelisted function a call refers to (``min`` or ``math.log2``)."""
    if isinstance(node, ast.Name) and node.id in _FUNCS:
        return node.id
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id == "math" and node.attr in _MATH_FUNCS):
        return node.attr
    shown = ast.unparse(node)
    raise _fail(expr, f"calling {shown!r} is not allowed")


def _check_magnitude(value: Number, expr: str) -> Number:
    if not isinstance(value, (int, float)):  # (-8)**0.5 is a complex number in Python
        raise _fail(expr, f"a value is {value!r}, not a real number",
                    "a negative number to a fractional power has no real value")
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        raise _fail(expr, f"the value {value} is not a number")
    if abs(value) > MAX_MAGNITUDE:
        raise _fail(expr, f"an intermediate value exceeds {MAX_MAGNITUDE:.0e}",
                    "batch sizes are small integers")
    return value


def _eval(node: ast.AST, n: int, expr: str) -> Number:
    """Interpret one whitelisted node (recursive)."""
    if isinstance(node, ast.Expression):
        return _eval(node.body, n, expr)
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool):
            return value
        if isinstance(value, (int, float)):
            return _check_magnitude(value, expr)
        raise _fail(expr, f"the constant {value!r} is not a number")
    if isinstance(node, ast.Name):
        if node.id == "n":
            return n
        raise _fail(expr, f"unknown name {node.id!r}", "the only variable is n (GPU/rank count)")
    if isinstance(node, ast.UnaryOp):
        value = _eval(node.operand, n, expr)
        if isinstance(node.op, ast.USub):
            return -value
        if isinstance(node.op, ast.UAdd):
            return +value
        if isinstance(node.op, ast.Not):
            return not value
        raise _fail(expr, f"the operator {type(node.op).__name__} is not allowed")
    if isinstance(node, ast.BinOp):
        op = _BINOPS.get(type(node.op))
        if op is None:
            raise _fail(expr, f"the operator {type(node.op).__name__} is not allowed")
        left, right = _eval(node.left, n, expr), _eval(node.right, n, expr)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise _fail(expr, f"the exponent {right} is too large (limit {MAX_EXPONENT})")
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise _fail(expr, "division by zero")
        try:
            value = op(left, right)
        except (OverflowError, ZeroDivisionError, ValueError) as exc:
            raise _fail(expr, str(exc)) from None
        return _check_magnitude(value, expr)
    if isinstance(node, ast.BoolOp):
        values = node.values
        result = _eval(values[0], n, expr)
        for item in values[1:]:
            if isinstance(node.op, ast.And) and not result:
                return result
            if isinstance(node.op, ast.Or) and result:
                return result
            result = _eval(item, n, expr)
        return result
    if isinstance(node, ast.Compare):
        left = _eval(node.left, n, expr)
        for op_node, comp in zip(node.ops, node.comparators):
            op = _CMPOPS.get(type(op_node))
            if op is None:
                raise _fail(expr, f"the comparison {type(op_node).__name__} is not allowed")
            right = _eval(comp, n, expr)
            if not op(left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return _eval(node.body if _eval(node.test, n, expr) else node.orelse, n, expr)
    if isinstance(node, ast.Call):
        name = _func_name(node.func, expr)
        if node.keywords:
            raise _fail(expr, f"keyword arguments to {name}() are not allowed")
        if any(isinstance(a, ast.Starred) for a in node.args):
            raise _fail(expr, f"*args in {name}() are not allowed")
        args = [_eval(a, n, expr) for a in node.args]
        try:
            return _check_magnitude(_FUNCS[name](*args), expr)
        except (TypeError, ValueError, OverflowError) as exc:
            raise _fail(expr, f"{name}(): {exc}") from None
    what = type(node).__name__
    if isinstance(node, ast.Attribute):
        what = f"attribute access {ast.unparse(node)!r}"
    raise _fail(expr, f"{what} is not allowed")


def _parse(expr: str) -> ast.Expression:
    text = expr.strip()
    if not text:
        raise _fail(expr, "it is empty")
    if len(text) > MAX_LENGTH:
        raise _fail(expr, f"it is longer than {MAX_LENGTH} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise _fail(expr, f"syntax error ({exc.msg})") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise _fail(expr, f"it has more than {MAX_NODES} syntax nodes")
    return tree


def evaluate(expr: str, n: int) -> Number:
    """Evaluate ``expr`` with ``n`` bound; raises :class:`ExprError` on anything not allowed."""
    return _eval(_parse(expr), n, expr)


def evaluate_batch_size(expr: str, n: int) -> int:
    """Evaluate ``expr`` for ``n`` GPUs/ranks and check the result is a positive integer."""
    value = evaluate(expr, n)
    if isinstance(value, bool):
        raise _fail(expr, f"it evaluates to the boolean {value} for n={n}")
    if isinstance(value, float):
        if not value.is_integer():
            raise _fail(expr, f"it evaluates to {value} for n={n}, not an integer",
                        "wrap it in int(...) or use // for integer division")
        value = int(value)
    if value < 1:
        raise _fail(expr, f"it evaluates to {value} for n={n}", "a batch size must be >= 1")
    return int(value)


def check_expression(expr: str) -> None:
    """Validate the syntax/whitelist of ``expr`` without a value of ``n`` (all branches)."""
    tree = _parse(expr)
    for node in ast.walk(tree):  # static check: catches disallowed nodes in untaken branches
        if isinstance(node, ast.Name) and node.id not in ("n", "math") and node.id not in _FUNCS:
            raise _fail(expr, f"unknown name {node.id!r}", "the only variable is n")
        if isinstance(node, ast.Attribute):
            _func_name(node, expr)
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                             ast.GeneratorExp, ast.Subscript, ast.Starred, ast.NamedExpr,
                             ast.JoinedStr, ast.Await, ast.Yield, ast.YieldFrom)):
            raise _fail(expr, f"{type(node).__name__} is not allowed")
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float)):
            raise _fail(expr, f"the constant {node.value!r} is not a number")
