"""Collecting: the coordinator's requests (collect, preempt, control) and a worker's
answers (a batch, an error report).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Self

from tensordict import TensorDictBase

from transports import ErrorPayload, ProtocolError

from .compact_frames import Patch, rebuild
from .fields import optional_int, optional_text, required


@dataclass(slots=True)
class Collect:
    """Coordinator -> worker: collect ``credits`` batches for request ``request``."""

    KIND: ClassVar[str] = "collect"
    request: int
    credits: int = 1

    def to_body(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: Any) -> Self:
        credits = required(body, "credits", int, "collect")
        if not 0 < credits <= 1 << 20:
            raise ProtocolError(f"collect credits must be in 1..2**20, got {credits}")
        return cls(request=required(body, "request", int, "collect"), credits=credits)


@dataclass(slots=True)
class Preempt:
    """Coordinator -> worker: stop the batch for ``request`` now and send what you have."""

    KIND: ClassVar[str] = "preempt"
    request: int

    def to_body(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_body(cls, body: Any) -> Self:
        return cls(request=required(body, "request", int, "preempt"))


@dataclass(slots=True)
class Batch:
    """Worker -> coordinator: the frames of one batch.

    ``next``: the compact form's patch (see :mod:`.compact_frames`): the frames
    then lack the ``("next", K)`` entries it rebuilds. ``from_body`` rebuilds
    them, so a received batch always has TorchRL's full layout.
    """

    KIND: ClassVar[str] = "batch"
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
        frames = required(body, "frames", TensorDictBase, "batch")
        if max_frames is not None:
            _check_claim(list(frames.batch_size), max_frames)
        if body.get("next") is not None:
            frames = rebuild(frames, body["next"])
        return cls(request=required(body, "request", int, "batch"), frames=frames)


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
    error: ErrorPayload
    fatal: bool = True
    #: A local worker that fails before its hello (building its env or policy) is not
    #: admitted yet: its slot and spawn token vouch for the report instead.
    slot: int = -1
    token: str = ""

    def to_body(self) -> dict[str, Any]:
        return {**self.error.to_body(), "fatal": self.fatal, "slot": self.slot,
                "token": self.token}

    @classmethod
    def from_body(cls, body: Any) -> Self:
        return cls(
            error=ErrorPayload.from_body(body, "error message"),
            fatal=required(body, "fatal", bool, "error"),
            slot=optional_int(body, "slot", "error", default=-1),
            token=optional_text(body, "token", "error", limit=200),
        )


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
        op = required(body, "op", str, "control")
        if op not in cls.OPS:
            raise ProtocolError(f"unknown control operation {op!r}; expected one of "
                                f"{sorted(cls.OPS)}")
        return cls(op=op, args=required(body, "args", dict, "control"))


__all__ = ["Batch", "Collect", "Control", "ErrorReport", "Preempt"]
