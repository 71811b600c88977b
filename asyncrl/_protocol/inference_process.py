"""The trainer and its dedicated inference process (``server_backend="process"``): their kinds.

The inference process is the trainer's own child on a private ipc socket (or the
trainer's listening hub, with a key made for it alone), so what it sends is no
attack; it is still a process that can fail half-way, and a message it sends is
decoded once, here, by its declared kind: a malformed one is a :class:`ProtocolError`
that stops the run naming it (a bug), never a ``KeyError`` in the middle of the
trainer's dispatcher.

====================  =====================================================
trainer -> process    :class:`ServerWeights` (a state dict), :class:`ServerHold` /
                      :class:`ServerGo` (back-pressure, pause), a remote env host's
                      request (:class:`RemoteRequest`), ``close``
                      (:class:`~.central_inference.EnvClose`)
process -> trainer    :class:`ServerReady`, :class:`ServerApplied`, :class:`ServerHeld`,
                      :class:`ServerStatistics`, a remote host's answer
                      (:class:`RemoteAnswer`), an error (``ErrorReport``'s body)
====================  =====================================================

>>> ServerStatistics.from_body(ServerStatistics(3, 12, [(4, 3)]).to_body())
ServerStatistics(calls=3, observations=12, sizes=[(4, 3)])
>>> ServerApplied.from_body({"error": "no weights"}).error
'no weights'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, ClassVar, Self

from msgspec import Meta

from transports import ProtocolError

from .central_inference import Actions, Observations
from .decoding import Text, read

__all__ = ["RemoteAnswer", "RemoteRequest", "ServerApplied", "ServerGo", "ServerHeld",
           "ServerHold", "ServerReady", "ServerStatistics", "ServerWeights"]

Count = Annotated[int, Meta(ge=0, le=(1 << 63) - 1)]
Slot = Annotated[int, Meta(ge=0, le=1 << 20)]
#: Most distinct batch sizes a statistics report lists (one per size up to max_batch_size).
MAX_SIZES = 1 << 16


@dataclass(slots=True)
class ServerReady:
    """Process -> trainer: serving, with the weights of ``version``."""

    KIND: ClassVar[str] = "ready"
    version: Count

    def to_body(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: Any) -> Self:
        return read(cls, body, "ready")


@dataclass(slots=True)
class ServerWeights:
    """Trainer -> process: a state dict of tensors to load between two calls."""

    KIND: ClassVar[str] = "weights"
    state: dict[str, Any]

    def to_body(self) -> dict[str, Any]:
        return self.state

    @classmethod
    def from_body(cls, body: Any) -> Self:
        import torch

        if not isinstance(body, dict) or not all(
                isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in body.items()):
            raise ProtocolError(f"weights message body must be a state dict of tensors, got "
                                f"{type(body).__name__}")
        return cls(body)


@dataclass(slots=True)
class ServerApplied:
    """Process -> trainer: the weights are in use from ``version`` on, or ``error``."""

    KIND: ClassVar[str] = "applied"
    version: Count | None = None
    error: Annotated[str, Text(2000)] = ""

    def to_body(self) -> dict[str, Any]:
        return {"error": self.error} if self.error else {"version": self.version}

    @classmethod
    def from_body(cls, body: Any) -> Self:
        applied = read(cls, body, "applied")
        if (applied.version is None) == (not applied.error):
            raise ProtocolError("applied message must carry a version or an error, got "
                                f"{sorted(body)[:4]}")
        return applied


@dataclass(slots=True)
class _Signal:
    """A message without a body."""

    def to_body(self) -> None:
        return None

    @classmethod
    def from_body(cls, body: Any) -> Self:
        if body not in (None, {}):
            raise ProtocolError(f"{getattr(cls, 'KIND', cls.__name__)} message carries no "
                                f"body, got {type(body).__name__}")
        return cls()


class ServerHold(_Signal):
    """Trainer -> process: answer no env worker (past the call under way) until ``go``."""

    KIND: ClassVar[str] = "hold"


class ServerGo(_Signal):
    """Trainer -> process: answer the env workers again."""

    KIND: ClassVar[str] = "go"


class ServerHeld(_Signal):
    """Process -> trainer: the answer to ``hold``: the call under way has answered."""

    KIND: ClassVar[str] = "held"


@dataclass(slots=True)
class ServerStatistics:
    """Process -> trainer: policy calls, observations served, calls per batch size."""

    KIND: ClassVar[str] = "stats"
    calls: Count
    observations: Count
    sizes: Annotated[list[tuple[Count, Count]], Meta(max_length=MAX_SIZES)] = field(
        default_factory=list)

    def to_body(self) -> dict[str, Any]:
        return {"calls": self.calls, "observations": self.observations,
                "sizes": [list(pair) for pair in self.sizes]}

    @classmethod
    def from_body(cls, body: Any) -> Self:
        stats = read(cls, body, "stats")
        stats.sizes = [tuple(pair) for pair in stats.sizes]  # type: ignore[misc]
        return stats


@dataclass(slots=True)
class RemoteRequest:
    """Trainer -> process: remote slot ``slot``'s observations (checked by the trainer).

    ``layout(rows)`` (the process's bound): the observations of ``rows`` envs;
    ``max_rows``: the most envs a slot may have (``max_batch_size``).
    """

    KIND: ClassVar[str] = "remote-obs"
    slot: int
    obs: Observations

    def to_body(self) -> dict[str, Any]:
        return {"slot": self.slot, "obs": self.obs.to_body()}

    @classmethod
    def from_body(cls, body: Any, *, first_slot: int, max_rows: int,
                  layout: Callable[[int], Mapping[str, tuple[str, tuple[int, ...]]]]) -> Self:
        head = read(_RemoteHead, body, "remote-obs")
        obs = body.get("obs")
        first = next(iter(obs.values()), None) if isinstance(obs, Mapping) else None
        rows = getattr(first, "shape", (0,))[0] if getattr(first, "shape", ()) else 0
        if head.slot < first_slot or not 1 <= rows <= max_rows:
            raise ProtocolError(f"remote-obs for slot {head.slot} of {rows} rows: expected a "
                                f"remote slot (from {first_slot}) of 1..{max_rows} rows")
        return cls(head.slot, Observations.from_body(obs, layout=layout(rows)))


@dataclass(slots=True)
class _RemoteHead:
    """What a remote request or answer says besides its tensors (read first)."""

    slot: Slot


@dataclass(slots=True)
class RemoteAnswer:
    """Process -> trainer: remote slot ``slot``'s answer (its host gets it from the trainer).

    ``layout(slot)``: the answer's layout, the slot's answer block's.
    """

    KIND: ClassVar[str] = "remote-act"
    slot: int
    answer: Actions

    def to_body(self) -> dict[str, Any]:
        return {"slot": self.slot, **self.answer.to_body()}

    @classmethod
    def from_body(cls, body: Any, *,
                  layout: Callable[[int], Mapping[str, tuple[str, tuple[int, ...]]] | None]
                  ) -> Self:
        head = read(_RemoteHead, body, "remote-act")
        expected = layout(head.slot)
        if expected is None:
            raise ProtocolError(f"remote-act for slot {head.slot}: not a remote slot")
        return cls(head.slot, Actions.from_body(body, layout=expected))
