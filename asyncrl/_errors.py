"""The asyncrl exception tree, and rebuilding a worker's exception in the trainer."""

from __future__ import annotations

import builtins
import sys

from transports import RemoteError


class AsyncRLError(Exception):
    """Root of every error asyncrl raises itself (collectors and weight sync).

    Errors from the wire layer stay :class:`transports.TransportError`; a
    worker's own exception comes back with its own type (see
    :func:`rebuild_remote_exception`).

    >>> issubclass(CollectorError, AsyncRLError)
    True
    """


class CollectorError(AsyncRLError):
    """Base class of the errors a collector raises itself."""


class WorkerLostError(CollectorError):
    """A worker process or host died or went silent."""


class BadBatchError(WorkerLostError):
    """A worker sent a batch that is not what it was asked for; it was dropped, not counted."""


def rebuild_remote_exception(
    type_path: str, message: str, traceback_text: str, *, peer: str | None = None
) -> BaseException:
    """The worker's exception as the trainer should see it.

    The original type is used when it is a builtin or lives in a module this
    process already imported (a remote peer never makes us import anything);
    otherwise a :class:`transports.RemoteError`. The remote traceback is kept
    as the ``__cause__`` (a ``RemoteError``) and as a note.

    A peer's word never becomes control flow: types that steer iteration,
    generators, cancellation or the interpreter (``StopIteration``,
    ``StopAsyncIteration``, ``GeneratorExit``, ``KeyboardInterrupt``,
    ``SystemExit``, asyncio/trio/anyio cancellation, any ``BaseException``
    that is not an ``Exception``) come back as a ``RemoteError``: raised in an
    ``async for``, a forged ``StopAsyncIteration`` would end the user's loop
    silently instead of failing it.
    """
    remote = RemoteError(message, peer=peer, remote_type=type_path,
                         remote_traceback=traceback_text)
    cls = _resolve_exception_type(type_path)
    if cls is None:
        return remote
    try:
        error = cls(message)
    except Exception:
        return remote
    where = f" in worker {peer}" if peer else " in a worker"
    error.add_note(f"raised{where}; its traceback:\n{traceback_text.rstrip()}")
    error.__cause__ = remote
    return error


def _resolve_exception_type(type_path: str) -> type[Exception] | None:
    if ":" in type_path:  # "module:Qual.Name", as worker error reports send it
        module_name, _, qualname = type_path.partition(":")
    else:
        module_name, _, qualname = type_path.rpartition(".")
    if module_name == "builtins":
        candidate = getattr(builtins, qualname, None)
    else:
        module = sys.modules.get(module_name)  # never import on a peer's word
        candidate = module
        for part in qualname.split(".") if module is not None else ():
            candidate = getattr(candidate, part, None)
    if (isinstance(candidate, type) and issubclass(candidate, Exception)
            and not issubclass(candidate, _control_flow_types())):
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
