"""Trainer-side batch shaping: joining workers' shares, padding with a mask, splitting trajectories.

Everything here runs in the trainer on batches already received (nothing in
the rollout's hot loop): :func:`assemble` joins the shares of one sync round
(padding unequal lengths, as a preempted round has), :func:`split_trajectories`
is TorchRL's ``split_trajs``. Both mark real frames in ``("collector", "mask")``,
TorchRL's key, where they pad.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from .._coordinator.round_gather import MASK_KEY, RoundGather, join_mode
from .._errors import CollectorError

__all__ = ["MASK_KEY", "InfoCheck", "assemble", "drop_env_dim", "split_trajectories"]


def assemble(shares: list[TensorDictBase], cat_results: str | int | None, *,
             gather: RoundGather | None = None) -> TensorDictBase:
    """Join the workers' ``[envs, time]`` shares in TorchRL's layout.

    ``cat_results`` is ``"stack"`` or the dim to concatenate along (None: 0).
    Workers with more than one env keep the env dim (a batched env in TorchRL):
    ``"stack"`` gives ``[workers, envs, time]``, 0 / -2 ``[workers * envs,
    time]``, 1 / -1 ``[envs, workers * time]``. Workers with one env have no env
    dim (an unbatched env in TorchRL): ``"stack"`` gives ``[workers, time]``,
    any dim ``[workers * time]``. Unequal lengths (preemption) are zero-padded
    with ``("collector", "mask")`` when stacked or joined along envs; joined
    along time they are simply concatenated (TorchRL drops the missing frames).

    ``gather``: the round's batch, already gathered from shared memory with one
    copy per frame (:mod:`asyncrl._coordinator.round_gather`), is the result when
    these shares are the ones it planned for; otherwise they are joined here.

    >>> full = TensorDict({"x": torch.ones(2, 3)}, [2, 3])
    >>> cut = TensorDict({"x": torch.ones(2, 1)}, [2, 1])  # a preempted share
    >>> batch = assemble([full, cut], 0)
    >>> batch.batch_size, batch["collector", "mask"].sum().item()
    (torch.Size([4, 3]), 8)
    >>> one_env = TensorDict({"x": torch.ones(1, 3)}, [1, 3])
    >>> assemble([one_env, one_env], "stack").batch_size, assemble([one_env] * 2, 0).batch_size
    (torch.Size([2, 3]), torch.Size([6]))
    """
    if not shares:
        raise CollectorError("no share to assemble")
    if gather is not None and (gathered := gather.finish(shares)) is not None:
        return gathered
    single_env = all(s.shape[0] == 1 for s in shares)
    along_time = join_mode(cat_results, single_env) == "time"
    lengths = {s.shape[-1] for s in shares}
    if len(lengths) > 1 and not along_time:
        shares = _pad_time(shares, max(lengths))
    if cat_results == "stack":
        batch = torch.stack(shares, 0)
        return batch.squeeze(1) if single_env else batch
    if along_time:
        batch = torch.cat(shares, -1)
        return batch.squeeze(0) if single_env else batch
    return torch.cat(shares, 0)


def drop_env_dim(batch: TensorDictBase) -> TensorDictBase:
    """One worker's ``[envs, time]`` batch in TorchRL's layout: ``[time]`` for one env.

    >>> drop_env_dim(TensorDict({"x": torch.ones(1, 3)}, [1, 3])).batch_size
    torch.Size([3])
    >>> drop_env_dim(TensorDict({"x": torch.ones(2, 3)}, [2, 3])).batch_size
    torch.Size([2, 3])
    """
    return batch.squeeze(0) if batch.ndim == 2 and batch.shape[0] == 1 else batch


def _pad_time(shares: list[TensorDictBase], length: int) -> list[TensorDictBase]:
    padded = []
    for share in shares:
        n, t = share.shape[0], share.shape[-1]
        out = share.new_zeros((*share.shape[:-1], length)) if hasattr(share, "new_zeros") \
            else _zeros_like(share, length)
        out[..., :t] = share
        mask = torch.zeros((n, length), dtype=torch.bool)
        mask[..., :t] = True
        out.set(MASK_KEY, mask)
        padded.append(out)
    return padded


def _zeros_like(share: TensorDictBase, length: int) -> TensorDictBase:
    return TensorDict(
        {k: torch.zeros((*v.shape[:1], length, *v.shape[2:]), dtype=v.dtype)
         for k, v in share.items(include_nested=True, leaves_only=True)},
        batch_size=[share.shape[0], length])


def split_trajectories(
    td: TensorDictBase, *, trajectory_key: Any = ("collector", "traj_ids")
) -> TensorDictBase:
    """Pad trajectories into ``[n_traj, max_len]``, as TorchRL's ``split_trajectories``.

    Trajectories are runs of equal ``traj_ids`` along the flattened (env-major)
    batch; the mask is written next to the ids (``("collector", "mask")``).

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
