"""Central inference's own CPU per frame, part by part, with no env and no CNN (#45 item 5).

    python -m benchmarks.central_inference_parts                    # every part
    python -m benchmarks.central_inference_parts --parts stepper --profile 25
    PYTHONPATH=/other/tree python benchmarks/central_inference_parts.py   # another tree's code

What :mod:`benchmarks.atari_server_profile` measures inside a real run, taken apart in a
tight loop on one thread, so that a change to one part shows in microseconds (the real
run's numbers move with the machine's load by more than these parts cost). The code timed
is the project's own; only what lies on the other side of a part is a stand-in that
costs next to nothing:

- ``stepper``: one local env worker's stepping (:meth:`EnvStepper.run_local`) with
  zero-cost envs of Atari's observations (uint8 [4, 84, 84], nothing computed); the
  inference loop is a stand-in that answers each request as it is rung (a real eventfd
  write, then the answer's sequence number), the trainer one that takes each chunk as it
  is rung (the ring's ``taken`` word). Its CPU per frame less the zero-cost envs' own
  steps (timed alone): the observation copies into the request block and the chunk, the
  answers into the chunk, the hand-over, seqlocks, the bells' system calls, Python. Not
  in it: the sleep on the answer bell and being woken (a real run's context switches).
- ``server``: the inference loop's thread (:meth:`InferenceLoop.serve`) with a policy
  that returns a preallocated action; the env workers are a stand-in that asks again
  (its request's sequence number) as each answer is rung, ``--lanes-per-call`` lanes per
  call (the real runs: 3.6-5.9 observations per call): scan, gather (real copies of the
  observations), the policy's Python, scatter, bells, the loop's Python.
- ``intake``: the trainer's side of the chunk rings: chunks published by
  :class:`ChunkWriter` s (not timed), taken into the collector's ``ChunkBuffer`` and cut
  into batches of ``--frames-per-batch`` (timed, with the thread's minor page faults).

Each part runs ``--repeats`` times; the best (least CPU per frame) is reported, with the
spread.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import resource
import statistics
import sys
import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict.nn import TensorDictModule
from torch import nn

from asyncrl._inference.chunk_buffer import ChunkBuffer
from asyncrl._inference.chunk_writer import ChunkWriter, chunk_layout
from asyncrl._inference.doorbell import EventFd
from asyncrl._inference.env_stepper import EnvStepper, EnvWorkerConfig, chunk_arrays
from asyncrl._inference.inference_loop import InferenceLoop
from asyncrl._inference.local_channels import LocalChannels
from asyncrl._inference.outputs import OutputLayout
from asyncrl._inference.worker_blocks import lane, make_blocks
from asyncrl._rollout.policies import PolicyAdapter

OBS_SHAPE = (4, 84, 84)
OBS = ("observation",)
OUTPUTS = OutputLayout(action=(torch.int64, ()))


class ZeroEnv(gym.Env):  # type: ignore[misc]
    """Atari's observation space, nothing computed; truncated every ``episode`` steps."""

    observation_space = gym.spaces.Box(0, 255, OBS_SHAPE, np.uint8)
    action_space = gym.spaces.Discrete(4)

    def __init__(self, episode: int = 1000) -> None:
        self._obs = np.zeros(OBS_SHAPE, np.uint8)
        self._episode = episode
        self._t = 0

    def reset(self, *, seed: Any = None, options: Any = None) -> tuple[np.ndarray, dict]:
        self._t = 0
        return self._obs, {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self._t += 1
        return self._obs, 0.0, False, self._t >= self._episode, {}


class Clock:
    """The calling thread's CPU seconds, wall seconds and minor page faults, from start."""

    def __init__(self) -> None:
        self.cpu, self.wall, self.faults = time.thread_time(), time.perf_counter(), _faults()

    def read(self) -> tuple[float, float, int]:
        return (time.thread_time() - self.cpu, time.perf_counter() - self.wall,
                _faults() - self.faults)


def _faults() -> int:
    return resource.getrusage(getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)).ru_minflt


def _profiled(profile: int, call: Any) -> Any:
    if not profile:
        return call()
    prof = cProfile.Profile()
    out = prof.runcall(call)
    pstats.Stats(prof).sort_stats("tottime").print_stats(profile)
    return out


# -- stepper ---------------------------------------------------------------------------------------
class _AnswerAtOnce:
    """The inference loop's stand-in: each ring (a request) is answered at once."""

    def __init__(self, words: list[Any], start_at: int, stop_after: int, stop: Any) -> None:
        self.bell = EventFd()  # a real system call per ring, as the real bell's
        self.words, self.asks, self.stop_after, self.stop = words, 0, stop_after, stop
        self.start_at = start_at  # the timed window starts here (warm: every page touched)
        self.clock: Clock | None = None

    def ring(self) -> None:
        self.bell.ring()
        word = self.words[self.asks % len(self.words)]  # the splits ask in turn
        word[0] += 2
        self.asks += 1
        if self.asks == self.start_at:
            self.clock = Clock()
        elif self.asks == self.stop_after:
            self.stop()


class _TakeAtOnce:
    """The trainer's stand-in: each chunk is taken as it is rung (its slot free again);
    with a ``reader``, really taken (copied out: the trainer's clone, in this thread)."""

    def __init__(self, taken: Any, stepper: EnvStepper, reader: Any = None) -> None:
        self.bell = EventFd()
        self.taken, self.stepper, self.reader = taken, stepper, reader

    def ring(self) -> None:
        self.bell.ring()
        if self.reader is not None:
            while self.reader.take() is not None:
                pass
            return
        writer = self.stepper._writer
        assert writer is not None
        self.taken[0] = writer.published


def stepper_part(args: argparse.Namespace) -> dict[str, float]:
    envs, splits, steps = args.envs_per_worker, args.splits, args.chunk_steps
    channels = LocalChannels()
    channels.make([envs], {OBS: torch.zeros((1, *OBS_SHAPE), dtype=torch.uint8)}, OUTPUTS,
                  splits=splits, chunk_steps=steps, frames_per_batch=args.frames_per_batch,
                  flat=True)
    blocks = channels.blocks[0]
    words = [blocks.act.control(k) for k in range(splits)]
    taken = channels.rings[0].taken_block.slot_views(0)["taken"].numpy()
    warm = 2 * args.capacity // envs  # columns: every ring slot written at least twice
    columns = args.chunks * steps
    config = EnvWorkerConfig(
        slot=0, factories=[ZeroEnv] * envs, create_env_kwargs={}, obs_block=blocks.obs.name,
        act_block=blocks.act.name, obs_paths=[OBS], extra_paths=[], chunk_steps=steps,
        answer_bell=channels.answer_bells[0], spin=0.0, chunk_ring=channels.rings[0].names,
        room_bell=channels.room_bells[0], splits=splits)
    stepper = EnvStepper(config)
    request = _AnswerAtOnce(words, start_at=splits * (warm + 1),
                            stop_after=splits * (warm + columns + 1), stop=stepper.stop)
    chunk = _TakeAtOnce(taken, stepper, channels.readers[0] if args.take else None)
    stepper.config = EnvWorkerConfig(**{**config.__dict__, "request_bell": request,
                                        "chunk_bell": chunk})
    try:
        _profiled(args.profile, stepper.run_local)
        assert request.clock is not None
        cpu, wall, faults = request.clock.read()
        frames = envs * columns
        # The zero-cost envs alone, as many steps (their pools' step_inplace)
        act = np.zeros(envs // splits, dtype=np.int64)
        pools = stepper.pools
        clock = Clock()
        for _ in range(columns):
            for pool in pools:
                pool.step_inplace(act)
                if pool.any_done:
                    pool.reset_where(pool.truncated)
        env_cpu = clock.read()[0]
    finally:
        for words_ in words:
            words_.release()
        del taken
        stepper.close()
        channels.close()
        for bell in (request.bell, chunk.bell):
            bell.close()
    return {"cpu_us": cpu / frames * 1e6, "env_us": env_cpu / frames * 1e6,
            "own_us": (cpu - env_cpu) / frames * 1e6, "wall_us": wall / frames * 1e6,
            "faults": faults / frames}


# -- server ----------------------------------------------------------------------------------------
class _FixedAction(nn.Module):
    """A policy that costs nothing: a preallocated action per observation."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.action = torch.zeros(capacity, dtype=torch.int64)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.action[:obs.shape[0]]


def server_part(args: argparse.Namespace) -> dict[str, float]:
    workers, envs, splits = args.workers, args.envs_per_worker, args.splits
    per_lane = envs // splits
    capacity = workers * envs
    adapter = PolicyAdapter(TensorDictModule(_FixedAction(capacity), in_keys=["observation"],
                                             out_keys=["action"]))
    blocks = make_blocks([envs] * workers, {OBS: torch.zeros((1, *OBS_SHAPE),
                                                             dtype=torch.uint8)},
                         OUTPUTS, splits=splits)
    bells = {slot: EventFd() for slot in blocks}
    # Lanes in the order real workers ask: every worker's split 0, then split 1, ...
    order = [(slot, k) for k in range(splits) for slot in range(workers)]
    words = {lane(s, k): blocks[s].obs.control(k) for s, k in order}
    lanes = [lane(s, k) for s, k in order]
    per_call = args.lanes_per_call
    calls_wanted = args.calls

    class Driven(InferenceLoop):
        """The loop; the env workers' stand-in asks again as each answer is rung."""

        asked = 0

        def ask(self, count: int) -> None:
            for _ in range(count):
                word = words[lanes[self.asked % len(lanes)]]
                self.asked += 1
                word[1] = self.asked  # its step: the loop serves the oldest first
                word[0] += 2

        def _answer(self, answered: list[int], version: int) -> None:
            super()._answer(answered, version)
            if self._calls >= calls_wanted:
                self.stop()
            else:
                self.ask(len(answered))

    loop = Driven(adapter, blocks, obs_paths=[OBS], outputs=OUTPUTS, device=None,
                  max_batch_size=per_call * per_lane, min_batch_size=1, server_timeout=0.0,
                  answer_bells=bells, spin=0.0)
    try:
        loop.ask(per_call)
        clock = Clock()
        _profiled(args.profile, loop.serve)
        cpu, wall, faults = clock.read()
        stats = loop.statistics()
    finally:
        for word in words.values():
            word.release()
        loop.close()
        for b in blocks.values():
            b.close()
        for bell in bells.values():
            bell.close()
    frames = stats.observations
    return {"cpu_us": cpu / frames * 1e6, "wall_us": wall / frames * 1e6,
            "faults": faults / frames, "per_call": frames / max(1, stats.calls)}


# -- intake ----------------------------------------------------------------------------------------
def intake_part(args: argparse.Namespace) -> dict[str, float]:
    workers, envs, steps = args.workers, args.envs_per_worker, args.chunk_steps
    obs = {OBS: torch.zeros((1, *OBS_SHAPE), dtype=torch.uint8)}
    channels = LocalChannels()
    channels.make([envs] * workers, obs, OUTPUTS, splits=1, chunk_steps=steps,
                  frames_per_batch=args.frames_per_batch, flat=True)
    layout = chunk_layout([(OBS, np.dtype(np.uint8), OBS_SHAPE)],
                          OutputLayout(action=(np.dtype(np.int64), ())),  # type: ignore[arg-type]
                          dtype_of=np.dtype)
    buffers = [chunk_arrays(layout, rows=envs, steps=steps) for _ in range(workers)]
    for b in buffers:
        for array in b.values():
            array.fill(1)  # touched, as a worker's are
    writers = [ChunkWriter(channels.rings[s].names, buffers[s]) for s in range(workers)]
    frames = ChunkBuffer(chunk_steps=steps, capacity=args.capacity, trajectories=False)
    order = list(channels.readers.items())
    batch_frames = args.frames_per_batch
    total = cpu = wall = 0.0
    faults, batches = 0, -4  # the first 4 batches warm up (not counted)
    try:
        while batches < args.batches:
            for writer in writers:  # (the env workers' work: not timed)
                while writer.has_room():
                    writer.publish()
            clock = Clock()
            frames.fill_from(order)
            taken = 0
            while frames.ready(batch_frames):
                batch = frames.take(batch_frames)
                taken += batch.numel()
                batches += 1
                del batch
            c, w, f = clock.read()
            if batches > 0:
                cpu, wall, faults, total = cpu + c, wall + w, faults + f, total + taken
    finally:
        for writer in writers:
            writer.close()
        channels.close()
    return {"cpu_us": cpu / total * 1e6, "wall_us": wall / total * 1e6,
            "faults": faults / total}


PARTS = {"stepper": stepper_part, "server": server_part, "intake": intake_part}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.central_inference_parts",
                                description=(__doc__ or "").split("\n")[0])
    p.add_argument("--parts", default=",".join(PARTS))
    p.add_argument("--workers", type=int, default=2, help="env workers (server, intake)")
    p.add_argument("--envs-per-worker", type=int, default=4)
    p.add_argument("--splits", type=int, default=2)
    p.add_argument("--chunk-steps", type=int, default=64)
    p.add_argument("--capacity", type=int, default=2048, help="the trainer's buffer, frames")
    p.add_argument("--chunks", type=int, default=40, help="stepper: chunks per repeat")
    p.add_argument("--calls", type=int, default=20000, help="server: calls per repeat")
    p.add_argument("--take", action="store_true",
                   help="stepper: the trainer's stand-in copies each chunk out (timed with it)")
    p.add_argument("--lanes-per-call", type=int, default=2)
    p.add_argument("--frames-per-batch", type=int, default=1024)
    p.add_argument("--batches", type=int, default=40, help="intake: batches per repeat")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--profile", type=int, default=0,
                   help="cProfile one repeat, print this many functions (0: none)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    import asyncrl

    print(f"asyncrl from {os.path.dirname(asyncrl.__file__)}; load average "
          f"{os.getloadavg()[0]:.2f}; {args.workers} workers x {args.envs_per_worker} envs, "
          f"{args.splits} splits, chunks of {args.chunk_steps} steps")
    for name in args.parts.split(","):
        part = PARTS[name]
        if args.profile:
            part(args)
            continue
        runs = [part(args) for _ in range(args.repeats)]
        best = min(runs, key=lambda r: r["cpu_us"])
        spread = [r["cpu_us"] for r in runs]
        rest = ", ".join(f"{k} {v:.2f}" for k, v in best.items() if k != "cpu_us")
        print(f"{name}: CPU µs per frame {best['cpu_us']:.2f} (median "
              f"{statistics.median(spread):.2f}, max {max(spread):.2f}); {rest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
