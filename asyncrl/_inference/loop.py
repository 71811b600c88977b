"""The central inference loop: batch the env workers' requests, run the policy once, answer.

Each env worker owns two shared-memory blocks (:class:`transports.SharedTensorBlock`):
its observations (written by the worker) and its policy outputs (written here,
stamped with the policy version). A request is the worker's slot number; the
observations are already in its block. :meth:`InferenceLoop.run` waits until
``min_batch_size`` observations are pending (or ``server_timeout`` passed since
the first one), takes whole requests up to ``max_batch_size`` observations,
and in one worker thread copies their observations into a preallocated batch,
runs the policy once on its device and copies each worker's rows back into its
response block. Then it answers each worker.

Versions: the loop holds a lock from reading the version to the last response
written; :meth:`InferenceLoop.update` takes the same lock to change the weights
and the version. So an update lands between two calls, never inside one, and
every row of a call carries the version of the weights that computed it.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import anyio
import torch
from tensordict import TensorDict

from transports import SharedTensorBlock

from .._rollout.policies import PolicyAdapter

Path = tuple[str, ...]
_RESERVED_ROOT = frozenset({"action", "done", "terminated", "truncated", "next", "collector"})


class InferenceStatistics(NamedTuple):
    """What the loop did: policy calls, observations served, calls per batch size."""

    calls: int
    observations: int
    batch_sizes: dict[int, int]


@dataclass
class OutputLayout:
    """What the policy writes for a batch of ``n``: ``action`` and the extras, per row."""

    action: tuple[torch.dtype, tuple[int, ...]]
    extras: list[tuple[Path, torch.dtype, tuple[int, ...]]] = field(default_factory=list)

    def block_tensors(self, rows: int) -> dict[str, torch.Tensor]:
        dtype, shape = self.action
        out = {"action": torch.zeros((rows, *shape), dtype=dtype)}
        for j, (_, dt, sh) in enumerate(self.extras):
            out[f"x{j}"] = torch.zeros((rows, *sh), dtype=dt)
        return out


def _key(path: Path) -> Any:
    return path[0] if len(path) == 1 else path


def discover_outputs(adapter: PolicyAdapter, obs: dict[Path, torch.Tensor],
                     action: tuple[torch.dtype, tuple[int, ...]]) -> OutputLayout:
    """Call the policy once on ``obs`` (batch of 1): which keys, shapes and dtypes does it write?"""
    td = TensorDict({_key(p): v for p, v in obs.items()}, batch_size=[1])
    with adapter.exploration():
        td = adapter(td)
    dtype, shape = action
    got = td.get("action", None)
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != (1, *shape):
        raise ValueError(f"the policy must write 'action' of shape (batch, *{shape}); for a "
                         f"batch of 1 it wrote {None if got is None else tuple(got.shape)}")
    if got.dtype.is_floating_point and not dtype.is_floating_point:
        raise ValueError(f"the policy writes {got.dtype} actions, the env takes {dtype}: "
                         "round or sample integer actions in the policy (never cast silently)")
    extras = []
    for key in td.keys(include_nested=True, leaves_only=True):
        path = (key,) if isinstance(key, str) else tuple(key)
        if path in obs or path == ("action",):
            continue
        if path[0] in _RESERVED_ROOT:
            raise ValueError(f"the policy wrote the reserved key {path!r}")
        value = td.get(key)
        if not isinstance(value, torch.Tensor) or value.shape[:1] != (1,):
            raise ValueError(f"the policy wrote {path!r} as {type(value).__name__}: expected a "
                             "tensor with the batch as its first dimension")
        extras.append((path, value.dtype, tuple(value.shape[1:])))
    return OutputLayout(action=action, extras=extras)


@dataclass
class WorkerBlocks:
    """One env worker's request and response blocks, and its number of envs."""

    rows: int
    obs: SharedTensorBlock
    act: SharedTensorBlock

    def close(self) -> None:
        for block in (self.obs, self.act):
            block.close()
            block.unlink()


class InferenceLoop:
    """Serve the requests of many env workers with one policy call per batch.

    ``blocks[slot]`` are the shared-memory blocks of worker ``slot``; ``reply(slot,
    version)`` tells that worker its outputs are ready. ``gate()`` is awaited before
    each call: the collector uses it for back-pressure (no answers while its
    buffer of collected frames is full, so the env workers wait).
    """

    def __init__(self, adapter: PolicyAdapter, blocks: dict[int, WorkerBlocks], *,
                 obs_paths: Sequence[Path], outputs: OutputLayout,
                 device: torch.device | None, max_batch_size: int, min_batch_size: int,
                 server_timeout: float, version: int = 0,
                 inline_below: float = 0.002) -> None:
        self.adapter = adapter
        self.blocks = blocks
        self.obs_paths = list(obs_paths)
        self.outputs = outputs
        self.device = device
        self.max_batch_size = max_batch_size
        self.min_batch_size = min_batch_size
        self.server_timeout = server_timeout
        #: The version of the weights the next call uses.
        self.version = version
        self._pending: collections.deque[int] = collections.deque()
        self._pending_rows = 0
        self._arrived: anyio.Event | None = None
        self._lock = anyio.Lock()
        # Short calls run on the event loop: a hop to a worker thread and back costs two
        # thread wake-ups per call, more than the policy itself on a small MLP. Long
        # ones (a big network, a GPU) run in a thread, so the loop keeps reading meanwhile.
        self.inline_below = inline_below
        self._inline = False
        self._durations: collections.deque[float] = collections.deque([1.0], maxlen=8)
        self._calls = 0
        self._observations = 0
        self._sizes: collections.Counter[int] = collections.Counter()
        capacity = max_batch_size
        layout = next(iter(blocks.values())).obs.layout if blocks else {}
        self._obs = {f"o{i}": torch.zeros((capacity, *layout[f"o{i}"][1][1:]),
                                          dtype=layout[f"o{i}"][0])
                     for i in range(len(self.obs_paths))}
        self._batch = TensorDict({_key(p): self._obs[f"o{i}"]
                                  for i, p in enumerate(self.obs_paths)},
                                 batch_size=[capacity])

    # -- requests ---------------------------------------------------------------------------
    def submit(self, slot: int) -> None:
        """Worker ``slot`` wrote its observations: serve it in a coming call."""
        self._pending.append(slot)
        self._pending_rows += self.blocks[slot].rows
        if self._arrived is not None:
            self._arrived.set()

    def statistics(self) -> InferenceStatistics:
        return InferenceStatistics(self._calls, self._observations, dict(self._sizes))

    async def _wait(self, rows: int) -> None:
        while self._pending_rows < rows:
            self._arrived = anyio.Event()
            await self._arrived.wait()

    async def _next_requests(self) -> list[int]:
        await self._wait(1)
        if self._pending_rows < self.min_batch_size:
            with anyio.move_on_after(self.server_timeout):
                await self._wait(self.min_batch_size)
        taken: list[int] = []
        rows = 0
        while self._pending:
            slot = self._pending[0]
            n = self.blocks[slot].rows
            if taken and rows + n > self.max_batch_size:
                break
            taken.append(self._pending.popleft())
            rows += n
        self._pending_rows -= rows
        return taken

    # -- the loop ------------------------------------------------------------------------------
    async def run(self, reply: Callable[[int, int], Awaitable[None]],
                  gate: Callable[[], Awaitable[None]] | None = None) -> None:
        """Serve forever (cancel to stop)."""
        while True:
            if gate is not None:
                await gate()
            slots = await self._next_requests()
            async with self._lock:
                version = self.version
                if self._inline:
                    rows = self._serve(slots, version)
                else:
                    rows = await anyio.to_thread.run_sync(self._serve, slots, version)
                # The shortest of the last few calls (preemption only ever adds time),
                # timed inside _serve: a thread hop must not count as policy time.
                self._inline = min(self._durations) < self.inline_below
            self._calls += 1
            self._observations += rows
            self._sizes[rows] += 1
            for slot in slots:
                await reply(slot, version)

    def _serve(self, slots: list[int], version: int) -> int:
        """Gather, one policy call, scatter (in a worker thread, or inline when short)."""
        start = time.perf_counter()
        row = 0
        for slot in slots:
            blocks = self.blocks[slot]
            n = blocks.rows
            blocks.obs.read_into({k: v[row:row + n] for k, v in self._obs.items()}, 0)
            row += n
        td = self._batch[:row]
        if self.device is not None and self.device.type != "cpu":
            td = td.to(self.device, non_blocking=True)
        with self.adapter.exploration():
            td = self.adapter(td)
        outputs = [td.get("action")] + [td.get(_key(p)) for p, _, _ in self.outputs.extras]
        if self.device is not None and self.device.type != "cpu":
            outputs = [o.to("cpu") for o in outputs]
        keys = ["action"] + [f"x{j}" for j in range(len(self.outputs.extras))]
        row = 0
        for slot in slots:
            blocks = self.blocks[slot]
            n = blocks.rows
            blocks.act.write({k: o[row:row + n] for k, o in zip(keys, outputs, strict=True)},
                             version=version, slot=0)
            row += n
        self._durations.append(time.perf_counter() - start)
        return row

    # -- weights ---------------------------------------------------------------------------------
    async def update(self, apply: Callable[[], None]) -> int:
        """Run ``apply`` (which changes the weights) between two calls; return the new version.

        Returns once the change is made: the next call uses the new weights.
        """
        async with self._lock:
            await anyio.to_thread.run_sync(apply)
            self.version += 1
            return self.version


def make_blocks(rows_per_worker: Sequence[int], obs: dict[Path, torch.Tensor],
                outputs: OutputLayout) -> dict[int, WorkerBlocks]:
    """Create each worker's two blocks (one slot each: a request and its answer alternate)."""
    blocks: dict[int, WorkerBlocks] = {}
    try:
        for slot, rows in enumerate(rows_per_worker):
            example = {f"o{i}": torch.zeros((rows, *t.shape[1:]), dtype=t.dtype)
                       for i, t in enumerate(obs.values())}
            obs_block = SharedTensorBlock.create(example, slots=1)
            try:
                act_block = SharedTensorBlock.create(outputs.block_tensors(rows), slots=1)
            except BaseException:
                obs_block.close()
                obs_block.unlink()
                raise
            blocks[slot] = WorkerBlocks(rows, obs_block, act_block)
    except BaseException:
        for b in blocks.values():
            b.close()
        raise
    return blocks


def auto_chunk_steps(frames_per_batch: int, num_envs: int) -> int:
    """Steps per chunk: up to 64 (TorchRL's figure), at most one batch's share per env."""
    return max(1, min(64, math.ceil(frames_per_batch / num_envs)))


__all__ = ["InferenceLoop", "InferenceStatistics", "OutputLayout", "WorkerBlocks",
           "auto_chunk_steps", "discover_outputs", "make_blocks"]
