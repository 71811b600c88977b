"""The process's open-files limit: a listening hub holds one descriptor per connection.

A socket that listens on a network accepts every tcp connection that comes, and
holds a descriptor for each until its handshake ends or fails. At the common
soft limit of 1,024 open files, a thousand connections that never finish their
greeting (a flood, a port scanner, a misconfigured client) leave no descriptor
for the real peers: ZeroMQ cannot accept them. The hard limit is usually far
higher (often 2^20 on Linux), and raising the soft limit up to it needs no
privilege, so a hub does it once for the process when it binds, as the Go
runtime and the JVM do at start. Children started afterwards inherit it.

Code that still uses ``select.select()`` cannot watch a descriptor numbered
1,024 or more; nothing of ours does (ZeroMQ, anyio, multiprocessing poll).
"""

from __future__ import annotations

import logging
import threading

try:
    import resource
except ImportError:  # not on POSIX: nothing to raise
    resource = None  # type: ignore[assignment]

log = logging.getLogger("transports")

_lock = threading.Lock()
_done = False


def raise_open_files_limit() -> tuple[int, int] | None:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit, once per process.

    Returns ``(soft before, soft now)`` the first time (logged at INFO if it
    changed, at DEBUG if it could not), None on later calls and where there is
    no such limit.
    """
    global _done
    with _lock:
        if _done or resource is None:
            return None
        _done = True
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:  # macOS: the kernel refuses "unlimited"
        target = max(soft, 1 << 16) if soft != resource.RLIM_INFINITY else soft
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        log.debug("could not raise the open-files soft limit from %d to %d: %s",
                  soft, target, exc)
        return soft, soft
    log.info("raised this process's open-files soft limit from %d to its hard limit %d "
             "(a listening hub holds a descriptor for each connection)", soft, target)
    return soft, target


__all__ = ["raise_open_files_limit"]
