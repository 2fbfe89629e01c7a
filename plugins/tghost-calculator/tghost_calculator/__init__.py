"""tghost-calculator: tools written as typed functions under ``@tghost.tool``, one plain, one streaming.

Both share one safe evaluator: the expression is parsed with ``ast`` and only whitelisted nodes are reduced (no eval).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Iterator

import tghost

__all__ = ["MAX_DEPTH", "MAX_DIGITS", "MAX_LENGTH", "calculate", "evaluate", "parse", "reductions", "solve_steps"]

Number = int | float

#: Longest expression accepted, in characters.
MAX_LENGTH = 1000
#: Deepest nesting of operations accepted (deeper trees would exhaust the recursion limit).
MAX_DEPTH = 100
#: Largest integer result accepted, in decimal digits; ``9 ** 9 ** 9`` is refused before it is computed.
MAX_DIGITS = 1000
_INT_LIMIT = 10**MAX_DIGITS

BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
UNARY: dict[type[ast.unaryop], Callable[[Number], Number]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
FUNCTIONS: dict[str, Callable[[Number], Number]] = {
    "abs": abs,
    "ceil": math.ceil,
    "floor": math.floor,
    "round": round,
    "sqrt": math.sqrt,
}
CONSTANTS: dict[str, Number] = {"e": math.e, "pi": math.pi}
ALLOWED = (
    "numbers, + - * / // % **, parentheses, the functions "
    f"{', '.join(sorted(FUNCTIONS))} (one argument each) and the constants {', '.join(sorted(CONSTANTS))}"
)


def parse(expression: str) -> ast.expr:
    """Parse ``expression`` into a syntax tree, without evaluating anything.

    Raises:
        tghost.InvalidArguments: it is too long, too deeply nested, or not a Python expression.
    """
    if len(expression) > MAX_LENGTH:
        raise tghost.InvalidArguments(f"expression is {len(expression)} characters long; the limit is {MAX_LENGTH}")
    try:
        tree = ast.parse(expression.strip(), mode="eval").body
    except (SyntaxError, ValueError) as exc:
        raise tghost.InvalidArguments(f"not an arithmetic expression: {getattr(exc, 'msg', exc)}") from None
    if (depth := _depth(tree)) > MAX_DEPTH:
        raise tghost.InvalidArguments(f"expression is nested {depth} levels deep; the limit is {MAX_DEPTH}")
    return tree


def _depth(tree: ast.AST) -> int:
    """How many levels of nodes ``tree`` has, counted without recursion."""
    depth, level = 0, [tree]
    while level:
        depth += 1
        level = [child for node in level for child in ast.iter_child_nodes(node)]
    return depth


def _number(node: ast.expr) -> Number | None:
    """The value of a number literal (``7``, ``2.5``, or ``-3`` as unary minus on ``3``), else None."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        operand = _number(node.operand)
        return None if operand is None or operand < 0 else -operand
    if not isinstance(node, ast.Constant) or isinstance(node.value, bool):
        return None
    if isinstance(node.value, float) and math.isinf(node.value):  # 1e999
        raise tghost.InvalidArguments("a number is too large (the largest is about 1.8e308)")
    return node.value if isinstance(node.value, int | float) else None


def _literal(value: Number) -> ast.expr:
    """A tree for ``value``; a negative number is unary minus, so ``ast.unparse`` keeps ``(-3) ** 2``.

    Raises:
        tghost.InvalidArguments: ``value`` is complex, infinite, or an int of over MAX_DIGITS digits.
    """
    if isinstance(value, complex):  # (-8) ** 0.5
        raise tghost.InvalidArguments("the result is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise tghost.InvalidArguments("the result is too large")
    if isinstance(value, int) and abs(value) >= _INT_LIMIT:
        raise tghost.InvalidArguments(f"the result has more than {MAX_DIGITS} digits")
    value = value + 0  # -0.0 -> 0.0
    return ast.UnaryOp(ast.USub(), ast.Constant(-value)) if value < 0 else ast.Constant(value)


def _apply(fn: Callable[..., Number], *args: Number) -> ast.expr:
    """``fn(*args)`` as a literal. An integer power too large to compute is refused beforehand.

    Raises:
        tghost.InvalidArguments: division by zero, a math domain error, or a result that is
            too large or not a real number.
    """
    if fn is operator.pow and all(type(a) is int for a in args) and abs(args[0]) > 1 and args[1] > 0:
        digits = args[1] * math.log10(abs(args[0]))
        if digits > MAX_DIGITS:
            raise tghost.InvalidArguments(
                f"{args[0]} ** {args[1]} would have about {digits:,.0f} digits; the limit is {MAX_DIGITS}"
            )
    try:
        return _literal(fn(*args))
    except ZeroDivisionError:
        raise tghost.InvalidArguments("division by zero") from None
    except OverflowError:
        raise tghost.InvalidArguments("the result is too large") from None
    except ValueError as exc:  # math.sqrt(-1)
        raise tghost.InvalidArguments(f"{exc}") from None


def _reduce(node: ast.expr) -> ast.expr:
    """One step: every operation whose operands are all numbers is replaced by its value.

    Every node that is not yet a number is visited, so a node outside the whitelist is
    refused on the first step.

    Raises:
        tghost.InvalidArguments: a node is not allowed, or an operation fails.
    """
    if _number(node) is not None:
        return node
    match node:
        case ast.Name(id=name) if name in CONSTANTS:
            return _literal(CONSTANTS[name])
        case ast.UnaryOp(op=op, operand=operand) if type(op) in UNARY:
            value = _number(operand)
            return ast.UnaryOp(op, _reduce(operand)) if value is None else _apply(UNARY[type(op)], value)
        case ast.BinOp(left=left, op=op, right=right) if type(op) in BINARY:
            a, b = _number(left), _number(right)
            if a is None or b is None:
                return ast.BinOp(_reduce(left), op, _reduce(right))
            return _apply(BINARY[type(op)], a, b)
        case ast.Call(func=ast.Name(id=name), args=[arg], keywords=[]) if name in FUNCTIONS:
            value = _number(arg)
            return ast.Call(node.func, [_reduce(arg)], []) if value is None else _apply(FUNCTIONS[name], value)
    kind = type(node).__name__.lower()
    kind = {"binop": "operator", "unaryop": "operator", "boolop": "operator", "compare": "comparison"}.get(kind, kind)
    snippet = ast.unparse(node)
    snippet = snippet if len(snippet) <= 40 else snippet[:37] + "..."
    raise tghost.InvalidArguments(f"{kind} {snippet!r} is not allowed; use only {ALLOWED}")


def reductions(tree: ast.expr) -> Iterator[ast.expr]:
    """Yield the tree after each reduction step, innermost operations first, ending with a number.

    Raises:
        tghost.InvalidArguments: see :func:`_reduce`.
    """
    while _number(tree) is None:
        tree = _reduce(tree)
        yield tree


def evaluate(expression: str) -> Number:
    """The value of an arithmetic ``expression``: an ``int`` when exact, else a ``float``.

    Raises:
        tghost.InvalidArguments: the expression is not allowed (it names the culprit),
            divides by zero, or its result is too large or not a real number.
    """
    tree = parse(expression)
    for step in reductions(tree):
        tree = step
    value = _number(tree)
    assert value is not None
    return value


@tghost.tool(name="calculate", service="calculator", group=["default", "compute"], state="results")
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Supports numbers, + - * / // % ** and parentheses, and the constants pi and e.
    Functions: abs, ceil, floor, round and sqrt. Whole numbers stay exact; / always gives a decimal.

    Args:
        expression: The expression to evaluate, e.g. "2 * (3 + 4)" or "sqrt(2) / 2".

    Returns:
        The value as text, e.g. "14" or "0.5".

    Raises:
        tghost.InvalidArguments: see :func:`evaluate`.
    """
    return str(evaluate(expression))


@tghost.tool(name="solve-steps", service="calculator-steps", group=["default", "compute"])
def solve_steps(expression: str) -> Iterator[str]:
    """Work out an arithmetic expression step by step, innermost parentheses first.

    Supports the same syntax as the calculate tool. Streams one line per step.

    Args:
        expression: The expression to solve, e.g. "2 * (3 + 4)".

    Yields:
        Lines such as "2 * (3 + 4)", "= 2 * 7", "= 14", each ending with a newline.

    Raises:
        tghost.InvalidArguments: see :func:`evaluate`.
    """
    tree = parse(expression)
    line = ast.unparse(tree)
    # Each line is sent once the next step has worked, so a refused expression sends nothing.
    for step in reductions(tree):
        yield f"{line}\n"
        line = f"= {ast.unparse(step)}"
    yield f"{line}\n"


@tghost.hookimpl
def tghost_register_services(register: Callable[[tghost.ToolService], None]) -> None:
    """Register both services; each decorated function registers its own tool too."""
    register(calculate)
    register(solve_steps)
