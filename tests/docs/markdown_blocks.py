"""The code blocks of the project's Markdown files, as the doc tests run them.

Every fenced ``python`` block is a program the tests execute. A block that is
a fragment (it uses a ``collector`` opened earlier in the text, say) is wrapped
in a *setup* written as an HTML comment before it, invisible on the rendered
page::

    <!-- docs-test setup
    import anyio
    async def main():
        async with MultiSyncCollector(...) as collector:
            {block}
    anyio.run(main)
    -->

The line ``{block}`` is replaced by the block, indented as that line is. A
setup holds for every later python block of the file, until the next setup or
``<!-- docs-test setup none -->``. ``<!-- docs-test skip: REASON -->`` skips
the next block and says why (the test reports it as skipped, never as passed).

``bash`` blocks are commands: the doc tests check what they can without a
network or a second host (see ``tests/docs/test_doc_blocks.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w+-]*)\s*$")
_SKIP = re.compile(r"^\s*<!--\s*docs-test skip:\s*(?P<reason>.+?)\s*-->\s*$")
_SETUP_START = "<!-- docs-test setup"
_SETUP_NONE = "<!-- docs-test setup none -->"


@dataclass(frozen=True)
class CodeBlock:
    """One fenced block: where it is, its language, its text and how to run it."""

    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    setup: str | None = None  # a template with a "{block}" line, or None
    skip: str | None = None  # the reason, when the text asks to skip it

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    def program(self) -> str:
        """The block as the program that runs: inside its setup, if it has one."""
        if self.setup is None:
            return self.code
        out: list[str] = []
        for line in self.setup.splitlines():
            if line.strip() == "{block}":
                indent = line[: len(line) - len(line.lstrip())]
                out.extend(indent + c if c.strip() else "" for c in self.code.splitlines())
            else:
                out.append(line)
        return "\n".join(out) + "\n"


def markdown_files() -> list[Path]:
    """README.md and every Markdown file under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def code_blocks(path: Path) -> list[CodeBlock]:
    """The fenced blocks of ``path``, each with the setup and skip marks in force."""
    lines = path.read_text().splitlines()
    blocks: list[CodeBlock] = []
    setup: str | None = None
    skip: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip() == _SETUP_NONE:
            setup = None
        elif line.strip().startswith(_SETUP_START):
            end = _comment_end(lines, i, path)
            setup = "\n".join(lines[i + 1:end])
            if "{block}" not in setup:
                raise ValueError(f"{path}:{i + 1}: a docs-test setup needs a '{{block}}' line")
            i = end
        elif match := _SKIP.match(line):
            skip = match["reason"]
        elif match := _FENCE.match(line):
            end = _fence_end(lines, i, path)
            indent = len(match["indent"])
            code = "\n".join(raw[indent:] for raw in lines[i + 1:end]) + "\n"
            lang = match["lang"] or "text"
            blocks.append(CodeBlock(path, i + 1, lang, code,
                                    setup if lang == "python" else None, skip))
            skip = None
            i = end
        i += 1
    return blocks


def _comment_end(lines: list[str], start: int, path: Path) -> int:
    for j in range(start + 1, len(lines)):
        if lines[j].strip() == "-->":
            return j
    raise ValueError(f"{path}:{start + 1}: a docs-test setup comment is not closed by '-->'")


def _fence_end(lines: list[str], start: int, path: Path) -> int:
    for j in range(start + 1, len(lines)):
        if lines[j].strip() == "```":
            return j
    raise ValueError(f"{path}:{start + 1}: a code block is not closed")


def shell_commands(code: str) -> list[str]:
    """The commands of a bash block: continuation lines joined, comments dropped."""
    commands: list[str] = []
    current = ""
    for raw in code.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        text = _strip_comment(current).strip()
        if text:
            commands.append(text)
        current = ""
    return commands


def _strip_comment(line: str) -> str:
    # A '#' that starts a word begins a comment (tcp://host:5555#x never appears here).
    return re.split(r"(?:^|\s)#", line, maxsplit=1)[0]
