"""Helpers shared by the CLI commands: one-line errors, JSON output, consoles."""
from __future__ import annotations

import json
from typing import Any, NoReturn

from pydantic import BaseModel
from rich.console import Console

console = Console()
err_console = Console(stderr=True)


class CliError(Exception):
    """Raised by a command for bad input; `agent` prints it as one line and exits 2."""


def fail(message: str) -> NoReturn:
    raise CliError(message)


def print_json(obj: Any) -> None:
    if isinstance(obj, BaseModel):
        obj = obj.model_dump(mode="json")
    print(json.dumps(obj, indent=2, default=str))
