"""A worker's side of its host's relay: attach to it, then take the weights it forwards.

Only weights come this way (see :mod:`asyncrl._worker.relay`); the worker hands them
to its :class:`~asyncrl.weights.WeightApplier` by the ``RELAY`` route, so their
acks go back to the relay, which acks upstream for all its members.
"""

from __future__ import annotations

import logging

import anyio

from transports import Link, PeerLostError

from .._protocol import WEIGHTS_KIND
from ..weights import AckRoute, WeightApplier
from .relay import ATTACHED_KIND

log = logging.getLogger("asyncrl.worker")


class RelayMembership:
    """The worker's link to its host's relay (``link`` None: no relay, weights come direct)."""

    def __init__(self, link: Link | None, name: str, weights: WeightApplier) -> None:
        self.link = link
        self.name = name  # the relay's identity on the coordinator's hub
        self.attached = False
        self._weights = weights

    @property
    def hello_name(self) -> str:
        """The relay to name in the hello: the coordinator sends our weights there."""
        return self.name if self.attached else ""

    async def attach(self, timeout: float = 10.0) -> None:
        """Wait until the relay knows us, so weights it forwards can reach us."""
        if self.link is None or self.attached:
            return
        with anyio.move_on_after(timeout):
            while True:
                try:
                    message = await self.link.recv()
                except PeerLostError:
                    break
                if message.kind == ATTACHED_KIND:
                    self.attached = True
                    return
        log.warning("the relay at %s did not answer within %s s: weights come directly",
                    self.link.endpoint, timeout)

    async def receive_weights(self) -> None:
        """Hand what the relay forwards to the applier; runs until cancelled."""
        if self.link is None or not self.attached:
            await anyio.sleep_forever()
        assert self.link is not None
        while True:
            try:
                message = await self.link.recv()
            except PeerLostError:
                # The coordinator notices too and sends to us directly until it is back.
                log.warning("the host's relay at %s went silent", self.link.endpoint)
                await self.link.wait_connected()
                continue
            if message.kind == WEIGHTS_KIND:
                self._weights.deliver(message, AckRoute.RELAY)
            elif message.kind != ATTACHED_KIND:
                log.warning("ignored a %r message from the relay", message.kind)
