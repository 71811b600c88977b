"""Who may stop the run with an error report: an admitted worker, or a local one that proves it.

Anyone can connect to a listening port and send an ``error`` message. A report
counts only from a live, admitted worker, or from a local worker that failed
before it could join (its env did not build), which proves it was spawned
here with the spawn token only the trainer and its children know.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable

from .._protocol import ErrorReport
from .records import WorkerInfo


def reporter(report: ErrorReport, sender: WorkerInfo | None, workers: Iterable[WorkerInfo],
             token: str) -> tuple[WorkerInfo | None, str] | None:
    """The worker a report speaks for and its name in messages; None: a stranger's report.

    ``sender``: the worker admitted as the report's peer, if any; ``token``: this
    run's spawn token ("" without local workers).
    """
    if sender is not None and sender.alive:
        return sender, f"{sender.index} ({sender.name})"
    if spawned_here(report, workers, token):
        return None, f"{report.slot} (failed before joining)"
    return None


def spawned_here(report: ErrorReport, workers: Iterable[WorkerInfo], token: str) -> bool:
    """A local worker's report sent before it was admitted (its env failed to build)."""
    if report.slot < 0 or not token or not report.token:
        return False
    if any(w.index == report.slot and w.alive for w in workers):
        return False  # that slot's worker is live and speaks for itself
    return secrets.compare_digest(report.token.encode(), token.encode())


__all__ = ["reporter", "spawned_here"]
