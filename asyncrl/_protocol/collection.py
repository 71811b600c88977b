"""Collecting: the coordinator's requests (collect, preempt, control) and a worker's
answers (a batch, an error report).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, ClassVar, Self

from msgspec import Meta
from tensordict import TensorDictBase

from transports import ErrorPayload, ProtocolError

from .compact_frames import CompactPatch, Patch, rebuild
from .decoding import Text, read, read_fields


@dataclass(slots=True)
class Collect:
    """Coordinator -> worker: collect ``credits`` batches for request ``request``."""

    KIND: ClassVar[str] = "collect"
    request: int
    credits: Annotated[int, Meta(ge=1, le=1 << 20)] = 1

    def to_body(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: Any) -> Self:
        return read(cls, body, "collect")


@dataclass(slots=True)
class Preempt:
    """Coordinator -> worker: stop the batch for ``request`` now and send what you have."""

    KIND: ClassVar[str] = "preempt"
    request: int

    def to_body(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: Any) -> Self:
        return read(cls, body, "preempt")


@dataclass(slots=True)
class Batch:
    """Worker -> coordinator: the frames of one batch.

    ``next``: the compact form's patch (see :mod:`.compact_frames`): the frames
    then lack the ``("next", K)`` entries it rebuilds. ``from_body`` rebuilds
    them, so a received batch always has TorchRL's full layout.
    """

    KIND: ClassVar[str] = "batch"
    #: On the wire ``next`` is declared as a :class:`CompactPatch` (read at decode); as
    #: written, the dict :func:`compact` made. A decoded batch has none left (rebuilt).
    WIRE: ClassVar[dict[str, Any]] = {"next": CompactPatch | None}
    request: int
    frames: TensorDictBase
    next: Patch | None = None

    def to_body(self) -> dict[str, Any]:
        body = {"request": self.request, "frames": self.frames}
        if self.next is not None:
            body["next"] = self.next
        return body

    @classmethod
    def from_body(cls, body: Any, *, max_frames: int | None = None) -> Self:
        """``max_frames``: the most frames this side asked for (the worker's share); the
        batch size the peer claims is checked against it before anything is built from it."""
        fields = read_fields(cls, body, "batch")
        frames, patch = fields.pop("frames"), fields.pop("next")
        if max_frames is not None:
            _check_claim(list(frames.batch_size), max_frames)
        if patch is not None:  # the one place a patch is checked against its frames, then used
            frames = rebuild(frames, patch)
        return cls(frames=frames, **fields)


def _check_claim(size: list[int], max_frames: int) -> None:
    """A peer's batch size is a claim: nothing is allocated from it (a patch's rebuild, the
    checks' positions) unless it fits the share this side asked for."""
    claimed = 1
    for dim in size:
        claimed *= dim
    if any(dim > max_frames for dim in size) or claimed > max_frames:
        raise ProtocolError(f"batch claims batch size {size[:8]} ({claimed} frames); this "
                            f"worker's share is at most {max_frames} frames per batch, and "
                            "no dimension may exceed it")


@dataclass(slots=True)
class ErrorReport:
    """Worker -> coordinator: an exception in the env, the policy or the worker.

    On the wire the :class:`transports.ErrorPayload` fields (``type``,
    ``message``, ``traceback``) sit beside the report's own.
    """

    KIND: ClassVar[str] = "error"
    #: On the wire the payload's fields sit beside the report's (read by ErrorPayload).
    WIRE: ClassVar[dict[str, Any]] = {"error": None}
    error: ErrorPayload
    fatal: bool = True
    #: A local worker that fails before its hello (building its env or policy) is not
    #: admitted yet: its slot and spawn token vouch for the report instead.
    slot: int = -1
    token: Annotated[str, Text(200)] = ""

    def to_body(self) -> dict[str, Any]:
        return {**self.error.to_body(), "fatal": self.fatal, "slot": self.slot,
                "token": self.token}

    @classmethod
    def from_body(cls, body: Any) -> Self:
        fields = read_fields(cls, body, "error")  # first: a body that is no map says so
        return cls(error=ErrorPayload.from_body(body, "error message"), **fields)


@dataclass(slots=True)
class Control:
    """Coordinator -> worker, acknowledged: an operation and its arguments.

    Operations: ``seed``, ``reset``, ``state_dict``, ``load_state_dict``,
    ``getattr_policy``, ``getattr_env``, ``close``.
    """

    KIND: ClassVar[str] = "control"
    OPS: ClassVar[frozenset[str]] = frozenset(
        {"seed", "reset", "state_dict", "load_state_dict", "getattr_policy", "getattr_env",
         "close"}
    )
    op: str
    args: dict[str, Any] = field(default_factory=dict)

    def to_body(self) -> dict[str, Any]:
        return {"op": self.op, "args": self.args}

    @classmethod
    def from_body(cls, body: Any) -> Self:
        control = read(cls, body, "control")
        if control.op not in cls.OPS:
            raise ProtocolError(f"unknown control operation {control.op[:40]!r}; expected one "
                                f"of {sorted(cls.OPS)}")
        return control


__all__ = ["Batch", "Collect", "Control", "ErrorReport", "Preempt"]
