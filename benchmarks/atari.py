"""Real Atari at the limit: asyncrl's collectors against EnvPool, gymnasium, PufferLib and TorchRL.

    python -m benchmarks.atari                                # every case, 3 repeats, interleaved
    python -m benchmarks.atari --repeats 1 --seconds 5        # a smoke run
    python -m benchmarks.atari --cases floor,envpool,asyncrl-async --repeats 5 --seconds 30

The benchmark of record for pixels (issue 45). The workload: ``ALE/Breakout-v5`` from
ale-py with ``frameskip=1``, gymnasium's ``AtariPreprocessing(frame_skip=4,
screen_size=84, grayscale_obs=True, noop_max=30)`` and ``FrameStackObservation(4)``
(uint8 [4, 84, 84]); EnvPool's ``Breakout-v5`` with the same options (below); CleanRL's
Nature CNN (conv 32 8x8/4, 64 4x4/2, 64 3x3/1, linear 512, logits) sampling its actions,
one torch thread per process; 8 envs; batches of 1,024 frames (CleanRL's 8 envs x 128
steps); collection only (no weight updates). Each case runs in a fresh interpreter, the
cases one after the other, in turn, ``--repeats`` times (drifts of the machine hit all
alike). A case is skipped, with the reason printed, when what it needs does not import.

- ``floor``: the CPU floor, in its own interpreter: CPU ms per env step (one env,
  preprocessed, random actions, resets included) and the CNN's CPU ms per frame at
  batch 1, 4 and 8. The floor of a case is ``min(cores, 8)`` cores' worth of CPU over
  env + CNN per frame at the batch its CNN runs (8 when one CNN serves all envs, 4 for
  per-worker 2x4); each case's frames/s is given as a fraction of it. It also measures
  env and CNN in turn in one thread (4 or 8 envs stepped, then the CNN on their
  observations), what a per-worker worker does: the per-worker cases are also given as a
  fraction of that one-thread floor;
- ``vector``: gymnasium ``AsyncVectorEnv(shared_memory=True)``, the CNN in the main process;
- ``envpool``: ``envpool.make("Breakout-v5", env_type="gymnasium", num_envs=8,
  num_threads=2, ...)`` stepped synchronously, the CNN in the main process (CleanRL's
  ``ppo_atari_envpool`` loop);
- ``pufferlib``: ``pufferlib.vector.Multiprocessing``, 2 workers x 4 envs, the CNN in
  the main process;
- ``torchrl``: TorchRL's ``MultiSyncCollector`` (``MultiSyncDataCollector`` before 0.14),
  2 workers x ``SerialEnv(4)``;
- ``asyncrl-async`` / ``asyncrl-async-compact``: ``MultiAsyncCollector`` 2 workers x 4
  envs, without / with ``compact_obs=True``; ``asyncrl-sync``: ``MultiSyncCollector`` 2x4;
- ``asyncrl-batched``: ``AsyncBatchedCollector``, 8 env workers, the CNN batched in the
  trainer's process; ``asyncrl-batched-2x4`` / ``-2x4s2`` / ``-4x2``: other layouts of it
  (``envs_per_worker=4``, without / with ``worker_num_splits=2``; ``envs_per_worker=2``);
  ``asyncrl-batched-noyield``: the inference loop without its ``sched_yield()`` after calls
  longer than ``YIELD_AFTER``; ``asyncrl-batched-compact``: 8 env workers,
  ``compact_obs=True`` (chunks, rings and batches without ``("next", "observation")``);
  ``asyncrl-batched-2x4s2-compact``: both, the layout with the least memory;
  ``asyncrl-batched-chunk16``: 8 env workers, ``transition_chunk_size=16`` (smaller
  rings: less memory for more hand-overs).

For a bigger machine (issue 45 item 6): ``--envs N --workers W`` runs every case with N
envs, the per-worker cases (and PufferLib's, TorchRL's) with W workers of N/W envs, the
floor at batch 1, N/W and N; ``--device cuda`` puts the CNN on the GPU in every case (the
main-process loops, each per-worker worker's policy, central inference's server), and the
floor is then the env steps alone. ``bash scripts/gpu_check.sh atari`` runs it on a lent
GPU machine.

The three main-process loops store each step as CleanRL's does (observation, action,
reward, done into preallocated ``[128, 8, ...]`` tensors; observations kept as uint8).
Per run, after ``--warmup`` batches, ``--seconds`` of batches are timed: frames/s;
CPU-seconds per 10k frames (utime + stime of the process and every live process below
it, read from ``/proc`` before and after: forked workers count); PSS of all those
processes (``/proc/<pid>/smaps_rollup``, read at the end while they are alive; then by
process and by kind of mapping: torch's libraries, anonymous memory, shared memory); and
the cold first batch: seconds from the launch of the interpreter to the first batch.
``--with-optimizer``: every case's trainer also builds CleanRL's Adam, as a training
script does (``torch.optim`` imports torch's compiler stack, about 75 MB, which
collection alone leaves out).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.metadata
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

if os.environ.get("ATARI_CASE", "").startswith("asyncrl"):
    # As a training script does: at module level, which starts the fork server early.
    import asyncrl  # noqa: F401

import numpy as np
import torch
from torch import nn

from benchmarks import ROOT
from benchmarks.pixels import by_kind_mb, by_role_mb, interleave, snapshot
from benchmarks.pixels_throughput import cpu_seconds

OBS_SHAPE = (4, 84, 84)
N_ACTIONS = 4  # Breakout's minimal action set
N_ENVS = 8  # the workload of record; --envs changes it (a machine with more cores)


class Shape:
    """Envs, per-worker workers and the CNN's device of a run (``--envs``, ``--workers``,
    ``--device``): 8 envs, 2 workers, CPU for the workload of record; the same in the
    parent and every case's interpreter."""

    envs, workers, device = N_ENVS, 2, "cpu"

    @classmethod
    def per_worker(cls) -> int:
        return cls.envs // cls.workers

    @classmethod
    def names(cls) -> dict[str, Any]:
        """What the cases' labels are formatted with."""
        return {"envs": cls.envs, "workers": cls.workers, "per_worker": cls.per_worker(),
                "threads": envpool_threads(), "device": cls.device}


def envpool_threads() -> int:
    """EnvPool's threads: one per core, at most one per env (2 on the 2-core machine)."""
    return max(1, min(len(os.sched_getaffinity(0)), Shape.envs))
FRAMES_PER_BATCH = 1024  # CleanRL's ppo_atari: 8 envs x 128 steps
#: EnvPool's options for gymnasium's preprocessing above: no life loss as episode end, no
#: reward clipping, no FIRE on reset, v5's sticky actions and episode cap (108k frames).
ENVPOOL_OPTIONS: dict[str, Any] = {
    "stack_num": 4, "frame_skip": 4, "noop_max": 30, "img_height": 84, "img_width": 84,
    "gray_scale": True, "episodic_life": False, "reward_clip": False,
    "use_fire_reset": False, "repeat_action_probability": 0.25, "max_episode_steps": 27000,
}
ATARI = ("ale_py", "cv2")  # gymnasium's AtariPreprocessing resizes with OpenCV


# -- the workload ------------------------------------------------------------------------------
def atari_factory() -> Callable[[], Any]:
    """``benchmarks.atari_env.make_atari``, imported when a case needs it: that module imports
    ale-py and OpenCV at its top, which EnvPool's process would otherwise hold for nothing."""
    from benchmarks.atari_env import make_atari

    return make_atari


def make_envpool(num_envs: int | None = None, num_threads: int | None = None) -> Any:
    """EnvPool's Breakout with :data:`ENVPOOL_OPTIONS` (the run's envs, a thread per core)."""
    import envpool

    num_envs = Shape.envs if num_envs is None else num_envs
    return envpool.make("Breakout-v5", env_type="gymnasium", num_envs=num_envs,
                        batch_size=num_envs,
                        num_threads=envpool_threads() if num_threads is None else num_threads,
                        seed=0, **ENVPOOL_OPTIONS)


class NatureCNN(nn.Module):
    """CleanRL's Atari agent without its value head: uint8 [..., 4, 84, 84] -> sampled action."""

    def __init__(self) -> None:
        super().__init__()
        self.network = nn.Sequential(
            nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(),
            nn.Linear(64 * 7 * 7, 512), nn.ReLU())
        self.actor = nn.Linear(512, N_ACTIONS)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        batch = obs.shape[:-3]
        logits = self.actor(self.network(obs.reshape(-1, *OBS_SHAPE) / 255.0))
        action = torch.distributions.Categorical(logits=logits).sample()
        return action.reshape(batch)


def make_cnn() -> NatureCNN:
    """The CNN, seeded (the same weights in every case and repeat)."""
    torch.manual_seed(0)
    return NatureCNN()


def make_policy() -> Any:
    """The CNN as the collectors take it."""
    from tensordict.nn import TensorDictModule

    return TensorDictModule(make_cnn(), in_keys=["observation"], out_keys=["action"])


# -- timing ------------------------------------------------------------------------------------
class Meter:
    """The first batch, ``warmup`` batches, then ``seconds`` of timed batches."""

    def __init__(self, warmup: int, seconds: float, launched_at: float,
                 frames_per_batch: int = FRAMES_PER_BATCH) -> None:
        self.warmup, self.seconds, self.launched_at = warmup, seconds, launched_at
        self.frames_per_batch = frames_per_batch  # what every case asks of its collector
        self.seen, self.frames = 0, 0
        self.start = (0.0, 0.0)
        self.result: dict[str, Any] = {}

    def batch(self, frames: int, workers: Callable[[], Any] = set) -> bool:
        """Count a batch of ``frames``; True when the run is done (its numbers taken)."""
        self.seen += 1
        if self.seen == 1:
            self.result["first_batch_s"] = time.time() - self.launched_at
        if self.seen == self.warmup:
            self.start = (time.perf_counter(), cpu_seconds())
            return False
        if self.seen < self.warmup:
            return False
        self.frames += frames
        wall = time.perf_counter() - self.start[0]
        if wall < self.seconds:
            return False
        cpu = cpu_seconds() - self.start[1]
        memory = snapshot(set(workers()))  # while every process is alive
        self.result.update(fps=self.frames / wall, cpu_per_10k=cpu / self.frames * 1e4,
                           frames=self.frames, wall=wall, cpu=cpu,
                           pss_mb=memory["total_mb"], processes=len(memory["processes"]),
                           pss_by_role=by_role_mb(memory["processes"]),
                           pss_by_kind=by_kind_mb(memory["processes"]))
        return True


# -- CleanRL's loop: the CNN in the main process -------------------------------------------------
def cleanrl_loop(reset: Callable[[], Any], step: Callable[[Any], tuple[Any, Any, Any, Any]],
                 meter: Meter) -> None:
    """CleanRL's rollout: per step store the observation, act, step, store reward and done."""
    device, n = torch.device(Shape.device), Shape.envs
    cnn = make_cnn().to(device)
    steps = meter.frames_per_batch // n
    # CleanRL keeps its storage on the device the agent is on
    obs_buf = torch.zeros((steps, n, *OBS_SHAPE), dtype=torch.uint8, device=device)
    act_buf = torch.zeros((steps, n), dtype=torch.long, device=device)
    rew_buf = torch.zeros((steps, n), device=device)
    done_buf = torch.zeros((steps, n), dtype=torch.bool, device=device)
    next_obs = torch.from_numpy(np.asarray(reset())).to(device)
    with torch.no_grad():
        while True:
            for t in range(steps):
                obs_buf[t] = next_obs
                action = cnn(next_obs)
                act_buf[t] = action
                obs, reward, terminated, truncated = step(action.cpu().numpy())
                rew_buf[t] = torch.from_numpy(np.asarray(reward)).to(device)
                done_buf[t] = torch.from_numpy(np.logical_or(terminated, truncated)).to(device)
                next_obs = torch.from_numpy(np.asarray(obs)).to(device)
            if meter.batch(steps * n):
                return


def run_vector(meter: Meter) -> None:
    import gymnasium as gym

    envs = gym.vector.AsyncVectorEnv([atari_factory()] * Shape.envs, shared_memory=True)
    try:
        cleanrl_loop(lambda: envs.reset(seed=0)[0], lambda a: envs.step(a)[:4], meter)
    finally:
        envs.close()


def run_envpool(meter: Meter) -> None:
    envs = make_envpool()
    try:
        cleanrl_loop(lambda: envs.reset()[0], lambda a: envs.step(a)[:4], meter)
    finally:
        envs.close()


def puffer_env(**kwargs: Any) -> Any:
    """PufferLib's gymnasium emulation of :func:`make_atari` (what its workers build; some
    PufferLib versions pass ``buf`` and ``seed``, handed on as they come)."""
    import pufferlib.emulation

    return pufferlib.emulation.GymnasiumPufferEnv(env_creator=atari_factory(), **kwargs)


def run_pufferlib(meter: Meter) -> None:
    import pufferlib.vector

    envs = pufferlib.vector.make(puffer_env, backend=pufferlib.vector.Multiprocessing,
                                 num_envs=Shape.envs, num_workers=Shape.workers,
                                 batch_size=Shape.envs)

    def step(action: Any) -> tuple[Any, Any, Any, Any]:
        envs.send(action)
        return envs.recv()[:4]

    def reset() -> Any:
        envs.async_reset(0)
        return envs.recv()[0]

    try:
        cleanrl_loop(reset, step, meter)
    finally:
        envs.close()


# -- collectors: TorchRL and asyncrl -------------------------------------------------------------
def torchrl_env() -> Any:
    """:func:`make_atari` behind TorchRL's gym wrapper, integer actions."""
    from torchrl.envs import GymWrapper

    return GymWrapper(atari_factory()(), categorical_action_encoding=True)


def run_torchrl(meter: Meter) -> None:
    import torchrl.collectors
    from torchrl.envs import SerialEnv

    # MultiSyncDataCollector before TorchRL 0.14, MultiSyncCollector since.
    cls = (getattr(torchrl.collectors, "MultiSyncCollector", None)
           or torchrl.collectors.MultiSyncDataCollector)
    serial = functools.partial(SerialEnv, Shape.per_worker(), torchrl_env)
    on_device = {} if Shape.device == "cpu" else {"policy_device": Shape.device}
    collector = cls([serial] * Shape.workers, make_policy(),
                    frames_per_batch=meter.frames_per_batch, total_frames=-1,
                    num_threads=1, num_sub_threads=1, **on_device)
    try:
        for batch in collector:
            if meter.batch(batch.numel()):
                break
    finally:
        collector.shutdown()


def run_asyncrl(meter: Meter, kind: str, compact_obs: bool = False,
                layout: dict[str, Any] | None = None) -> None:
    import anyio

    from asyncrl import AsyncBatchedCollector, MultiAsyncCollector, MultiSyncCollector

    def open_collector() -> Any:
        if kind == "batched":
            # named by import path, from a module without torch: its env workers are then
            # torch-free (docs/inference.md, memory); "worker": a per-worker worker's envs
            options = {key: Shape.per_worker() if value == "worker" else value
                       for key, value in (layout or {}).items()}
            return AsyncBatchedCollector("benchmarks.atari_env:make_atari", policy=make_policy(),
                                         num_envs=Shape.envs, device=Shape.device,
                                         frames_per_batch=meter.frames_per_batch,
                                         num_threads=1, **options)
        cls = MultiSyncCollector if kind == "sync" else MultiAsyncCollector
        on_device = {} if Shape.device == "cpu" else {"policy_device": Shape.device}
        return cls(atari_factory(), make_policy(), num_workers=Shape.workers,
                   envs_per_worker=Shape.per_worker(),
                   frames_per_batch=meter.frames_per_batch, compact_obs=compact_obs,
                   num_threads=1, num_sub_threads=1, **on_device)

    async def main() -> None:
        async with open_collector() as collector:
            pids = getattr(collector, "worker_pids", ())
            async for batch in collector:
                if meter.batch(batch.numel(), lambda: pids):
                    break

    anyio.run(main)


def run_batched_without_yield(meter: Meter) -> None:
    """``asyncrl-batched`` with the inference loop's yield after long calls turned off."""
    from asyncrl._inference import inference_loop

    inference_loop.YIELD_AFTER = float("inf")
    run_asyncrl(meter, kind="batched")


# -- the floor -----------------------------------------------------------------------------------
def floor_batches() -> list[int]:
    """The CNN's batch sizes the floor measures: 1, a worker's envs, all envs (1, 4, 8)."""
    return sorted({1, Shape.per_worker(), Shape.envs})


def run_floor(seconds: float) -> dict[str, Any]:
    """CPU ms per env step (one env, random actions) and per CNN frame at each of
    :func:`floor_batches`; then the two in turn in one thread (``interleaved_ms``), as a
    per-worker worker runs them. With the CNN on a GPU the floor is the env steps alone
    (the CNN's CPU is its launches, not its work): its CNN times are 0."""
    env = atari_factory()()
    env.reset(seed=0)
    env.action_space.seed(0)
    steps, start = 0, time.process_time()
    while time.process_time() - start < seconds / 3:
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        steps += 1
        if terminated or truncated:
            env.reset()
    env_ms = (time.process_time() - start) / steps * 1e3
    env.close()
    sizes = floor_batches()
    if Shape.device != "cpu":
        return {"env_ms": env_ms, "cnn_ms": {str(size): 0.0 for size in sizes}}
    cnn, cnn_ms = make_cnn(), {}
    rng = np.random.default_rng(0)
    with torch.no_grad():
        for size in sizes:
            obs = torch.from_numpy(rng.integers(0, 256, (size, *OBS_SHAPE), np.uint8))
            cnn(obs)  # warm-up
            calls, start = 0, time.process_time()
            while time.process_time() - start < seconds / (3 * len(sizes)):
                cnn(obs)
                calls += 1
            cnn_ms[str(size)] = (time.process_time() - start) / (calls * size) * 1e3
    return {"env_ms": env_ms, "cnn_ms": cnn_ms,
            "interleaved_ms": {str(size): run_interleaved(cnn, size, seconds / 6)
                               for size in sorted({Shape.per_worker(), Shape.envs})}}


def run_interleaved(cnn: nn.Module, size: int, seconds: float) -> float:
    """CPU ms per frame of ``size`` envs stepped in turn with the CNN at batch ``size``, in one
    thread: what env and CNN cost together when each evicts the other's data from the caches
    (the floor's sum assumes they run apart)."""
    envs = [atari_factory()() for _ in range(size)]
    obs = np.stack([env.reset(seed=i)[0] for i, env in enumerate(envs)])
    with torch.no_grad():
        frames, start = 0, time.process_time()
        while time.process_time() - start < seconds:
            actions = cnn(torch.from_numpy(obs)).numpy()
            for i, env in enumerate(envs):
                obs[i], _, terminated, truncated, _ = env.step(int(actions[i]))
                if terminated or truncated:
                    obs[i] = env.reset()[0]
            frames += size
    for env in envs:
        env.close()
    return (time.process_time() - start) / frames * 1e3


def floor_fps(floor: dict[str, Any], batch: int, cores: int, envs: int | None = None) -> float:
    """Frames/s if ``min(cores, envs)`` cores did nothing but step envs and run the CNN at
    ``batch`` (``envs``: the run's, 8 unless ``--envs``).

    >>> floor_fps({"env_ms": 0.6, "cnn_ms": {"8": 0.4}}, 8, cores=2)
    2000.0
    """
    envs = Shape.envs if envs is None else envs
    return min(cores, envs) * 1e3 / (floor["env_ms"] + floor["cnn_ms"][str(batch)])


# -- the cases -----------------------------------------------------------------------------------
class Case:
    """A case: its label (formatted with :meth:`Shape.names`), what must import, its runner,
    the batch its CNN runs at: ``"all"`` envs (one CNN for all) or ``"worker"`` (a worker's)."""

    def __init__(self, label: str, needs: tuple[str, ...], run: Callable[[Meter], None],
                 cnn_batch: str) -> None:
        assert cnn_batch in ("all", "worker")
        self.label, self.needs, self.run, self._cnn_batch = label, needs, run, cnn_batch

    @property
    def runs_in_turn(self) -> bool:
        """Whether each worker runs env and CNN in turn in one thread (per-worker inference)."""
        return self._cnn_batch == "worker"

    @property
    def cnn_batch(self) -> int:
        return Shape.envs if self._cnn_batch == "all" else Shape.per_worker()

    def title(self) -> str:
        return self.label.format(**Shape.names())


CASES: dict[str, Case] = {
    "vector": Case("gymnasium AsyncVectorEnv(shared_memory=True), CNN in the main process",
                   ("gymnasium", *ATARI), run_vector, "all"),
    "envpool": Case("EnvPool sync, num_threads={threads}, CNN in the main process",
                    ("envpool",), run_envpool, "all"),
    "pufferlib": Case("PufferLib vector Multiprocessing {workers}x{per_worker}, CNN in the main "
                      "process", ("pufferlib.vector", "pufferlib.emulation", *ATARI),
                      run_pufferlib, "all"),
    "torchrl": Case("TorchRL MultiSync(Data)Collector, {workers} x SerialEnv({per_worker})",
                    ("torchrl", *ATARI), run_torchrl, "worker"),
    "asyncrl-async": Case("asyncrl MultiAsyncCollector {workers}x{per_worker}", ATARI,
                          functools.partial(run_asyncrl, kind="async"), "worker"),
    "asyncrl-async-compact": Case(
        "asyncrl MultiAsyncCollector {workers}x{per_worker}, compact_obs=True", ATARI,
        functools.partial(run_asyncrl, kind="async", compact_obs=True), "worker"),
    "asyncrl-sync": Case("asyncrl MultiSyncCollector {workers}x{per_worker}", ATARI,
                         functools.partial(run_asyncrl, kind="sync"), "worker"),
    "asyncrl-batched": Case("asyncrl AsyncBatchedCollector, {envs} env workers", ATARI,
                            functools.partial(run_asyncrl, kind="batched"), "all"),
    # Other layouts of central inference: fewer env processes, each with several envs. The
    # names say the 8-env workload's shape; with --envs/--workers they take the run's.
    "asyncrl-batched-2x4": Case(
        "asyncrl AsyncBatchedCollector, {workers} env workers x {per_worker} envs", ATARI,
        functools.partial(run_asyncrl, kind="batched", layout={"envs_per_worker": "worker"}),
        "all"),
    "asyncrl-batched-2x4s2": Case(
        "asyncrl AsyncBatchedCollector, {workers} env workers x {per_worker} envs in 2 splits",
        ATARI, functools.partial(run_asyncrl, kind="batched",
                                 layout={"envs_per_worker": "worker", "worker_num_splits": 2}),
        "all"),
    "asyncrl-batched-2x4s2-compact": Case(
        "asyncrl AsyncBatchedCollector, {workers} env workers x {per_worker} envs in 2 splits, "
        "compact_obs=True", ATARI,
        functools.partial(run_asyncrl, kind="batched",
                          layout={"envs_per_worker": "worker", "worker_num_splits": 2,
                                  "compact_obs": True}), "all"),
    "asyncrl-batched-noyield": Case(
        "asyncrl AsyncBatchedCollector, {envs} env workers, no sched_yield after long calls",
        ATARI, run_batched_without_yield, "all"),
    "asyncrl-batched-compact": Case(
        "asyncrl AsyncBatchedCollector, {envs} env workers, compact_obs=True", ATARI,
        functools.partial(run_asyncrl, kind="batched", layout={"compact_obs": True}), "all"),
    "asyncrl-batched-chunk16": Case(
        "asyncrl AsyncBatchedCollector, {envs} env workers, chunks of 16 steps", ATARI,
        functools.partial(run_asyncrl, kind="batched", layout={"transition_chunk_size": 16}),
        "all"),
    "asyncrl-batched-4x2": Case(
        "asyncrl AsyncBatchedCollector, {envs} / 2 env workers x 2 envs", ATARI,
        functools.partial(run_asyncrl, kind="batched", layout={"envs_per_worker": 2}), "all"),
}
FLOOR = "floor"
BASELINES = ("envpool", "vector", "torchrl")


def missing(needs: tuple[str, ...]) -> str | None:
    """Why one of ``needs`` does not import (None when all do)."""
    for name in needs:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a package that is there but broken is missing too
            return f"{name} does not import ({type(exc).__name__}: {exc})"
    return None


#: What ``--with-optimizer`` builds in a case's process, kept until it exits.
_optimizer: list[torch.optim.Optimizer] = []


def build_optimizer() -> None:
    """CleanRL's Adam over a Nature CNN, built as a training script builds it (never stepped).

    Collection alone (the issue's workload) leaves torch's compiler stack out of a
    process that imports only torch: EnvPool's loop. tensordict's import loads it
    (``torch.compiler.allow_in_graph`` imports ``torch._dynamo``, sympy with it), and so
    does building any ``torch.optim`` optimizer; with this, every case's trainer holds
    what a training script's does.
    """
    _optimizer.append(torch.optim.Adam(make_cnn().parameters(), lr=2.5e-4, eps=1e-5))


def run_child(case: str, args: argparse.Namespace) -> None:
    torch.set_num_threads(1)  # one torch thread per process, the main one included
    if args.with_optimizer and case != FLOOR:
        build_optimizer()
    needs = ATARI if case == FLOOR else CASES[case].needs
    reason = missing(needs)
    if reason is not None:
        result: dict[str, Any] = {"skipped": reason}
    elif case == FLOOR:
        result = run_floor(args.seconds)
    else:
        meter = Meter(args.warmup, args.seconds, float(os.environ["ATARI_LAUNCHED_AT"]),
                      args.frames_per_batch)
        CASES[case].run(meter)
        result = meter.result
        result["with_optimizer"] = bool(args.with_optimizer)
    print("RESULT " + json.dumps(result), flush=True)


def run_case(case: str, args: argparse.Namespace) -> dict[str, Any]:
    """One case in a fresh interpreter; its numbers, ``skipped`` or ``error``."""
    env = {**os.environ, "ATARI_CASE": case, "ATARI_LAUNCHED_AT": repr(time.time())}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "benchmarks.atari", "--child", case, "--seconds",
               str(args.seconds), "--warmup", str(args.warmup), "--frames-per-batch",
               str(args.frames_per_batch), "--envs", str(args.envs), "--workers",
               str(args.workers), "--device", args.device,
               *(["--with-optimizer"] if args.with_optimizer else [])]
    try:
        out = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT,
                             timeout=args.seconds * 4 + 300)
    except subprocess.TimeoutExpired as exc:
        return {"error": f"timed out after {exc.timeout:.0f} s"}
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        tail = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        print(f"{case} exited with {out.returncode}:\n{out.stderr[-3000:]}", file=sys.stderr)
        return {"error": f"exit {out.returncode}: {tail[:160]}"}
    result: dict[str, Any] = json.loads(lines[0][len("RESULT "):])
    return result


def _shown(row: dict[str, Any]) -> str:
    if "skipped" in row:
        return "skipped"
    if "error" in row:
        return "error"
    if "env_ms" in row:
        largest = max(row["cnn_ms"], key=int)
        return f"env {row['env_ms']:.3f} ms, CNN@{largest} {row['cnn_ms'][largest]:.3f} ms"
    return f"{row['fps']:,.0f}/s"


# -- the report ----------------------------------------------------------------------------------
def _spread(values: list[float], fmt: str) -> str:
    median = format(statistics.median(values), fmt)
    if len(values) == 1:
        return median
    return f"{median} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def environment() -> str:
    versions = [f"python {platform.python_version()}"]
    for name in ("torch", "gymnasium", "ale_py", "envpool", "pufferlib", "torchrl"):
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            version = "missing"
        versions.append(f"{name} {version}")
    return (f"{len(os.sched_getaffinity(0))} cores, load {os.getloadavg()[0]:.2f}; "
            + ", ".join(versions))


def report(cases: list[str], results: dict[str, list[dict[str, Any]]]) -> None:
    """The floor, the table of medians and ratios, what was skipped, the command."""
    cores = len(os.sched_getaffinity(0))
    sizes = [str(size) for size in floor_batches()]
    worker_batch, all_batch = Shape.per_worker(), Shape.envs
    floor, one_thread = None, None
    floors = [r for r in results.get(FLOOR, []) if "env_ms" in r]
    if floors:
        floor = {"env_ms": statistics.median(r["env_ms"] for r in floors),
                 "cnn_ms": {b: statistics.median(r["cnn_ms"][b] for r in floors) for b in sizes}}
        if Shape.device != "cpu":
            print(f"\nCPU floor (median of {len(floors)}): env step {floor['env_ms']:.3f} ms; "
                  f"the CNN on {Shape.device}: {Shape.envs} envs on "
                  f"{min(cores, Shape.envs)} cores give at most "
                  f"{floor_fps(floor, all_batch, cores):,.0f} frames/s (the env steps alone)")
        else:
            cnn = ", ".join(f"{floor['cnn_ms'][b]:.3f} at batch {b}" for b in sizes)
            print(f"\nCPU floor (median of {len(floors)}): env step {floor['env_ms']:.3f} ms, "
                  f"CNN {cnn} (ms per frame); {Shape.envs} envs on {min(cores, Shape.envs)} "
                  f"cores: at most {floor_fps(floor, all_batch, cores):,.0f} frames/s (CNN at "
                  f"batch {all_batch}), {floor_fps(floor, worker_batch, cores):,.0f} (at batch "
                  f"{worker_batch})")
        together = [r["interleaved_ms"] for r in floors if "interleaved_ms" in r]
        if together:
            both = {b: statistics.median(t[b] for t in together) for b in together[0]}
            print("Env and CNN in turn in one thread (a per-worker worker's way), ms per frame: "
                  + ", ".join(f"{ms:.3f} at batch {b} ("
                              f"{ms / (floor['env_ms'] + floor['cnn_ms'][b]):.2f}x the floor's sum)"
                              for b, ms in both.items()))
            one_thread = min(cores, Shape.envs) * 1e3 / both[str(worker_batch)]
    done = {c: [r for r in results[c] if "fps" in r] for c in cases if c in CASES}
    fps = {c: statistics.median(r["fps"] for r in rows) for c, rows in done.items() if rows}
    bases = [b for b in BASELINES if b in fps]
    print("\n| case | frames/s, median (range) | x floor | x one-thread floor | "
          + "".join(f"x {b} | " for b in bases)
          + "CPU-s per 10k frames | PSS MB, all processes | cold first batch, s |")
    print("|---|---:|---:|---:|" + "---:|" * len(bases) + "---:|---:|---:|")
    for case, rows in done.items():
        if not rows:
            continue
        of_floor = (f"{fps[case] / floor_fps(floor, CASES[case].cnn_batch, cores):.2f}"
                    if floor else "")
        # only the cases whose workers run env and CNN in turn in one thread
        of_one_thread = (f"{fps[case] / one_thread:.2f}"
                         if one_thread and CASES[case].runs_in_turn else "-")
        ratios = "".join(f"{fps[case] / fps[b]:.2f} | " for b in bases)
        print(f"| {case}: {CASES[case].title()} | {_spread([r['fps'] for r in rows], ',.0f')} "
              f"| {of_floor} | {of_one_thread} | {ratios}"
              f"{_spread([r['cpu_per_10k'] for r in rows], '.1f')} | "
              f"{_spread([r['pss_mb'] for r in rows], '.0f')} | "
              f"{_spread([r['first_batch_s'] for r in rows], '.1f')} |")
    for case, rows in done.items():  # where the memory is: PSS by process, median of the runs
        roles = sorted({role for r in rows for role in r.get("pss_by_role", {})})
        if roles:
            def median(role: str, i: int, rows: list[dict[str, Any]] = rows) -> float:
                return statistics.median(r["pss_by_role"].get(role, [0, 0.0])[i] for r in rows)

            print(f"PSS of {case} by process (median MB): " + ", ".join(
                f"{role} x{median(role, 0):.0f} {median(role, 1):.0f}" for role in roles))
        kinds = sorted({(role, kind) for r in rows for role, by in r.get("pss_by_kind", {}).items()
                        for kind in by})
        if kinds:  # and what it maps: torch's libraries, anonymous memory, shared memory...
            def of_kind(role: str, kind: str, rows: list[dict[str, Any]] = rows) -> float:
                return statistics.median(r["pss_by_kind"].get(role, {}).get(kind, 0.0)
                                         for r in rows)

            print(f"PSS of {case} by process and mapping (median MB): " + ", ".join(
                f"{role} {kind} {of_kind(role, kind):.0f}" for role, kind in kinds))
    for case in cases:
        for row in results[case][:1]:
            if "skipped" in row:
                print(f"skipped {case}: {row['skipped']}")
        errors = [r["error"] for r in results[case] if "error" in r]
        if errors:
            print(f"failed {case} ({len(errors)} of {len(results[case])} runs): {errors[-1]}")
    print(f"\n{environment()}")
    print("command: python -m benchmarks.atari " + shlex.join(sys.argv[1:]))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.atari",
                                description=(__doc__ or "").split("\n")[0])
    every = [FLOOR, *CASES]
    p.add_argument("--cases", default=",".join(every),
                   help=f"comma-separated, run in this order: {', '.join(every)}")
    p.add_argument("--repeats", type=int, default=3, help="fresh interpreters per case")
    p.add_argument("--seconds", type=float, default=20.0,
                   help="timed seconds per run (the floor: its measuring time)")
    p.add_argument("--warmup", type=int, default=2,
                   help="batches before the timed ones, the first included")
    p.add_argument("--frames-per-batch", type=int, default=FRAMES_PER_BATCH,
                   help="frames per batch, a multiple of envs x workers")
    p.add_argument("--envs", type=int, default=N_ENVS,
                   help="envs in every case (8: the workload of record; more for more cores)")
    p.add_argument("--workers", type=int, default=2,
                   help="per-worker cases' workers (and PufferLib's, TorchRL's); a divisor "
                        "of --envs")
    p.add_argument("--device", default="cpu",
                   help="where the CNN runs: cpu (of record) or cuda (issue 45 item 6); the "
                        "floor is then the env steps alone")
    p.add_argument("--with-optimizer", action="store_true",
                   help="every case's trainer also builds CleanRL's Adam (as a training "
                        "script does: torch.optim loads torch's compiler stack, about 75 MB)")
    p.add_argument("--json", help="write every run's numbers here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.warmup < 1 or args.seconds <= 0 or args.repeats < 1:
        p.error(f"--warmup and --repeats must be >= 1 and --seconds > 0; got {args.warmup}, "
                f"{args.repeats} and {args.seconds}")
    if args.envs < 1 or args.workers < 1 or args.envs % args.workers:
        p.error(f"--workers must divide --envs (each worker the same envs); got --envs "
                f"{args.envs} and --workers {args.workers}")
    unit = args.envs * args.workers
    if args.frames_per_batch <= 0 or args.frames_per_batch % unit:
        p.error(f"--frames-per-batch must be a positive multiple of {unit} ({args.envs} envs "
                f"x {args.workers} workers), got {args.frames_per_batch}")
    try:
        device = torch.device(args.device)
    except RuntimeError as exc:
        p.error(f"--device {args.device!r} is not a torch device ({exc}); use cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error(f"--device {args.device}: this machine has no CUDA device; use cpu")
    return args


def configure(args: argparse.Namespace) -> None:
    """The run's :class:`Shape` from its arguments (in the parent and in each case's child)."""
    Shape.envs, Shape.workers, Shape.device = args.envs, args.workers, args.device


def case_names(text: str) -> Iterator[str]:
    return (name.strip() for name in text.split(",") if name.strip())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        # Through the module's import name, also when run as ``python -m``: workers
        # unpickle make_atari and the CNN as benchmarks.atari's, never as __main__'s.
        from benchmarks import atari

        atari.configure(args)
        atari.run_child(args.child, args)
        return 0
    configure(args)
    cases = list(case_names(args.cases))
    unknown = [c for c in cases if c != FLOOR and c not in CASES]
    if unknown or not cases:
        print(f"unknown cases {unknown}; expected some of {FLOOR}, {', '.join(CASES)}",
              file=sys.stderr)
        return 2
    known: dict[str, dict[str, Any]] = {}  # a skipped case is not started again

    def run(case: str) -> dict[str, Any]:
        if case in known:
            return known[case]
        result = run_case(case, args)
        if "skipped" in result:
            known[case] = result
            print(f"skipped {case}: {result['skipped']}", flush=True)
        return result

    results = interleave(cases, args.repeats, run, _shown, args.json)
    report(cases, results)
    return 1 if any("error" in r for rows in results.values() for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
