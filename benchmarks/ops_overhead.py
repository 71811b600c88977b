"""Trainer-side cost of ``statistics()`` bookkeeping per delivered batch (issue #13).

    python -m benchmarks.ops_overhead            # [envs, T] CartPole-layout batches

Times ``CollectorOperations._note_batch`` (rate, episode returns joined by
``traj_ids``, policy lag), run once per batch handed to the trainer, and one
``statistics()`` snapshot of a collector without workers; nothing here runs in
the workers or per env step.
"""

from __future__ import annotations

import argparse
import time

import torch
from tensordict import TensorDict

from asyncrl.collectors._operations import CollectorOperations


def make_batch(envs: int, steps: int, episode: int, start: int) -> TensorDict:
    t = torch.arange(start, start + steps).expand(envs, steps)
    env = torch.arange(envs).unsqueeze(-1)
    return TensorDict({
        ("collector", "traj_ids"): env * 1_000_000 + t // episode,
        ("collector", "policy_version"): torch.full((envs, steps), 3),
        ("next", "reward"): torch.ones(envs, steps, 1),
        ("next", "done"): (t % episode == episode - 1).unsqueeze(-1),
        "observation": torch.zeros(envs, steps, 4),
    }, [envs, steps])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--steps", type=int, default=256)
    p.add_argument("--episode", type=int, default=22, help="steps per episode")
    p.add_argument("--batches", type=int, default=2000)
    args = p.parse_args()
    ops = CollectorOperations()
    ops._init_operations()
    batches = [make_batch(args.envs, args.steps, args.episode, i * args.steps)
               for i in range(16)]
    for b in batches:
        ops._note_batch(b)  # warm up
    start = time.perf_counter()
    for i in range(args.batches):
        ops._note_batch(batches[i % len(batches)])
    per_batch = (time.perf_counter() - start) / args.batches
    start = time.perf_counter()
    for _ in range(args.batches):
        ops.statistics()
    per_snapshot = (time.perf_counter() - start) / args.batches
    frames = args.envs * args.steps
    print(f"batch [{args.envs}, {args.steps}] ({frames} frames, episodes of {args.episode} "
          f"steps): _note_batch {per_batch * 1e6:.0f} us/batch "
          f"({per_batch / frames * 1e9:.0f} ns/frame); statistics() {per_snapshot * 1e6:.1f} us; "
          f"episode_return_mean={ops.statistics().episode_return_mean}")


if __name__ == "__main__":
    main()
