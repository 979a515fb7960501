"""The house (issue 24), held by construction: no project module imports another that imports it
back, directly or through others, and the dependency direction is agent -> tools -> tasks /
knowledge. Every import counts, the ones inside functions too (they tie modules as surely)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent", "tools", "tasks", "knowledge")
# what a package may import of the project's others
ALLOWED = {"agent": {"agent", "tools", "tasks", "knowledge"}, "tools": {"tools", "tasks", "knowledge"},
           "tasks": {"tasks"}, "knowledge": {"knowledge"}}


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports (a name imported from a package counts as its module
    where there is one)."""
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # a.b.c of which a.b is the module
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {m: {t for t in _imports(m, p, known) if not m.startswith(t + ".")} for m, p in mods.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                return stack[stack.index(t):] + [t]
            if t not in state and (found := visit(t)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_circles():
    cycle = _cycle(_graph())
    assert cycle is None, " -> ".join(cycle)


def test_the_dependency_direction():
    wrong = [f"{m} imports {t}" for m, ts in _graph().items() for t in ts
             if t.split(".")[0] not in ALLOWED[m.split(".")[0]]]
    assert not wrong, wrong


def test_the_scan_sees_circles_and_local_imports(tmp_path):
    """The scanner itself: a circle through a function-local import is found."""
    graph = {"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}}
    assert _cycle(graph) == ["a.x", "a.y", "a.z", "a.x"]
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from agent.report import load_runs\n")
    assert _imports("agent.fixit.build", src, {"agent.report", "agent.fixit.build"}) == {"agent.report"}
