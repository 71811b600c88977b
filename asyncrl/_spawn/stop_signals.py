"""SIGTERM and SIGINT in a process asyncrl runs: the first one stops it, the next are ignored.

A worker, a worker host and an env worker all stop cleanly on the first SIGTERM
(``docker stop``, systemd, ``kill``) or Ctrl-C. Stopping takes a moment (the
coordinator is told, children are stopped), and a second signal must not kill
the process half-way: systemd and a host forward the same SIGTERM to a whole
process group, so a worker gets it twice.

>>> STOP_SIGNALS
(<Signals.SIGTERM: 15>, <Signals.SIGINT: 2>)
"""

from __future__ import annotations

import signal

import anyio

#: The signals that ask a process to stop.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def wait_stop_signal() -> signal.Signals:
    """Return the first of :data:`STOP_SIGNALS` this process gets (main thread only).

    Until then the default handlers are replaced; on return they are back: call
    :func:`ignore_stop_signals` at once if a second one must not end the process.
    """
    with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
        async for signum in signals:
            return signal.Signals(signum)
    raise RuntimeError("the signal receiver ended before any signal came")


def ignore_stop_signals(*signals: signal.Signals) -> None:
    """Ignore ``signals`` (default: both :data:`STOP_SIGNALS`) from now on: already stopping."""
    for signum in signals or STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


__all__ = ["STOP_SIGNALS", "ignore_stop_signals", "wait_stop_signal"]
