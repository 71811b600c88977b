"""transports: the wire layer of asyncrl (bytes, tensors, peers, acks; nothing about RL).

* :func:`encode` / :func:`decode`: a msgpack header plus raw tensor frames, zero
  copy both ways, never pickle; hostile input raises :class:`ProtocolError`.
  :class:`ArrayDict`: numpy arrays sent as a TensorDict (by a process without torch).
* :class:`Hub` (many identified peers) and :class:`Link` (one upstream): async
  ZeroMQ channels over anyio (asyncio and trio) with acks, heartbeats and goodbyes.
* :class:`SharedArrayBlock`: such a block attached as numpy arrays, for a process without
  torch (``ASYNCRL_TORCH_FREE=1``, an env worker: :mod:`transports._torch_free`).
* :class:`SharedTensorBlock`: same-host tensors in shared memory, read whole or not at all;
  sealed by default (a memfd nobody can shrink: no SIGBUS from another process), its pages
  reserved when it is made (:class:`SharedMemoryFullError` if ``/dev/shm`` is full, for a
  ``sealed=False`` one).
  :class:`SharedTensorFile`: such a block read by its creator through the file descriptor
  only, for a writer it does not trust (a shrunk segment is a ProtocolError, never a SIGBUS).
* :class:`LocalHub` / :class:`LocalLink`: the same send/ack contract in memory (in-process
  collectors, tests).
* CURVE: :class:`CurveServer` / :class:`CurveClient` (keys from a directory, key files or
  ``ASYNCRL_CURVE_*`` variables); :func:`generate_keys`, :func:`add_host`, :func:`revoke_host`,
  :func:`list_keys` manage a key directory that a running hub watches.
* :func:`parse_endpoint`: a ZeroMQ address checked before a socket sees it (one-line
  ValueError); :func:`check_resolves`: does its host name resolve.
* Errors: :class:`TransportError` and its family; :class:`ErrorPayload` is the one wire form
  of an exception. :class:`ClosedResourceError` is also anyio's.
* :mod:`declared <transports._declared>`: a message declared once (a dataclass, msgspec
  bounds) and read by one mechanism; asyncrl's kinds and :class:`ErrorPayload` use it.
* A peer's text made safe to print: :func:`printable` (one line), :func:`printable_lines`,
  :func:`printable_block` (multi-line, indented), :func:`peer_name` (an identity's bytes).

Everything else (``transports._name``) is private: asyncrl itself imports only this face.
"""

import logging as _logging
from typing import TYPE_CHECKING as _TYPE_CHECKING

from ._torch_free import TORCH_FREE as TORCH_FREE

if _TYPE_CHECKING or not TORCH_FREE:
    # First, before anything imports tensordict: it imports tensordict without torch._dynamo.
    from . import _lazy_dynamo as _lazy_dynamo
from . import _declared as declared
from ._channel import ChannelStatistics as ChannelStatistics
from ._codec import DEFAULT_MAX_BYTES as DEFAULT_MAX_BYTES
from ._codec import PROTOCOL_VERSION as PROTOCOL_VERSION
from ._codec import ArrayDict as ArrayDict
from ._codec import decode as decode
from ._codec import encode as encode
from ._curve import CurveClient as CurveClient
from ._curve import CurveServer as CurveServer
from ._endpoints import Endpoint as Endpoint
from ._endpoints import check_resolves as check_resolves
from ._endpoints import parse_endpoint as parse_endpoint
from ._error_payload import ErrorPayload as ErrorPayload
from ._errors import ClosedResourceError as ClosedResourceError
from ._errors import PeerLostError as PeerLostError
from ._errors import ProtocolError as ProtocolError
from ._errors import RemoteError as RemoteError
from ._errors import TransportError as TransportError
from ._hub import STRANGER_MAX_BYTES as STRANGER_MAX_BYTES
from ._hub import Hub as Hub
from ._keyring import AuthorizedKeys as AuthorizedKeys
from ._keyring import KeyEntry as KeyEntry
from ._keyring import add_host as add_host
from ._keyring import generate_keys as generate_keys
from ._keyring import list_keys as list_keys
from ._keyring import revoke_host as revoke_host
from ._link import Link as Link
from ._link import random_identity as random_identity
from ._memory import LocalHub as LocalHub
from ._memory import LocalLink as LocalLink
from ._printable import peer_name as peer_name
from ._printable import printable as printable
from ._printable import printable_block as printable_block
from ._printable import printable_lines as printable_lines
from ._ratelimit import RateLimitedLog as RateLimitedLog
from ._resource import TaskGroupResource as TaskGroupResource
from ._shm import SharedTensorBlock as SharedTensorBlock
from ._shm import TornReadError as TornReadError
from ._shm import copy_into as copy_into
from ._shm_arrays import SharedArrayBlock as SharedArrayBlock
from ._shm_segment import SharedMemoryFullError as SharedMemoryFullError
from ._socket import shutdown as shutdown
from ._types import Message as Message
from ._types import PeerEvent as PeerEvent
from ._types import Ticket as Ticket

if _TYPE_CHECKING or not TORCH_FREE:  # (ASYNCRL_TORCH_FREE=1: an env worker, no torch)
    from ._shm_file import SharedTensorFile as SharedTensorFile
else:

    def __getattr__(name: str) -> object:
        if name == "SharedTensorFile":  # (imports torch: asked for, it is the caller's)
            from ._shm_file import SharedTensorFile

            return SharedTensorFile
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# A library never configures logging: the application does.
_logging.getLogger("transports").addHandler(_logging.NullHandler())

__all__ = [
    "DEFAULT_MAX_BYTES",
    "PROTOCOL_VERSION",
    "STRANGER_MAX_BYTES",
    "TORCH_FREE",
    "ArrayDict",
    "AuthorizedKeys",
    "ChannelStatistics",
    "ClosedResourceError",
    "CurveClient",
    "CurveServer",
    "Endpoint",
    "ErrorPayload",
    "Hub",
    "KeyEntry",
    "Link",
    "LocalHub",
    "LocalLink",
    "Message",
    "PeerEvent",
    "PeerLostError",
    "ProtocolError",
    "RateLimitedLog",
    "RemoteError",
    "SharedArrayBlock",
    "SharedMemoryFullError",
    "SharedTensorBlock",
    "SharedTensorFile",
    "TaskGroupResource",
    "Ticket",
    "TornReadError",
    "TransportError",
    "add_host",
    "check_resolves",
    "copy_into",
    "declared",
    "decode",
    "encode",
    "generate_keys",
    "list_keys",
    "parse_endpoint",
    "peer_name",
    "printable",
    "printable_block",
    "printable_lines",
    "random_identity",
    "revoke_host",
    "shutdown",
]
