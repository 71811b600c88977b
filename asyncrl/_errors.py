"""The asyncrl exception tree, and rebuilding a worker's exception in the trainer."""

from __future__ import annotations

import functools
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

import transports
from transports import ErrorPayload, printable_block

E = TypeVar("E", bound=BaseException)


class AsyncRLError(Exception):
    """Root of every error asyncrl raises itself (collectors, workers and weight sync).

    What a user catches, in one tree under ``asyncrl``::

        AsyncRLError
          CollectorError
            CollectorStopped          the run was stopped from outside (SIGTERM)
            WorkerLostError           a worker died, went silent or was expelled
              BadBatchError           ... for sending a batch it was not asked for
            SpecMismatchError         envs cannot be batched together, or an env returned
                                      an observation its spec does not describe
            NoLengthError             len() of an endless collector (also a TypeError)
          RefusedError                a worker or env worker the collector refused
          JoinTimeout                 an env worker was not welcomed in time (a TimeoutError)
          WorkerExit                  ends a worker (an exit code and a reason)
          WeightSyncError, ...        see :mod:`asyncrl.weights`
          TransportError              the wire, as asyncrl raises it (also transports')
            ProtocolError             a malformed or hostile message
            PeerLostError             a peer went away while owing an answer (``.peers``)
            RemoteError               a peer's error that has no local type

    The wire layer (:mod:`transports`) knows nothing of asyncrl and raises its
    own classes; asyncrl translates them where they reach a user (a collector's
    calls and iteration, see :func:`as_asyncrl_error`) into the classes above,
    each a subclass of both :class:`AsyncRLError` and the transports class of
    the same name: ``except asyncrl.AsyncRLError``, ``except
    asyncrl.RemoteError`` and ``except transports.RemoteError`` all catch it. A
    worker's own exception comes back with its own type when this process knows
    it (see :func:`rebuild_remote_exception`).

    >>> issubclass(CollectorError, AsyncRLError)
    True
    """


class CollectorError(AsyncRLError):
    """Base class of the errors a collector raises itself."""


class CollectorStopped(CollectorError):
    """The run was stopped from outside (a local worker got SIGTERM), not failed.

    ``async for batch in collector`` ends (as at ``total_frames``) instead of
    raising it; other calls (``update_policy_weights``...) raise it.
    """


class WorkerLostError(CollectorError):
    """A worker process or host died or went silent."""


class BadBatchError(WorkerLostError):
    """A worker sent a batch that is not what it was asked for; it was dropped, not counted."""


class SpecMismatchError(CollectorError):
    """Two local workers' envs have specs that cannot be batched together, or an env
    returned an observation its spec does not describe (the worker, env and key named)."""


class NoLengthError(CollectorError, TypeError, RuntimeError):
    """``len()`` of an endless collector: a TypeError (Python's "has no len()") that is
    also the RuntimeError TorchRL raises, so a ported ``except RuntimeError`` still works."""


class RefusedError(AsyncRLError):
    """The collector refused this worker or env worker (the message says why).

    ``asyncrl env-worker`` exits with code 4 on it; a refusal for a full run
    may be retried, one for a wrong key or spec may not.
    """


class WorkerExit(AsyncRLError):
    """Ends a worker's run with an exit code and a one-line reason (``asyncrl worker``'s code).

    ``final``: the coordinator is not waited for again (``--reconnect`` does not apply).
    """

    def __init__(self, code: int, reason: str, *, final: bool = False) -> None:
        super().__init__(reason)
        self.code = code
        self.final = final


class JoinTimeout(AsyncRLError, TimeoutError):
    """No welcome within ``join_timeout``: ``asyncrl env-worker`` exits with code 5 on it."""


# -- the wire's errors, as asyncrl raises them ------------------------------------------------
class TransportError(AsyncRLError, transports.TransportError):
    """A wire error (:class:`transports.TransportError`) as asyncrl raises it."""


class ProtocolError(TransportError, transports.ProtocolError):
    """A malformed or hostile message (:class:`transports.ProtocolError`)."""


class PeerLostError(TransportError, transports.PeerLostError):
    """A peer went silent while it owed an answer (:class:`transports.PeerLostError`)."""


class RemoteError(TransportError, transports.RemoteError):
    """A peer's error that has no local type (:class:`transports.RemoteError`)."""


class ClosedResourceError(TransportError, transports.ClosedResourceError):
    """A channel this process closed (:class:`transports.ClosedResourceError`)."""


_TRANSLATED: dict[type[BaseException], type[TransportError]] = {
    transports.TransportError: TransportError, transports.ProtocolError: ProtocolError,
    transports.PeerLostError: PeerLostError, transports.RemoteError: RemoteError,
    transports.ClosedResourceError: ClosedResourceError,
}


def as_asyncrl_error(error: E) -> E:
    """``error`` as asyncrl raises it: a transports error becomes an :class:`AsyncRLError`.

    The copy is of asyncrl's class of the same meaning, which is also the
    transports class of ``error`` (every ``except`` that caught it still does),
    with the same message, attributes, notes, cause and traceback. Any other
    exception is returned as it is.

    >>> lost = as_asyncrl_error(transports.PeerLostError([b"w0"], "while collecting"))
    >>> isinstance(lost, AsyncRLError), isinstance(lost, transports.PeerLostError), lost.peers
    (True, True, [b'w0'])
    """
    if not isinstance(error, transports.TransportError) or isinstance(error, AsyncRLError):
        return error
    cls = _asyncrl_class(type(error))
    translated = cls.__new__(cls, *error.args)
    translated.__dict__.update(error.__dict__)  # .peer, .peers, notes ...
    translated.__cause__, translated.__context__ = error.__cause__, error.__context__
    translated.__suppress_context__ = error.__suppress_context__
    translated.__traceback__ = error.__traceback__
    return translated  # type: ignore[return-value]  # a subclass of type(error)


@contextmanager
def translated_errors() -> Iterator[None]:
    """Raise a transports error leaving the block as asyncrl's (:func:`as_asyncrl_error`).

    Used where a call leaves asyncrl for the user's code (httpcore's
    ``map_exceptions``): a collector's iteration and its started calls.

    >>> with translated_errors():
    ...     raise transports.ProtocolError("bad header")
    Traceback (most recent call last):
    ...
    asyncrl._errors.ProtocolError: bad header
    """
    try:
        yield
    except transports.TransportError as exc:
        translated = as_asyncrl_error(exc)
        if translated is exc:
            raise
        raise translated from exc.__cause__


P = ParamSpec("P")
T = TypeVar("T")


def translating(method: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """An async function whose transports errors leave it as asyncrl's
    (:func:`translated_errors`): for public calls that wait on the wire, such as
    :meth:`WeightSender.wait_ack <asyncrl.weights.WeightSender.wait_ack>`."""

    @functools.wraps(method)
    async def translated(*args: P.args, **kwargs: P.kwargs) -> T:
        with translated_errors():
            return await method(*args, **kwargs)

    return translated


def _asyncrl_class(cls: type[transports.TransportError]) -> type[TransportError]:
    """asyncrl's class for transports' ``cls``: one of the five above, or one made once
    for a class of transports' own (``TornReadError``...) that subclasses both."""
    translated = _TRANSLATED.get(cls)
    if translated is None:
        base = next(_TRANSLATED[c] for c in cls.__mro__ if c in _TRANSLATED)
        translated = type(cls.__name__, (base, cls), {"__module__": __name__,
                                                      "__doc__": cls.__doc__})
        _TRANSLATED[cls] = translated
    return translated


def rebuild_remote_exception(error: ErrorPayload | transports.RemoteError, *,
                             peer: str | None = None) -> BaseException:
    """The worker's exception as the trainer should see it.

    ``error`` is what the worker sent (an :class:`transports.ErrorPayload`, or
    the :class:`transports.RemoteError` a transport made of it; ``peer`` then
    defaults to its peer). The original type is used when it is a builtin or
    lives in a module this process already imported (a remote peer never makes
    us import anything); otherwise a :class:`transports.RemoteError` (asyncrl's
    :class:`RemoteError` once it leaves a collector, see :func:`translated_errors`). The
    remote traceback is kept as the ``__cause__`` (a ``RemoteError``) and as a
    note.

    A peer's word never becomes control flow: types that steer iteration,
    generators, cancellation or the interpreter (``StopIteration``,
    ``StopAsyncIteration``, ``GeneratorExit``, ``KeyboardInterrupt``,
    ``SystemExit``, asyncio/trio/anyio cancellation, any ``BaseException``
    that is not an ``Exception``) come back as a ``RemoteError``: raised in an
    ``async for``, a forged ``StopAsyncIteration`` would end the user's loop
    silently instead of failing it.

    >>> from transports import ErrorPayload
    >>> error = rebuild_remote_exception(ErrorPayload("builtins.KeyError", "'obs'"), peer="w0")
    >>> type(error).__name__, type(error.__cause__).__name__
    ('KeyError', 'RemoteError')
    """
    if isinstance(error, transports.RemoteError):
        remote, payload = error, ErrorPayload.from_exception(error)
        peer = remote.peer if peer is None else peer
    else:
        remote, payload = error.to_remote_error(peer), error
    cls = _resolve_exception_type(payload.type)
    if cls is None:
        return remote
    try:
        rebuilt = cls(payload.message)
    except Exception:
        return remote
    where = f" in worker {peer}" if peer else " in a worker"
    # Indented: no line of a peer's traceback can pass for one of the trainer's own.
    rebuilt.add_note(f"raised{where}; its traceback:\n" + printable_block(
        payload.traceback.rstrip(), limit=2 * ErrorPayload.MAX_TRACEBACK))
    rebuilt.__cause__ = remote
    return rebuilt


def _resolve_exception_type(type_path: str) -> type[Exception] | None:
    """The exception class ``type_path`` names in what is imported here, else None.

    ``"module.Qual.Name"`` (how :class:`transports.ErrorPayload` spells it) is
    split at the longest prefix that is an imported module; ``"module:Qual.Name"``
    (pkgutil's spelling, which older worker reports used) names the split itself.
    """
    candidate = _lookup(type_path)
    if (isinstance(candidate, type) and issubclass(candidate, Exception)
            and not issubclass(candidate, _control_flow_types())):
        return candidate
    return None


def _lookup(type_path: str) -> object:
    if ":" in type_path:
        module_name, _, qualname = type_path.partition(":")
        splits = [(module_name, qualname.split("."))]
    else:
        parts = type_path.split(".")
        splits = [(".".join(parts[:i]), parts[i:]) for i in range(len(parts) - 1, 0, -1)]
    for module_name, names in splits:
        module = sys.modules.get(module_name)  # never import on a peer's word
        if module is None:
            continue
        candidate: object = module
        for name in names:
            candidate = getattr(candidate, name, None)
        return candidate
    return None


def _control_flow_types() -> tuple[type[BaseException], ...]:
    """Exception types that mean "stop" or "cancelled" rather than "failed".

    Cancellation types are BaseExceptions already; they are listed so that a
    class deriving from both ``Exception`` and one of them is refused too.
    """
    import asyncio

    types: list[type[BaseException]] = [StopIteration, StopAsyncIteration, GeneratorExit,
                                        asyncio.CancelledError]
    trio = sys.modules.get("trio")  # only if loaded (never import on a peer's word)
    if trio is not None:
        types.append(trio.Cancelled)
    return tuple(types)
