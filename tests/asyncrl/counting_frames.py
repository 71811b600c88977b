"""What every frame of :class:`asyncrl.testing.CountingEnv` episodes must hold.

Shared by the AsyncBatchedCollector tests (local and remote env hosts): each
trajectory of a batch is one episode's frames, in order.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict


def check_counting_frames(frames: TensorDict, *, length: int, action: int | None = None) -> None:
    """Every frame of CountingEnv(length) episodes, trajectory by trajectory, in order.

    ``action``: the action every frame carries (a constant policy); None: not checked.
    """
    traj = frames["collector", "traj_ids"]
    for tid in traj.unique().tolist():
        t = frames[traj == tid]
        steps = t["observation"][:, 0].tolist()
        assert steps == list(range(int(steps[0]), int(steps[0]) + len(steps))), steps
        assert (t["next", "observation"][:, 0] == t["observation"][:, 0] + 1).all()
        assert (t["observation"][:, 1] == t["observation"][0, 1]).all()  # one episode
        ends = (t["next", "observation"][:, 0] == length).unsqueeze(-1)
        assert torch.equal(t["next", "terminated"], ends)
        assert torch.equal(t["next", "done"], ends)
        assert not t["next", "truncated"].any() and not t["done"].any()
        assert (t["next", "reward"] == 1).all()
        if action is not None:
            assert (t["action"] == action).all()
        assert (t["collector", "worker_id"] == tid >> 32).all()
