"""Doorbells between local env workers and the inference loop: eventfds and spin-then-block.

A local request and its answer need no message: the observations and the
outputs already live in shared memory, and each block's slot carries a sequence
number (:class:`transports.SharedTensorBlock`'s seqlock) that moves by two per
write. So a request is "my observation block's sequence number moved", an
answer "my output block's sequence number moved", and all that is left is to
wake whoever waits, which an eventfd does for the price of one system call:

* one **request bell** shared by every local env worker: a worker rings it after
  writing its observations; the inference thread wakes and scans the workers'
  sequence numbers (dynamic batching: every request that is ready);
* one **answer bell** per env worker: the inference thread rings it after
  writing that worker's outputs.

A waiter first spins for a few microseconds on the sequence number (an answer
that comes within the spin costs no system call and no sleep), then blocks on
its eventfd, with the GIL released. The sequence number is the truth and the
bell only a hint: a ring that comes while nobody sleeps (its count stays in the
eventfd) makes one later wait return at once, which rechecks the number and
blocks again. So no ring can be lost and no ordering between the number and the
bell is needed.

Two scheduling rules keep a machine with fewer cores than waiters from
serializing on the bells (measured in benchmarks/LOG.md, "Central inference on
a full machine"): waiters spin only while every one of them can own a core
(:func:`spin_for`), and an env worker's stepping thread asks the kernel not to
preempt whoever rings it (:func:`no_wakeup_preemption`), so the loop rings
every worker it answered before the first of them runs.

An :class:`EventFd` pickles only on its way to a child process started by
multiprocessing (the fd travels with the process: SCM_RIGHTS to the fork
server, or the spawned child's inherited fds), never over a network.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable
from multiprocessing import reduction
from typing import Any

__all__ = ["DEFAULT_SPIN", "EventFd", "no_wakeup_preemption", "spin_for", "spin_then_block"]

#: Seconds a waiter spins on a sequence number before it sleeps on its eventfd.
#: Long enough to catch an answer computed while it spins on another core, short
#: enough not to steal a busy machine's CPU from the process it waits for.
DEFAULT_SPIN = 20e-6


def usable_cores() -> int:
    """CPUs this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def spin_for(waiters: int, cores: int | None = None) -> float:
    """How long ``waiters`` threads that wait on each other should spin: DEFAULT_SPIN or 0.

    A spinner only catches an answer computed meanwhile on *another* core; when
    the waiters (local env workers and the loop) outnumber the cores, it steals
    the CPU the answer needs instead (4 env workers on 2 cores: 5-10 % fewer
    frames/s with the spin). So spin only while every waiter can own a core.

    >>> spin_for(3, cores=16) == DEFAULT_SPIN, spin_for(5, cores=2)
    (True, 0.0)
    """
    return DEFAULT_SPIN if waiters <= (usable_cores() if cores is None else cores) else 0.0


def no_wakeup_preemption() -> bool:
    """Make the calling thread SCHED_BATCH: woken, it waits for the waker's slice (Linux).

    For an env worker's stepping thread: woken by the loop's answer bell on a busy
    core it would otherwise preempt the loop at once, mid-way through ringing the
    other workers it answered, and each ring would then cost the loop a whole
    step of that worker. Its share of the CPU is unchanged (same nice level).
    Returns False where the platform has no SCHED_BATCH (nothing changed).
    """
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None:
        return False
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))
    except OSError:  # a seccomp profile or container that forbids it: keep the default
        return False
    return True


class EventFd:
    """A Linux eventfd: ``ring()`` from any process that holds it, ``wait()`` to sleep until rung.

    >>> bell = EventFd()
    >>> bell.ring(); bell.wait(timeout=0)
    True
    >>> bell.wait(timeout=0)
    False
    >>> bell.close()
    """

    def __init__(self, fd: int | None = None) -> None:
        self.fd = os.eventfd(0, os.EFD_CLOEXEC) if fd is None else fd
        self._poll = select.poll()
        self._poll.register(self.fd, select.POLLIN)

    def ring(self) -> None:
        """Wake a waiter (or the next one to wait). Never blocks."""
        os.eventfd_write(self.fd, 1)

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep until rung (True: the count is reset), or ``timeout`` seconds passed (False)."""
        if timeout is not None and not self._poll.poll(max(0, int(timeout * 1000 + 0.999))):
            return False
        os.eventfd_read(self.fd)  # readable (or no timeout): returns once rung, GIL released
        return True

    def close(self) -> None:
        """Close this process's copy of the fd (idempotent)."""
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __reduce__(self) -> Any:
        # Only while multiprocessing starts a child: DupFd hands the fd to the child.
        return _rebuild, (reduction.DupFd(self.fd),)

    def __repr__(self) -> str:
        return f"EventFd({self.fd})"


def _rebuild(dup: Any) -> EventFd:
    return EventFd(dup.detach())


def spin_then_block(ready: Callable[[], bool], bell: EventFd, *, spin: float,
                    stopped: Callable[[], bool], deadline: float | None = None) -> bool:
    """Return True once ``ready()``; False when ``stopped()`` or past ``deadline``.

    Spins on ``ready()`` for ``spin`` seconds, then sleeps on ``bell`` (whoever
    makes ``ready()`` true, or stops the wait, rings it afterwards).
    """
    if ready():
        return True
    if spin > 0:
        clock = time.perf_counter
        end = clock() + spin
        while clock() < end:
            if ready():
                return True
    while True:
        if stopped():
            return False
        if deadline is None:
            bell.wait()
        else:
            left = deadline - time.monotonic()
            if left <= 0:
                return ready()
            bell.wait(left)
        if ready():
            return True
