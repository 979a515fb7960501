"""Safe arithmetic over task axes for launch manifests ("cdiv(M, 128) * cdiv(N, 256)").

Only numbers, names, + - * / // % **, comparisons, conditional expressions and a few
functions are allowed; anything else is a ValueError naming the offending piece.
"""
from __future__ import annotations

import ast
import math
import operator

FUNCTIONS = {
    "cdiv": lambda a, b: -(-int(a) // int(b)),
    "ceil_div": lambda a, b: -(-int(a) // int(b)),
    "min": min, "max": max, "sqrt": math.sqrt, "log2": math.log2,
    "int": int, "float": float, "round_up": lambda a, b: -(-int(a) // int(b)) * int(b),
}
_BINOPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
    ast.LShift: operator.lshift, ast.RShift: operator.rshift,
}
_CMPOPS = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
           ast.Eq: operator.eq, ast.NotEq: operator.ne}


def evaluate(expr: str | int | float, env: dict[str, float | int]) -> float | int:
    """Evaluate one manifest expression with the given names (axes, scalars, num_sms)."""
    if isinstance(expr, (int, float)):
        return expr
    try:
        tree = ast.parse(str(expr).strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"cannot parse expression {expr!r}: {exc.msg}") from None
    return _eval(tree.body, env, str(expr))


def names_in(expr: str | int | float) -> set[str]:
    if isinstance(expr, (int, float)):
        return set()
    try:
        tree = ast.parse(str(expr).strip(), mode="eval")
    except SyntaxError:
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id not in FUNCTIONS}


def _eval(node: ast.AST, env: dict, src: str):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in env:
            return env[node.id]
        known = ", ".join(sorted(env)) or "none"
        raise ValueError(f"unknown name {node.id!r} in {src!r} (known: {known})")
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left, env, src), _eval(node.right, env, src)
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ValueError(f"division by zero in {src!r}")
        return _BINOPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval(node.operand, env, src)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMPOPS:
        return int(_CMPOPS[type(node.ops[0])](_eval(node.left, env, src), _eval(node.comparators[0], env, src)))
    if isinstance(node, ast.IfExp):
        return _eval(node.body, env, src) if _eval(node.test, env, src) else _eval(node.orelse, env, src)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS and not node.keywords:
        return FUNCTIONS[node.func.id](*[_eval(a, env, src) for a in node.args])
    raise ValueError(f"unsupported construct {ast.dump(node)[:40]!r} in expression {src!r}")
