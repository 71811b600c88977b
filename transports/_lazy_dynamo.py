"""Import tensordict without loading ``torch._dynamo``: 1-2 s and ~70 MB less per process.

tensordict (0.10-0.14) marks a few of its functions for Dynamo at import time, with
``torch.compiler.allow_in_graph`` and ``torch.compiler.assume_constant_result``. Each
of these imports ``torch._dynamo``, and with it sympy and the FX symbolic-shape
machinery: on a 2-core machine that was 1.1-1.9 s of a 3.5-4 s import and ~70 MB of
RSS, in the trainer and (copy-on-write) in every worker, for a compiler a collector
never calls. Neither mark has any effect until Dynamo traces, and Dynamo cannot trace
before ``torch._dynamo`` is imported (``torch.compile`` imports it first). So while
tensordict imports, the two functions *record* what they are given, and the records
are applied the moment ``torch._dynamo`` finishes importing: with the same calls, in
the same order, before any trace can start.

Importing this module does it (``transports/__init__.py`` imports it first). Nothing
changes when tensordict or ``torch._dynamo`` was imported already (the marks were made
the usual way), nor with ``ASYNCRL_DEFER_DYNAMO=0`` in the environment.

>>> import sys, transports
>>> "tensordict" in sys.modules
True
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__all__ = ["import_tensordict", "pending_marks"]

log = logging.getLogger("transports.lazy_dynamo")

#: The ``torch.compiler`` functions that import ``torch._dynamo`` when tensordict calls them.
_MARKS = ("allow_in_graph", "assume_constant_result")
_DYNAMO = "torch._dynamo"

_pending: list[tuple[str, Any]] = []
_lock = threading.Lock()


def pending_marks() -> list[tuple[str, Any]]:
    """The marks recorded and not applied yet: ``(function name, what it was given)``."""
    with _lock:
        return list(_pending)


def import_tensordict() -> None:
    """``import tensordict`` (and ``tensordict.nn``), deferring its Dynamo marks if it can."""
    if (os.environ.get("ASYNCRL_DEFER_DYNAMO", "1") == "0" or "tensordict" in sys.modules
            or _DYNAMO in sys.modules):
        import tensordict.nn
        return
    import torch.compiler as compiler

    originals = {name: getattr(compiler, name) for name in _MARKS}
    finder = _ApplyWhenDynamoLoads()
    sys.meta_path.insert(0, finder)
    for name in _MARKS:
        setattr(compiler, name, _recorder(name))
    try:
        import tensordict.nn  # noqa: F401
    finally:
        for name, original in originals.items():
            setattr(compiler, name, original)
    if _DYNAMO in sys.modules:  # something imported it anyway: nothing left to wait for
        _remove(finder)
        _apply()


def _recorder(name: str) -> Callable[[Any], Any]:
    def record(fn: Any) -> Any:
        # Both return what they are given (torch/_dynamo/decorators.py), so the caller
        # keeps the very object the real call would have returned.
        with _lock:
            _pending.append((name, fn))
        return fn

    return record


def _apply() -> None:
    """Make every recorded mark for real, in order (``torch._dynamo`` is imported now)."""
    import torch.compiler as compiler

    with _lock:
        marks, _pending[:] = list(_pending), []
    for name, fn in marks:
        try:
            getattr(compiler, name)(fn)
        except Exception:  # a mark Dynamo refuses must not break the user's import
            log.warning("tensordict's %s(%r) could not be applied after torch._dynamo loaded",
                        name, fn, exc_info=True)


def _remove(finder: importlib.abc.MetaPathFinder) -> None:
    try:
        sys.meta_path.remove(finder)
    except ValueError:
        pass


class _ApplyWhenDynamoLoads(importlib.abc.MetaPathFinder):
    """Finds ``torch._dynamo`` the usual way, and runs :func:`_apply` once it executed."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != _DYNAMO:
            return None
        _remove(self)  # one shot, and no recursion through the finders below
        spec: importlib.machinery.ModuleSpec | None = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        if spec is None or spec.loader is None:
            return spec
        loader: Any = spec.loader
        execute = loader.exec_module

        def exec_then_apply(module: ModuleType) -> None:
            execute(module)
            _apply()

        loader.exec_module = exec_then_apply  # this spec's own loader object
        return spec


import_tensordict()
