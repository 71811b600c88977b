"""Write docs/api.md, the API reference, from the public faces' docstrings.

    python scripts/gen_api_docs.py            # rewrite docs/api.md
    python scripts/gen_api_docs.py --check    # exit 1 if docs/api.md is out of date

The public faces are the packages' ``__all__`` (``asyncrl``, ``asyncrl.weights``,
``asyncrl.collectors``, ``asyncrl.metrics``, ``asyncrl.testing``,
``transports``): each name with its signature and docstring, and for classes
each public method and property. A test runs ``--check``, so a docstring
changed without regenerating the page fails CI.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "api.md"
#: The faces, in the order of the page; a face that does not import (an optional
#: extra missing) is listed with the reason.
FACES = ("asyncrl", "asyncrl.collectors", "asyncrl.weights", "asyncrl.metrics",
         "asyncrl.testing", "transports")


def render() -> str:
    out = ["# API reference", "",
           "Generated from the docstrings by `python scripts/gen_api_docs.py`; do not edit by "
           "hand (a test checks that this page is current).", ""]
    seen: set[int] = set()
    for face in FACES:
        try:
            module = importlib.import_module(face)
        except ImportError:
            continue
        names = list(getattr(module, "__all__", []))
        out += [f"## `{face}`", "", _doc(module), ""]
        for name in names:
            obj = getattr(module, name)
            if name.startswith("__"):
                continue
            if id(obj) in seen and inspect.isclass(obj):
                out += [f"### `{face}.{name}`", "", f"The same class as "
                        f"`{obj.__module__.split('._')[0]}.{obj.__qualname__}` above.", ""]
                continue
            seen.add(id(obj))
            out += _entry(f"{face}.{name}", obj)
    return "\n".join(line.rstrip() for line in out).rstrip() + "\n"


def _entry(qualname: str, obj: Any) -> list[str]:
    if inspect.isclass(obj):
        lines = [f"### class `{qualname}{_signature(obj)}`", ""]
        bases = [b.__name__ for b in obj.__bases__ if b is not object]
        if bases:
            lines += [f"Bases: {', '.join(f'`{b}`' for b in bases)}", ""]
        lines += [_doc(obj), ""]
        for name, member in _members(obj):
            kind = "property" if isinstance(member, property) else "method"
            sig = "" if kind == "property" else _signature(member)
            prefix = "async " if inspect.iscoroutinefunction(member) else ""
            lines += [f"#### {kind} `{prefix}{name}{sig}`", "", _doc(member), ""]
        return lines
    if callable(obj):
        prefix = "async " if inspect.iscoroutinefunction(obj) else ""
        return [f"### `{prefix}{qualname}{_signature(obj)}`", "", _doc(obj), ""]
    return [f"### `{qualname}` = `{obj!r}`", ""]


def _members(cls: type) -> list[tuple[str, Any]]:
    """Public methods and properties the class defines or inherits from asyncrl/transports."""
    found = []
    for name in sorted(dir(cls)):
        if name.startswith("_") and name not in ("__aenter__", "__aiter__"):
            continue
        owner = next((k for k in cls.__mro__ if name in vars(k)), None)
        if owner is None or not owner.__module__.startswith(("asyncrl", "transports")):
            continue
        member = vars(owner)[name]
        if isinstance(member, staticmethod | classmethod):
            member = member.__func__
        if isinstance(member, property) or inspect.isfunction(member):
            if _doc(member) or not name.startswith("_"):
                found.append((name, member))
    return found


def _signature(obj: Any) -> str:
    """``(a: int, *, b: str = 'x') -> None`` with annotations as written in the source."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"
    params = []
    star_done = False
    for param in sig.parameters.values():
        if param.kind is param.KEYWORD_ONLY and not star_done:
            params.append("*")
            star_done = True
        if param.kind is param.VAR_POSITIONAL:
            star_done = True
        prefix = {param.VAR_POSITIONAL: "*", param.VAR_KEYWORD: "**"}.get(param.kind, "")
        text = prefix + param.name
        if param.annotation is not param.empty:
            text += f": {_annotation(param.annotation)}"
        if param.default is not param.empty:
            text += f" = {_default(param.default)}"
        params.append(text)
    if params and params[0] in ("self", "cls"):
        params = params[1:]
    result = f"({', '.join(params)})"
    if sig.return_annotation is not sig.empty:
        result += f" -> {_annotation(sig.return_annotation)}"
    return result


def _default(value: Any) -> str:
    # A function's repr holds its address, which changes each run: its name does not.
    if inspect.isfunction(value) or inspect.isbuiltin(value):
        return value.__qualname__
    return repr(value)


def _annotation(annotation: Any) -> str:
    if isinstance(annotation, str):
        return annotation
    return inspect.formatannotation(annotation)


def _doc(obj: Any) -> str:
    doc = inspect.getdoc(obj)
    if not doc:
        return ""
    return "```text\n" + doc + "\n```"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if docs/api.md is stale")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT.relative_to(ROOT)} is out of date: run python scripts/gen_api_docs.py",
                  file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(ROOT)} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
