"""A coordinator lost: how the worker ends, or how it waits for one again.

The link's loss of its hub is read first for what the hub said (:func:`hub_lost`):
a finished run's goodbye is exit 0, a revoked or denied key a final refusal. A
worker whose coordinator otherwise went away joins again once one answers, within
a bound, or exits with code 3 naming it. Three cases, three bounds:

- ``--reconnect``, the coordinator went silent or died: any coordinator at the
  address (it, or a restarted one), within ``reconnect_timeout``;
- ``--reconnect``, the trainer said it only stops (its close said the run is not
  finished: SIGTERM, a rollout restart): first its goodbye, then the next trainer,
  within ``give_up_after``;
- no ``--reconnect``, an admitted worker's connection went down (a cut link): the
  *same* coordinator, within ``give_up_after`` (see :func:`ride_out`).
"""

from __future__ import annotations

import logging

import anyio

from transports import Link, PeerLostError

from .._errors import WorkerExit
from .._spawn.exit_codes import EXIT_COORDINATOR_LOST, EXIT_OK, EXIT_REFUSED
from .join import denied, unreachable

log = logging.getLogger("asyncrl.worker")

__all__ = ["await_next_trainer", "hub_lost", "ride_out", "wait_for_coordinator"]


def hub_lost(link: Link, error: PeerLostError, *, welcomed: bool) -> WorkerExit:
    """How a worker ends when ``link`` lost its hub, by what the hub said (or did not)."""
    if link.hub_finished:  # whatever our state: joining, rejoining, admitted
        log.info("the run at %s is over (its trainer closed it): exiting", link.endpoint)
        return WorkerExit(EXIT_OK, "the run is over", final=True)
    if link.key_revoked:  # told so by the hub: a refusal, and final
        return WorkerExit(EXIT_REFUSED, f"the coordinator at {link.endpoint} revoked this "
                          "host's CURVE key (asyncrl keys revoke): it is refused from now on",
                          final=True)
    if (refused := denied(link)) is not None:
        return refused
    if not welcomed:  # maybe never reached
        return WorkerExit(EXIT_COORDINATOR_LOST, unreachable(link))
    return WorkerExit(EXIT_COORDINATOR_LOST,
                      f"the coordinator at {link.endpoint} is gone ({error})")


async def wait_for_coordinator(link: Link, timeout: float) -> None:
    """``--reconnect``: return once a coordinator answers at the link's address.

    Our heartbeats go on; the hub answers with its own once it (or its successor)
    is back.
    """
    with anyio.move_on_after(timeout):
        await link.wait_connected()
        return
    raise WorkerExit(EXIT_COORDINATOR_LOST, f"the coordinator at {link.endpoint} did not come "
                     f"back within {timeout} s")


async def await_next_trainer(link: Link, give_up_after: float) -> None:
    """``--reconnect``, the trainer said it only stops: wait for its successor.

    The stopping trainer's hub says goodbye once its workers acknowledged the close
    (within a second or two; a peer timeout bounds it): until then the link still
    counts it as connected, and a hello would go to a trainer that is closing.
    """
    log.info("the trainer at %s is stopping before the run finished: waiting up to %s s "
             "for the next one", link.endpoint, give_up_after)
    with anyio.move_on_after(2 * link.peer_timeout + 2.0):
        while link.connected:
            try:
                await link.recv()  # what the closing trainer still sends is void
            except PeerLostError:
                break
    with anyio.move_on_after(give_up_after):
        await link.wait_connected()
        log.info("a trainer answers at %s again: joining it", link.endpoint)
        return
    raise WorkerExit(EXIT_COORDINATOR_LOST,
                     f"the trainer at {link.endpoint} stopped before the run finished and no "
                     f"next one answered within --give-up-after {give_up_after} s", final=True)


async def ride_out(link: Link, lost: WorkerExit, *, admitted: bool,
                   give_up_after: float) -> None:
    """Without ``--reconnect``: wait ``give_up_after`` s for the same coordinator.

    A cut link (a switch reboots, a VPN renegotiates) ends a connection the
    coordinator did not close; once it is up again this worker joins again (the
    coordinator welcomes it back, or admits it anew if it had dropped it). A
    coordinator that said goodbye, one that never admitted us, or a restarted one
    (a new instance: that takes ``--reconnect``) ends the worker as before.
    """
    instance = link.hub_instance
    if not admitted or give_up_after <= 0 or link.hub_closed:
        raise lost
    log.warning("%s; waiting up to %s s for it to come back (the link may be cut)",
                lost, give_up_after)
    with anyio.move_on_after(give_up_after):
        await link.wait_connected()
        if link.hub_instance not in (None, instance):
            raise WorkerExit(EXIT_COORDINATOR_LOST, f"the coordinator at {link.endpoint} was "
                             "restarted (a new instance); pass --reconnect to join a restarted "
                             "trainer", final=True)
        log.warning("the coordinator at %s answers again: joining again", link.endpoint)
        return
    raise WorkerExit(EXIT_COORDINATOR_LOST,
                     f"the coordinator at {link.endpoint} did not come back within "
                     f"{give_up_after} s ({lost})", final=True)
