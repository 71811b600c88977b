"""Asking again when the run is full: the pauses a worker and a host's relay share.

A hello refused *only* because the run has no free place (``Refuse.full``) is
asked again after :data:`JOIN_BACKOFF` seconds, doubling up to
:data:`JOIN_BACKOFF_MAX`, each pause stretched by up to a quarter at random so
that hosts refused together do not all ask again at once. Any other refusal
(keys, specs, protocol) is final.
"""

from __future__ import annotations

import random

#: The first pause after a "full" refusal, in seconds; it doubles up to the max.
JOIN_BACKOFF = 0.5
JOIN_BACKOFF_MAX = 8.0


class RunFull(Exception):
    """The coordinator refused us only because it has no free place: ask again later."""


def full_pause(backoff: float) -> tuple[float, float]:
    """``(pause, next backoff)``: how long to wait now (jittered), and the next step.

    >>> pause, after = full_pause(0.5)
    >>> 0.5 <= pause <= 0.625, after
    (True, 1.0)
    """
    return backoff * (1 + random.random() / 4), min(2 * backoff, JOIN_BACKOFF_MAX)


__all__ = ["JOIN_BACKOFF", "JOIN_BACKOFF_MAX", "RunFull", "full_pause"]
