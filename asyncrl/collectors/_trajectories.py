"""Whole trajectories out of fixed-size batches: TorchRL 0.14's ``trajs_per_batch``.

Runs in the trainer on batches already received (never in the rollout's hot
loop). Frames are grouped by ``("collector", "traj_ids")``; a trajectory is
complete when its last frame is done (``("next", "done" | "terminated" |
"truncated")``), as TorchRL's ``_traj_ingest``. Complete trajectories leave in
completion order (inside one batch: by trajectory id), either as a padded
``[trajs_per_batch, max_len]`` batch with ``("collector", "mask")``, or
concatenated along time (``traj_format="cat"``), or all at once, flat, for a
replay buffer. Partial trajectories wait for their next frames; whatever is
still partial (or too few to fill a batch) when the collector stops is dropped,
as in TorchRL.
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

import torch
from tensordict import TensorDictBase, pad

from ._assemble import MASK_KEY

__all__ = ["TRAJ_FORMATS", "TrajectoryAssembler", "check_trajectory_options"]

TRAJ_FORMATS = ("padded", "cat")
_DONE_KEYS = (("next", "done"), ("next", "terminated"), ("next", "truncated"))
_TRAJ_IDS = ("collector", "traj_ids")


def check_trajectory_options(trajs_per_batch: Any, traj_format: Any, *, replay_buffer: Any,
                             split_trajs: bool, extend_buffer: Any) -> str:
    """TorchRL's checks of ``trajs_per_batch`` / ``traj_format`` / ``extend_buffer``.

    Returns the resolved ``traj_format``. ``traj_format=None`` resolves to
    ``"padded"`` with TorchRL's FutureWarning (its default becomes ``"cat"`` in
    0.16) when padded batches would be yielded.
    """
    if extend_buffer is not True:
        raise ValueError(
            f"extend_buffer={extend_buffer!r} is not supported: asyncrl writes whole batches "
            "(each frame once, flat) into replay_buffer, TorchRL's extend_buffer=True; "
            "TorchRL's step-by-step writes (extend_buffer=False) are deprecated there. "
            "Drop the argument")
    if trajs_per_batch is not None:
        if isinstance(trajs_per_batch, bool) or not isinstance(trajs_per_batch, int) \
                or trajs_per_batch < 1:
            raise ValueError(f"trajs_per_batch must be an int >= 1 (complete trajectories "
                             f"per batch) or None, got {trajs_per_batch!r}")
        if split_trajs:
            raise ValueError("trajs_per_batch already yields whole trajectories: use it "
                             "without split_trajs=True (traj_format='padded' pads and masks "
                             "them as split_trajs does)")
    if traj_format is None:
        if trajs_per_batch is not None and replay_buffer is None:
            warnings.warn(
                "trajs_per_batch is set but traj_format is not: batches are 'padded' (as "
                "TorchRL 0.14, whose default becomes 'cat' in v0.16). Pass "
                "traj_format='padded' or traj_format='cat' to choose",
                FutureWarning, stacklevel=4)
        return "padded"
    if traj_format not in TRAJ_FORMATS:
        raise ValueError(f"traj_format must be 'padded' or 'cat', got {traj_format!r}")
    if traj_format != "padded" and trajs_per_batch is None:
        raise ValueError("traj_format has no effect unless trajs_per_batch is set (the "
                         "number of complete trajectories per batch)")
    return str(traj_format)


class TrajectoryAssembler:
    """Collects frames into complete trajectories; see the module's docstring.

    >>> from tensordict import TensorDict
    >>> td = TensorDict({("collector", "traj_ids"): torch.tensor([0, 0, 1, 1, 1, 2]),
    ...                  ("next", "done"): torch.tensor([0, 1, 0, 0, 1, 0]).bool()[:, None]},
    ...                 [6])
    >>> assembler = TrajectoryAssembler(2, "padded")
    >>> assembler.ingest(td)
    >>> batch = assembler.pop_batch()
    >>> batch.batch_size, batch["collector", "mask"].sum().item()
    (torch.Size([2, 3]), 5)
    """

    def __init__(self, trajs_per_batch: int | None,
                 traj_format: Literal["padded", "cat"] | str = "padded") -> None:
        self.trajs_per_batch = trajs_per_batch
        self.traj_format = traj_format
        self._partial: dict[int, list[TensorDictBase]] = {}
        self._complete: list[TensorDictBase] = []

    def ingest(self, batch: TensorDictBase) -> None:
        """Route ``batch``'s frames to their trajectories (any batch shape: flattened)."""
        flat = batch.reshape(-1)
        if _TRAJ_IDS not in flat.keys(include_nested=True):
            raise KeyError("trajs_per_batch needs ('collector', 'traj_ids') in every batch; "
                           "a postproc must keep it")
        ids = flat.get(_TRAJ_IDS).reshape(-1)
        order = torch.argsort(ids, stable=True)
        flat, ids = flat[order], ids[order]
        unique, counts = ids.unique_consecutive(return_counts=True)
        start = 0
        for tid, count in zip(unique.tolist(), counts.tolist(), strict=True):
            chunk = flat[start:start + count]
            start += count
            self._partial.setdefault(tid, []).append(chunk)
            if _ends_done(chunk):
                chunks = self._partial.pop(tid)
                self._complete.append(torch.cat(chunks, 0) if len(chunks) > 1 else chunks[0])

    def drop_partial(self) -> None:
        """Forget unfinished trajectories (their envs were reset)."""
        self._partial.clear()

    def flush(self) -> None:
        """Forget everything (a full reset: TorchRL's ``_flush_trajectory_assembly``)."""
        self._partial.clear()
        self._complete.clear()

    @property
    def ready(self) -> bool:
        """Enough complete trajectories for one batch."""
        assert self.trajs_per_batch is not None
        return len(self._complete) >= self.trajs_per_batch

    def pop_batch(self) -> TensorDictBase:
        """The oldest ``trajs_per_batch`` complete trajectories, padded or concatenated."""
        n = self.trajs_per_batch
        assert n is not None and len(self._complete) >= n
        trajs, self._complete = self._complete[:n], self._complete[n:]
        if self.traj_format == "cat":
            return torch.cat(trajs, 0) if len(trajs) > 1 else trajs[0]
        max_len = max(t.shape[0] for t in trajs)
        padded = []
        for traj in trajs:
            traj = traj.copy()
            traj.set(MASK_KEY, torch.ones(traj.shape[0], dtype=torch.bool, device=traj.device))
            if traj.shape[0] < max_len:  # zeros after the last frame (mask False)
                traj = pad(traj, [0, max_len - traj.shape[0]])
            padded.append(traj)
        return torch.stack(padded, 0)

    def pop_all(self) -> TensorDictBase | None:
        """Every complete trajectory, concatenated flat (a replay buffer's write), or None."""
        trajs, self._complete = self._complete, []
        if not trajs:
            return None
        return torch.cat(trajs, 0) if len(trajs) > 1 else trajs[0]


def _ends_done(chunk: TensorDictBase) -> bool:
    keys = chunk.keys(include_nested=True)
    return any(key in keys and bool(chunk.get(key)[-1].any()) for key in _DONE_KEYS)
