"""What the torch-free fork server imports last: the envs' modules, then it freezes.

The env workers of central inference are forked from a fork server of their own
(:mod:`.torch_free`). Whatever it imports before it forks, its children share
copy-on-write; whatever they import after, each holds a copy of its own. So it also
imports the modules the envs are named from (an import path's module, a gymnasium
id's entry point: ``ale_py.env`` for ``"ALE/Breakout-v5"``), listed in
``ASYNCRL_TORCH_FREE_PRELOAD`` when it starts (after the fork server's other preloads:
this module is the last of them, and nothing else imports it), and then freezes what it holds for
the garbage collector (:func:`gc.freeze`): a child's collection would otherwise
write to every object's header, copying the pages they share one by one (the same
as the torch fork server, :mod:`.early`). A module that fails to import is left to
the env worker, which reports the error as its own.

Imported anywhere else (``tests/test_layout.py`` imports every module) it does nothing.
"""

from __future__ import annotations

import gc
import importlib
import logging
import os

from .early import in_fork_server
from .torch_free import PRELOAD_VARIABLE, VARIABLE

log = logging.getLogger("asyncrl.collectors")


def preload() -> None:
    """Import the listed modules (each failure left to the children), then freeze."""
    for name in filter(None, os.environ.get(PRELOAD_VARIABLE, "").split(",")):
        try:
            importlib.import_module(name)
        except (Exception, SystemExit) as exc:  # the env worker imports it again, says why
            log.debug("the torch-free fork server did not preload %s: %r", name, exc)
    gc.collect()
    gc.freeze()


if os.environ.get(VARIABLE) == "1" and in_fork_server():
    preload()
