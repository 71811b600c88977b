"""TorchRL's SAC on Pendulum-v1, ported to asyncrl: off-policy, collection overlapping training.

    python examples/sac_pendulum.py                          # asyncrl's AsyncCollector
    python examples/sac_pendulum.py --collector torchrl      # the same, TorchRL's AsyncCollector

TorchRL's SAC pieces, unchanged: a TanhNormal ``ProbabilisticActor``, two Q
networks (``ValueOperator`` on observation and action), ``SACLoss``,
``SoftUpdate`` and a ``ReplayBuffer`` over ``LazyTensorStorage``. The
collector is an ``AsyncCollector`` (TorchRL 0.14's name: one worker process
that collects ahead of the trainer), so the env steps while the trainer
makes its gradient updates. The number of updates per collected frame (the
UTD ratio, ``--utd``) is kept exactly by :class:`asyncrl.UpdateRatio`; the
first ``--init-random-frames`` frames only fill the buffer.

``--collector torchrl`` runs TorchRL's own ``AsyncCollector`` on the same env,
networks, loss and ratio, so the two can be compared line by line
(docs/off_policy.md) and timed (``benchmarks.sac_port``).
"""

import argparse
import time
from collections.abc import Callable
from typing import Any

import anyio
import torch
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.collectors import AsyncCollector as TorchRLAsyncCollector
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.envs import Compose, DoubleToFloat, RewardSum, StepCounter, TransformedEnv
from torchrl.envs.libs.gym import GymEnv
from torchrl.modules import MLP, ProbabilisticActor, TanhNormal, ValueOperator
from torchrl.objectives import SACLoss, SoftUpdate

import asyncrl

HIDDEN = 64


def make_env() -> TransformedEnv:
    """Pendulum-v1 with TorchRL's usual transforms (module level: the worker imports it)."""
    return TransformedEnv(GymEnv("Pendulum-v1"),
                          Compose(DoubleToFloat(), StepCounter(), RewardSum()))


def make_actor() -> ProbabilisticActor:
    net = nn.Sequential(nn.Linear(3, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                        nn.Linear(HIDDEN, 2), NormalParamExtractor())
    module = TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"])
    return ProbabilisticActor(module, in_keys=["loc", "scale"], distribution_class=TanhNormal,
                              distribution_kwargs={"low": -2.0, "high": 2.0},
                              return_log_prob=False)


def make_qvalue() -> ValueOperator:
    # TorchRL's MLP concatenates its inputs: Q(observation, action)
    net = MLP(in_features=4, out_features=1, num_cells=[HIDDEN, HIDDEN], activation_class=nn.ReLU)
    return ValueOperator(net, in_keys=["observation", "action"])


class Learner:
    """SACLoss + SoftUpdate over a ReplayBuffer: TorchRL's SAC, unchanged."""

    def __init__(self, actor: ProbabilisticActor, qvalue: ValueOperator, *,
                 buffer_size: int, batch_size: int = 128, lr: float = 3e-4) -> None:
        self.actor, self.batch_size = actor, batch_size
        # target_entropy: "auto" is -dim(action), -1 for Pendulum (given: no env spec here)
        self.loss = SACLoss(actor, qvalue, num_qvalue_nets=2, target_entropy=-1.0)
        self.loss.make_value_estimator(gamma=0.99)
        self.target = SoftUpdate(self.loss, eps=0.995)
        self.optim = torch.optim.Adam(self.loss.parameters(), lr=lr)
        self.buffer = ReplayBuffer(storage=LazyTensorStorage(buffer_size))

    def update(self) -> float:
        """One gradient step on a sampled minibatch; returns the critic loss."""
        losses = self.loss(self.buffer.sample(self.batch_size))
        total = losses["loss_actor"] + losses["loss_qvalue"] + losses["loss_alpha"]
        self.optim.zero_grad()
        total.backward()
        self.optim.step()
        self.target.step()
        return float(losses["loss_qvalue"].detach())


def mean_return(batch: Any) -> float:
    returns = batch["next", "episode_reward"][batch["next", "done"]]
    return float(returns.mean()) if returns.numel() else float("nan")


async def run_asyncrl(args: argparse.Namespace, learner: Learner, utd: asyncrl.UpdateRatio,
                      report: Callable[[int, int, float], None]) -> None:
    async with asyncrl.AsyncCollector(
            make_env, learner.actor, frames_per_batch=args.frames_per_batch,
            total_frames=args.total_frames, init_random_frames=args.init_random_frames) as c:
        async for batch in c:  # the worker collects the next batch while we train
            learner.buffer.extend(batch)
            for _ in utd.take(c.frames_collected):
                learner.update()
            c.update_policy_weights_()  # TorchRL's call: starts now, awaited or not
            report(batch.numel(), utd.updates, mean_return(batch))


def run_torchrl(args: argparse.Namespace, learner: Learner, utd: asyncrl.UpdateRatio,
                report: Callable[[int, int, float], None]) -> None:
    collector = TorchRLAsyncCollector(
        make_env, learner.actor, frames_per_batch=args.frames_per_batch,
        total_frames=args.total_frames, init_random_frames=args.init_random_frames)
    frames = 0
    try:
        for batch in collector:
            frames += batch.numel()
            learner.buffer.extend(batch)
            for _ in utd.take(frames):
                learner.update()
            collector.update_policy_weights_()
            report(batch.numel(), utd.updates, mean_return(batch))
    finally:
        collector.shutdown()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="TorchRL's SAC on Pendulum-v1, collected by "
                                            "asyncrl's (or TorchRL's) AsyncCollector")
    p.add_argument("--collector", choices=("asyncrl", "torchrl"), default="asyncrl",
                   help="whose AsyncCollector collects (default: asyncrl)")
    p.add_argument("--frames-per-batch", type=int, default=200, help="(default 200)")
    p.add_argument("--total-frames", type=int, default=20_000, help="(default 20000)")
    p.add_argument("--init-random-frames", type=int, default=1_000,
                   help="random actions first; no update before (default 1000)")
    p.add_argument("--utd", type=float, default=0.25,
                   help="gradient updates per collected frame (default 0.25)")
    p.add_argument("--batch-size", type=int, default=128, help="minibatch (default 128)")
    p.add_argument("--seed", type=int, default=0, help="torch seed (default 0)")
    p.add_argument("--quiet", action="store_true", help="print only the summary")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Train; returns frames, updates, seconds and the last mean episode return."""
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    learner = Learner(make_actor(), make_qvalue(), buffer_size=args.total_frames,
                      batch_size=args.batch_size)
    # Updates start once the random frames are in: the ratio counts from there.
    utd = asyncrl.UpdateRatio(args.utd, start_after=args.init_random_frames)
    totals = {"frames": 0.0, "updates": 0.0, "seconds": 0.0, "steady_s": 0.0,
              "last_return": float("nan")}
    started = time.perf_counter()
    first: list[float] = []  # when the first batch was in (worker start-up excluded after it)

    def report(frames: int, updates: int, ret: float) -> None:
        totals["frames"] += frames
        totals["updates"] = updates
        if not first:
            first.append(time.perf_counter())
        if ret == ret:  # not NaN: an episode ended in this batch
            totals["last_return"] = ret
        if not args.quiet:
            print(f"{args.collector}: {int(totals['frames']):>7} frames  {updates:>6} updates  "
                  f"return {ret:8.1f}", flush=True)

    if args.collector == "asyncrl":
        anyio.run(run_asyncrl, args, learner, utd, report)
    else:
        run_torchrl(args, learner, utd, report)
    totals["seconds"] = time.perf_counter() - started
    totals["steady_s"] = time.perf_counter() - first[0] if first else 0.0
    print(f"{args.collector}: {int(totals['frames'])} frames, {int(totals['updates'])} updates "
          f"in {totals['seconds']:.1f} s; last return {totals['last_return']:.1f}", flush=True)
    return totals


if __name__ == "__main__":
    main()
