"""The asyncrl exception tree, and rebuilding a worker's exception in the trainer."""

from __future__ import annotations

import sys

from transports import ErrorPayload, RemoteError


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
          RefusedError                a worker or env worker the collector refused
          WorkerExit                  ends a worker (an exit code and a reason)
          WeightSyncError, ...        see :mod:`asyncrl.weights`
        TransportError                the wire (re-exported as ``asyncrl.TransportError``)
          ProtocolError               a malformed or hostile message
          PeerLostError               a peer went away while owing an answer (``.peers``)
          RemoteError                 a peer's error that has no local type

    Errors from the wire layer stay :class:`transports.TransportError` (the same
    classes are exported here, so ``except asyncrl.RemoteError`` works); a
    worker's own exception comes back with its own type (see
    :func:`rebuild_remote_exception`).

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


def rebuild_remote_exception(error: ErrorPayload | RemoteError, *,
                             peer: str | None = None) -> BaseException:
    """The worker's exception as the trainer should see it.

    ``error`` is what the worker sent (an :class:`transports.ErrorPayload`, or
    the :class:`transports.RemoteError` a transport made of it; ``peer`` then
    defaults to its peer). The original type is used when it is a builtin or
    lives in a module this process already imported (a remote peer never makes
    us import anything); otherwise a :class:`transports.RemoteError`. The
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
    if isinstance(error, RemoteError):
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
    rebuilt.add_note(f"raised{where}; its traceback:\n{payload.traceback.rstrip()}")
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
