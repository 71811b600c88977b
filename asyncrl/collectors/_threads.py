"""The trainer's torch threads while local workers share its cores (TorchRL's ``num_threads``)."""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("asyncrl.collectors")


class TrainerThreads:
    """Caps ``torch``'s intra-op threads in the trainer's process; ``restore()`` undoes it.

    Without a cap, a trainer running torch on every core and N local workers on
    the same cores oversubscribe them: OpenMP threads spin while waiting, and a
    policy forward or an optimiser step takes many times longer.

    >>> cap = TrainerThreads.cap(None, local_workers=2)   # doctest: +SKIP
    >>> cap.restore()                                      # doctest: +SKIP
    """

    def __init__(self, before: int, now: int) -> None:
        self.before = before
        self.now = now
        self._restored = False

    @classmethod
    def cap(cls, num_threads: int | None, local_workers: int) -> TrainerThreads:
        """Set ``num_threads`` (None: current threads minus ``local_workers``, at least 1)."""
        before = torch.get_num_threads()
        now = max(1, before - local_workers) if num_threads is None else num_threads
        if now != before:
            torch.set_num_threads(now)
            log.debug("trainer torch threads: %d -> %d (%d local workers)",
                      before, now, local_workers)
        return cls(before, now)

    def restore(self) -> None:
        """Put back the count from before ``cap``, unless someone changed it since (idempotent)."""
        if self._restored:
            return
        self._restored = True
        if torch.get_num_threads() == self.now and self.now != self.before:
            torch.set_num_threads(self.before)


__all__ = ["TrainerThreads"]
