"""The user's ``__main__`` as worker processes see it: a file they can run again, or not.

multiprocessing gives each child it starts (and the fork server, which preloads
it) the parent's main module again, by running ``__main__.__file__`` (or by
importing ``__main__.__spec__.name`` under ``python -m``). A script read from
stdin (``python - <<EOF``: ``__file__`` is ``'<stdin>'``) has a ``__file__``
that names no file: the fork server and every child would fail on
FileNotFoundError before running a line of ours, and the collector could only
report a worker that exited with code 1. Such a script is treated like one of
``python -c`` (no ``__file__``): children start without it. What must travel
to them then (an env factory, a policy class) cannot come from it, which the
collector's constructor checks (``check_picklable``) and says.

A script without an ``if __name__ == "__main__":`` guard is treated the same way:
run again in the fork server (at ``import asyncrl``) or in each worker, its whole
program would run again there (twice the training, twice the benchmark).
"""

from __future__ import annotations

import ast
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import process

__all__ = ["has_main_guard", "main_unavailable", "without_unavailable_main"]


def main_unavailable() -> str | None:
    """Why child processes cannot run ``__main__`` again, or None when they can.

    ``"an interactive session (__main__ has no file)"`` (a REPL, a notebook,
    ``python -c``) or ``"a script read from stdin (`python -`), ..."``.
    """
    main = sys.modules.get("__main__")
    if main is None or getattr(getattr(main, "__spec__", None), "name", None):
        return None  # ``python -m pkg.mod``: children import it by name
    path = getattr(main, "__file__", None)
    if path is None:
        return "an interactive session (__main__ has no file)"
    original_dir = getattr(process, "ORIGINAL_DIR", None)  # where the parent started
    if not os.path.isabs(path) and original_dir is not None:
        path = os.path.join(original_dir, path)  # as multiprocessing resolves it
    if os.path.isfile(path):
        if has_main_guard(path):
            return None
        return (f"a script without an `if __name__ == \"__main__\":` guard ({main.__file__!r}): "
                "worker processes would run all of it again, so they start without it (put "
                "what runs at its top level under the guard)")
    where = "stdin (`python -`)" if main.__file__ == "<stdin>" else repr(main.__file__)
    return (f"a script read from {where}, not from a file that worker processes can run "
            "again (save it to a file and run that)")


def has_main_guard(path: str) -> bool:
    """Whether the script at ``path`` has an ``if __name__ == "__main__":`` at its top level.

    Without one, running it again in a child (as multiprocessing does, as the fork server
    would) runs the whole program again: the trainer, its collector, a second copy of any
    benchmark. A file that cannot be read or parsed counts as guarded (as before).

    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
    ...     _ = f.write("x = 1\nif __name__ == '__main__':\n    print(x)\n")
    >>> has_main_guard(f.name)
    True
    """
    try:
        stat = os.stat(path)
        key = (path, stat.st_mtime_ns, stat.st_size)
        if key not in _guards:
            with open(path, "rb") as f:
                tree = ast.parse(f.read(), path)
            _guards[key] = any(isinstance(node, ast.If) and _is_main_test(node.test)
                               for node in tree.body)
        return _guards[key]
    except (OSError, SyntaxError, ValueError):
        return True


_guards: dict[tuple[str, int, int], bool] = {}


def _is_main_test(test: ast.expr) -> bool:
    # `__name__ == "__main__"` either way round, alone or within `and` / `or`.
    for node in ast.walk(test):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(
                node.ops[0], ast.Eq):
            sides = [node.left, *node.comparators]
            if (any(isinstance(x, ast.Name) and x.id == "__name__" for x in sides)
                    and any(isinstance(x, ast.Constant) and x.value == "__main__"
                            for x in sides)):
                return True
    return False


class _HiddenMainFile:
    """Hides ``__main__.__file__`` while any thread starts a process; restores it after."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._saved: str | None = None

    @contextmanager
    def __call__(self) -> Iterator[None]:
        main = sys.modules.get("__main__")
        with self._lock:
            # Once hidden, every thread that starts a process counts until it started.
            hide = main is not None and (self._users > 0 or (
                hasattr(main, "__file__") and main_unavailable() is not None))
            if hide:
                if self._users == 0:
                    self._saved = main.__dict__.pop("__file__")
                self._users += 1
        try:
            yield
        finally:
            if hide:
                with self._lock:
                    self._users -= 1
                    if self._users == 0:
                        main.__file__ = self._saved  # type: ignore[union-attr]
                        self._saved = None


#: ``with without_unavailable_main(): process.start()``: a main module that no child can
#: run again (a script read from stdin) is left out of what the child is given, as
#: ``python -c``'s is. Threads may start processes at once (counted).
without_unavailable_main = _HiddenMainFile()
