"""``asyncrl worker`` whose host relay takes a while to open: for signal tests.

``python -m tests.asyncrl.worker.slow_relay worker --workers 2 ...`` runs the real
command line, with :class:`~asyncrl._worker.relay.HostRelay`'s opening made to write the
file named by ``ASYNCRL_TEST_OPENING`` and then wait 10 s first (a relay reaching a
trainer that is slow to answer its connection): a window where the host runs and has
started no worker yet.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio

from asyncrl._worker.relay import HostRelay

_open = HostRelay._open  # noqa: SLF001 -- the one step this helper slows down


async def _slow_open(self: HostRelay) -> None:
    # Written at once, on purpose: the test reads it as "the relay is opening now".
    Path(os.environ["ASYNCRL_TEST_OPENING"]).write_text(str(os.getpid()))  # noqa: ASYNC240
    await anyio.sleep(10)  # long: a loaded machine may be slow to send the signal
    await _open(self)


HostRelay._open = _slow_open  # type: ignore[method-assign]  # noqa: SLF001

if __name__ == "__main__":
    from asyncrl.cli import main

    sys.exit(main(sys.argv[1:]))
