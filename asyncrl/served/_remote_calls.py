"""The trainer's end of remote workers' calls: checked, batched with the local ones, answered.

A remote worker's env sends a :class:`~asyncrl._protocol.ServedCall` on the link it
was admitted on; the coordinator hands it here with the live admitted worker that
sent it (``Coordinator.services``), or None: a stranger, or a worker lost meanwhile,
is refused (a ``ProtocolError``, logged rate-limited, listed in :attr:`RemoteCalls.
refusals`, and answered with the reason). An admitted worker's call is decoded
against the module's own layout (every input's dtype and shape, exactly) before
anything reaches the module, then made through one of the module's client slots,
claimed here in the trainer's process (:meth:`~._client.ServedModuleClient.
call_async`): the inference loop batches it with every local env's call waiting at
the same moment, and it is bounded by ``call_timeout`` like theirs. The answer (the
output and the version that computed it, or why there is none) goes back to the
worker; a worker gone meanwhile gets nothing, and its slot serves the next call.

Calls waiting here are bounded too: at most ``clients`` (the module's slots) are
queued; past that a call is answered "busy" at once.

Every refusal is counted by reason (:data:`REASONS`: ``"not admitted"``,
``"malformed"``, ``"unknown module"``, ``"busy"``) in :class:`Refusals`, which the
collector reads into ``statistics().served_refusals``; the first refusal of each reason
from each peer is also a ``"refused"`` event of ``collector.events()`` (a flood of one
peer's calls is counted, not published call by call).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from transports import Message, ProtocolError, RateLimitedLog, peer_name, printable

from .._observe.events import CollectorEvent
from .._observe.statistics import SERVED_REFUSAL_REASONS, ServedRefusalReason
from .._protocol import ServedAnswer, ServedCall, ServedRoute, decode
from ._client import ServedModuleClient
from ._errors import ServedModuleError, ServedModuleTimeout
from ._module import ServedModule

__all__ = ["REASONS", "Refusals", "RemoteCalls", "ServedCallRouter", "open_module_calls",
           "route_of"]

log = logging.getLogger("asyncrl.served")

#: Most refusals kept (a stranger may try again and again).
_MAX_REFUSALS = 100

Send = Callable[[bytes, Any, str], Awaitable[None]]
Reason = ServedRefusalReason
#: Why a remote call was refused: the keys of ``statistics().served_refusals`` (declared
#: with the statistics, which ``asyncrl.metrics`` exports by reason).
REASONS: tuple[Reason, ...] = SERVED_REFUSAL_REASONS
#: Peers whose first refusal of a reason was published (then counted only).
_MAX_PUBLISHED = 1024


class Refusals:
    """The refused remote calls of a run, counted by reason (every module's together);
    ``publish``: the collector's events (the first refusal of each reason per peer).

    >>> refusals = Refusals()
    >>> refusals.note("busy", b"w", "served module 'r' is busy")
    >>> refusals.counts()
    {'busy': 1}
    """

    def __init__(self, publish: Callable[[Any], None] | None = None) -> None:
        self.publish = publish
        self.counter: Counter[str] = Counter()
        self._published: set[tuple[str, bytes]] = set()

    def note(self, reason: Reason, peer: bytes, text: str) -> None:
        self.counter[reason] += 1
        if self.publish is None or (reason, peer) in self._published \
                or len(self._published) >= _MAX_PUBLISHED:
            return
        self._published.add((reason, peer))
        self.publish(CollectorEvent("refused", name=peer_name(peer),
                                    reason=f"served_call refused ({reason}): {text}"))

    def counts(self) -> dict[str, int]:
        """``{reason: refused calls}``, the reasons seen so far."""
        return {r: self.counter[r] for r in REASONS if self.counter[r]}


def route_of(served: ServedModule) -> ServedRoute:
    """How a remote worker calls ``served`` (its welcome's data)."""
    handle = served.handle
    return ServedRoute.from_config({  # checked as a worker will check it
        "name": handle.name, "inputs": [[n, d, list(s)] for n, d, s in handle.inputs],
        "output": [handle.output[0], handle.output[1], list(handle.output[2])],
        "call_timeout": handle.call_timeout})


class RemoteCalls:
    """Remote workers' calls to ``served``, answered through ``send(peer, body, kind)``.

    :meth:`on_message` is the coordinator's service for :class:`ServedCall` (it returns
    at once); :meth:`run` serves the calls (a task of the collector's run: cancel it to
    stop; it closes the slots it claimed).

    >>> calls = RemoteCalls(served, hub.send)                        # doctest: +SKIP
    >>> coordinator.services[ServedCall.KIND] = calls.on_message      # doctest: +SKIP
    """

    def __init__(self, served: ServedModule, send: Send,
                 refusals: Refusals | None = None) -> None:
        self.served = served
        #: Counted by reason (shared with the other modules of the run by its router).
        self.counted = refusals if refusals is not None else Refusals()
        self.route = route_of(served)
        self._layout = self.route.input_layout
        self._send = send
        self._queue, self._calls = anyio.create_memory_object_stream[tuple[bytes, ServedCall]](
            max(1, served.clients))
        self._idle: list[ServedModuleClient] = []
        self._claimed: list[ServedModuleClient] = []
        #: Why each refused call was (most recent last, at most 100).
        self.refusals: list[str] = []
        #: Calls answered with an output.
        self.answered = 0
        self._limited = RateLimitedLog(log)

    # -- the coordinator's loop: returns at once ------------------------------------------
    async def on_message(self, worker: Any, message: Message) -> None:
        """A ``served_call`` from ``message.peer``; ``worker``: the live admitted worker
        that sent it (None: refused). Never raises."""
        number = _call_number(message.body)
        if worker is None:
            await self._refuse(message.peer, number, "served_call from a peer that is not a "
                               "live admitted worker of this collector: only the workers "
                               "admitted to the run may call its served modules",
                               "not admitted")
            return
        try:
            call = decode(ServedCall, message.body, layout=self._layout)
        except ProtocolError as exc:
            await self._refuse(message.peer, number, str(exc), "malformed")
            return
        try:
            self._queue.send_nowait((message.peer, call))
        except anyio.WouldBlock:
            busy = (f"served module {self.route.name!r} is busy: more calls wait than its "
                    f"{self.served.clients} client slots; give ServedModule(..., clients=) at "
                    "least the number of envs across all workers")
            self.counted.note("busy", message.peer, busy)
            await self._answer(message.peer, ServedAnswer(self.route.name, call.call,
                                                          error=busy))

    @property
    def refused(self) -> dict[str, int]:
        """Refused calls by reason (this module's and its router's others')."""
        return self.counted.counts()

    async def _refuse(self, peer: bytes, number: int, reason: str, why: Reason) -> None:
        where = f"served module {self.route.name!r} refused a call from {peer!r}: {reason}"
        self._limited.warning("served-refusal", "%s", where)
        self.counted.note(why, peer, reason)
        self.refusals.append(where)
        del self.refusals[:-_MAX_REFUSALS]
        await self._answer(peer, ServedAnswer(self.route.name, number,
                                              error=f"refused: {printable(reason, limit=2000)}"))

    # -- serving ------------------------------------------------------------------------
    async def run(self) -> None:
        """Serve the calls until cancelled; then let go of the slots claimed."""
        try:
            async with anyio.create_task_group() as tg:
                async for peer, call in self._calls:
                    tg.start_soon(self._serve, peer, call)
        finally:
            for client in self._claimed:
                client.close()
            self._claimed, self._idle = [], []

    async def _serve(self, peer: bytes, call: ServedCall) -> None:
        name = self.route.name
        try:
            client = self._take()
        except ServedModuleError as exc:
            await self._answer(peer, ServedAnswer(name, call.call, error=str(exc)))
            return
        try:
            output, version = await client.call_async(call.inputs)
        except ServedModuleTimeout as exc:
            answer = ServedAnswer(name, call.call, error=str(exc), timeout=True)
            client.close()  # its late answer must not meet the next call: a fresh slot
            self._claimed.remove(client)
        except ServedModuleError as exc:
            answer = ServedAnswer(name, call.call, error=str(exc))
            self._idle.append(client)
        else:
            answer = ServedAnswer(name, call.call, version=version, output=output)
            self.answered += 1
            self._idle.append(client)
        await self._answer(peer, answer)

    @property
    def in_flight(self) -> int:
        """Calls being served now (each holds one of the module's client slots)."""
        return len(self._claimed) - len(self._idle)

    def _take(self) -> ServedModuleClient:
        """A slot free for one call: one claimed before, or a new claim."""
        if self._idle:
            return self._idle.pop()
        client = ServedModuleClient(self.served.handle)
        self._claimed.append(client)
        return client

    async def _answer(self, peer: bytes, answer: ServedAnswer) -> None:
        try:
            await self._send(peer, answer.to_body(), ServedAnswer.KIND)
        except Exception as exc:  # gone meanwhile (its loss says the rest)
            log.debug("could not answer %r's call to served module %r: %r", peer,
                      self.route.name, exc)


def _call_number(body: Any) -> int:
    """The call number a body claims (0 when it claims none usable): the refusal repeats it."""
    number = body.get("call") if isinstance(body, dict) else None
    return number if isinstance(number, int) and not isinstance(number, bool) \
        and 0 <= number < 1 << 63 else 0


class ServedCallRouter:
    """The coordinator's one service for ``served_call``: each call to its module's
    :class:`RemoteCalls` by name; a call to a module the run does not serve is refused.

    >>> router = ServedCallRouter(hub.send)                          # doctest: +SKIP
    >>> router.add(RemoteCalls(served, hub.send))                    # doctest: +SKIP
    >>> coordinator.services[ServedCall.KIND] = router.on_message     # doctest: +SKIP
    """

    def __init__(self, send: Send,
                 how: str = "weight_sync_schemes with a ServedModuleScheme",
                 publish: Callable[[Any], None] | None = None) -> None:
        self._send = send
        self._how = how  # how a module becomes one this run serves (the refusal says it)
        self.modules: dict[str, RemoteCalls] = {}
        #: Every refused call of the run, by reason (``statistics().served_refusals``).
        self.refusals = Refusals(publish)
        self._limited = RateLimitedLog(log)

    def add(self, calls: RemoteCalls) -> None:
        calls.counted = self.refusals  # one count for the run
        self.modules[calls.route.name] = calls

    async def on_message(self, worker: Any, message: Message) -> None:
        """Never raises."""
        name = message.body.get("name") if isinstance(message.body, dict) else None
        calls = self.modules.get(name) if isinstance(name, str) else None
        if calls is not None:
            await calls.on_message(worker, message)
            return
        said = printable(str(name), limit=64)
        reason = (f"served_call names module {said!r}; this run serves "
                  f"{sorted(self.modules)} ({self._how})")
        if isinstance(name, str) and _open_now(name):
            reason += (f"; {said!r} is open in the trainer's process but was opened after "
                       "this collector, whose remote hosts learn the routes in their "
                       "welcome: open the ServedModule before the collector")
        self._limited.warning("served-unknown", "refused a call from %r: %s", message.peer,
                              reason)
        self.refusals.note("unknown module", message.peer, reason)
        try:
            await self._send(message.peer, ServedAnswer(
                said if isinstance(name, str) and name else "?", _call_number(message.body),
                error=f"refused: {reason}").to_body(), ServedAnswer.KIND)
        except Exception as exc:
            log.debug("could not refuse %r: %r", message.peer, exc)


def _open_now(name: str) -> bool:
    try:
        ServedModule.named(name)
    except KeyError:
        return False
    return True


def open_module_calls(hub: Any, publish: Callable[[Any], None] | None = None
                      ) -> ServedCallRouter | None:
    """Remote calls to every served module open in this process, answered over ``hub``
    (a collector with no scheme for them: ``AsyncBatchedCollector``'s remote env hosts);
    None when none is open. Run each of ``router.modules``' :meth:`RemoteCalls.run`.
    ``publish``: the collector's events (refusals)."""
    modules = list(ServedModule._open.values())  # noqa: SLF001
    if not modules:
        return None

    async def send(peer: bytes, body: Any, kind: str) -> None:
        await hub.send(peer, body, kind=kind)

    router = ServedCallRouter(send, "the served modules open in the trainer's process as "
                              "the collector opened", publish)
    for served in modules:
        router.add(RemoteCalls(served, send))
    return router
