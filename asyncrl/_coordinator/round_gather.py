"""A sync round's batch: gathered with one copy as its shares arrive, or joined at its end.

:func:`assemble` joins the workers' shares of a round in TorchRL's layout
(``cat_results``), padding short shares with a mask. Shares copied out of their
shared-memory slots first and joined after would copy every frame twice; here
the round's batch is allocated at the round's first shared-memory notice, in
the layout ``assemble`` gives for ``cat_results`` (all targets delivering whole
shares), and each notice's share is copied from its slot into its region at
once. So the slot is free again as soon as before: a worker never waits for the
whole round. A share that came over the socket (a worker's first batch, a
remote worker, a full ``/dev/shm``) is copied into its region when the round
ends: one copy, as ``assemble``'s. Short shares (``preemptive_threshold``) are
zero-padded with ``("collector", "mask")`` as ``assemble`` pads them.

When a round ends otherwise than planned (a target lost before delivering, a
departed worker's share re-planned, every share cut short, shares joined along
time cut short, a socket share of another layout), :meth:`RoundGather.finish`
returns None and ``assemble`` joins the shares, which are views of the buffer:
the same batch, with the second copy in those rare rounds only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from tensordict import TensorDict, TensorDictBase

from transports import copy_into

from .._errors import CollectorError
from .records import Round, WorkerInfo

#: Where padding is marked (TorchRL's key): True for a real frame, False for a pad.
MASK_KEY = ("collector", "mask")

Key = tuple[str, ...]
#: Copies a share into the views it is given (by key): a slot read through its descriptor.
Fill = Callable[[dict[Key, torch.Tensor]], None]


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


def join_mode(cat_results: str | int | None, single_env: bool) -> str:
    """How ``assemble`` joins shares: ``"stack"``, along ``"envs"`` or along ``"time"``.

    >>> join_mode("stack", True), join_mode(0, False), join_mode(-1, False), join_mode(0, True)
    ('stack', 'envs', 'time', 'time')
    """
    if cat_results == "stack":
        return "stack"
    dim = 0 if cat_results is None else int(cat_results)
    return "time" if single_env or dim in (1, -1) else "envs"


@dataclass(eq=False)
class _Plan:
    """One round's batch: its tensors, and where each target's share goes in them."""

    request: int
    order: list[bytes]  # the targets' peers, by worker index (assemble's order)
    steps: list[int]  # each target's whole share, in steps
    envs: int
    mode: str
    leaves: dict[Key, tuple[torch.dtype, torch.Size]]  # per-frame dtype and shape
    device: str | None
    batch: TensorDict = field(init=False)
    canvas: dict[Key, torch.Tensor] = field(init=False)  # [rows, columns, ...] views
    columns: list[int] = field(init=False)  # each target's first column
    width: int = field(init=False)  # columns: the longest share, or all shares in a row
    written: dict[bytes, TensorDictBase] = field(default_factory=dict)

    def __post_init__(self) -> None:
        workers, envs, time_mode = len(self.order), self.envs, self.mode == "time"
        self.width = sum(self.steps) if time_mode else max(self.steps)
        self.columns = [sum(self.steps[:i]) if time_mode else 0 for i in range(workers)]
        if time_mode:
            shape = [self.width] if envs == 1 else [envs, self.width]
        elif self.mode == "stack":
            shape = [workers, self.width] if envs == 1 else [workers, envs, self.width]
        else:
            shape = [workers * envs, self.width]
        self.batch = TensorDict({}, batch_size=shape, device=self.device)
        self.canvas = {}
        for key, (dtype, frame) in self.leaves.items():
            out = torch.empty((*shape, *frame), dtype=dtype)
            self.batch.set(key if len(key) > 1 else key[0], out)
            rows = envs if time_mode else workers * envs
            self.canvas[key] = out.view(rows, self.width, *frame)

    def region(self, position: int, steps: int) -> dict[Key, torch.Tensor]:
        """The views where the share of ``order[position]`` (``steps`` long) goes."""
        if self.mode == "time":
            rows = slice(None)
        else:
            rows = slice(position * self.envs, (position + 1) * self.envs)
        first = self.columns[position]
        return {key: view[rows, first:first + steps] for key, view in self.canvas.items()}

    def fits(self, share: TensorDictBase, position: int) -> bool:
        """A share that did not come through a slot: can it be copied into its region?"""
        if (share.batch_dims != 2 or share.shape[0] != self.envs
                or not 0 < share.shape[1] <= self.steps[position] or share.device != (
                    None if self.device is None else torch.device(self.device))):
            return False
        count = 0
        for key, value in share.items(include_nested=True, leaves_only=True):
            count += 1
            leaf = self.leaves.get((key,) if isinstance(key, str) else tuple(key))
            if (leaf is None or not isinstance(value, torch.Tensor) or value.device.type != "cpu"
                    or (value.dtype, value.shape[2:]) != leaf):
                return False
        return count == len(self.leaves)


class RoundGather:
    """The current sync round's batch, gathered as its shares arrive (see the module docstring).

    >>> from asyncrl._coordinator.records import Round, WorkerInfo
    >>> workers = [WorkerInfo(i, f"w{i}".encode(), f"w{i}", "h", i) for i in range(2)]
    >>> round_ = Round(1, {w.peer: w for w in workers})
    >>> gather = RoundGather("stack", share_frames=[3, 3])
    >>> leaves = {("x",): torch.arange(3.0).view(1, 3)}
    >>> for w in workers:
    ...     round_.shares[w.peer] = gather.take(round_, w, leaves, None)
    >>> gather.finish(list(round_.shares.values()))["x"]
    tensor([[0., 1., 2.],
            [0., 1., 2.]])
    """

    def __init__(self, cat_results: str | int | None, *, share_frames: list[int]) -> None:
        self.cat_results = cat_results
        self.share_frames = share_frames
        self._plan: _Plan | None = None
        self._unplanned = -1  # a request no plan could be made for: not tried again

    def take(self, round_: Round, worker: WorkerInfo, sources: dict[Key, torch.Tensor],
             device: str | None, fill: Fill | None = None) -> TensorDictBase | None:
        """Copy ``worker``'s share (``sources``: ``[envs, steps, ...]`` slot views) into its
        region of ``round_``'s batch; the share as views of that region, or None (the
        caller copies it out itself: not a share this round planned for).

        ``fill``: copies the share into the region's views itself (``sources`` then only
        give shapes and dtypes, e.g. meta tensors); if it raises, nothing is taken.
        """
        if worker.peer not in round_.targets or worker.peer in round_.shares:
            return None  # a stale or second share: the rounds discard or re-plan it
        plan = self._plan_for(round_, sources, device)
        if plan is None or worker.peer not in plan.order:
            return None
        envs, steps = next(iter(sources.values())).shape[:2]
        position = plan.order.index(worker.peer)
        if envs != plan.envs or steps > plan.steps[position] or {
                k: (v.dtype, v.shape[2:]) for k, v in sources.items()} != plan.leaves:
            return None
        region = plan.region(position, steps)
        if fill is not None:
            fill(region)
        else:
            for key, source in sources.items():
                _copy(region[key], source)
        share = TensorDict({}, batch_size=[envs, steps], device=device)
        for key in sources:
            share.set(key if len(key) > 1 else key[0], region[key])
        plan.written[worker.peer] = share
        return share

    def finish(self, shares: list[TensorDictBase]) -> TensorDictBase | None:
        """The round's batch if ``shares`` (its shares, in ``assemble``'s order) are what
        was planned: socket shares copied in, pads zeroed and masked. None: join them
        with ``assemble`` (the shares this gathered are views of a buffer, still valid)."""
        plan, self._plan = self._plan, None
        if plan is None or len(shares) != len(plan.order):
            return None
        for position, share in enumerate(shares):
            written = plan.written.get(plan.order[position])
            if share is not written and (written is not None or not plan.fits(share, position)):
                return None
        lengths = [share.shape[1] for share in shares]
        if lengths != plan.steps if plan.mode == "time" else max(lengths) != plan.width:
            return None  # along time the regions would move; every share short: narrower
        for position, share in enumerate(shares):
            if share is not plan.written.get(plan.order[position]):
                region = plan.region(position, lengths[position])
                for key, value in share.items(include_nested=True, leaves_only=True):
                    _copy(region[(key,) if isinstance(key, str) else tuple(key)], value)
        if len(set(lengths)) > 1:  # stack / envs: pad short shares as assemble does
            _pad(plan, lengths)
        return plan.batch

    def _plan_for(self, round_: Round, sources: dict[Key, torch.Tensor],
                  device: str | None) -> _Plan | None:
        plan = self._plan
        if plan is not None and plan.request == round_.request:
            return plan
        self._plan = None
        if self._unplanned == round_.request or round_.replacements or round_.owed:
            return None  # newcomers or re-planned shares will join: assemble joins this one
        envs = next(iter(sources.values())).shape[0]
        order = [w.peer for w in sorted(round_.targets.values(), key=lambda w: w.index)]
        shares = [self._share(w.index) for w in sorted(round_.targets.values(),
                                                       key=lambda w: w.index)]
        if envs == 0 or any(share <= 0 or share % envs for share in shares):
            self._unplanned = round_.request
            return None
        leaves = {k: (v.dtype, v.shape[2:]) for k, v in sources.items()}
        self._plan = _Plan(round_.request, order, [s // envs for s in shares], envs,
                           join_mode(self.cat_results, envs == 1), leaves, device)
        return self._plan

    def _share(self, index: int) -> int:
        shares = self.share_frames
        return shares[index] if 0 <= index < len(shares) else shares[0]


def _copy(destination: torch.Tensor, source: torch.Tensor) -> None:
    """One memcpy per env row: a region's rows are contiguous, the region need not be."""
    if destination.is_contiguous() and source.is_contiguous():
        copy_into(destination, source)
        return
    for row in range(destination.shape[0]):
        copy_into(destination[row], source[row])


def _pad(plan: _Plan, lengths: list[int]) -> None:
    mask = torch.zeros(plan.batch.batch_size, dtype=torch.bool)
    mask_rows = mask.view(len(plan.order) * plan.envs, plan.width)
    for position, length in enumerate(lengths):
        rows = slice(position * plan.envs, (position + 1) * plan.envs)
        mask_rows[rows, :length] = True
        if length < plan.width:
            for view in plan.canvas.values():
                view[rows, length:].zero_()
    plan.batch.set(MASK_KEY, mask)


__all__ = ["MASK_KEY", "RoundGather", "assemble", "join_mode"]
