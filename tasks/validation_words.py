"""pydantic's validation errors in the words a user reads.

A launch.json, a sweep config or a flag that fails its schema is told as `where: what`
("launches.0.grid.0: must be text or a whole number"), never in pydantic's phrasing ("Field
required", "Input should be a valid integer") or with a Python repr of the value. Every error
type the launch manifest's schema can raise has its words here (tests/test_steering_45.py breaks
every field of a full manifest every way); a type without words keeps pydantic's message.

It lives in `tasks`, the room every other may import (tasks imports nothing of the others): task
Definitions (tasks.registry), launch manifests (tools.solution) and the CLI's configs and flags
(agent.commands) share this one table.
"""
from __future__ import annotations

from typing import Any, Iterable

# error type -> what the value must be or do; {ctx keys} are filled from the error's context
_WORDS = {
    "missing": "is required",
    "extra_forbidden": "is not a key this object takes",
    "string_type": "must be text",
    "string_too_long": "must be at most {max_length} characters",
    "string_too_short": "must be at least {min_length} characters",
    "int_type": "must be a whole number", "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number", "float_parsing": "must be a number", "finite_number": "must be a finite number",
    "bool_type": "must be true or false", "bool_parsing": "must be true or false",
    "list_type": "must be a list", "dict_type": "must be an object ({{...}})", "model_type": "must be an object ({{...}})",
    "model_attributes_type": "must be an object ({{...}})",
    "literal_error": "must be one of {expected}", "enum": "must be one of {expected}",
    "too_short": "must have at least {min_length} {entries}", "too_long": "must have at most {max_length} {entries}",
    "greater_than_equal": "must be at least {ge}", "greater_than": "must be more than {gt}",
    "less_than_equal": "must be at most {le}", "less_than": "must be less than {lt}",
}

# Where pydantic names the member of a union it tried (Union[str, int] -> "str", "int"; a tagged
# union -> its tag): not a place a person wrote. The errors of all members at one place are one.
_UNION_MEMBERS = {"str", "int", "float", "bool", "by_name", "by_value"}


def plain_validation_error(error: dict) -> str:
    """One pydantic error (ValidationError.errors()[i]) as `where: what`."""
    where, what = _place(error), _what(error)
    return f"{where}: {what}" if where else what


def plain_validation_errors(errors: Iterable[dict], root: str = "", most: int = 3) -> str:
    """All errors of one ValidationError as one line: the errors of a union's members at one
    place merged ("must be text or a whole number"), the first `most` places, then "(+N more)".
    `root` names the place of an error about the whole document."""
    places: dict[str, list[str]] = {}
    for e in errors:
        places.setdefault(_place(e) or root, []).append(_what(e))
    parts = [f"{where}: {_merge(whats)}" if where else _merge(whats) for where, whats in list(places.items())[:most]]
    more = f" (+{len(places) - most} more)" if len(places) > most else ""
    return "; ".join(parts) + more


def _place(error: dict) -> str:
    return ".".join(str(x) for x in error.get("loc", ()) if not (isinstance(x, str) and _member(x)))


def _member(part: str) -> bool:
    return part in _UNION_MEMBERS or "[" in part  # "list[union[str,int]]": a member named by its type


def _what(error: dict) -> str:
    template = _WORDS.get(error.get("type", ""))
    ctx: dict[str, Any] = dict(error.get("ctx") or {})
    n = ctx.get("min_length", ctx.get("max_length"))
    ctx["entries"] = "entry" if n == 1 else "entries"
    try:
        what = template.format(**ctx) if template else None
    except (KeyError, IndexError):
        what = None
    return what or str(error.get("msg", "invalid")).removeprefix("Value error, ")


def _merge(whats: list[str]) -> str:
    """"must be text" + "must be a whole number" -> "must be text or a whole number"."""
    unique = list(dict.fromkeys(whats))
    if len(unique) > 1 and all(w.startswith("must be ") for w in unique):
        return "must be " + " or ".join(w.removeprefix("must be ") for w in unique)
    return "; ".join(unique)
