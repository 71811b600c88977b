"""Remember, in an asyncrl worker process, that pandas is not installed.

tensordict's ``TensorDict.from_any`` asks ``importlib.util.find_spec("pandas")``
for every tensor a ``TensorDictModule`` writes (tensordict 0.14; twice per step
for a ``ProbabilisticActor``). Without pandas installed that is a scan of every
``sys.path`` entry each time: ~30 us per call here, ~14% of the ported PPO
script's collection under the profiler (benchmarks/LOG.md). With
``sys.modules["pandas"] = None``, ``find_spec`` answers None at once, as the scan
would, and ``import pandas`` still raises ``ModuleNotFoundError``.

Only in worker processes asyncrl starts (their whole life is the rollout), and
only when pandas is absent; never in the user's own process.
"""

from __future__ import annotations

import importlib.util
import sys

__all__ = ["PROBED_MODULES", "remember_absent_modules"]

#: Modules that libraries on the rollout path probe for at every step.
PROBED_MODULES = ("pandas",)


def remember_absent_modules(names: tuple[str, ...] = PROBED_MODULES) -> list[str]:
    """Mark the modules of ``names`` that are not installed as absent; return those marked.

    >>> import sys
    >>> remember_absent_modules(("surely_not_installed_xyz",))
    ['surely_not_installed_xyz']
    >>> importlib.util.find_spec("surely_not_installed_xyz") is None
    True
    >>> del sys.modules["surely_not_installed_xyz"]
    """
    marked = []
    for name in names:
        if name in sys.modules:  # imported already, or marked: nothing to do
            continue
        if importlib.util.find_spec(name) is None:
            sys.modules[name] = None  # type: ignore[assignment]
            marked.append(name)
    return marked
