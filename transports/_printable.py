"""A peer's text made safe to print: the one place that escapes what came off the wire.

Anything a peer sends (a hello's host name, a forwarded log record, a remote
error's message and traceback, a key or spec name) may end in a log line, an
event, ``statistics()`` or a metric label. Read raw, it could clear the
trainer's screen (``\\x1b[2J``), reverse the text after it (``\\u202e``), or
start a new line that reads like the trainer's own (``\\n2026-01-01 ... INFO
asyncrl.coordinator: all workers verified``). So every string is read through
:func:`printable` (one line) or :func:`printable_lines` (a text that stays
multi-line) where it is decoded, and every sink downstream gets safe text.

What is escaped: the Unicode categories Cc (C0 and C1 controls, DEL), Cf
(format: bidi overrides and isolates, zero-width characters), Zl and Zp (the
line and paragraph separators U+2028/U+2029), written as Python writes them in
a ``repr`` (``\\n``, ``\\x1b``, ``\\u202e``). Ordinary text (é, 中, emoji) stays.
A backslash is not doubled: escaping again changes nothing, so text that
crosses two hops (a relay) reads the same. Lengths are bounded, with a visible
marker saying how much was cut.

>>> printable("evil\\n2026 INFO asyncrl: ok\\x1b[2J\\u202e", limit=200)
'evil\\\\n2026 INFO asyncrl: ok\\\\x1b[2J\\\\u202e'
>>> printable("x" * 100, limit=40)
'xxxxxxx [... cut, 100 characters in all]'
>>> print(printable_lines("first\\nWARNING asyncrl.coordinator: fake", limit=200))
first
  WARNING asyncrl.coordinator: fake
"""

from __future__ import annotations

import unicodedata
from typing import Literal

#: What every continuation line of a multi-line text starts with: no line of a
#: peer's text can start like the trainer's own ``LEVEL logger: ...`` lines.
INDENT = "  "
#: The categories shown escaped: controls, format characters, line and paragraph separators.
UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: str, *, limit: int) -> str:
    """``text`` on one line, every unsafe character escaped, at most ``limit`` characters.

    >>> printable("tab\\there, bell\\x07, é", limit=100)
    'tab\\\\there, bell\\\\x07, é'
    """
    return _bounded(text, limit, keep_newlines=False)


def printable_lines(text: str, *, limit: int, indent: str = INDENT,
                    keep: Literal["head", "tail"] = "head") -> str:
    """``text`` with its line breaks, every other unsafe character escaped.

    Each continuation line that does not start with ``indent`` gets it (empty
    lines stay empty), so the text may follow a log line's prefix but none of
    its lines can pass for a line of its own. ``indent=""`` only escapes (a
    traceback kept as sent; :func:`printable_block` indents it where it is
    shown). ``keep="tail"`` cuts the head instead (a traceback's end is where
    the raise is). At most ``limit`` characters; applying it twice changes nothing.

    >>> printable_lines("a\\x1b\\nb\\u2028c", limit=100)
    'a\\\\x1b\\n  b\\\\u2028c'
    """
    return _bounded(text, limit, keep_newlines=True, keep=keep, indent=indent)


def printable_block(text: str, *, limit: int, indent: str = INDENT) -> str:
    """:func:`printable_lines` with the first line indented too: a text shown on lines
    of its own (a remote traceback under a message) starts no line unindented.

    >>> printable_block("Traceback (most recent call last):\\nValueError: x", limit=100)
    '  Traceback (most recent call last):\\n  ValueError: x'
    """
    return _bounded(text, limit, keep_newlines=True, indent=indent, first=True)


def peer_name(identity: bytes, *, limit: int = 255) -> str:
    """A peer's identity (bytes it chose) as text to print: UTF-8 where it decodes,
    everything unsafe escaped.

    >>> peer_name(b"worker-1\\x1b[2J\\xff")
    'worker-1\\\\x1b[2J\\ufffd'
    """
    return printable(identity.decode(errors="replace"), limit=limit)


def is_unsafe(char: str) -> bool:
    """Whether ``char`` is one :func:`printable` escapes."""
    return unicodedata.category(char) in UNSAFE_CATEGORIES


def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _safe(text: str, keep_newlines: bool) -> bool:
    # isprintable() is False for every unsafe character (and for a few harmless
    # ones, such as a no-break space): it is the C-speed filter, the category decides.
    return text.isprintable() or (keep_newlines and text.replace("\n", "").isprintable())


def _pieces(text: str, keep_newlines: bool) -> list[str]:
    return [c if c.isprintable() or (keep_newlines and c == "\n") or not is_unsafe(c)
            else _escape(c) for c in text]


def _bounded(text: str, limit: int, *, keep_newlines: bool,
             keep: Literal["head", "tail"] = "head", indent: str = "",
             first: bool = False) -> str:
    # Escaping and indenting only lengthen: more than ``limit`` characters of the
    # text are never shown, so the rest is not even looked at.
    part = text[:limit] if keep == "head" else text[max(0, len(text) - limit):]
    whole = len(part) == len(text)
    if indent:
        part = _indent_lines(part, indent, first=first)
    if _safe(part, keep_newlines):
        if whole and len(part) <= limit:
            return part  # the common case: nothing to escape, nothing to cut
        pieces = list(part)
    else:
        pieces = _pieces(part, keep_newlines)
        if whole and sum(map(len, pieces)) <= limit:
            return "".join(pieces)
    return _cut(pieces, len(text), limit, keep, indent, first)


def _cut(pieces: list[str], total: int, limit: int, keep: Literal["head", "tail"],
         indent: str, first: bool) -> str:
    """As many pieces (one per character shown) of the kept end as fit in ``limit``
    beside a marker that says the text was cut and how long it was."""
    marker = f"[... cut, {total} characters in all]"
    room = limit - len(marker) - 1
    kept: list[str] = []
    for piece in pieces if keep == "head" else reversed(pieces):
        if len(piece) > room:
            break
        kept.append(piece)
        room -= len(piece)
    # The kept lines have their indent; the marker's own line needs it when it starts one.
    while indent and room < len(indent) and kept and _marker_starts_line(kept, keep, first):
        room += len(kept.pop())
    if keep == "head":
        text = "".join(kept) + " " + marker
    else:
        text = marker + " " + "".join(reversed(kept))
    if indent:
        text = _indent_lines(text, indent, first=first)
    return text[:limit] if keep == "head" else text[-limit:]


def _marker_starts_line(kept: list[str], keep: Literal["head", "tail"], first: bool) -> bool:
    if keep == "tail":
        return first  # the marker leads the text
    return kept[-1] == "\n" or (first and "\n" not in kept)


def _indent_lines(text: str, indent: str, *, first: bool) -> str:
    lines = text.split("\n")
    for i in range(0 if first else 1, len(lines)):
        if lines[i] and not lines[i].startswith(indent):
            lines[i] = indent + lines[i]
    return "\n".join(lines)


__all__ = ["INDENT", "UNSAFE_CATEGORIES", "is_unsafe", "peer_name", "printable",
           "printable_block", "printable_lines"]
