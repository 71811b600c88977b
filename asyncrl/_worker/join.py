"""A worker's join: its hello, said until a coordinator welcomes it.

A coordinator answers a hello at once with a welcome or a refusal. The hello is
said again when no answer came (a coordinator that died just after it, its
successor in its place), and, with ``join_timeout``, when refused *only* because
the run has no free place (``Refuse.full``): after :data:`JOIN_BACKOFF` seconds,
doubling up to :data:`JOIN_BACKOFF_MAX`, each pause stretched by up to a quarter
at random so that hosts refused together do not all ask again at once (a host's
relay backs off the same way). Any other refusal (keys, specs, protocol) is final,
but one: a host's ``--env`` id the trainer registers at run time is answered with
where it comes from (:class:`EnvOffered`), and the worker says hello again once it
has built its envs.

A hello can go unanswered because nothing listens there (a wrong address, a
firewall), because something else listens (another service, a blocked trainer),
or because the trainer's CURVE authentication denied this host's key at the
handshake, which ZeroMQ shows the client only as a monitor event
(``Link.key_denied``). The last is final: asking again cannot help. Each is said
the way an operator can act on it.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from typing import NoReturn

import anyio

from transports import Link, Message, ProtocolError, RateLimitedLog

from .._errors import WorkerExit
from .._protocol import WEIGHTS_KIND, Hello, Refuse, Welcome, decode
from .._rollout.env_ids import EnvIdSource
from .._spawn.exit_codes import EXIT_COORDINATOR_LOST, EXIT_JOIN_TIMEOUT, EXIT_REFUSED

log = logging.getLogger("asyncrl.worker")

__all__ = ["JOIN_BACKOFF", "JOIN_BACKOFF_MAX", "EnvOffered", "Joining", "RunFull",
           "cancel_when_denied", "denied", "full_pause", "no_welcome", "unreachable"]

#: The first pause after a "full" refusal, in seconds; it doubles up to the max.
JOIN_BACKOFF = 0.5
JOIN_BACKOFF_MAX = 8.0


class RunFull(Exception):
    """The coordinator refused us only because it has no free place: ask again later."""


class EnvOffered(Exception):
    """A refusal that says where the trainer's gymnasium id comes from: import, hello again."""

    def __init__(self, source: EnvIdSource) -> None:
        super().__init__(source.env_id)
        self.source = source


def full_pause(backoff: float) -> tuple[float, float]:
    """``(pause, next backoff)``: how long to wait now (jittered), and the next step.

    >>> pause, after = full_pause(0.5)
    >>> 0.5 <= pause <= 0.625, after
    (True, 1.0)
    """
    return backoff * (1 + random.random() / 4), min(2 * backoff, JOIN_BACKOFF_MAX)


class Joining:
    """Says a worker's hello on ``link`` until a coordinator welcomes it.

    ``recv`` is the worker's receive (it turns a lost hub into the worker's exit);
    weights that come before the welcome (a late joiner's catch-up) are kept in
    :attr:`early` for the worker to apply once it has a rollout.

    >>> joining = Joining(link, worker.recv, join_timeout=30.0)     # doctest: +SKIP
    >>> welcome = await joining.hello_until_welcome(hello)          # doctest: +SKIP
    """

    def __init__(self, link: Link, recv: Callable[[], Awaitable[Message]], *,
                 join_timeout: float | None, limited_log: RateLimitedLog | None = None) -> None:
        self.link = link
        self.recv = recv
        #: Bound on one join, hello to welcome (None: none).
        self.join_timeout = join_timeout
        #: Weights that came before the welcome: the worker applies them, then clears this.
        self.early: list[Message] = []
        # What the network makes us log is rate-limited (a malformed answer is dropped).
        self._limited_log = limited_log or RateLimitedLog(log)

    async def hello_until_welcome(self, hello: Hello) -> Welcome:
        """Say hello until welcomed: again when no answer came, or (with a backoff) when
        refused only because the run was full; within ``join_timeout`` s if given.

        Raises :class:`EnvOffered` when the refusal says where ``hello.env_missing``
        comes from, and ``WorkerExit`` (refused, unreachable, no welcome) otherwise.
        """
        link = self.link
        deadline = None if self.join_timeout is None else anyio.current_time() + self.join_timeout
        backoff = JOIN_BACKOFF
        while True:
            sent = False
            with anyio.move_on_after(link.peer_timeout):
                # A send blocks while no connection is up (e.g. a failing CURVE handshake):
                # a handshake the hub denied ends the wait at once.
                async with anyio.create_task_group() as tg:
                    tg.start_soon(cancel_when_denied, link, tg.cancel_scope)
                    await link.send(hello.to_body(), kind=Hello.KIND)
                    sent = True
                    tg.cancel_scope.cancel()
            if not sent:
                raise denied(link) or WorkerExit(EXIT_COORDINATOR_LOST, unreachable(link))
            # A coordinator answers at once; one that stays alive (its heartbeats
            # come) but silent got our hello just before it died and a successor
            # took its place: say hello again (a gone one ends the wait first).
            wait = 2 * link.peer_timeout
            if deadline is not None:
                wait = min(wait, max(0.0, deadline - anyio.current_time()))
            welcome = None
            try:
                with anyio.move_on_after(wait):
                    welcome = await self._await_welcome(hello)
            except RunFull as full:
                pause, after = full_pause(backoff)  # jittered: not all at once
                if deadline is not None and anyio.current_time() + pause > deadline:
                    raise WorkerExit(EXIT_REFUSED, f"the coordinator refused this worker: "
                                     f"{full} (still full after --join-timeout "
                                     f"{self.join_timeout} s)") from None
                log.warning("the run is full (%s); asking again in %.1f s", full, pause)
                await anyio.sleep(pause)
                backoff = after
                hello.attempt += 1
                continue
            if welcome is not None:
                return welcome
            if deadline is not None and anyio.current_time() >= deadline:
                raise WorkerExit(EXIT_JOIN_TIMEOUT, no_welcome(link, self.join_timeout))
            log.warning("no welcome from %s within %s s; saying hello again",
                        link.endpoint, 2 * link.peer_timeout)
            hello.attempt += 1

    async def _await_welcome(self, hello: Hello) -> Welcome:
        while True:
            message = await self.recv()
            try:  # a malformed answer is dropped: the hello is said again after a while
                if message.kind == Welcome.KIND:
                    welcome = decode(Welcome, message.body)
                    if welcome.attempt == hello.attempt:
                        return welcome
                    log.info("ignored the welcome of an earlier hello (attempt %d)",
                             welcome.attempt)
                    continue
                if message.kind == Refuse.KIND:
                    self._refused(decode(Refuse, message.body), hello.env_missing)
            except ProtocolError as exc:
                self._limited_log.warning("bad-answer", "dropped a malformed %r message: %s",
                                          message.kind, exc)
                continue
            if message.kind == WEIGHTS_KIND:
                # Weights may precede the welcome for a late joiner: keep them.
                self.early.append(message)
                continue
            log.warning("ignored %r message before the welcome", message.kind)

    def _refused(self, refuse: Refuse, env_missing: str) -> NoReturn:
        # Where our own --env id comes from (any other id: the plain refusal).
        if refuse.env_source is not None and env_missing \
                and refuse.env_source["env_id"] == env_missing:
            raise EnvOffered(EnvIdSource(**refuse.env_source))
        if refuse.full and self.join_timeout is not None:
            raise RunFull(refuse.reason)
        raise WorkerExit(EXIT_REFUSED, f"the coordinator refused this worker: {refuse.reason}")


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
