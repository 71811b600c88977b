"""TorchRL's PPO on Pendulum-v1, ported to asyncrl: the import and ``async with`` / ``async for``.

    python examples/ppo_pendulum.py                          # asyncrl, 2 worker processes
    python examples/ppo_pendulum.py --collector torchrl      # the same, TorchRL's collector

This is the script of TorchRL's PPO tutorial (GymEnv with DoubleToFloat +
StepCounter + RewardSum, a ProbabilisticActor with a TanhNormal, a
ValueOperator, GAE, ClipPPOLoss, a ReplayBuffer of minibatches) with one
change: the collector. ``--collector torchrl`` runs TorchRL's own
``MultiSyncCollector`` on the same env, policy and loss, so the two can be
compared line by line (docs/migration.md) and timed (``benchmarks.ppo_port``).

Everything but the collector is TorchRL: asyncrl's batches go straight into
GAE, ClipPPOLoss and the ReplayBuffer.
"""

import argparse
import time
from collections.abc import Callable
from typing import Any

import anyio
import torch
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.collectors import MultiSyncCollector as TorchRLMultiSyncCollector
from torchrl.data import LazyTensorStorage, ReplayBuffer, SamplerWithoutReplacement
from torchrl.envs import Compose, DoubleToFloat, RewardSum, StepCounter, TransformedEnv
from torchrl.envs.libs.gym import GymEnv
from torchrl.modules import ProbabilisticActor, TanhNormal, ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

import asyncrl

HIDDEN = 64


def make_env() -> TransformedEnv:
    """Pendulum-v1 as TorchRL's tutorial builds it (module level: workers import it)."""
    return TransformedEnv(GymEnv("Pendulum-v1"),
                          Compose(DoubleToFloat(), StepCounter(), RewardSum()))


def make_actor() -> ProbabilisticActor:
    net = nn.Sequential(nn.Linear(3, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                        nn.Linear(HIDDEN, 2), NormalParamExtractor())
    module = TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"])
    return ProbabilisticActor(module, in_keys=["loc", "scale"], distribution_class=TanhNormal,
                              distribution_kwargs={"low": -2.0, "high": 2.0},
                              return_log_prob=True)


def make_critic() -> ValueOperator:
    net = nn.Sequential(nn.Linear(3, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                        nn.Linear(HIDDEN, 1))
    return ValueOperator(net, in_keys=["observation"])


class Learner:
    """GAE + ClipPPOLoss over minibatches of a ReplayBuffer: TorchRL's tutorial, unchanged."""

    def __init__(self, actor: ProbabilisticActor, critic: ValueOperator, *,
                 frames_per_batch: int, epochs: int = 4, minibatch: int = 64) -> None:
        self.actor, self.epochs, self.minibatch = actor, epochs, minibatch
        self.advantage = GAE(gamma=0.99, lmbda=0.95, value_network=critic,
                             average_gae=True)
        self.loss = ClipPPOLoss(actor, critic, clip_epsilon=0.2, entropy_coeff=1e-4)
        self.optim = torch.optim.Adam(self.loss.parameters(), lr=3e-4)
        self.buffer = ReplayBuffer(storage=LazyTensorStorage(frames_per_batch),
                                   sampler=SamplerWithoutReplacement())

    def train(self, batch: Any) -> float:
        """One PPO update on a ``[..., T]`` batch; returns the mean episode return seen."""
        for _ in range(self.epochs):
            self.advantage(batch)
            self.buffer.extend(batch.reshape(-1))
            for _ in range(batch.numel() // self.minibatch):
                sub = self.buffer.sample(self.minibatch)
                losses = self.loss(sub)
                total = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
                self.optim.zero_grad()
                total.backward()
                nn.utils.clip_grad_norm_(self.loss.parameters(), 1.0)
                self.optim.step()
        done = batch["next", "done"]
        returns = batch["next", "episode_reward"][done]
        return float(returns.mean()) if returns.numel() else float("nan")


async def run_asyncrl(args: argparse.Namespace, learner: Learner,
                      report: Callable[[int, float, float], None]) -> None:
    async with asyncrl.MultiSyncCollector(
            [make_env] * args.workers, learner.actor, frames_per_batch=args.frames_per_batch,
            total_frames=args.total_frames) as collector:
        waited = time.perf_counter()
        async for batch in collector:
            collected = time.perf_counter() - waited
            mean_return = learner.train(batch)
            await collector.update_policy_weights()
            report(batch.numel(), collected, mean_return)
            waited = time.perf_counter()


def run_torchrl(args: argparse.Namespace, learner: Learner,
                report: Callable[[int, float, float], None]) -> None:
    collector = TorchRLMultiSyncCollector(
        [make_env] * args.workers, learner.actor, frames_per_batch=args.frames_per_batch,
        total_frames=args.total_frames)
    try:
        waited = time.perf_counter()
        for batch in collector:
            collected = time.perf_counter() - waited
            mean_return = learner.train(batch)
            collector.update_policy_weights_()
            report(batch.numel(), collected, mean_return)
            waited = time.perf_counter()
    finally:
        collector.shutdown()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="TorchRL's PPO tutorial on Pendulum-v1, collected by "
                                            "asyncrl's (or TorchRL's) MultiSyncCollector")
    p.add_argument("--collector", choices=("asyncrl", "torchrl"), default="asyncrl",
                   help="whose MultiSyncCollector collects (default: asyncrl)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--frames-per-batch", type=int, default=1000, help="(default 1000)")
    p.add_argument("--total-frames", type=int, default=50_000, help="(default 50000)")
    p.add_argument("--seed", type=int, default=0, help="torch seed (default 0)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Train; returns the seconds spent waiting for batches, frames and the last return."""
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    learner = Learner(make_actor(), make_critic(), frames_per_batch=args.frames_per_batch)
    totals = {"frames": 0.0, "collect_s": 0.0, "batches": 0.0, "last_return": float("nan")}

    def report(frames: int, collected: float, mean_return: float) -> None:
        totals["frames"] += frames
        totals["batches"] += 1
        if totals["batches"] > 1:  # the first batch also pays the workers' start
            totals["collect_s"] += collected
        totals["last_return"] = mean_return
        print(f"{args.collector}: {int(totals['frames']):>7} frames  "
              f"collect {collected * 1000:6.0f} ms  return {mean_return:8.1f}", flush=True)

    if args.collector == "asyncrl":
        anyio.run(run_asyncrl, args, learner, report)
    else:
        run_torchrl(args, learner, report)
    return totals


if __name__ == "__main__":
    main()
