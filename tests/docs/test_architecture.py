"""docs/architecture.md names every module of asyncrl/ and transports/, and only those.

The page has one table per room, under a heading naming the room's folder
(``### `asyncrl/_rollout/` ``); each row starts with a module's file name. A move
is then one edited row, and this test says which.
"""

from __future__ import annotations

import re

from .markdown_blocks import ROOT

PAGE = ROOT / "docs" / "architecture.md"
_ROOM = re.compile(r"^#{2,4} `((?:asyncrl|transports)(?:/[\w]+)*)/`")
_ROW = re.compile(r"^\| `(\w+\.py)` \|")


def _named_modules(text: str) -> list[str]:
    """``room/file.py`` for each table row, the room being the last heading that named one."""
    room, named = None, []
    for line in text.splitlines():
        if heading := _ROOM.match(line):
            room = heading.group(1)
        elif line.startswith("#"):
            room = None
        elif (row := _ROW.match(line)) and room is not None:
            named.append(f"{room}/{row.group(1)}")
    return named


def _module_files() -> set[str]:
    return {str(p.relative_to(ROOT)) for base in ("asyncrl", "transports")
            for p in (ROOT / base).rglob("*.py")}


def test_the_page_reads_rooms_and_rows() -> None:
    text = "### `asyncrl/_rollout/`\n\n| module | x |\n|---|---|\n| `loop.py` | the loop |\n" \
           "## Wire\n| `loop.py` | not a module row |\n"
    assert _named_modules(text) == ["asyncrl/_rollout/loop.py"]


def test_architecture_names_every_module() -> None:
    named = _named_modules(PAGE.read_text())
    missing = sorted(_module_files() - set(named))
    assert not missing, (
        "modules docs/architecture.md does not name: add a row to their room's table "
        "(one line per module):\n" + "\n".join(f"  {m}" for m in missing))


def test_every_module_architecture_names_exists() -> None:
    named = _named_modules(PAGE.read_text())
    gone = sorted(set(named) - _module_files())
    twice = sorted({m for m in named if named.count(m) > 1})
    assert not gone, ("docs/architecture.md names modules that do not exist (moved or "
                      "removed? fix the row):\n" + "\n".join(f"  {m}" for m in gone))
    assert not twice, f"docs/architecture.md names these modules twice: {twice}"
