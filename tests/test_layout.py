"""The package's layout holds: every module imports, rooms by role, no circle, nothing up.

docs/architecture.md draws the tree; these tests keep it true as code moves
(mypy's ``ignore_missing_imports`` would not notice an import of a module that
moved away).
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from collections import defaultdict
from pathlib import Path

import pytest

import asyncrl
import transports

ROOT = Path(__file__).resolve().parents[1]

#: asyncrl's rooms, lowest floor first: a module may import from its own room and
#: from rooms on lower floors, never from a room above (the public faces, which
#: re-export, sit on top).
FLOORS: list[set[str]] = [
    {"transports"},
    {"asyncrl._errors", "asyncrl._protocol"},
    {"asyncrl._spawn", "asyncrl._observe"},
    {"asyncrl._rollout", "asyncrl.weights"},
    {"asyncrl._worker", "asyncrl._coordinator", "asyncrl._inference"},
    {"asyncrl.collectors", "asyncrl.launch", "asyncrl.testing"},
    {"asyncrl.collectors.multi", "asyncrl.collectors.batched"},
    {"asyncrl", "asyncrl.cli", "asyncrl._cli_env", "asyncrl.__main__", "asyncrl.metrics",
     "asyncrl.collectors.__init__"},
]
#: Imports that point up on purpose, with the reason.
UPWARD_ALLOWED = {
    ("asyncrl.collectors._torchrl_dispatch", "asyncrl.collectors.multi.collector"):
        "Collector(backend='process') is TorchRL's dispatcher: it builds a MultiCollector "
        "(imported when called)",
}
#: The flat modules asyncrl/ keeps: its face, the error tree, the messages, the CLI,
#: metrics and the test doubles.
FLAT = {"__init__.py", "__main__.py", "_errors.py", "_protocol.py", "cli.py", "_cli_env.py",
        "metrics.py", "testing.py"}


def _modules() -> list[str]:
    names = []
    for package in (asyncrl, transports):
        names.append(package.__name__)
        names += [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
    return names


def _room(module: str, is_package: bool) -> str:
    if module == "asyncrl.collectors" and is_package:
        return "asyncrl.collectors.__init__"  # the face re-exports the sub-packages
    for room in sorted(set().union(*FLOORS), key=len, reverse=True):  # the longest match
        if module == room or module.startswith(room + "."):
            return room
    raise AssertionError(f"{module} is in no room of tests/test_layout.py's FLOORS")


def _floor(room: str) -> int:
    return next(i for i, floor in enumerate(FLOORS) if room in floor)


def _imports(path: Path, module: str, is_package: bool) -> list[str]:
    package = module if is_package else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = parts[: len(parts) - (node.level - 1)]
                found.append(".".join(base + ([node.module] if node.module else [])))
            elif node.module:
                found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
    return [name for name in found if name.split(".")[0] in ("asyncrl", "transports")]


@pytest.mark.parametrize("module", _modules())
def test_every_module_imports(module: str) -> None:
    importlib.import_module(module)


def test_asyncrl_keeps_only_its_face_flat() -> None:
    flat = {p.name for p in (ROOT / "asyncrl").glob("*.py")}
    assert flat <= FLAT, f"private modules belong in a room (docs/architecture.md): {flat - FLAT}"


def test_no_import_points_up_a_floor_or_closes_a_circle() -> None:
    upward, edges = [], defaultdict(set)
    for base in ("asyncrl", "transports"):
        for path in (ROOT / base).rglob("*.py"):
            is_package = path.name == "__init__.py"
            parts = path.relative_to(ROOT).with_suffix("").parts
            module = ".".join(parts[:-1] if is_package else parts)
            room = _room(module, is_package)
            for target in _imports(path, module, is_package):
                target_room = _room(target, is_package=False)
                if target_room == room or (module, target) in UPWARD_ALLOWED:
                    continue
                edges[room].add(target_room)
                if _floor(target_room) > _floor(room):
                    upward.append(f"{module} -> {target} ({room} -> {target_room})")
    assert not upward, "imports that point up a floor:\n" + "\n".join(sorted(upward))
    assert not _circles(edges), f"rooms that import each other: {_circles(edges)}"


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every room that can reach itself, with the path (depth-first)."""
    circles = []
    for start in sorted(edges):
        stack = [(start, [start])]
        seen = set()
        while stack:
            room, path = stack.pop()
            for target in edges.get(room, ()):
                if target == start:
                    circles.append([*path, start])
                elif target not in seen:
                    seen.add(target)
                    stack.append((target, [*path, target]))
    return circles
