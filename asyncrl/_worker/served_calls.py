"""A remote worker's calls to the trainer's served modules, over the link it was admitted on.

A worker on another host (``asyncrl worker --connect``) shares no memory with a
:class:`~asyncrl.served.ServedModule`; its welcome names the modules it may call
(:class:`~asyncrl._protocol.ServedRoute`, data: name, layouts, ``call_timeout``).
An env's step (in the rollout's thread) calls :meth:`ServedCalls.call`: the inputs
go to the coordinator as a :class:`~asyncrl._protocol.ServedCall` through the
worker's event loop, and the step waits, at most ``call_timeout``, for the
:class:`~asyncrl._protocol.ServedAnswer` that the worker's dispatch loop hands to
:meth:`ServedCalls.deliver` (decoded against the route's output layout: the
trainer's word never sizes an array here). When the admission ends (the trainer
lost, the worker dropped), every waiting call fails at once, saying why.

The wrappers of :mod:`asyncrl.served` find a module's route here by name
(:func:`route_for`): a worker spawned by the collector on the trainer's host calls
through shared memory instead and registers no route.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
import numpy as np

from transports import Link, Message, ProtocolError, printable

from .._protocol import ServedAnswer, ServedCall, ServedRoute, decode

__all__ = ["ServedCallError", "ServedCalls", "route_for"]

log = logging.getLogger("asyncrl.worker")
T = TypeVar("T")


class ServedCallError(RuntimeError):
    """A call over the link failed (``timeout``: no answer in time); the served module's
    client turns it into its own error types."""

    def __init__(self, message: str, *, timeout: bool = False) -> None:
        super().__init__(message)
        self.timeout = timeout


@dataclass(eq=False)
class _Waiter:
    done: threading.Event = field(default_factory=threading.Event)
    output: Any = None
    version: int = 0
    error: str = ""
    timeout: bool = False


#: This process's routes: model id -> (its route, the calls that carry it).
_routes: dict[str, tuple[ServedRoute, ServedCalls]] = {}
_routes_lock = threading.Lock()


def route_for(name: str) -> tuple[ServedRoute, ServedCalls] | None:
    """The route to served module ``name`` a welcome gave this process (None: none)."""
    with _routes_lock:
        return _routes.get(name)


def _as_array(value: Any) -> Any:
    # A tensor (a worker with torch) as numpy's view of its bytes; numpy stays numpy.
    return value.numpy() if hasattr(value, "numpy") and not isinstance(value, np.ndarray) \
        else value


class ServedCalls:
    """One remote worker's served-module calls: ``output, version = calls.call(name, inputs)``.

    Made by the worker over its link; :meth:`bind` (on the worker's event loop) before
    the first call. Thread-safe: any thread but the event loop's may call.

    >>> calls = ServedCalls(link)                         # doctest: +SKIP
    >>> calls.add(ServedRoute.from_config(welcome.schemes[name]["route"]))  # doctest: +SKIP
    >>> reward, version = calls.call(name, {"next_observation": obs})       # doctest: +SKIP
    """

    def __init__(self, link: Link) -> None:
        self.link = link
        self.routes: dict[str, ServedRoute] = {}
        self._token: Any = None
        self._loop_thread: int | None = None
        self._lock = threading.Lock()
        self._numbers = itertools.count()
        self._waiting: dict[int, _Waiter] = {}
        self._down = "this worker is not admitted yet"

    def bind(self) -> None:
        """Calls go out through this event loop (call it there)."""
        self._token = anyio.lowlevel.current_token()
        self._loop_thread = threading.get_ident()

    def add(self, route: ServedRoute) -> None:
        """Served module ``route.name`` is called over this link (a welcome said so)."""
        self.routes[route.name] = route
        with _routes_lock:
            _routes[route.name] = (route, self)

    def take(self, schemes: Mapping[str, Any],
             routes: Sequence[Any] = ()) -> dict[str, Any]:
        """Take the routes a welcome gives (``Welcome.served``, and the scheme configs'
        ``{"scheme": "served", "route": ...}`` of a trainer of the release before it; a
        malformed one raises :class:`ProtocolError`); return the other scheme configs.
        A served module's weights never travel to a worker: it needs no receiver."""
        for route in routes:
            self.add(ServedRoute.from_config(route))
        others = {}
        for model_id, config in schemes.items():
            if isinstance(config, dict) and config.get("scheme") == "served":
                if config.get("route") is not None:
                    self.add(ServedRoute.from_config(config["route"]))
            else:
                others[model_id] = config
        return others

    def close(self) -> None:
        """Fail the waiting calls and take this link's routes out of the process's registry."""
        self.lost("this worker is closing")
        with _routes_lock:
            for name in [n for n, (_, calls) in _routes.items() if calls is self]:
                del _routes[name]

    def admitted(self) -> None:
        with self._lock:
            self._down = ""

    def lost(self, reason: str) -> None:
        """The admission ended: every waiting call fails now with ``reason``."""
        with self._lock:
            self._down = reason
            waiting, self._waiting = self._waiting, {}
        for waiter in waiting.values():
            waiter.error = reason
            waiter.done.set()

    # -- the env's thread ---------------------------------------------------------------
    def call(self, name: str, inputs: Mapping[str, np.ndarray]) -> tuple[np.ndarray, int]:
        """Send one env's ``inputs`` to served module ``name``; its output and version.

        Raises :class:`ServedCallError` when no answer comes within the route's
        ``call_timeout`` (``timeout``), the trainer answers with an error, or the
        admission ends meanwhile.
        """
        route = self.routes[name]
        if threading.get_ident() == self._loop_thread or self._token is None:
            raise ServedCallError(f"served module {name!r} was called from the worker's event "
                                  "loop thread: a remote worker's envs call it from the "
                                  "rollout's thread only")
        waiter = _Waiter()
        with self._lock:
            if self._down:
                raise ServedCallError(f"served module {name!r} cannot be called: {self._down}")
            number = next(self._numbers)
            self._waiting[number] = waiter
        body = ServedCall(name, number, dict(inputs)).to_body()
        try:
            try:
                anyio.from_thread.run(self._send, body, token=self._token)
            except Exception as exc:
                raise ServedCallError(f"served module {name!r}: the call could not be sent "
                                      f"to the trainer: {type(exc).__name__}: {exc}") from None
            if not waiter.done.wait(route.call_timeout):
                raise ServedCallError(
                    f"served module {name!r}: no answer from the trainer at "
                    f"{self.link.endpoint} within call_timeout={route.call_timeout} s; the "
                    "trainer may be blocked, paused or gone: check it, or raise "
                    "ServedModule(..., call_timeout=) for a slow module", timeout=True)
        finally:
            with self._lock:
                self._waiting.pop(number, None)
        if waiter.error:
            raise ServedCallError(waiter.error, timeout=waiter.timeout)
        return waiter.output, waiter.version

    async def _send(self, body: dict[str, Any]) -> None:
        await self.link.send(body, kind=ServedCall.KIND)

    # -- the event loop -----------------------------------------------------------------
    def deliver(self, message: Message) -> None:
        """An answer from the trainer (raises :class:`ProtocolError` for a bad one)."""
        name = _map(message.body).get("name")
        route = self.routes.get(name) if isinstance(name, str) else None
        if route is None:
            raise ProtocolError(f"served_answer for {printable(str(name), limit=64)!r}, a "
                                "module this worker does not call (its routes: "
                                f"{sorted(self.routes)})")
        answer = decode(ServedAnswer, message.body, layout=route.output_layout,
                        convert=_as_array)
        with self._lock:
            waiter = self._waiting.pop(answer.call, None)
        if waiter is None:  # the caller gave up (call_timeout): a late answer is dropped
            log.debug("dropped a late answer of served module %r (call %d)", name, answer.call)
            return
        waiter.output = None if answer.error else np.array(answer.output, copy=True)
        waiter.version, waiter.error, waiter.timeout = answer.version, answer.error, \
            answer.timeout
        waiter.done.set()

    async def run_answering(self, build: Callable[[], T], recv: Callable[[], Awaitable[Message]],
                            backlog: deque[Message]) -> T:
        """``build()`` in a thread while this loop reads the link: answers are delivered,
        any other message kept in ``backlog`` (the rollout's first, probing step may call a
        served module before the worker's dispatch loop runs)."""
        failure: list[BaseException] = []

        async def read() -> None:
            try:
                while True:
                    message = await recv()
                    if message.kind == ServedAnswer.KIND:
                        try:
                            self.deliver(message)
                        except ProtocolError as exc:
                            log.warning("dropped a malformed served_answer: %s", exc)
                    else:
                        backlog.append(message)
            except Exception as exc:  # the link lost: the calls under way fail now
                failure.append(exc)
                self.lost(f"the trainer's link failed: {exc}")

        built: list[T] = []

        def build_here() -> None:
            try:
                built.append(build())
            except BaseException as exc:  # raised below as itself, not in a task group's
                failure.insert(0, exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            try:
                await anyio.to_thread.run_sync(build_here)
            finally:
                tg.cancel_scope.cancel()
        if failure:
            raise failure[0]
        return built[0]


def _map(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ProtocolError(f"served_answer message body must be a map, got "
                            f"{type(body).__name__}")
    return body
