"""Why a worker's join got no answer, said the way an operator can act on it.

A hello can go unanswered because nothing listens there (a wrong address, a
firewall), because something else listens (another service, a blocked trainer),
or because the trainer's CURVE authentication denied this host's key at the
handshake, which ZeroMQ shows the client only as a monitor event
(``Link.key_denied``). The last is final: asking again cannot help.
"""

from __future__ import annotations

import logging

import anyio

from transports import Link, PeerLostError

from .._errors import WorkerExit
from .._spawn.exit_codes import EXIT_COORDINATOR_LOST, EXIT_OK, EXIT_REFUSED

log = logging.getLogger("asyncrl.worker")


def denied(link: Link) -> WorkerExit | None:
    """The refusal to exit with when the hub denied ``link``'s CURVE key, else None."""
    if not link.key_denied:
        return None
    return WorkerExit(EXIT_REFUSED, f"refused: the coordinator at {link.endpoint} denied this "
                      "host's CURVE key at the handshake (revoked with `asyncrl keys revoke`, "
                      "or not among its authorized keys): authorize a key with `asyncrl keys "
                      "add-host` and give it to this host", final=True)


async def cancel_when_denied(link: Link, scope: anyio.CancelScope) -> None:
    """Cancel ``scope`` once the hub denied ``link``'s key (a blocked send never returns)."""
    while True:  # the link reads its monitor every heartbeat: no event to wait on
        if link.key_denied:
            scope.cancel()
            return
        await anyio.sleep(link.heartbeat_interval)


def unreachable(link: Link) -> str:
    """Nothing answered at all within ``peer_timeout``."""
    return (f"no coordinator answered at {link.endpoint} within {link.peer_timeout} s: check "
            "the address and port, that the trainer is running with MultiCollector(listen=...) "
            "there, that no firewall is in the way, and (with --keys) that this host's key is "
            "authorized")


def no_welcome(link: Link, join_timeout: float | None) -> str:
    """Something answered the connection but never welcomed the worker."""
    return (f"no welcome from {link.endpoint} within --join-timeout {join_timeout} s: "
            "something there accepts connections but does not answer as an asyncrl collector "
            "(a different service on that port, or a trainer whose event loop is blocked)")


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


__all__ = ["cancel_when_denied", "denied", "hub_lost", "no_welcome", "unreachable"]
