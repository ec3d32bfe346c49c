"""`calculator` environment: safe arithmetic through the `<tool_call>` interface.

Expressions are parsed with `ast` and evaluated by walking the tree over a whitelist of number
literals, arithmetic operators and math functions; nothing is ever passed to `eval`.
"""

from __future__ import annotations

import ast
import math
import operator
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from slime_envs.base import ToolEnv

__all__ = ["CalculatorEnv", "safe_eval"]

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "abs": abs,
    "round": round,
    "min": min,
    "max": max,
    "sqrt": math.sqrt,
    "log": math.log,
    "log2": math.log2,
    "log10": math.log10,
    "exp": math.exp,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "floor": math.floor,
    "ceil": math.ceil,
    "gcd": math.gcd,
    "factorial": math.factorial,
}
_CONSTANTS = {"pi": math.pi, "e": math.e}
# Bounds that keep one expression cheap: 10**(10**9) would take minutes and gigabytes.
_MAX_EXPONENT = 10_000
_MAX_FACTORIAL = 1_000
_MAX_LENGTH = 1_000
# Integer results are bounded too: exponents of 10,000 nest, (9**9999)**9999 is 3e8 bits (minutes on the rollout
# loop, where env tools run); a product's or power's size is known from its operands' before it is computed.
_MAX_BITS = 100_000


def _int_bits(value: Any) -> int:
    return value.bit_length() if isinstance(value, int) else 0


def _check_size(op: ast.operator, left: Any, right: Any) -> None:
    if not (isinstance(left, int) and isinstance(right, int)):
        return  # float arithmetic overflows to an OverflowError, which safe_eval reports
    if isinstance(op, ast.Pow):
        bits = _int_bits(left) * right if right > 0 else 0  # a negative exponent gives a float
    elif isinstance(op, ast.Mult):
        bits = _int_bits(left) + _int_bits(right)
    else:
        return  # + - // % never grow past the larger operand by more than a bit
    if bits > _MAX_BITS:
        raise ValueError(f"the result would have about {bits:,} bits (limit {_MAX_BITS:,})")


def _eval(node: ast.AST) -> Any:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.Name) and node.id in _CONSTANTS:
        return _CONSTANTS[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large (limit {_MAX_EXPONENT})")
        _check_size(node.op, left, right)
        value = _BINARY[type(node.op)](left, right)
        if isinstance(value, complex):  # Python's (-8) ** 0.5 is complex: the tool answered "(1.7e-16+2.8j)"
            raise ValueError(f"{left!r} ** {right!r} has no real value")
        return value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS:
        if node.keywords:
            raise ValueError(f"keyword arguments are not supported in {node.func.id}()")
        args = [_eval(a) for a in node.args]
        if node.func.id == "factorial" and args and args[0] > _MAX_FACTORIAL:
            raise ValueError(f"factorial argument {args[0]} is too large (limit {_MAX_FACTORIAL})")
        if node.func.id == "round" and len(args) == 2 and isinstance(args[1], int) and abs(args[1]) > _MAX_EXPONENT:
            # round(5, -10**9) builds 10**(10**9) to round an int: 21 characters held the rollout loop for minutes.
            raise ValueError(f"round() digits {args[1]} are too many (limit {_MAX_EXPONENT})")
        return _FUNCTIONS[node.func.id](*args)
    raise ValueError(f"unsupported expression element: {ast.dump(node)[:60]}")


def safe_eval(expression: str) -> int | float:
    """Evaluates an arithmetic expression without `eval`.

    Supports numbers, `+ - * / // % **`, parentheses, `pi`, `e` and the functions abs, round, min,
    max, sqrt, log, log2, log10, exp, sin, cos, tan, floor, ceil, gcd, factorial.

    Args:
        expression: e.g. `"2 * (3 + 4) ** 2"`.

    Returns:
        The value (int for integer arithmetic, float otherwise).

    Raises:
        ValueError: a syntax error, an unsupported element (names, attributes, strings, ...), a value
            out of bounds (an exponent over 10,000, a factorial over 1,000, round() to over 10,000 digits, an
            integer result over 100,000 bits, nesting deeper than Python's recursion limit), or a math error
            (division by zero, domain error, a power with no real value such as `(-8) ** 0.5`), with the reason.
    """
    if len(expression) > _MAX_LENGTH:
        raise ValueError(f"expression longer than {_MAX_LENGTH} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"syntax error: {e.msg}") from None
    try:
        return _eval(tree)
    except RecursionError:  # "-" * 999 + "1" parses, and nests deeper than the walk may recurse
        raise ValueError("the expression is nested too deeply") from None
    except (ZeroDivisionError, OverflowError, TypeError) as e:
        raise ValueError(f"{type(e).__name__}: {e}") from None
    except ValueError as e:
        raise ValueError(str(e)) from None


class CalculatorEnv(ToolEnv):
    """A `calculator` tool (`{"expression": "..."}`); a turn without tool calls is the final answer.

    The tool answers the value as Python prints it, or `Error: ...` (`safe_eval`'s reasons; an integer result of
    more digits than Python prints, 4,300 by default).
    """

    tool_specs = [
        {
            "type": "function",
            "function": {
                "name": "calculator",
                "description": "Evaluate an arithmetic expression (numbers, + - * / // % **, sqrt, log, ...).",
                "parameters": {
                    "type": "object",
                    "properties": {"expression": {"type": "string", "description": "e.g. 2 * (3 + 4)"}},
                    "required": ["expression"],
                },
            },
        }
    ]

    def tool_functions(self) -> dict[str, Callable[..., Awaitable[str]]]:
        """`calculator(expression)`."""
        return {"calculator": self._calculator}

    async def _calculator(self, expression: str) -> str:
        if not isinstance(expression, str):
            return f"Error: 'expression' must be a string, got {type(expression).__name__}"
        try:
            value = safe_eval(expression)
        except ValueError as e:
            return f"Error: {e}"
        try:
            return str(value)
        except ValueError:  # an int past Python's digit limit (within _MAX_BITS): its own advice means nothing here
            limit = sys.get_int_max_str_digits()
            return f"Error: the result has more than {limit} digits (limit {limit})"
