"""Messages declared once, checked by one mechanism: a peer's body becomes a typed message.

A message kind is declared as a dataclass: its fields' types are what the wire
must hold, ``Annotated[int, msgspec.Meta(ge=..., le=...)]`` bounds them, and a
:class:`Marker` on a field says what happens to a peer's value after it is
checked (:class:`Text`: made printable, cut at a limit; see :mod:`._printable`).
:func:`read` checks a body against the declaration with msgspec, strictly (a bool
is no int, a string no bytes; unknown fields are ignored, so a newer peer may add
some), runs the dataclass's ``__post_init__`` (its cross-field rules: a
:class:`ProtocolError` raised there passes as raised) and turns msgspec's
complaint into a :class:`ProtocolError` naming the message, the field, what was
expected and what came. A kind whose wire form differs from its fields says so
in its ``WIRE`` class variable: ``{field: wire type}``, ``None`` for a field read
elsewhere, ``Required[T]`` for a field the wire must carry though its dataclass
has a default; :func:`read_fields` reads those.

This is the mechanism of both layers: transports declares its one message (an
:class:`~transports.ErrorPayload`) with it, and ``asyncrl._protocol.decoding``
builds every asyncrl kind on it (its ``read`` names a kind ``"<kind> message"``).
``what`` is the subject of the error text, as the caller names it.

>>> from dataclasses import dataclass
>>> @dataclass
... class Ping:
...     count: Annotated[int, msgspec.Meta(ge=0, le=9)]
...     note: Annotated[str, Text(8)] = ""
>>> read(Ping, {"count": 3, "note": "hi"}, "ping")
Ping(count=3, note='hi')
>>> try:
...     read(Ping, {"count": 10}, "ping")
... except ProtocolError as exc:
...     print(exc)
ping field 'count' must be an int in 0..9, got 10
"""

from __future__ import annotations

import dataclasses
import re
import types
from functools import cache
from typing import (
    Annotated,
    Any,
    Literal,
    Required,
    TypeVar,
    get_args,
    get_origin,
    get_type_hints,
)

import msgspec

from ._errors import ProtocolError
from ._printable import printable, printable_block, printable_lines

__all__ = ["Marker", "Text", "clean", "read", "read_fields"]

T = TypeVar("T")


class Marker:
    """What becomes of a peer's value once it is checked (an ``Annotated`` field's marker):
    ``clean(value)`` is the value the message holds."""

    __slots__ = ()

    def clean(self, value: Any) -> Any:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True, slots=True)
class Text(Marker):
    """A string field from a peer: printable, at most ``limit`` characters (cut, not
    refused). ``style``: ``"line"`` (one line), ``"lines"`` (its line breaks kept,
    continuation lines indented), ``"block"`` (every line indented: a traceback)."""

    limit: int
    style: Literal["line", "lines", "block"] = "line"

    def clean(self, value: str) -> str:
        if self.style == "lines":
            return printable_lines(value, limit=self.limit)
        if self.style == "block":
            return printable_block(value, limit=self.limit)
        return printable(value, limit=self.limit)


def read(cls: type[T], body: Any, what: str) -> T:
    """``body`` checked against ``cls``'s declaration, its texts made printable (a kind
    without a ``WIRE`` form: see :func:`read_fields` for those)."""
    message: T = _convert(cls, body, what)
    return message


def read_fields(cls: type, body: Any, what: str) -> dict[str, Any]:
    """For a kind with a ``WIRE`` form: ``{field: value}`` of ``body`` checked against
    the declaration (the fields ``WIRE`` names as it declares them, left to the
    caller; the others as ``cls`` declares them, their texts made printable)."""
    fields: dict[str, Any] = _convert(cls, body, what)
    return fields


def clean(message: T) -> T:
    """``message`` (built from checked values) with its texts made printable."""
    kind: type = type(message)
    for name, marker in _plan(kind)[1]:
        object.__setattr__(message, name, marker.clean(getattr(message, name)))
    return message


def _convert(cls: type, body: Any, what: str) -> Any:
    if not isinstance(body, dict):
        raise ProtocolError(f"{what} body must be a map, got {type(body).__name__}")
    schema, cleaners, options = _plan(cls)
    try:
        message = msgspec.convert(body, schema, strict=True, **options)
    except msgspec.ValidationError as exc:
        raise ProtocolError(_explain(str(exc), body, what, schema)) from None
    if schema is not cls:
        values = {name: getattr(message, name) for name in schema.__struct_fields__}
        for name, marker in cleaners:
            values[name] = marker.clean(values[name])
        return values
    for name, marker in cleaners:
        object.__setattr__(message, name, marker.clean(getattr(message, name)))
    return message


def _options(schema: Any) -> dict[str, Any]:
    """``msgspec.convert``'s options for ``schema``: where it declares bytes (a peer
    identity), bytes are builtin, so that a string is refused, never read as base64
    (msgspec's default). Only there: the option costs each convert a fifth of a microsecond."""
    return {"builtin_types": (bytes, bytearray)} if _holds_bytes(schema, set()) else {}


def _holds_bytes(kind: Any, seen: set[Any]) -> bool:
    if kind in (bytes, bytearray):
        return True
    if isinstance(kind, type) and (dataclasses.is_dataclass(kind) or hasattr(kind, "_fields")
                                   or hasattr(kind, "__struct_fields__")):
        if kind in seen:
            return False
        seen.add(kind)
        return any(_holds_bytes(hint, seen)
                   for hint in get_type_hints(kind, include_extras=True).values())
    return any(_holds_bytes(arg, seen) for arg in get_args(kind) if arg is not Ellipsis)


@cache
def _plan(cls: type) -> tuple[Any, tuple[tuple[str, Marker], ...], dict[str, Any]]:
    """What to convert a body into (``cls``, or a Struct of its ``WIRE`` form), the
    fields to clean after the check (for a ``WIRE`` form, those it does not name), and
    ``msgspec.convert``'s options for it."""
    hints = get_type_hints(cls, include_extras=True)
    fields = dataclasses.fields(cls)
    cleaners = tuple((f.name, marker) for f in fields for marker in
                     getattr(hints[f.name], "__metadata__", ()) if isinstance(marker, Marker))
    wire: dict[str, Any] | None = getattr(cls, "WIRE", None)
    if wire is None:
        return cls, cleaners, _options(cls)
    spec: list[Any] = []
    for f in fields:
        kind = wire.get(f.name, hints[f.name])
        if kind is None:
            continue  # read by the caller
        if get_origin(kind) is Required:  # on the wire, though the dataclass has a default
            spec.append((f.name, get_args(kind)[0]))
        elif f.default is not dataclasses.MISSING:
            spec.append((f.name, kind, f.default))
        elif f.default_factory is not dataclasses.MISSING:
            spec.append((f.name, kind, msgspec.field(default_factory=f.default_factory)))
        else:
            spec.append((f.name, kind))
    schema = msgspec.defstruct(f"{cls.__name__}Wire", spec, kw_only=True)
    return (schema, tuple((name, marker) for name, marker in cleaners if name not in wire),
            _options(schema))


_AT = re.compile(r"^(?P<head>.*?)(?: - at `(?P<at>[^`]*)`(?: in `(?P<inside>[^`]*)`)?)?$",
                 re.DOTALL)
_WORDS = {"object": "map", "array": "list", "null": "None"}
_MISSING = object()
#: One step of msgspec's path: ``[3]`` (a list's), ``[...]`` (a map's value), ``name``.
_STEP = re.compile(r"\[(\d+|\.\.\.)\]|([^.\[\]]+)")


def _explain(complaint: str, body: Any, what: str, schema: Any) -> str:
    """msgspec's complaint in our words: ``<what> field 'f' must be X, got Y``."""
    match = _AT.match(complaint)
    assert match is not None  # the pattern matches any text
    head, at, inside = match["head"], match["at"] or "", match["inside"]
    path = (inside if inside is not None else at).removeprefix("$").removeprefix(".")
    kind, name = _walk(schema, path)
    missing = re.fullmatch(r"Object missing required field `([^`]*)`", head)
    if missing:
        return f"{what} field {(f'{name}.' if name else '') + missing[1]!r} is missing"
    expected = re.fullmatch(r"Expected (.*?)(, got (`?)([^`]*)\3)?", head, re.DOTALL)
    if expected is None:
        return f"{what} field {name!r}: {head}"
    want = _range(kind) or re.sub(r"`([^`]*)`", lambda m: " | ".join(
        _WORDS.get(w, w) for w in m[1].split(" | ")), expected[1])
    if inside is not None:
        return f"{what} field {name!r} must have {want} keys"
    value = _value_at(body, path)
    got = (_WORDS.get(expected[4], expected[4]) if value is _MISSING and expected[3]
           else _described(value, type_only=bool(expected[3])))
    return f"{what} {f'field {name!r}' if name else 'body'} must be {want}, got {got}"


def _walk(schema: Any, path: str) -> tuple[Any, str]:
    """The declared type at msgspec's ``path`` (None: not found) and the path in words
    (a named tuple's position by its name: ``records[0].level``)."""
    kind: Any = schema
    words = ""
    for index, key in re.findall(_STEP, path):
        kind = _bare(kind)
        fields = getattr(kind, "_fields", None)  # a NamedTuple
        if index == "...":  # a value in a map (msgspec does not say under which key)
            words += "[...]"
            args = get_args(kind)
            kind = args[1] if get_origin(kind) is dict and len(args) == 2 else None
        elif key:
            words += f".{key}" if words else key
            hints = get_type_hints(kind, include_extras=True) if isinstance(kind, type) else {}
            kind = hints.get(key)
        elif fields is not None and int(index) < len(fields):
            words += f".{fields[int(index)]}"
            kind = get_type_hints(kind, include_extras=True)[fields[int(index)]]
        else:
            words += f"[{index}]"
            args = get_args(kind)
            if get_origin(kind) is tuple and args and args[-1] is not Ellipsis:
                kind = args[int(index)] if int(index) < len(args) else None
            else:
                kind = args[0] if get_origin(kind) in (list, tuple) and args else None
    return kind, words


def _bare(kind: Any) -> Any:
    """``kind`` without its ``Annotated`` markers, an optional one without its None."""
    while True:
        if get_origin(kind) is Annotated:
            kind = get_args(kind)[0]
        elif isinstance(kind, types.UnionType) and type(None) in get_args(kind) \
                and len(get_args(kind)) == 2:
            kind = next(arg for arg in get_args(kind) if arg is not type(None))
        else:
            return kind


def _range(kind: Any) -> str:
    """``"an int in 0..7"`` for an int declared with both bounds ("" otherwise): the
    whole range, where msgspec names the side that was crossed."""
    if get_origin(kind) is not Annotated or get_args(kind)[0] is not int:
        return ""
    for meta in get_args(kind)[1:]:
        if isinstance(meta, msgspec.Meta) and meta.ge is not None and meta.le is not None:
            return f"an int in {meta.ge}..{meta.le}"
    return ""


def _value_at(body: Any, path: str) -> Any:
    value = body
    for step in re.findall(_STEP, path):
        index, key = step
        if index == "...":
            return _MISSING
        try:
            value = value[int(index)] if index else value[key]
        except (KeyError, IndexError, TypeError):
            return _MISSING
    return value


def _described(value: Any, *, type_only: bool) -> str:
    if value is _MISSING:
        return "something else"
    if type_only:
        return type(value).__name__
    if isinstance(value, int | float):
        return repr(value)[:40]
    if isinstance(value, str | bytes | list | dict):
        return f"{type(value).__name__} of length {len(value)}"
    return type(value).__name__
