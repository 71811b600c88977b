"""Model ids are attribute paths resolved on the worker: ``"env.transform[0]"``."""

from __future__ import annotations

import re
from typing import Any

from ._errors import ModelPathError

__all__ = ["parse_model_path", "resolve_model_path"]

_TOKEN = re.compile(
    r"""\.?(?P<attr>[A-Za-z_][A-Za-z0-9_]*)      # .name (the dot is optional at the start)
      | \[(?P<index>-?\d+)\]                      # [3]
      | \[(?P<quote>['"])(?P<key>[^'"\]]*)(?P=quote)\]   # ["key"]
    """,
    re.VERBOSE,
)


def parse_model_path(path: str) -> list[str | int]:
    """Split ``"critic.module[1]"`` into ``["critic", "module", 1]``.

    ``[n]`` is an index, ``["key"]`` a mapping key, a dotted name an attribute.

    >>> parse_model_path('env.transform[0]')
    ['env', 'transform', 0]
    """
    steps: list[str | int] = []
    pos = 0
    while pos < len(path):
        match = _TOKEN.match(path, pos)
        if match is None or (match.group("attr") and pos == 0 and path.startswith(".")):
            raise ModelPathError(
                f"cannot parse model id {path!r} at character {pos}: expected attribute "
                "names separated by dots and [int] or ['key'] subscripts, "
                "e.g. 'policy' or 'env.transform[0]'"
            )
        if match.group("attr") is not None:
            if pos and not path.startswith(".", pos):
                raise ModelPathError(f"model id {path!r}: missing '.' before {match.group()!r}")
            steps.append(match.group("attr"))
        elif match.group("index") is not None:
            steps.append(int(match.group("index")))
        else:
            steps.append("\0" + match.group("key"))  # marks a mapping key, not an attribute
        pos = match.end()
    if not steps:
        raise ModelPathError("model id is empty; use e.g. 'policy'")
    return steps


def resolve_model_path(root: Any, path: str) -> Any:
    """Follow ``path`` from ``root``: ``resolve_model_path(worker, "env.transform[0]")``.

    >>> class Box: pass
    >>> box = Box(); box.layers = [Box(), "second"]
    >>> resolve_model_path(box, "layers[1]")
    'second'
    """
    obj = root
    walked = ""
    for step in parse_model_path(path):
        try:
            if isinstance(step, int):
                obj = obj[step]
                walked += f"[{step}]"
            elif step.startswith("\0"):
                obj = obj[step[1:]]
                walked += f"[{step[1:]!r}]"
            else:
                obj = getattr(obj, step)
                walked += f".{step}" if walked else step
        except (AttributeError, IndexError, KeyError, TypeError) as exc:
            where = walked or "the root"
            raise ModelPathError(
                f"model id {path!r} does not resolve: {where!s} "
                f"({type(obj).__name__}) has no {_describe(step)} ({type(exc).__name__}: {exc})"
            ) from None
    return obj


def _describe(step: str | int) -> str:
    if isinstance(step, int):
        return f"item [{step}]"
    if step.startswith("\0"):
        return f"key {step[1:]!r}"
    return f"attribute {step!r}"
