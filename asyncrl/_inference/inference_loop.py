"""The central inference loop: batch the env workers' requests, run the policy once, answer.

Each env worker owns two shared-memory blocks (:class:`transports.SharedTensorBlock`):
its observations (written by the worker) and its policy outputs (written here,
stamped with the policy version). A local request costs no message: the worker
writes its observations (the block's sequence number moves by two) and rings
the request bell (:mod:`.doorbell`); the answer is the output block's sequence
number moving, and a ring of that worker's answer bell. A worker whose envs step
in splits (``splits`` > 1, Sample Factory's double buffering) has one block slot per
split, and each split asks on its own: the loop serves *lanes*, a local worker's
splits or a remote worker's one request (:func:`lane`).

:meth:`InferenceLoop.serve` runs in a thread of its own (the trainer's, or the
dedicated inference process's): it waits on the request bell (spinning a few
microseconds first), gathers every request that is ready (dynamic batching),
waits until ``min_batch_size`` observations are pending (or ``server_timeout``
passed since the first one), takes whole requests up to ``max_batch_size``
observations, copies their observations into a preallocated batch, runs the
policy once on its device, writes each worker's rows into its output block and
rings each worker. Requests of remote env workers (:meth:`submit`, from the
event loop) join the same batches; their answers go back through the event
loop (:meth:`relay_remote_answers`), which sends them over ZeroMQ.

Versions: the loop holds a lock from reading the version to the last answer
written; :meth:`InferenceLoop.update` takes the same lock to change the weights
and the version. So an update lands between two calls, never inside one, and
every row of a call carries the version of the weights that computed it.
Back-pressure and pause (:meth:`set_room`, :meth:`held`) are checked under the
same lock before each call.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple

import anyio
import torch
from tensordict import TensorDict
from tensordict.nn import set_interaction_type

from .._rollout.policies import PolicyAdapter
from .._spawn.threads import use_torch_threads
from .block_io import SlotArrays, array_of, copier
from .device_batch import DeviceBatch
from .doorbell import DEFAULT_SPIN, EventFd, spin_then_block
from .graphed_batch import GraphedDeviceBatch
from .outputs import OutputLayout, key_of
from .worker_blocks import SPLIT_BITS, WorkerBlocks, lane

Path = tuple[str, ...]
#: A call longer than this (seconds) is followed by ``sched_yield()``: the env workers it
#: answered run (their stepping threads do not preempt this one, see
#: :func:`.doorbell.no_wakeup_preemption`) and ask again before the loop scans, so the
#: next call gathers them all instead of serving a lone request at once (a 50 ms policy,
#: 4 env workers on 2 cores: 2.0 observations per call without it, 2.6 with it).
YIELD_AFTER = 1e-3
class InferenceStatistics(NamedTuple):
    """What the loop did: policy calls, observations served, calls per batch size."""

    calls: int
    observations: int
    batch_sizes: dict[int, int]


class InferenceLoop:
    """Serve the requests of many env workers with one policy call per batch.

    ``blocks[slot]`` are the shared-memory blocks of worker ``slot`` (``obs_spec``, each
    observation's dtype and per-env shape, is read from them unless given: a loop that
    starts with remote slots only has none yet). A local worker
    (a slot in ``answer_bells``) asks by writing its observation block and ringing
    ``request_bell``, and is answered through its output block and its bell; any
    other slot (a remote env worker) asks through :meth:`submit` and is answered
    by :meth:`relay_remote_answers`. Run :meth:`run` in a task group (it serves
    from a thread of its own; cancel it to stop).
    """

    def __init__(self, adapter: PolicyAdapter, blocks: dict[int, WorkerBlocks], *,
                 obs_paths: Sequence[Path], outputs: OutputLayout,
                 device: torch.device | None, max_batch_size: int, min_batch_size: int,
                 server_timeout: float, version: int = 0,
                 request_bell: EventFd | None = None,
                 answer_bells: dict[int, EventFd] | None = None,
                 spin: float = DEFAULT_SPIN, threads: int | None = None,
                 obs_spec: Sequence[tuple[torch.dtype, tuple[int, ...]]] | None = None,
                 static_batch_size: int | None = None) -> None:
        self.adapter = adapter
        self.blocks = blocks
        self.obs_paths = list(obs_paths)
        self.outputs = outputs
        self.device = device
        self.max_batch_size = max_batch_size
        self.min_batch_size = min_batch_size
        self.server_timeout = server_timeout
        self.spin = spin
        #: torch intra-op threads for the policy's calls (None: leave the thread's count)
        self.threads = threads
        #: The version of the weights the next call uses.
        self.version = version
        self.request_bell = request_bell if request_bell is not None else EventFd()
        self._own_bell = request_bell is None
        self.answer_bells = dict(answer_bells or {})
        # Local lanes' block slots as arrays and control words (.block_io): a step reads
        # and writes them with no call into the block.
        self._io: dict[int, tuple[SlotArrays, SlotArrays]] = {}
        self._lane_rows: dict[int, int] = {}
        for slot in sorted(self.answer_bells):
            worker = blocks[slot]
            for split in range(worker.splits):
                self._io[lane(slot, split)] = (SlotArrays(worker.obs, split),
                                               SlotArrays(worker.act, split))
                self._lane_rows[lane(slot, split)] = worker.rows // worker.splits
        # Local lanes: (lane, its observation slot's live [seq, version], its rows).
        self._local = [(n, io[0].word, self._lane_rows[n]) for n, io in self._io.items()]
        # Workers in splits: the requests one scan finds are queued oldest first (below).
        self._in_splits = any(blocks[slot].splits > 1 for slot in self.answer_bells)
        # Fresh blocks (sequence 0): a worker may have asked before this loop started.
        self._taken = {n: 0 for n, _, _ in self._local}
        self._pending: collections.deque[int] = collections.deque()
        self._pending_rows = 0
        self._submitted: collections.deque[int] = collections.deque()  # remote requests
        self._remote_answers: collections.deque[tuple[int, int]] = collections.deque()
        self._remote_bell = EventFd()
        self._rung: dict[int, int] = {}  # per local worker: the call its bell was last rung for
        self._lock = threading.Lock()  # the version lock: held for a whole call
        self._room = threading.Event()
        self._room.set()
        self._stopped = False
        self._done = threading.Event()  # no thread in serve()
        self._done.set()
        self._calls = 0
        self._observations = 0
        self._sizes: collections.Counter[int] = collections.Counter()
        capacity = max_batch_size
        if obs_spec is None:  # from the blocks (there may be none: remote env hosts only)
            if not blocks:
                raise ValueError("InferenceLoop without blocks needs obs_spec: (dtype, "
                                 "per-env shape) of each observation")
            layout = next(iter(blocks.values())).obs.layout
            obs_spec = [(layout[f"o{i}"][0], tuple(layout[f"o{i}"][1][1:]))
                        for i in range(len(self.obs_paths))]
        on_gpu = device is not None and device.type == "cuda"
        # Pinned for a GPU policy: the copy of a call's rows to the device is a DMA.
        self._obs = {f"o{i}": torch.zeros((capacity, *shape), dtype=dtype, pin_memory=on_gpu)
                     for i, (dtype, shape) in enumerate(obs_spec)}
        self._batch = TensorDict({key_of(p): self._obs[f"o{i}"]
                                  for i, p in enumerate(self.obs_paths)},
                                 batch_size=[capacity])
        self._keys = ["action"] + [f"x{j}" for j in range(len(self.outputs.extras))]
        # A policy on another device: its device buffers are made once (.device_batch);
        # with static_batch_size, one CUDA graph of that many rows (.graphed_batch).
        gathered = {key_of(p): self._obs[f"o{i}"] for i, p in enumerate(self.obs_paths)}
        self._device_batch: DeviceBatch | GraphedDeviceBatch | None = None
        if static_batch_size is not None:
            if not on_gpu:
                raise ValueError(f"static_batch_size={static_batch_size} captures the policy "
                                 "in a CUDA graph: it needs a CUDA device (device='cuda'), "
                                 f"got {device}; leave static_batch_size out")
            assert device is not None
            self._device_batch = GraphedDeviceBatch(gathered, device, capacity=capacity,
                                                    static=static_batch_size)
        elif device is not None and device.type != "cpu":
            self._device_batch = DeviceBatch(gathered, device, capacity=capacity)
        self._output_keys = ["action"] + [key_of(p) for p, _, _ in self.outputs.extras]
        # The exploration type, set around each call by one reused context (the loop's
        # thread only): adapter.exploration() builds an ExitStack and two contexts per call.
        kind = adapter.exploration_type
        self._explore: contextlib.AbstractContextManager[Any] = (
            contextlib.nullcontext() if kind is None else set_interaction_type(kind))
        self._obs_arrays = [array_of(self._obs[f"o{i}"]) for i in range(len(self.obs_paths))]
        # Per local lane and first row in the batch, its gather's (copy, batch rows, block):
        # made the first time a batch puts the lane there, then reused.
        self._gathers: dict[int, list[Any]] = {n: [None] * capacity for n in self._io}
        # The batch's first ``row`` rows as a TensorDict, per row count (made once each).
        self._batches: list[TensorDict | None] = [None] * (capacity + 1)
        # A policy of one observation that writes only the action is called on the
        # tensor itself (PolicyAdapter.tensor_call): a TensorDict per call cost a third
        # of a 64-wide MLP's call (benchmarks/LOG.md). Views and expected shapes per row
        # count, made once each.
        self._tensor_call = (adapter.tensor_call() if len(self.obs_paths) == 1
                             and not self.outputs.extras else None)
        self._obs_rows: list[torch.Tensor | None] = [None] * (capacity + 1)
        self._action_shapes: list[torch.Size | None] = [None] * (capacity + 1)

    # -- requests ---------------------------------------------------------------------------
    def submit(self, slot: int) -> None:
        """Remote worker ``slot``'s observations are in its block: serve it in a coming call."""
        self._submitted.append(slot)
        self.request_bell.ring()

    def statistics(self) -> InferenceStatistics:
        return InferenceStatistics(self._calls, self._observations, dict(self._sizes))

    def _rows(self, lane_: int) -> int:
        rows = self._lane_rows.get(lane_)
        return self.blocks[lane_ >> SPLIT_BITS].rows if rows is None else rows

    def _scan(self) -> bool:
        """Queue every request made since the last scan; whether any request is pending."""
        pending = self._pending
        if self._in_splits:
            self._scan_in_order()
        else:
            taken = self._taken
            for n, word, rows in self._local:
                seq = word[0]
                if seq != taken[n] and not seq & 1:  # odd: the worker is still writing
                    taken[n] = seq
                    pending.append(n)
                    self._pending_rows += rows
        while self._submitted:
            slot = self._submitted.popleft()
            pending.append(lane(slot))
            self._pending_rows += self.blocks[slot].rows
        return self._pending_rows > 0

    def _scan_in_order(self) -> None:
        # A worker asks for split a's step k + 1 before it waits for split b's step k: a
        # scan that finds both must serve b's first (its request version is its step),
        # or the worker, waiting for b, idles while the loop computes a.
        taken, found = self._taken, []
        for n, word, rows in self._local:
            seq = word[0]
            if seq != taken[n] and not seq & 1:  # odd: the worker is still writing
                taken[n] = seq
                found.append((int(word[1]), n, rows))
        found.sort()
        for _, n, rows in found:
            self._pending.append(n)
            self._pending_rows += rows

    def _enough(self) -> bool:
        self._scan()
        return self._pending_rows >= self.min_batch_size

    def _is_stopped(self) -> bool:
        return self._stopped

    def _next_requests(self) -> list[int] | None:
        """Block until requests wait; take whole ones up to ``max_batch_size`` (None: stopped)."""
        bell = self.request_bell
        if not spin_then_block(self._scan, bell, spin=self.spin, stopped=self._is_stopped):
            return None
        if self._pending_rows < self.min_batch_size:
            spin_then_block(self._enough, bell, spin=0.0, stopped=self._is_stopped,
                            deadline=time.monotonic() + self.server_timeout)
        taken: list[int] = []
        rows = 0
        while self._pending:
            n = self._rows(self._pending[0])
            if taken and rows + n > self.max_batch_size:
                break
            taken.append(self._pending.popleft())
            rows += n
        self._pending_rows -= rows
        return taken

    def _put_back(self, lanes: list[int]) -> None:
        self._pending.extendleft(reversed(lanes))
        self._pending_rows += sum(self._rows(n) for n in lanes)

    # -- the loop ------------------------------------------------------------------------------
    async def run(self, remote_reply: Callable[[int, int], Awaitable[None]] | None = None
                  ) -> None:
        """Serve until cancelled (or the policy raises: that error, here).

        ``remote_reply(slot, version)`` sends a remote worker its answer (from this
        task's event loop); without it there must be no remote slots.
        """
        self._stopped = False
        error: Exception | None = None
        try:
            async with anyio.create_task_group() as tg:
                if remote_reply is not None:
                    tg.start_soon(self.relay_remote_answers, remote_reply)
                try:
                    await anyio.to_thread.run_sync(self.serve, abandon_on_cancel=True)
                except Exception as exc:  # the policy's: raised as itself, not in a group
                    error = exc
                tg.cancel_scope.cancel()
        finally:
            self.stop()
        if error is not None:
            raise error

    def serve(self) -> None:
        """The loop itself, in a thread: returns once :meth:`stop` is called."""
        self._done.clear()
        try:
            if self.threads is not None:
                # OpenMP keeps its thread count per thread: a pool thread that ran torch
                # before the trainer's cap keeps every core, and each small call then
                # waits for descheduled OpenMP threads (measured: 3-10x slower, at random).
                use_torch_threads(self.threads)
            with torch.no_grad():  # grad mode is per thread: this one's, for good
                self._serve_until_stopped()
        finally:
            self._done.set()

    def _serve_until_stopped(self) -> None:
        room, lock = self._room, self._lock
        while not self._stopped:
            if not room.is_set():
                room.wait()
                continue
            lanes = self._next_requests()
            if lanes is None:
                return
            with lock:
                if not room.is_set() or self._stopped:  # held meanwhile: not this call
                    self._put_back(lanes)
                    continue
                version = self.version
                started = time.perf_counter()
                rows = self._serve(lanes, version)
                took = time.perf_counter() - started
            self._calls += 1
            self._observations += rows
            self._sizes[rows] += 1
            self._answer(lanes, version)
            if took > YIELD_AFTER:
                os.sched_yield()

    def _answer(self, lanes: list[int], version: int) -> None:
        bells, remote, rung = self.answer_bells, False, self._rung
        call = self._calls
        for n in lanes:
            slot = n >> SPLIT_BITS
            bell = bells.get(slot)
            if bell is not None:
                # A worker's splits share its bell, each checks its own answer: one ring per
                # worker and call (a second would only wake it again for nothing).
                if rung.get(slot) != call:
                    rung[slot] = call
                    bell.ring()
            else:
                self._remote_answers.append((slot, version))
                remote = True
        if remote:
            self._remote_bell.ring()

    async def relay_remote_answers(self, reply: Callable[[int, int], Awaitable[None]]) -> None:
        """Send remote workers their answers, from the event loop (forever: cancel to stop)."""
        fd = self._remote_bell.fd
        while True:
            await anyio.wait_readable(fd)
            os.eventfd_read(fd)
            while self._remote_answers:
                await reply(*self._remote_answers.popleft())

    def stop(self) -> None:
        """End :meth:`serve` (from any thread; idempotent)."""
        self._stopped = True
        self._room.set()
        self.request_bell.ring()

    def close(self, timeout: float = 5.0) -> None:
        """Stop, wait (up to ``timeout`` s) for the thread to leave, close the bells it made."""
        self.stop()
        if not self._done.wait(timeout):  # a call that long: leave the bells to the exit
            return
        # The sequence words view the blocks' mappings: released here, a closed block is
        # unmapped (and its descriptor closed) at once, not whenever gc finds this loop.
        for obs, act in self._io.values():
            obs.release()
            act.release()
        self._local, self._io, self._gathers = [], {}, {}
        self._remote_bell.close()
        if self._own_bell:
            self.request_bell.close()

    def _serve(self, lanes: list[int], version: int) -> int:
        """Gather, one policy call, scatter (under the version lock)."""
        rows = self._gather(lanes)
        self._scatter(lanes, self._compute(rows), version)
        return rows

    def _gather(self, lanes: list[int]) -> int:
        """Copy each lane's observations into the batch's next rows; the rows filled."""
        row = 0
        for lane_ in lanes:
            n = self._rows(lane_)
            gather = self._gathers.get(lane_)
            if gather is None:  # a remote slot: its block is the event loop's copy
                self.blocks[lane_ >> SPLIT_BITS].obs.read_into(
                    {k: v[row:row + n] for k, v in self._obs.items()}, 0)
            else:
                copies = gather[row]
                if copies is None:
                    copies = gather[row] = [
                        (copier(dst), dst, src) for dst, src in zip(
                            [a[row:row + n] for a in self._obs_arrays],
                            self._io[lane_][0].arrays, strict=True)]
                for copy, dst, src in copies:
                    copy(dst, src)
            row += n
        return row

    def _compute(self, row: int) -> list[Any]:
        """The policy on the batch's first ``row`` rows: its outputs, in ``_output_keys``."""
        device_batch = self._device_batch
        if isinstance(device_batch, DeviceBatch):
            with self._explore:  # no_grad is the thread's own (serve)
                return device_batch(row, self.adapter, self._output_keys,
                                    tensor_call=self._tensor_call, check=self._checked_action)
        if device_batch is not None:  # a CUDA graph: captured from the TensorDict path
            with self._explore:
                return device_batch(row, self.adapter, self._output_keys)
        return self._call_policy(row)

    def _scatter(self, lanes: list[int], outputs: list[Any], version: int) -> None:
        """Write each lane's rows of ``outputs`` into its answer block, as ``version``."""
        arrays = [array_of(o) for o in outputs]
        keys = self._keys
        row = 0
        for lane_ in lanes:
            n = self._rows(lane_)
            io = self._io.get(lane_)
            if io is None:
                self.blocks[lane_ >> SPLIT_BITS].act.write(
                    {k: o[row:row + n] for k, o in zip(keys, outputs, strict=True)},
                    version=version, slot=0)
            else:
                act = io[1]
                seq = act.begin()
                for copy, dst, out in zip(act.copies, act.arrays, arrays, strict=True):
                    copy(dst, out[row:row + n])
                act.end(seq, version)
            row += n

    def _call_policy(self, row: int) -> list[Any]:
        """The policy on the batch's first ``row`` rows (on the host): its output tensors."""
        call = self._tensor_call
        if call is not None:
            obs = self._obs_rows[row]
            if obs is None:
                obs = self._obs_rows[row] = self._obs["o0"][:row]
            with self._explore:  # no_grad is the thread's own (serve)
                action = call(obs)
            if action is not None:  # None: a hook came since, the TensorDict path below
                return [self._checked_action(action, row)]
        td = self._batches[row]
        if td is None:
            td = self._batches[row] = self._batch[:row]
        td = td.copy()  # a shallow copy: what the policy sets stays out of the cached one
        with self._explore:
            td = self.adapter(td)
        return [td.get(key) for key in self._output_keys]

    def _checked_action(self, action: Any, rows: int) -> torch.Tensor:
        expected = self._action_shapes[rows]
        if expected is None:
            expected = self._action_shapes[rows] = torch.Size((rows, *self.outputs.action[1]))
        if not isinstance(action, torch.Tensor) or action.shape != expected:
            got = (f"a tensor of shape {tuple(action.shape)}" if isinstance(action, torch.Tensor)
                   else f"a {type(action).__name__}")
            raise ValueError(f"the policy returned {got} for a batch of {rows} observations: "
                             f"expected an action tensor of shape {tuple(expected)}")
        return action

    # -- weights, back-pressure, pause ------------------------------------------------------
    async def update(self, apply: Callable[[], None], timeout: float | None = None) -> int:
        """Run ``apply`` (which changes the weights) between two calls; return the new version.

        Returns once the change is made: the next call uses the new weights. ``timeout``:
        seconds to wait for the call under way to end (None: as long as it takes); past
        it, :class:`TimeoutError`, and nothing is changed.
        """
        def locked() -> int:
            if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
                raise TimeoutError(f"the call under way did not end within {timeout} s; "
                                   "the weights were not loaded")
            try:
                apply()
                self.version += 1
                return self.version
            finally:
                self._lock.release()

        return await anyio.to_thread.run_sync(locked)

    def set_room(self, room: bool) -> None:
        """Answer requests (True) or hold them (False) from the next call on. Never blocks."""
        if room:
            self._room.set()
        else:
            self._room.clear()

    async def held(self) -> None:
        """Return once no call is under way and none starts until ``set_room(True)``."""
        def wait_for_the_call() -> None:
            with self._lock:
                pass

        if not self._room.is_set():
            await anyio.to_thread.run_sync(wait_for_the_call)


__all__ = ["InferenceLoop", "InferenceStatistics"]
