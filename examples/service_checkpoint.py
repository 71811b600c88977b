"""What the service needs to continue a run after a restart: one checkpoint file.

``ASYNCRL_CHECKPOINT`` names the file (on a volume that outlives the pod: a
PersistentVolumeClaim); the service writes it every ``ASYNCRL_CHECKPOINT_EVERY``
training steps and once more when it stops (SIGTERM), and reads it at start. It
holds the policy's and the optimiser's state dicts and the run's counters (frames
and batches handed to the trainer, training steps, the policy version). Writes are
atomic (a temporary file in the same directory, fsync, rename): a node lost in
the middle of a write leaves the previous checkpoint whole. Reads use
``torch.load(weights_only=True)``: tensors and plain containers only, no pickled code.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

#: Bumped when the file's layout changes; a file of another format is refused.
FORMAT = 1
COUNTERS = ("frames", "batches", "updates", "policy_version")


@dataclass(frozen=True)
class RunState:
    """A run's state as saved: ``policy`` and ``optimizer`` state dicts and its counters.

    >>> RunState({}, {}, frames=512, batches=2, updates=2, policy_version=1).frames
    512
    """

    policy: dict[str, Any]
    optimizer: dict[str, Any]
    frames: int = 0
    batches: int = 0
    updates: int = 0
    policy_version: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "policy": self.policy, "optimizer": self.optimizer,
                **{name: getattr(self, name) for name in COUNTERS}}

    @classmethod
    def from_dict(cls, data: Any, path: Path) -> RunState:
        """Check what ``torch.load`` returned (a file may be foreign or truncated)."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"{path} is not an asyncrl service checkpoint of format {FORMAT} "
                             f"(found {found!r}): move it away to start afresh")
        for name in ("policy", "optimizer"):
            if not isinstance(data.get(name), dict):
                raise ValueError(f"{path}: expected a state dict under {name!r}")
        counts = {name: data.get(name) for name in COUNTERS}
        bad = {k: v for k, v in counts.items() if not isinstance(v, int) or v < 0}
        if bad:
            raise ValueError(f"{path}: expected counters >= 0, got {bad}")
        return cls(data["policy"], data["optimizer"], **counts)


class Checkpoint:
    """Save and load a :class:`RunState` at ``path`` (atomically; tensors only).

    >>> import tempfile, pathlib
    >>> ckpt = Checkpoint(pathlib.Path(tempfile.mkdtemp()) / "run.pt")
    >>> ckpt.load() is None        # nothing saved yet: a fresh run
    True
    >>> ckpt.save(RunState({"w": torch.ones(2)}, {}, frames=64, batches=1))
    >>> ckpt.load().frames
    64
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def save(self, state: RunState) -> None:
        directory = self.path.parent
        directory.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=directory)
        try:
            with os.fdopen(fd, "wb") as file:
                torch.save(state.to_dict(), file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, self.path)  # atomic on POSIX: old or new, never half
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        _fsync_directory(directory)  # the rename itself survives a power loss

    def load(self) -> RunState | None:
        """The saved state, or None if there is no checkpoint yet."""
        try:
            data = torch.load(self.path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            return None
        except Exception as exc:  # truncated, foreign, or pickled code (weights_only)
            raise ValueError(f"cannot load the checkpoint {self.path}: {exc}; move it away "
                             "to start afresh") from exc
        return RunState.from_dict(data, self.path)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["FORMAT", "Checkpoint", "RunState"]
