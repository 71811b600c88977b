"""The package's layout holds: every module imports, rooms by role, no circle, nothing up.

docs/architecture.md draws the tree; these tests keep it true as code moves
(mypy's ``ignore_missing_imports`` would not notice an import of a module that
moved away). They also guard against monsters: no module over 800 lines (a guard, not a
target: a module is cut by concept, never to meet a count), no
circle between modules (``TYPE_CHECKING`` and function-local imports count: a
circle of concepts is a circle whether or not Python runs it) and few reaches
into another object's private members (ruff's SLF001).
"""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import re
import subprocess
import sys
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
    {"asyncrl.collectors", "asyncrl.launch", "asyncrl.testing", "asyncrl.served"},
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
FLAT = {"__init__.py", "__main__.py", "_errors.py", "cli.py", "_cli_env.py",
        "metrics.py", "testing.py"}
#: A guard against monsters, not a target: past it a module surely holds two concepts (split
#: it by concept). Below it, cut a module where its concepts part, never to meet a count.
MAX_LINES = 800
#: The most reaches into another object's private members (ruff's SLF001, each access a
#: ``noqa`` silences counting) asyncrl and transports may hold: give the object the method its
#: caller needs. Of the 40: 7 are EnvPool's C++ binding (envpool_raw.binding), 4 torch's hook
#: dicts (td_module_direct), 7 multiprocessing's and importlib's internals (spawn).
MAX_PRIVATE_ACCESSES = 40


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


@pytest.mark.parametrize("module", _modules())
def test_every_module_imports(module: str) -> None:
    importlib.import_module(module)


def test_asyncrl_keeps_only_its_face_flat() -> None:
    flat = {p.name for p in (ROOT / "asyncrl").glob("*.py")}
    assert flat <= FLAT, f"private modules belong in a room (docs/architecture.md): {flat - FLAT}"


def test_no_import_points_up_a_floor_or_closes_a_circle() -> None:
    upward, edges = [], defaultdict(set)
    for module, targets in _module_graph().items():
        room = _room(module, is_package=(ROOT / module.replace(".", "/") / "__init__.py").exists())
        for target in targets:
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


def _source_files() -> list[Path]:
    return sorted(p for base in ("asyncrl", "transports") for p in (ROOT / base).rglob("*.py"))


def test_no_module_is_over_800_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in _source_files()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, (
        f"modules over {MAX_LINES} lines (each holds two concepts: split it by concept):\n"
        + "\n".join(f"  {path}: {n} lines" for path, n in sorted(long.items())))


def _module_graph() -> dict[str, set[str]]:
    """Module -> the modules of asyncrl/transports it imports, wherever the import sits."""
    files = {}
    for path in _source_files():
        parts = path.relative_to(ROOT).with_suffix("").parts
        is_package = path.name == "__init__.py"
        files[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    graph: dict[str, set[str]] = {}
    for module, (path, is_package) in files.items():
        targets = set()
        for name in _imported_names(path, module, is_package):
            # ``from pkg import mod`` imports the module pkg.mod; ``from mod import name`` mod
            while name not in files and "." in name:
                name = name.rsplit(".", 1)[0]
            if name in files and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def _imported_names(path: Path, module: str, is_package: bool) -> list[str]:
    """Every module name an import statement of ``path`` may mean (``pkg.name`` for names too)."""
    package = module if is_package else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - (node.level - 1)] + ([base] if base else []))
            found += [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
    return [name for name in found if name.split(".")[0] in ("asyncrl", "transports")]


def _module_circles(graph: dict[str, set[str]]) -> list[str]:
    """Each group of modules that import each other (a strongly connected component), as a path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [" -> ".join(_cycle(graph, group)) + (f"  (group: {', '.join(group)})"
                                                  if len(group) > 2 else "")
            for group in sorted(groups)]


def _cycle(graph: dict[str, set[str]], group: list[str]) -> list[str]:
    """The shortest way from the group's first module back to itself (breadth-first)."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for target in sorted(graph[node] & members):
            if target == start:
                return [*paths[node], start]
            if target not in paths:
                paths[target] = [*paths[node], target]
                queue.append(target)
    raise AssertionError(f"no cycle through {start} in {group}")


def test_no_modules_import_each_other() -> None:
    circles = _module_circles(_module_graph())
    assert not circles, (
        "modules that import each other (TYPE_CHECKING and function-local imports count): "
        "let one depend on the other, or merge them if they are one concept:\n"
        + "\n".join(f"  {circle}" for circle in circles))


def _private_accesses() -> list[str]:
    """ruff's SLF001 findings in asyncrl and transports, plus each access a ``noqa`` silences.

    Counted per access, not per line: a line that reads five private members of an
    object counts five (packing reaches onto one line must not hide them).
    """
    ran = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--select", "SLF001", "--output-format", "json",
         "--no-cache", "asyncrl", "transports"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert ran.returncode in (0, 1), f"ruff failed ({ran.returncode}): {ran.stderr}"
    found = [(str(Path(d["filename"]).relative_to(ROOT)), d["location"]["row"], d["message"])
             for d in json.loads(ran.stdout)]
    silenced = re.compile(r"#\s*noqa:[^#]*\bSLF001\b")
    for path in _source_files():
        source = path.read_text()
        rows = {row for row, line in enumerate(source.splitlines(), 1) if silenced.search(line)}
        if not rows:
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Attribute) and node.lineno in rows \
                    and _is_foreign_private(node):
                found.append((str(path.relative_to(ROOT)), node.lineno,
                              f"noqa: SLF001 ({ast.unparse(node)})"))
    return [f"{path}:{row}: {message}" for path, row, message in sorted(found)]


def _is_foreign_private(node: ast.Attribute) -> bool:
    """``x._name`` on another object than ``self`` / ``cls`` (dunders are public)."""
    name = node.attr
    own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
    return name.startswith("_") and not name.startswith("__") and not own


def test_few_reaches_into_other_objects_private_members() -> None:
    found = _private_accesses()
    assert len(found) <= MAX_PRIVATE_ACCESSES, (
        f"{len(found)} private-member accesses across objects (ruff SLF001, each access a "
        f"noqa silences counting), at most {MAX_PRIVATE_ACCESSES}: give the object the method "
        "or property its caller needs, or hold one foreign private in one small function:\n"
        + "\n".join(f"  {line}" for line in found))
