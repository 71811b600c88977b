"""Logging across processes: a worker logs the way its trainer does.

A spawned or forked worker starts with a fresh ``logging`` setup. The trainer
(a script, a service under uvicorn) has its own: the level of the ``asyncrl``
logger and the format of the root logger's first handler. :func:`capture`
reads them when a collector opens; :func:`apply` sets them up in the worker.
Only plain strings and an int cross the process boundary (a formatter object
may not pickle). The library itself never configures logging in the trainer:
``asyncrl`` and ``transports`` carry a ``NullHandler`` (see the package faces).
"""

from __future__ import annotations

import logging
from typing import Any

#: What a worker uses when its trainer configured nothing (Python's own default:
#: warnings and errors on stderr), with the worker's pid to tell the lines apart.
DEFAULT_FORMAT = "worker %(process)d: %(levelname)s %(name)s: %(message)s"

#: The names ``--log-level`` takes.
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def capture() -> dict[str, Any]:
    """The trainer's logging as plain values: levels (``asyncrl``'s, root's) and format."""
    level = logging.getLogger("asyncrl").getEffectiveLevel()
    config: dict[str, Any] = {"level": level, "root_level": logging.getLogger().level,
                              "format": DEFAULT_FORMAT, "datefmt": None, "style": "%"}
    for handler in logging.getLogger().handlers:
        formatter = handler.formatter
        style = getattr(formatter, "_style", None)
        fmt = getattr(style, "_fmt", None)
        if isinstance(fmt, str):
            config["format"] = fmt
            config["datefmt"] = getattr(formatter, "datefmt", None)
            config["style"] = {"StrFormatStyle": "{", "StringTemplateStyle": "$"}.get(
                type(style).__name__, "%")
        break
    return config


def apply(config: dict[str, Any] | None) -> None:
    """Set up a worker process's logging from :func:`capture`'s values (None: defaults)."""
    config = config or {}
    level = config.get("level", logging.WARNING)
    logging.basicConfig(level=level, format=config.get("format") or DEFAULT_FORMAT,
                        datefmt=config.get("datefmt"), style=config.get("style", "%"),
                        force=True)
    # Third-party libraries in the worker (torch, gymnasium) log as the trainer's root.
    logging.getLogger().setLevel(config.get("root_level", logging.WARNING))
    for name in ("asyncrl", "transports"):
        logging.getLogger(name).setLevel(level)


def add_file(path: str) -> logging.FileHandler:
    """Also log to ``path`` (appended; ``asyncrl worker --log-file``), in the root's format.

    The host and each of its worker processes append whole lines to the same file.
    """
    handler = logging.FileHandler(path, mode="a", encoding="utf-8")
    root = logging.getLogger()
    if root.handlers and root.handlers[0].formatter is not None:
        handler.setFormatter(root.handlers[0].formatter)
    root.addHandler(handler)
    return handler


def parse_level(name: str) -> int:
    """``"info"`` -> ``logging.INFO``; a clear ``ValueError`` for anything else."""
    value = logging.getLevelName(name.upper())
    if not isinstance(value, int) or name.upper() not in LEVELS:
        raise ValueError(f"unknown log level {name!r}; expected one of {', '.join(LEVELS)}")
    return value


__all__ = ["DEFAULT_FORMAT", "LEVELS", "add_file", "apply", "capture", "parse_level"]
