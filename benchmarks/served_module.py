"""A reward model served once (asyncrl.ServedModule) against a copy of it in every worker.

    python -m benchmarks.served_module                     # 3 repeats, interleaved
    python -m benchmarks.served_module --hidden 2048 --workers 2 --envs-per-worker 4 --repeats 3

Both cases collect CartPole-v1 with a random policy on a ``MultiSyncCollector``
(``--workers`` x ``--envs-per-worker`` envs, ``--frames-per-batch``) whose reward comes
from the same MLP reward model (``next_observation -> reward``, ``--hidden`` units, 3
hidden layers):

- ``served``: one ``ServedModule`` in the trainer's process; every env calls it through
  ``asyncrl.ServedReward`` (its calls batched across envs);
- ``served-process``: the same, hosted in a process of its own
  (``server_backend="process"``);
- ``served-ray`` (with ``--ray``): the same, hosted in a Ray actor
  (``server_backend="ray"``) of a local Ray cluster the case starts (``ray.init``); its
  PSS counts the actor's process, not Ray's own daemons (GCS, raylet, ...);
- ``copied``: each worker process builds its own copy of the model (one per worker,
  shared by its envs' wrappers) and each env calls it at every step.

Each case runs in a fresh interpreter; repeats alternate the cases. Reported per case:
``start_s`` (from opening the module / collector to the first batch), ``frames_s``
(frames per second over the batches after the first), ``pss_mb`` (the summed
proportional set size of the trainer and every process below it, read after the last
batch while they are alive). Medians over the repeats, and ratios to ``copied``.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import time
from typing import Any

import gymnasium as gym
import numpy as np

from benchmarks.pixels import descendants, pss_kb

#: The cases, in the order each repeat runs them (``copied``, the reference, last).
CASES = ("served", "served-process", "served-ray", "copied")
BACKENDS = {"served": "thread", "served-process": "process", "served-ray": "ray"}


@functools.cache  # one copy per process (per worker, in ``copied``)
def shared_copy(hidden: int) -> Any:
    return reward_model(hidden)


def reward_model(hidden: int) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                         nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1))


class CopiedReward(gym.Wrapper):  # type: ignore[type-arg]
    """The reward model copied into this env's process, called at every step."""

    def __init__(self, env: gym.Env, hidden: int) -> None:  # type: ignore[type-arg]
        import torch

        super().__init__(env)
        torch.set_num_threads(1)
        self.model = shared_copy(hidden)

    def step(self, action: Any) -> Any:
        import torch

        obs, _, terminated, truncated, info = self.env.step(action)
        with torch.no_grad():
            reward = float(self.model(torch.from_numpy(np.asarray(obs, np.float32))[None]))
        return obs, reward, terminated, truncated, info


def copied_env(hidden: int) -> gym.Env:  # type: ignore[type-arg]
    return CopiedReward(gym.make("CartPole-v1"), hidden)


def served_env(handle: Any) -> gym.Env:  # type: ignore[type-arg]
    from asyncrl import ServedReward

    return ServedReward(gym.make("CartPole-v1"), handle)


async def run_case(case: str, args: argparse.Namespace) -> dict[str, float]:
    import contextlib
    import os

    import torch

    from asyncrl import MultiSyncCollector, ServedModule

    torch.set_num_threads(1)
    if case == "served-ray":
        import ray

        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    start = time.monotonic()
    actor = -1
    async with contextlib.AsyncExitStack() as stack:
        if case.startswith("served"):
            served = await stack.enter_async_context(ServedModule(
                reward_model(args.hidden), name="reward",
                example={"next_observation": torch.zeros(4)},
                clients=args.workers * args.envs_per_worker, threads=1,
                server_backend=BACKENDS[case]))
            actor = served.pid if case == "served-ray" else -1
            factory = functools.partial(served_env, served.handle)
        else:
            factory = functools.partial(copied_env, args.hidden)
        collector = await stack.enter_async_context(MultiSyncCollector(
            factory, num_workers=args.workers, envs_per_worker=args.envs_per_worker,
            frames_per_batch=args.frames_per_batch,
            total_frames=args.frames_per_batch * (args.batches + 1)))
        first = steady = 0.0
        frames = 0
        async for batch in collector:
            now = time.monotonic()
            if not first:
                first, steady = now - start, now
            else:
                frames += batch.numel()
        elapsed = time.monotonic() - steady
        me = os.getpid()
        # Ray's daemons are this driver's children too: only its actor counts
        pss = sum(pss_kb(p) for p in [me, *descendants(me)]
                  if p == actor or not _ray_daemon(p)) / 1024
    return {"start_s": first, "frames_s": frames / elapsed, "pss_mb": pss}


def _ray_daemon(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            line = f.read()
    except OSError:
        return False
    return any(mark in line for mark in (b"/ray/", b"ray::", b"gcs_server", b"raylet"))


def child(args: argparse.Namespace) -> None:
    import anyio

    print("RESULT", json.dumps(anyio.run(run_case, args.case, args)), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--envs-per-worker", type=int, default=4)
    p.add_argument("--frames-per-batch", type=int, default=512)
    p.add_argument("--batches", type=int, default=6)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--ray", action="store_true",
                   help="add the served-ray case (a local Ray cluster, the ray extra)")
    p.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.case:
        child(args)
        return 0
    cases = [c for c in CASES if args.ray or c != "served-ray"]
    rows: dict[str, list[dict[str, float]]] = {case: [] for case in cases}
    passed = [a for a in (argv if argv is not None else sys.argv[1:])]
    for _ in range(args.repeats):
        for case in rows:
            out = subprocess.run([sys.executable, "-m", "benchmarks.served_module", *passed,
                                  "--case", case], capture_output=True, text=True, timeout=900,
                                 check=True).stdout
            line = next(x for x in out.splitlines() if x.startswith("RESULT "))
            rows[case].append(json.loads(line[len("RESULT "):]))
            print(case, rows[case][-1], flush=True)
    print("command: python -m benchmarks.served_module " + " ".join(passed))
    med = {c: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for c, rs in rows.items()}
    print("| case | start to first batch (s) | frames/s | PSS, all processes (MB) |")
    print("|---|---|---|---|")
    for case, m in med.items():
        print(f"| {case} | {m['start_s']:.1f} | {m['frames_s']:.0f} | {m['pss_mb']:.0f} |")
    c = med["copied"]
    for case in cases[:-1]:
        s = med[case]
        print(f"| {case} / copied | {s['start_s'] / c['start_s']:.2f}x | "
              f"{s['frames_s'] / c['frames_s']:.2f}x | {s['pss_mb'] / c['pss_mb']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
