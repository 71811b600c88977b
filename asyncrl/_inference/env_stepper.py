"""An env worker's stepping for central inference: step envs, ask the server, write chunks.

An env worker of :class:`~asyncrl.AsyncBatchedCollector` holds no policy. Per
step it writes its envs' observations into its shared-memory request block,
rings the inference loop's request bell, waits for its answer (its output
block's sequence number moves: :mod:`.doorbell`, spin then sleep on its own
eventfd), reads the actions (and every other policy output, and the policy
version that made them) from its response block, steps its envs and writes the
transition into preallocated chunk buffers ``[E, C]``. Every ``C`` steps a local
worker copies the chunk into its shared-memory chunk ring and rings the trainer
(:mod:`.chunk_ring`); a remote one sends it as one message. Observations, actions
and a local worker's chunks never cross a socket: a local worker's link to the
trainer carries only heartbeats, errors and ``close``.

With ``splits`` > 1 (Sample Factory's double buffering) the worker's envs step in
equal splits, each asking on a block slot of its own: while the loop computes one
split's actions the worker steps another, so the env worker and the policy
overlap instead of taking turns. Every split steps once per column of the chunk.

Torch-free: neither this module nor what it imports needs torch or tensordict (a
local env worker is spawned with none: :mod:`asyncrl._spawn.torch_free`). Its
buffers are numpy arrays; it attaches the trainer's blocks as numpy views
(:class:`transports.SharedArrayBlock`). An env that needs torch imports it itself.

The stepping runs in a thread of its own (:meth:`EnvStepper.run_local`): it
sleeps in a system call, GIL released, while it waits for an answer, so the
process's event loop stays free for the trainer's link (heartbeats, ``close``:
the process around the stepper is :mod:`.env_worker`). A remote env worker
(:mod:`.remote_env_stepper`) steps on its event loop instead, with ``obs`` and
``act`` messages (:meth:`EnvStepper.run`).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from transports import (
    CurveClient,
    Link,
    Message,
    ProtocolError,
    SharedArrayBlock,
)

from .._errors import RefusedError
from .._protocol import (
    Actions,
    EnvChunk,
    EnvClose,
    Observations,
    Refuse,
    decode,
)
from .._rollout.env_ids import EnvIdSource
from .._rollout.env_pools import EnvPool
from .._rollout.envs import make_env_pool
from .._rollout.gym_pools import GymEnvListPool
from .._rollout.traj_ids import TrajectoryIds
from .block_io import SlotArrays
from .chunk_writer import ChunkWriter, Layout, chunk_layout
from .doorbell import DEFAULT_SPIN, EventFd, no_wakeup_preemption, spin_then_block
from .info_columns import InfoColumn, attach_columns
from .spare_chunk import SpareChunk

log = logging.getLogger("asyncrl.env_worker")

Path = tuple[str, ...]


def dtype_name(dtype: Any) -> str:
    """A dtype's name, whoever made it: ``torch.float32``, ``np.dtype("float32")``, ``"float32"``.

    >>> dtype_name("bfloat16"), dtype_name(np.dtype(np.uint8))
    ('bfloat16', 'uint8')
    """
    return str(dtype).removeprefix("torch.")


def numpy_dtype(dtype: Any) -> np.dtype:
    """The numpy dtype an env worker holds ``dtype`` in (bfloat16's bytes: uint16)."""
    return SharedArrayBlock.storage_dtype(dtype_name(dtype))


#: The chunk entries no step writes: the worker's id and the root flags (always False:
#: ended episodes are reset in place). A chunk target holds them from the start.
CONSTANT_PATHS = frozenset({("collector", "worker_id"), ("done",), ("terminated",),
                            ("truncated",)})


def chunk_arrays(layout: Layout, *, rows: int, steps: int) -> dict[Path, np.ndarray]:
    """Zeroed ``[rows, steps, *shape]`` numpy arrays of ``layout`` (a worker records into them)."""
    return {path: np.zeros((rows, steps, *shape), dtype=numpy_dtype(dtype))
            for path, (dtype, shape) in layout.items()}


@dataclass(frozen=True)
class _Outputs:
    """The policy's outputs as :func:`chunk_layout` reads them (the trainer's OutputLayout)."""

    action: tuple[Any, tuple[int, ...]]
    extras: list[tuple[Path, Any, tuple[int, ...]]] = field(default_factory=list)


@dataclass(frozen=True)
class EnvWorkerConfig:
    """What one env worker is given (pickled by the trainer for its own child)."""

    slot: int
    factories: Sequence[Any]  # one per env: a gymnasium id, import path or callable
    create_env_kwargs: Mapping[str, Any]
    obs_block: str  # shared-memory block names, created (and unlinked) by the trainer
    act_block: str
    obs_paths: Sequence[Path]  # block key "o{i}" holds observation obs_paths[i]
    extra_paths: Sequence[Path]  # block key "x{j}" holds policy output extra_paths[j]
    chunk_steps: int
    heartbeat_interval: float = 1.0
    peer_timeout: float = 10.0
    #: A local worker's doorbells (:mod:`.doorbell`): the inference loop's request
    #: bell, rung after each request, and this worker's answer bell.
    request_bell: EventFd | None = None
    answer_bell: EventFd | None = None
    #: Seconds spent spinning on the answer before sleeping on the answer bell.
    spin: float = DEFAULT_SPIN
    #: A local worker's chunk ring (:class:`.chunk_ring.ChunkRing` names), the trainer's
    #: chunk bell (rung after each chunk) and this worker's room bell (rung by the
    #: trainer after it took a chunk: a worker whose slots are all full waits on it).
    #: The ring's slots bound what waits for the trainer while a training step holds it.
    chunk_ring: tuple[str, str] | None = None
    chunk_bell: EventFd | None = None
    room_bell: EventFd | None = None
    # The high 32 bits of its traj_ids: the slot, unless the collector gave a remote
    # worker another (a slot's later occupants must not repeat an earlier one's ids).
    traj_tag: int | None = None
    #: Equal splits of the envs, stepped in turn, each asking on its own block slot
    #: (local workers only: a remote worker asks with one message for all its envs).
    splits: int = 1
    #: Its key for the trainer's hub when that hub speaks CURVE (``listen`` with keys):
    #: a pair made for this hub only, as a MultiCollector's local workers get.
    curve: CurveClient | None = None
    #: Where the trainer's gymnasium ids are registered (run-time registrations: the
    #: fork server never ran its main()); imported before the envs are built.
    env_sources: Sequence[EnvIdSource] = ()
    #: Proves to the collector's admission that this worker was spawned by it (its hello).
    token: str = ""
    #: The info leaves (``info_keys``) its chunks hold, as the trainer fixed them
    #: (:mod:`.info_columns`): read from each step's info, written at ``("next", *path)``.
    info_columns: Sequence[InfoColumn] = ()
    #: False under the collector's ``compact_obs=True``: its chunks hold no
    #: ``("next", obs)`` twins (:func:`.chunk_writer.chunk_layout`), so it copies none.
    next_observations: bool = True


def build_pool(factories: Sequence[Any], kwargs: Mapping[str, Any]) -> EnvPool:
    """One pool for a worker's envs: ``make_env_pool`` when they share one factory."""
    first = factories[0]
    if all(f is first or f == first for f in factories):
        return make_env_pool(first, create_env_kwargs=kwargs, num_envs=len(factories))
    pools = [make_env_pool(f, create_env_kwargs=kwargs, num_envs=1) for f in factories]
    envs = [getattr(p, "_envs", [None])[0] for p in pools]
    if not all(isinstance(p, GymEnvListPool) for p in pools) or None in envs:
        for p in pools:
            p.close()
        raise ValueError("different env factories in one env worker must all build gymnasium "
                         "envs; give torchrl envs one per worker (envs_per_worker=1)")
    return GymEnvListPool(envs)


class _Views(NamedTuple):
    """A split's rows of one chunk target (the worker's buffers, or a ring slot): what
    :meth:`_Split.step` copies where (``(dst, src)``), and the two stamped columns."""

    pre: list[tuple[np.ndarray, np.ndarray]]  # observations, before the step
    post: list[tuple[np.ndarray, np.ndarray]]  # next observations, reward, flags, infos
    outputs: list[tuple[Any, Any]]  # (chunk buffer, the answer's array)
    version: np.ndarray
    traj: np.ndarray


class _Split:
    """A split of a worker's envs: its pool, its rows of the chunk buffers, its answer.

    :meth:`step` records one step into column ``i`` of its rows and steps its envs.
    """

    def __init__(self, pool: EnvPool, first: int, traj_ids: TrajectoryIds) -> None:
        self.pool = pool
        self.first = first  # its first row among the worker's envs
        self.rows = slice(first, first + pool.num_envs)
        self.traj_ids = traj_ids  # the worker's: a split renews its own rows
        self.traj_now = traj_ids.current[self.rows]  # a view: renew writes in place
        self.infos: list[tuple[Path, np.ndarray]] = []  # its pool's info columns
        self.answers: list[Any] = []  # the answer's arrays, in the outputs' order
        self.act_np: Any = None
        self.done = np.zeros(pool.num_envs, dtype=bool)
        # Its rows of each chunk target (EnvStepper._bind), and those it records into now.
        self.views: list[_Views] = []
        self.pre: list[tuple[np.ndarray, np.ndarray]] = []
        self.post: list[tuple[np.ndarray, np.ndarray]] = []
        self.outputs: list[tuple[Any, Any]] = []
        self.version: np.ndarray = np.empty(0)
        self.traj: np.ndarray = np.empty(0)
        # A local worker's block slots (EnvStepper._local_views) and its answer's count.
        self.obs_slot: SlotArrays | None = None
        self.act_slot: SlotArrays | None = None
        self.answer_word: Any = None
        self.expected = 0

    def use(self, target: int) -> None:
        """Record into chunk target ``target`` from the next step on (once per chunk)."""
        self.pre, self.post, self.outputs, self.version, self.traj = self.views[target]

    def answered(self) -> bool:
        return bool(self.answer_word[0] >= self.expected)

    def step(self, i: Any, version: int) -> None:
        """Record the answer (in ``outputs``) into column ``i``, step the envs."""
        for dst, src in self.pre:
            dst[i] = src
        for out, answer in self.outputs:
            out[i] = answer
        self.version[i] = version
        self.traj[i] = self.traj_now
        pool = self.pool
        pool.step_inplace(self.act_np)
        for dst, src in self.post:
            dst[i] = src
        if pool.any_done:
            np.logical_or(pool.terminated, pool.truncated, out=self.done)
            pool.reset_where(self.done)
            self.traj_ids.renew(self.done, first=self.first)


class EnvStepper:
    """One worker's envs, its two shared-memory blocks and its chunk buffers."""

    def __init__(self, config: EnvWorkerConfig, *, pool: EnvPool | None = None,
                 blocks: tuple[Any, Any] | None = None) -> None:
        # A remote env worker (asyncrl._inference.remote_env_stepper) passes its pool, built before
        # it joins, and inline blocks whose contents travel in the messages instead.
        self.config = config
        if pool is not None and config.splits != 1:
            raise ValueError("a remote env worker steps its envs in one split")
        factories = list(config.factories)
        if len(factories) % config.splits:
            raise ValueError(f"{len(factories)} envs do not split in {config.splits} equal "
                             "parts")
        per_split = len(factories) // config.splits
        pools: list[EnvPool] = [] if pool is None else [pool]
        try:
            if pool is None:
                for source in config.env_sources:
                    source.ensure()
                for k in range(config.splits):
                    pools.append(build_pool(factories[k * per_split:(k + 1) * per_split],
                                            config.create_env_kwargs))
            self.pool = pools[0]  # a remote worker's (it has one split)
            self.pools = pools
            # (a local worker's shared memory, or a remote one's InlineArrays)
            self.obs_block: Any
            self.act_block: Any
            if blocks is None:
                self.obs_block = SharedArrayBlock.attach(config.obs_block)
                self.act_block = SharedArrayBlock.attach(config.act_block)
            else:
                self.obs_block, self.act_block = blocks
            self._check_layout()
            self._allocate()
        except BaseException:
            for p in pools:
                p.close()
            raise
        for p in pools:
            p.reset()

    def _check_layout(self) -> None:
        pool, layout = self.pool, self.obs_block.layout
        slots = int(getattr(self.obs_block, "slots", 1))
        if slots != len(self.pools):
            raise ValueError(f"this worker steps its envs in {len(self.pools)} splits, the "
                             f"server's blocks have {slots}: give both the same splits")
        got = {f"o{i}": (a.dtype.name, tuple(a.shape)) for i, a in enumerate(pool.obs_arrays)}
        layout = {k: (dtype_name(d), tuple(s)) for k, (d, s) in layout.items()}
        if got != layout or len(self.config.obs_paths) != len(pool.obs_arrays):
            raise ValueError(f"this worker's envs give observations {got}, the server expects "
                             f"{layout}: every env must have the same observation space")
        dtype, shape = self.act_block.layout["action"]
        spec = pool.specs.action
        act = (dtype_name(dtype), tuple(shape))
        if act != (np.dtype(spec.dtype).name, (pool.num_envs, *spec.shape)):
            raise ValueError(f"this worker's envs take actions {spec}, the server sends {act}")

    def _allocate(self) -> None:
        pool, c = self.pool, self.config
        n, t = sum(p.num_envs for p in self.pools), c.chunk_steps
        self.obs_src = {f"o{i}": a for i, a in enumerate(pool.obs_arrays)}
        self.act_dst = {k: np.empty(shape, dtype=numpy_dtype(dtype))
                        for k, (dtype, shape) in self.act_block.layout.items()}
        self.act_np = self.act_dst["action"]

        # The policy's outputs: "action", then the extras, as the answer block has them.
        self._output_keys = ["action"] + [f"x{j}" for j in range(len(c.extra_paths))]
        outputs = list(zip([("action",)] + [tuple(p) for p in c.extra_paths],
                           self._output_keys, strict=True))
        act = self.act_block.layout
        layout = chunk_layout(
            [(tuple(p), a.dtype, tuple(a.shape[1:]))
             for p, a in zip(c.obs_paths, pool.obs_arrays, strict=True)],
            _Outputs(action=(act["action"][0], tuple(act["action"][1][1:])),
                     extras=[(path, act[key][0], tuple(act[key][1][1:]))
                             for path, key in outputs[1:]]),
            infos=c.info_columns, dtype_of=np.dtype, next_observations=c.next_observations)
        self.layout = layout
        # The chunk buffers, in the layout's order (a local worker's ring has the same);
        # a local worker's are its spare, given back after each use (_hand_over).
        self._spare = SpareChunk(layout, rows=n, steps=t, constant=CONSTANT_PATHS,
                                 dtype_of=numpy_dtype)
        data = self._data = self._spare.arrays
        data[("collector", "worker_id")].fill(c.slot)
        self._traj_ids = TrajectoryIds(n, tag=c.slot if c.traj_tag is None else c.traj_tag)
        self._output_paths = [path for path, _ in outputs]
        # Each split records into its own rows of the buffers (numpy views: no copy).
        self._splits: list[_Split] = []
        first = 0
        for p in self.pools:
            split = _Split(p, first, self._traj_ids)
            if c.info_columns:  # the pool reads them at each step, before the copies
                reader = attach_columns(p, c.info_columns)
                split.infos = list(zip(reader.paths, reader.arrays, strict=True))
            split.answers = [self.act_dst[key] for key in self._output_keys]
            split.act_np = self.act_np
            self._splits.append(split)
            first += p.num_envs
        # Where chunks are recorded: these buffers (a local worker adds its ring's slots
        # before them: run_local), and the one recorded into now.
        self._bind([data])
        self._idx = [(slice(None), i) for i in range(t)]
        self._t = 0  # the step's column in the chunk
        self._stopping = False
        self._finished = threading.Event()
        self._writer: ChunkWriter | None = None  # a local worker's (run_local)

    def _bind(self, targets: list[dict[Path, np.ndarray]]) -> None:
        """Point each split at its rows of every chunk target (made once), and record into
        the last one. Every entry of a chunk is written at each step, but the constant
        ``CONSTANT_PATHS``, which a target holds from the start."""
        c = self.config
        self._targets = targets
        self._dones: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = [
            (t[("next", "terminated")][..., 0], t[("next", "truncated")][..., 0],
             t[("next", "done")][..., 0]) for t in targets]
        for split in self._splits:
            pool, rows = split.pool, split.rows
            split.views = []
            for data in targets:
                pre: list[tuple[np.ndarray, np.ndarray]] = []
                post: list[tuple[np.ndarray, np.ndarray]] = []
                for path, src in zip(c.obs_paths, pool.obs_arrays, strict=True):
                    pre.append((data[tuple(path)][rows], src))
                    if c.next_observations:
                        post.append((data[("next", *path)][rows], src))
                post += [(data[("next", "reward")][rows, ..., 0], pool.reward),
                         (data[("next", "terminated")][rows, ..., 0], pool.terminated),
                         (data[("next", "truncated")][rows, ..., 0], pool.truncated)]
                post += [(data[("next", *path)][rows], arr) for path, arr in split.infos]
                outputs = [(data[path][rows], answer) for path, answer in zip(
                    self._output_paths, split.answers, strict=True)]
                split.views.append(_Views(pre, post, outputs,
                                          data[("collector", "policy_version")][rows],
                                          data[("collector", "traj_ids")][rows]))
        self._use(len(targets) - 1)

    def _use(self, target: int) -> None:
        self._target = target
        for split in self._splits:
            split.use(target)

    async def run(self, link: Link, *, recv: Callable[[], Awaitable[Message]] | None = None,
                  step: Callable[[int], Awaitable[bool]] | None = None) -> None:
        """Step over ``link`` (a remote worker: ``obs`` / ``act`` messages) until close.

        Ends when the collector says close (or goes away: PeerLostError). Each answer
        is decoded by its declared kind (:mod:`asyncrl._protocol.central_inference`);
        any other kind is a ProtocolError, a refusal a RefusedError naming its reason.
        ``recv`` / ``step``: the link's next message and one step, when not
        ``link.recv`` and a step on this loop (a host whose envs call a served module).
        """
        obs_write, act_read = self.obs_block.write, self.act_block.read_into
        receive = link.recv if recv is None else recv
        count = 0
        while True:
            obs_write(self.obs_src, version=count, slot=0)
            await link.send(self.request_body(), kind=Observations.KIND)
            message = await receive()
            if message.kind == EnvClose.KIND:
                return
            if message.kind == Refuse.KIND:
                raise RefusedError(f"the collector refused this env worker: "
                                   f"{decode(Refuse, message.body).reason}")
            if message.kind != Actions.KIND:
                raise ProtocolError(f"an env worker expects {Actions.KIND!r}, "
                                    f"{EnvClose.KIND!r} or {Refuse.KIND!r} messages, got "
                                    f"{str(message.kind)[:64]!r}")
            version = self.read_answer(message.body, act_read)
            if self._step(version) if step is None else await step(version):
                await link.send(self.chunk_body(), kind=EnvChunk.KIND)
            count += 1

    def run_local(self) -> None:
        """Step a local worker, in a thread, until :meth:`stop` (doorbells, no messages).

        Each finished chunk goes into the worker's chunk ring (:meth:`_hand_over`). A
        chunk is recorded straight into the ring slot it goes to when the trainer has
        freed that slot as the chunk starts (the hand-over then copies nothing); else
        into the worker's own buffers, copied into the slot once it is free.
        """
        c = self.config
        request, answer = c.request_bell, c.answer_bell
        if request is None or answer is None:
            raise ValueError("a local env worker needs its doorbells (request_bell, answer_bell)")
        if c.chunk_ring is None or c.chunk_bell is None or c.room_bell is None:
            raise ValueError("a local env worker needs its chunk ring and bells (chunk_ring, "
                             "chunk_bell, room_bell)")
        self._writer = writer = ChunkWriter(c.chunk_ring, self._data)
        splits = self._local_views()
        slots = writer.slot_buffers()
        for target in slots:  # (the worker's own buffers have it: _allocate)
            target[("collector", "worker_id")].fill(c.slot)
        self._bind([*slots, self._data])
        # (bound once: a step allocates nothing)
        asks = [(split, split.obs_slot.copies_from(split.pool.obs_arrays),  # type: ignore[union-attr]
                 split.answered, split.step) for split in splits]
        ask = self._ask
        ring, stopped, spin = request.ring, self._is_stopping, c.spin
        idx, full = self._idx, c.chunk_steps
        one_torch_thread()  # as the process's main thread (OpenMP counts are per thread)
        no_wakeup_preemption()  # the loop rings all the workers it answered, then they run
        step = 0
        self._start_chunk()
        try:
            for split, copies, _, _ in asks:  # every split asks: the loop serves one, the next...
                ask(split, copies, step)
                ring()
            while not self._stopping:
                i = idx[self._t]
                for split, copies, answered, step_split in asks:
                    if not spin_then_block(answered, answer, spin=spin, stopped=stopped):
                        return
                    # The answer is read in place (step copies it into the chunk and hands
                    # the action to the envs): the loop writes it again only after this
                    # split's next request, made at once.
                    step_split(i, split.answer_word[1])
                    ask(split, copies, step + 1)
                    ring()
                step += 1
                self._t += 1
                if self._t == full:  # every split stepped every column: hand the chunk over
                    self._t = 0
                    self._finish_chunk()
                    if not self._hand_over():
                        return
                    self._start_chunk()
        finally:
            self._finished.set()

    def _start_chunk(self) -> None:
        """Record the next chunk into its ring slot if the trainer has freed it, else into
        the worker's own buffers (the last target)."""
        assert self._writer is not None
        slot = self._writer.begin_in_place()
        self._use(len(self._targets) - 1 if slot < 0 else slot)

    def _hand_over(self) -> bool:
        """The finished chunk into the ring, once a slot is free; False: stopped meanwhile."""
        c, writer = self.config, self._writer
        assert writer is not None and c.room_bell is not None and c.chunk_bell is not None
        if self._target < len(self._targets) - 1:  # recorded in its slot: publish it
            writer.end_in_place()
        else:
            if not writer.has_room() and not spin_then_block(
                    writer.has_room, c.room_bell, spin=0.0, stopped=self._is_stopping):
                return False
            writer.publish()
            self._spare.release()  # copied out: its pages wait for the next use unheld
        c.chunk_bell.ring()
        return True

    @staticmethod
    def _ask(split: _Split, copies: Sequence[Any], step: int) -> None:
        """A split's request: its observations into its block slot (the caller rings)."""
        obs = split.obs_slot
        assert obs is not None
        seq = obs.begin()
        for copy, dst, src in copies:
            copy(dst, src)
        obs.end(seq, step)
        split.expected += 2

    def _local_views(self) -> list[_Split]:
        """Point each split at its block slots: the answer is read where the loop wrote it."""
        for k, split in enumerate(self._splits):
            split.obs_slot = SlotArrays(self.obs_block, k)
            split.act_slot = act = SlotArrays(self.act_block, k)
            answers = dict(zip(act.keys, act.arrays, strict=True))
            split.answers = [answers[key] for key in self._output_keys]
            split.act_np = answers["action"]
            split.answer_word = act.word
            split.expected = int(act.word[0])
        return self._splits

    def _is_stopping(self) -> bool:
        return self._stopping

    def stop(self) -> None:
        """End :meth:`run_local` at its next wait (from any thread; idempotent)."""
        self._stopping = True
        for bell in (self.config.answer_bell, self.config.room_bell):
            if bell is not None:
                bell.ring()

    def wait_stopped(self, timeout: float) -> bool:
        """After :meth:`stop`: whether :meth:`run_local` has returned within ``timeout`` s."""
        return self._finished.wait(timeout)

    def _step(self, version: int) -> bool:
        """One split's step (a remote worker's: outputs in ``act_dst``); True: chunk full."""
        self._splits[0].step(self._idx[self._t], version)
        self._t += 1
        if self._t < self.config.chunk_steps:
            return False
        self._t = 0
        self._finish_chunk()
        return True

    def _finish_chunk(self) -> None:
        terminated, truncated, done = self._dones[self._target]
        np.logical_or(terminated, truncated, out=done)

    def request_body(self) -> Any:
        """What an ``obs`` message carries: nothing, the observations are in shared memory."""
        return None

    def read_answer(self, body: Any, read: Callable[[Any, int], int]) -> int:
        """Copy the policy's outputs into ``act_dst``; return their policy version."""
        return read(self.act_dst, 0)

    def chunk_body(self) -> Any:
        """What a ``chunk`` message carries (a remote worker's: :meth:`run`)."""
        raise NotImplementedError("a local env worker hands its chunks over through its ring")

    def close(self) -> None:
        for pool in self.pools:
            pool.close()
        # The step's views of the blocks' memory go first: a closed block is then unmapped.
        self._targets, self._dones = [], []
        for split in self._splits:
            split.views, split.pre, split.post, split.outputs = [], [], [], []
            split.answers, split.act_np, split.answer_word = [], None, None
            split.version = split.traj = np.empty(0)
            for slot in (split.obs_slot, split.act_slot):
                if slot is not None:
                    slot.release()
        if self._writer is not None:
            self._writer.close()
        self._data = {}
        if (spare := getattr(self, "_spare", None)) is not None:
            spare.close()
        self.obs_block.close()
        self.act_block.close()


def one_torch_thread() -> None:
    """One torch thread for the calling thread, if an env imported torch (else nothing)."""
    if "torch" in sys.modules:
        from .._spawn.threads import use_torch_threads

        use_torch_threads(1)


__all__ = [
    "CONSTANT_PATHS",
    "EnvStepper",
    "EnvWorkerConfig",
    "build_pool",
    "chunk_arrays",
    "dtype_name",
    "numpy_dtype",
    "one_torch_thread",
]
