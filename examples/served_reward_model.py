"""PPO on CartPole whose reward comes from a small learned reward model, served once.

    python examples/served_reward_model.py            # 2 workers x 2 envs, 12 batches

The reward model (``next_observation -> reward``) lives once, in the trainer's
process, as an :class:`asyncrl.ServedModule`; every env of every worker calls it
through :class:`asyncrl.ServedReward` (a gymnasium wrapper), batched across envs.
Every ``--reward-every`` batches the trainer fits the reward model to a labelling
function (a stand-in for human preferences: upright and centred is good) and pushes
it with the same call that pushes the policy, by model id::

    await collector.update_policy_weights(reward_model, model_id="env.transform[0]")

Each frame records the reward model's version that computed its reward
(``batch["next", "served_versions", "env.transform[0]"]``, through ``info_keys``);
the script recomputes every batch's rewards with the snapshot of that version and
prints the largest difference (0 up to float rounding), next to the policy's version.
"""

from __future__ import annotations

import argparse
import copy
import functools
import sys
from dataclasses import dataclass, field

import anyio
import gymnasium as gym
import torch
from tensordict import TensorDictBase
from torch import nn

from examples.train_cartpole import PPO, PPOConfig, make_critic, make_policy

NAME = "env.transform[0]"  # the model id: TorchRL's path of the env's first transform
OBS_DIM = 4


class RewardModel(nn.Module):
    """``next_observation [B, 4] -> reward [B, 1]``: a small MLP, served to every env."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(OBS_DIM, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, next_observation: torch.Tensor) -> torch.Tensor:
        return self.net(next_observation)


def label(next_observation: torch.Tensor) -> torch.Tensor:
    """What the reward model learns (a stand-in for preferences): upright and centred."""
    angle = next_observation[..., 2].abs() / 0.21
    position = next_observation[..., 0].abs() / 2.4
    return (1.0 - angle - 0.2 * position).unsqueeze(-1)


def make_env(handle: object) -> gym.Env:  # type: ignore[type-arg]
    """CartPole whose reward is the served reward model's (runs in each worker)."""
    from asyncrl import ServedReward

    return ServedReward(gym.make("CartPole-v1"), handle)  # type: ignore[arg-type]


@torch.no_grad()
def served_rewards(model: nn.Module, batch: TensorDictBase) -> torch.Tensor:
    """The rewards ``model`` gives the batch's steps (what the envs got, if its version)."""
    next_obs = batch["next", "observation"].float()
    return model(next_obs.reshape(-1, OBS_DIM)).reshape(batch["next", "reward"].shape)


def fit(model: nn.Module, optimizer: torch.optim.Optimizer, batch: TensorDictBase,
        steps: int) -> float:
    """A few regression steps of the reward model on the batch's observations."""
    obs = batch["next", "observation"].float().reshape(-1, OBS_DIM)
    target = label(obs)
    loss = torch.zeros(())
    for _ in range(steps):
        loss = (model(obs) - target).pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return float(loss.detach())


@dataclass
class BatchReport:
    index: int
    policy_version: int
    served_versions: list[int]  # the reward model's versions found in the batch
    max_error: float  # |reward - snapshot(version)(next_observation)|, over the batch
    mean_reward: float


@dataclass
class Report:
    batches: list[BatchReport] = field(default_factory=list)
    reward_versions: int = 0
    served_calls: int = 0


async def train(args: argparse.Namespace) -> Report:
    from asyncrl import MultiSyncCollector, ServedModule
    from asyncrl.served import ServedModuleScheme

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    policy = make_policy()
    ppo = PPO(policy.module, make_critic(), PPOConfig(epochs=4))
    reward_model = RewardModel()
    optimizer = torch.optim.Adam(reward_model.parameters(), lr=1e-2)
    snapshots = {0: copy.deepcopy(reward_model)}  # version -> the weights it served
    report = Report()
    clients = args.workers * args.envs_per_worker
    async with ServedModule(reward_model, name=NAME, clients=clients,
                            example={"next_observation": torch.zeros(OBS_DIM)}) as served:
        async with MultiSyncCollector(
                functools.partial(make_env, served.handle), policy, num_workers=args.workers,
                envs_per_worker=args.envs_per_worker, frames_per_batch=args.frames_per_batch,
                total_frames=args.batches * args.frames_per_batch,
                info_keys=[served.handle.info_key],
                weight_sync_schemes={NAME: ServedModuleScheme(served)}) as collector:
            await collector.set_seed(args.seed)
            index = 0
            async for batch in collector:
                versions = batch["next", "served_versions", NAME]
                reward = batch["next", "reward"]
                error = 0.0
                for version in versions.unique().tolist():
                    rows = versions == version
                    expected = served_rewards(snapshots[version], batch)
                    error = max(error, float((reward[rows] - expected[rows]).abs().max()))
                report.batches.append(BatchReport(
                    index, int(batch["collector", "policy_version"].max()),
                    versions.unique().tolist(), error, float(reward.mean())))
                print(f"batch {index}: policy v{report.batches[-1].policy_version} reward "
                      f"model v{versions.unique().tolist()} mean reward {reward.mean():.3f} "
                      f"max |reward - served(v)| {error:.2e}", flush=True)
                ppo.update(batch)
                await collector.update_policy_weights()  # the policy, to every worker
                if (index + 1) % args.reward_every == 0:
                    loss = fit(reward_model, optimizer, batch, args.reward_steps)
                    await collector.update_policy_weights(reward_model, model_id=NAME)
                    snapshots[served.version] = copy.deepcopy(reward_model)
                    print(f"  reward model v{served.version} (fit loss {loss:.4f})")
                index += 1
            report.reward_versions = served.version
            report.served_calls = served.statistics().calls
    return report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--envs-per-worker", type=int, default=2)
    p.add_argument("--frames-per-batch", type=int, default=512)
    p.add_argument("--batches", type=int, default=12)
    p.add_argument("--reward-every", type=int, default=3,
                   help="fit and push the reward model every this many batches")
    p.add_argument("--reward-steps", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    report = anyio.run(train, parse_args(argv))
    worst = max(b.max_error for b in report.batches)
    print(f"{len(report.batches)} batches, reward model at v{report.reward_versions}, "
          f"{report.served_calls} batched calls; largest |reward - served(v)| {worst:.2e}")
    return 0 if worst < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
