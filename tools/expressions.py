"""Safe arithmetic over task axes for launch manifests ("cdiv(M, 128) * cdiv(N, 256)").

Only numbers, names, + - * / // % ** << >>, comparisons, conditional expressions and a few
functions are allowed; anything else is a ValueError naming the offending piece.

A manifest is written by a model (or an optimiser that tries every gap), so evaluation is
bounded by construction and every problem is a ValueError, never another exception and
never a hang: the text's length and the tree's size and depth are checked before anything
is evaluated (iteratively, so a 50,000-term sum is refused, not a RecursionError);
powers and shifts are bounded before they are computed (`9**9**9` never starts); every
intermediate integer must stay within ±MAX_MAGNITUDE and every float must be finite.
So each of at most MAX_NODES nodes is evaluated at most once, on operands of at most ~1100
bits: microseconds, by construction. No clock is read: a value depends on the expression and
its names only, so a launch plan is the same in every process and phase that computes it (a
wall-clock budget refused a legal expression when another thread held the GIL past it: a
manifest_error by host load).
"""
from __future__ import annotations

import ast
import math
import operator

MAX_CHARS = 1000  # manifest expressions are one line ("min(num_sms, cdiv(M, 128) * (N // 256))")
MAX_NODES = 400
MAX_DEPTH = 40
MAX_MAGNITUDE = 2**64  # u64 arguments are the widest a kernel parameter can take
MAX_SHIFT = 64


def _cdiv(a, b):
    return -(-int(a) // int(b))


FUNCTIONS = {
    "cdiv": _cdiv, "ceil_div": _cdiv,
    "min": min, "max": max, "sqrt": math.sqrt, "log2": math.log2,
    "int": int, "float": float, "round_up": lambda a, b: _cdiv(a, b) * int(b),
}
_ARITY = {"cdiv": (2, 2), "ceil_div": (2, 2), "round_up": (2, 2), "min": (2, 16), "max": (2, 16),
          "sqrt": (1, 1), "log2": (1, 1), "int": (1, 1), "float": (1, 1)}
_BINOPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
    ast.LShift: operator.lshift, ast.RShift: operator.rshift,
}
_CMPOPS = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
           ast.Eq: operator.eq, ast.NotEq: operator.ne}


def evaluate(expr: str | int | float, env: dict[str, float | int]) -> float | int:
    """Evaluate one manifest expression with the given names (axes, scalars, num_sms).

    Raises ValueError (and nothing else) for anything that is not a bounded number."""
    if isinstance(expr, bool) or not isinstance(expr, (str, int, float)):
        raise ValueError(f"expected a number or an expression string, got {type(expr).__name__} {expr!r:.60}")
    if isinstance(expr, (int, float)):
        return _checked(expr, repr(expr))
    tree = _parse(expr)
    ev = _Evaluator(env, _short(expr))
    try:
        return ev.eval(tree.body)
    except ValueError:
        raise
    except (ArithmeticError, TypeError, RecursionError, MemoryError) as exc:  # belt and braces: never leak another type
        raise ValueError(f"cannot evaluate {ev.src}: {type(exc).__name__}: {exc}") from None


def names_in(expr: str | int | float) -> set[str]:
    """The names an expression uses (functions excluded); empty for numbers and bad text."""
    if isinstance(expr, bool) or not isinstance(expr, str):
        return set()
    try:
        tree = _parse(expr)
    except ValueError:
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id not in FUNCTIONS}


def _short(expr: str) -> str:
    """The expression as quoted in messages: long text is cut so an error stays one short line."""
    text = str(expr)
    return repr(text) if len(text) <= 80 else repr(text[:77] + "...")


def _parse(expr: str) -> ast.Expression:
    """Parse and check the tree's shape before anything is evaluated."""
    text = expr.strip()
    if len(text) > MAX_CHARS:
        raise ValueError(f"expression {_short(text)} is {len(text)} characters long; at most {MAX_CHARS} are allowed")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"cannot parse expression {_short(text)}: {exc.msg}") from None
    except (RecursionError, MemoryError, ValueError):  # deep nesting, or a NUL byte
        raise ValueError(f"cannot parse expression {_short(text)}: too deeply nested or malformed") from None
    _check_shape(tree, _short(text))
    return tree


def _check_shape(tree: ast.AST, src: str) -> None:
    """Count nodes and depth with an explicit stack (no recursion, so no RecursionError)."""
    stack, nodes = [(tree, 0)], 0
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise ValueError(f"expression {src} is too large (more than {MAX_NODES} syntax nodes)")
        if depth > MAX_DEPTH:
            raise ValueError(f"expression {src} is nested too deeply (more than {MAX_DEPTH} levels)")
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))


def _checked(v, src: str):
    """Every intermediate value: an int within ±MAX_MAGNITUDE or a finite float."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        if abs(v) > MAX_MAGNITUDE:
            raise ValueError(f"integer overflow in {src}: an intermediate value exceeds 2**64 in magnitude")
        return v
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"{src} produces a non-finite value ({v})")
        return v
    raise ValueError(f"{src} produces a {type(v).__name__}, not a real number")


class _Evaluator:
    def __init__(self, env: dict, src: str):
        self.env, self.src = env, src

    def eval(self, node: ast.AST):
        return _checked(self._node(node), self.src)

    def _node(self, node: ast.AST):
        src = self.src
        if isinstance(node, ast.Constant):
            if isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
                return node.value
            raise ValueError(f"constant {node.value!r:.40} in {src} is not a number")
        if isinstance(node, ast.Name):
            if node.id in self.env:
                return self.env[node.id]
            known = ", ".join(sorted(self.env)) or "none"
            raise ValueError(f"unknown name {node.id!r} in {src} (known: {known})")
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return self._binop(node.op, self.eval(node.left), self.eval(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = self.eval(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMPOPS:
            return int(_CMPOPS[type(node.ops[0])](self.eval(node.left), self.eval(node.comparators[0])))
        if isinstance(node, ast.IfExp):
            return self.eval(node.body) if self.eval(node.test) else self.eval(node.orelse)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS \
                and not node.keywords:
            return self._call(node.func.id, [self.eval(a) for a in node.args])
        raise ValueError(f"unsupported construct {type(node).__name__} in expression {src}")

    def _binop(self, op: ast.operator, left, right):
        src = self.src
        if isinstance(op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ValueError(f"division by zero in {src}")
        if isinstance(op, ast.Pow):
            _check_power(left, right, src)
        if isinstance(op, (ast.LShift, ast.RShift)):
            if not (isinstance(left, int) and isinstance(right, int)):
                raise ValueError(f"shift of a non-integer in {src}")
            if not 0 <= right <= MAX_SHIFT:
                raise ValueError(f"shift count {right} in {src} is outside 0..{MAX_SHIFT}")
        return _BINOPS[type(op)](left, right)

    def _call(self, name: str, args: list):
        lo, hi = _ARITY[name]
        if not lo <= len(args) <= hi:
            want = str(lo) if lo == hi else f"{lo} to {hi}"
            raise ValueError(f"{name}() takes {want} arguments, got {len(args)} in {self.src}")
        if name in ("cdiv", "ceil_div", "round_up") and int(args[1]) == 0:
            raise ValueError(f"division by zero in {self.src}")
        try:
            return FUNCTIONS[name](*args)
        except (ValueError, ArithmeticError) as exc:  # sqrt(-1), log2(0), int(inf)
            raise ValueError(f"{name}() failed in {self.src}: {exc}") from None


def _check_power(base, exp, src: str) -> None:
    """Refuse a power whose result would be out of range before computing it."""
    if isinstance(base, int) and isinstance(exp, int):
        if exp < 0:
            if base == 0:
                raise ValueError(f"division by zero in {src}")
            return  # a float between -1 and 1
        if abs(base) >= 2 and exp * math.log2(abs(base)) > 64:
            raise ValueError(f"integer overflow in {src}: {base}**{exp} exceeds 2**64")
        return
    # a float power: a negative base with a fractional exponent is complex; overflow raises
    # OverflowError, which evaluate() turns into a ValueError
    if base < 0 and not float(exp).is_integer():
        raise ValueError(f"({base})**{exp} in {src} is not a real number")
