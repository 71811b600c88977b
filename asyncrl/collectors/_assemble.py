"""Trainer-side batch shaping: joining workers' shares, padding with a mask, splitting trajectories.

Everything here runs in the trainer on batches already received (nothing in
the rollout's hot loop): :func:`split_trajectories` is TorchRL's ``split_trajs``
and marks real frames in ``("collector", "mask")``, TorchRL's key, where it pads.
The shares of a sync round are joined by the coordinator's batch sink
(:meth:`~asyncrl._coordinator.batch_sink.BatchSink.join`, through
:func:`~asyncrl._coordinator.round_gather.assemble`, re-exported here).
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase

from .._coordinator.round_gather import MASK_KEY, assemble
from .._errors import CollectorError

__all__ = ["MASK_KEY", "InfoCheck", "assemble", "drop_env_dim", "split_trajectories"]


def drop_env_dim(batch: TensorDictBase) -> TensorDictBase:
    """One worker's ``[envs, time]`` batch in TorchRL's layout: ``[time]`` for one env.

    >>> from tensordict import TensorDict
    >>> drop_env_dim(TensorDict({"x": torch.ones(1, 3)}, [1, 3])).batch_size
    torch.Size([3])
    >>> drop_env_dim(TensorDict({"x": torch.ones(2, 3)}, [2, 3])).batch_size
    torch.Size([2, 3])
    """
    return batch.squeeze(0) if batch.ndim == 2 and batch.shape[0] == 1 else batch


def split_trajectories(
    td: TensorDictBase, *, trajectory_key: Any = ("collector", "traj_ids")
) -> TensorDictBase:
    """Pad trajectories into ``[n_traj, max_len]``, as TorchRL's ``split_trajectories``.

    Trajectories are runs of equal ``traj_ids`` along the flattened (env-major)
    batch; the mask is written next to the ids (``("collector", "mask")``).

    >>> from tensordict import TensorDict
    >>> ids = torch.tensor([[0, 0, 1], [2, 2, 2]])
    >>> td = TensorDict({("collector", "traj_ids"): ids, "x": torch.ones(2, 3)}, [2, 3])
    >>> out = split_trajectories(td)
    >>> out.batch_size, out["collector", "mask"].sum().item()
    (torch.Size([3, 3]), 6)
    """
    key = (trajectory_key,) if isinstance(trajectory_key, str) else tuple(trajectory_key)
    mask_key = (*key[:-1], "mask")
    flat = td.reshape(-1)
    ids = flat.get(key)
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[1:] = ids[1:] != ids[:-1]
    traj = starts.cumsum(0) - 1  # trajectory index of each frame
    start_pos = torch.nonzero(starts).squeeze(-1)
    pos = torch.arange(ids.numel()) - start_pos[traj]  # position inside its trajectory
    n_traj = int(start_pos.numel())
    max_len = int(pos.max()) + 1 if ids.numel() else 0
    out = flat[:1].clone().zero_().expand(n_traj, max_len).clone()
    out[traj, pos] = flat
    mask = torch.zeros(n_traj, max_len, dtype=torch.bool)
    mask[traj, pos] = True
    out.set(mask_key[0] if len(mask_key) == 1 else mask_key, mask)
    return out


class InfoCheck:
    """The trainer's check of the ``info_keys`` entries in each worker's batch.

    A worker's rollout checks its own info against the specs of its first step;
    this checks what arrives against what was asked (a remote host's batch too):
    each asked entry present under ``"next"``, its leaves with the dtypes and
    per-frame shapes of the first batch received.

    >>> from tensordict import TensorDict
    >>> check = InfoCheck(((("steps",), None),))
    >>> share = TensorDict({("next", "steps"): torch.zeros(2, 3, dtype=torch.int64)}, [2, 3])
    >>> check.check("worker 0", share)
    >>> check.check("worker 1", TensorDict({}, [2, 3]))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    asyncrl._errors.CollectorError: worker 1's batch lacks ('next', 'steps'), ...
    """

    def __init__(self, info_keys: Any) -> None:
        self._paths = [("next", *path) for path, _ in info_keys or ()]
        self._leaves: dict[tuple[str, ...], tuple[torch.dtype, tuple[int, ...]]] = {}

    def check(self, worker: str, share: TensorDictBase) -> None:
        for path in self._paths:
            value = share.get(path, None)
            if value is None:
                raise CollectorError(
                    f"{worker}'s batch lacks {path}, which info_keys asked for and its "
                    "welcome told it to read: a host that does not apply the trainer's "
                    "rollout options is refused when it joins, so this one misbehaves; "
                    "check the asyncrl release and the env it runs")
            leaves = [(path, value)] if isinstance(value, torch.Tensor) else [
                ((*path, *((k,) if isinstance(k, str) else k)), v)
                for k, v in value.items(include_nested=True, leaves_only=True)]
            for leaf, tensor in leaves:
                self._check_leaf(worker, leaf, tensor, share.batch_dims)

    def _check_leaf(self, worker: str, leaf: tuple[str, ...], tensor: torch.Tensor,
                    dims: int) -> None:
        got = (tensor.dtype, tuple(tensor.shape[dims:]))
        want = self._leaves.setdefault(leaf, got)
        if got != want:
            raise CollectorError(
                f"{worker}'s batch has {leaf} as {got[0]} of per-frame shape {got[1]}, the "
                f"first batch had {want[0]} of shape {want[1]}: every worker's envs must "
                "give that info entry the same shape and dtype")
