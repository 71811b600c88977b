"""Learn CartPole-v1 with PPO on an asyncrl multi-process collector.

    python examples/train_cartpole.py            # 2 workers, stops at a mean return >= 195

Two worker processes step CartPole with the current actor and send back
TorchRL-layout batches; the trainer runs a compact PPO (GAE, clipped surrogate,
value loss, entropy bonus) in plain torch, then ``await
collector.update_policy_weights()`` pushes the new weights and returns once both
workers applied them. Sync mode makes it on-policy: every batch after the update
was collected with the new weights (the progress bar's ``lag`` stays 0).

The script exits 0 once the mean return of the last ``--window`` finished
episodes reaches ``--target`` and 1 if ``--max-frames`` frames did not get there.
torchrl is not needed; tqdm is (``pip install "asyncrl[progress]"``): the bar is
:class:`asyncrl.Progress`, whose figures (frames/s, mean return, policy lag,
workers) all come from ``collector.statistics()``.

Workers on other hosts (or other terminals) join the same run:

    python examples/train_cartpole.py --workers 0 --remote-workers 2 --listen tcp://0.0.0.0:5555
    asyncrl worker --connect tcp://TRAINER:5555 --env CartPole-v1 --envs-per-worker 4 \
        --policy examples.train_cartpole:make_policy --workers 2     # from the repository root
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import anyio
import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn

OBS_DIM, N_ACTIONS = 4, 2  # CartPole-v1


class Actor(nn.Module):
    """Observation -> (sampled action, its log-probability). Runs in the workers."""

    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(OBS_DIM, hidden), nn.Tanh(),
            nn.Linear(hidden, hidden), nn.Tanh(),
            nn.Linear(hidden, N_ACTIONS),
        )

    def distribution(self, observation: torch.Tensor) -> torch.distributions.Categorical:
        return torch.distributions.Categorical(logits=self.net(observation))

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dist = self.distribution(observation)
        action = dist.sample()
        return action, dist.log_prob(action)


def make_policy(hidden: int = 64) -> TensorDictModule:
    """The collector's policy: writes ``"action"`` and ``"action_log_prob"``."""
    return TensorDictModule(Actor(hidden), in_keys=["observation"],
                            out_keys=["action", "action_log_prob"])


def make_critic(hidden: int = 64) -> nn.Module:
    return nn.Sequential(
        nn.Linear(OBS_DIM, hidden), nn.Tanh(),
        nn.Linear(hidden, hidden), nn.Tanh(),
        nn.Linear(hidden, 1),
    )


# -- PPO in plain torch ----------------------------------------------------------------------
@dataclass
class PPOConfig:
    gamma: float = 0.99
    lmbda: float = 0.95
    clip: float = 0.2
    epochs: int = 10
    minibatch: int = 256
    lr: float = 1e-3
    value_coef: float = 0.5
    entropy_coef: float = 0.0
    max_grad_norm: float = 0.5


@torch.no_grad()
def gae(reward: torch.Tensor, value: torch.Tensor, next_value: torch.Tensor,
        terminated: torch.Tensor, done: torch.Tensor, gamma: float,
        lmbda: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the last dim (time) of ``[..., T]`` tensors.

    ``terminated`` cuts the bootstrap (no value after a real end); ``done``
    (terminated or truncated) cuts the trace, so a time-limit truncation still
    bootstraps from the value of its final observation. Returns (advantage,
    value target).
    """
    not_terminated = 1.0 - terminated.float()
    not_done = 1.0 - done.float()
    delta = reward + gamma * next_value * not_terminated - value
    advantage = torch.zeros_like(delta)
    running = torch.zeros_like(delta[..., 0])
    for t in range(delta.shape[-1] - 1, -1, -1):
        running = delta[..., t] + gamma * lmbda * not_done[..., t] * running
        advantage[..., t] = running
    return advantage, advantage + value


class PPO:
    """Clipped-surrogate PPO on TorchRL-layout batches of shape ``[envs, T]``."""

    def __init__(self, actor: Actor, critic: nn.Module, config: PPOConfig) -> None:
        self.actor, self.critic, self.config = actor, critic, config
        params = list(actor.parameters()) + list(critic.parameters())
        self.optimizer = torch.optim.Adam(params, lr=config.lr)

    def update(self, batch: TensorDictBase) -> dict[str, float]:
        cfg = self.config
        obs = batch["observation"].float()
        next_obs = batch["next", "observation"].float()
        with torch.no_grad():
            value = self.critic(obs).squeeze(-1)
            next_value = self.critic(next_obs).squeeze(-1)
        advantage, target = gae(
            batch["next", "reward"].squeeze(-1).float(), value, next_value,
            batch["next", "terminated"].squeeze(-1), batch["next", "done"].squeeze(-1),
            cfg.gamma, cfg.lmbda)
        flat = {
            "obs": obs.reshape(-1, obs.shape[-1]),
            "action": batch["action"].reshape(-1),
            "old_log_prob": batch["action_log_prob"].reshape(-1).float(),
            "advantage": advantage.reshape(-1),
            "target": target.reshape(-1),
        }
        n = flat["action"].numel()
        stats: dict[str, float] = {}
        for _ in range(cfg.epochs):
            for idx in torch.randperm(n).split(cfg.minibatch):
                stats = self._step({k: v[idx] for k, v in flat.items()})
        return stats

    def _step(self, mb: dict[str, torch.Tensor]) -> dict[str, float]:
        cfg = self.config
        adv = mb["advantage"]
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        dist = self.actor.distribution(mb["obs"])
        ratio = (dist.log_prob(mb["action"]) - mb["old_log_prob"]).exp()
        surrogate = torch.min(ratio * adv, ratio.clamp(1 - cfg.clip, 1 + cfg.clip) * adv)
        policy_loss = -surrogate.mean()
        value_loss = (self.critic(mb["obs"]).squeeze(-1) - mb["target"]).pow(2).mean()
        entropy = dist.entropy().mean()
        loss = policy_loss + cfg.value_coef * value_loss - cfg.entropy_coef * entropy
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.optimizer.param_groups[0]["params"], cfg.max_grad_norm)
        self.optimizer.step()
        return {"policy_loss": policy_loss.item(), "value_loss": value_loss.item(),
                "entropy": entropy.item()}


# -- the loop ---------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--remote-workers", type=int, default=0,
                   help="also wait for this many 'asyncrl worker' processes (needs --listen)")
    p.add_argument("--listen", default=None, metavar="tcp://HOST:PORT",
                   help="where remote workers connect (e.g. tcp://0.0.0.0:5555)")
    p.add_argument("--envs-per-worker", type=int, default=4)
    p.add_argument("--frames-per-batch", type=int, default=2048)
    p.add_argument("--max-frames", type=int, default=500_000,
                   help="give up (exit 1) after this many frames")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", type=float, default=195.0,
                   help="mean return over the last --window finished episodes")
    p.add_argument("--window", type=int, default=20,
                   help="episodes in the mean return (at most 100, the collector's window)")
    p.add_argument("--lr", type=float, default=PPOConfig.lr)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


async def train(args: argparse.Namespace) -> int:
    from asyncrl import MultiSyncCollector, Progress

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # two cores: leave one to the workers
    policy = make_policy()
    ppo = PPO(policy.module, make_critic(), PPOConfig(lr=args.lr))
    window = min(args.window, 100)  # the collector keeps the last 100 episode returns
    batches = -(-args.max_frames // args.frames_per_batch)  # whole batches, rounded up
    start = time.perf_counter()
    frames, first_batch_s = 0, float("nan")
    returns: list[float] = []
    async with MultiSyncCollector(
        "CartPole-v1", policy, num_workers=args.workers,
        envs_per_worker=args.envs_per_worker, frames_per_batch=args.frames_per_batch,
        total_frames=batches * args.frames_per_batch,
        remote_workers=args.remote_workers, listen=args.listen,
    ) as collector:
        if args.listen:
            print(f"listening on {collector.endpoint} for {args.remote_workers} remote "
                  "worker(s)", flush=True)
        await collector.set_seed(args.seed)
        with Progress(collector, disable=args.no_progress) as progress:
            async for batch in collector:
                if not frames:
                    first_batch_s = time.perf_counter() - start
                frames += batch.numel()
                returns = collector.episode_returns(window)
                progress.update()  # frames/s, return, lag, workers: collector.statistics()
                if len(returns) == window and mean(returns) >= args.target:
                    break
                ppo.update(batch)
                await collector.update_policy_weights()
        episodes = collector.statistics().episodes
    elapsed = time.perf_counter() - start
    solved = len(returns) == window and mean(returns) >= args.target
    summary = (f"episodes={episodes} mean_return(last {len(returns)})="
               f"{mean(returns):.1f} frames={frames} seconds={elapsed:.1f} "
               f"(first batch after {first_batch_s:.1f} s)")
    if solved:
        print(f"SOLVED CartPole-v1 (target {args.target:g}): {summary}")
        return 0
    print(f"NOT SOLVED: target {args.target:g} not reached within --max-frames "
          f"{args.max_frames}: {summary}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    return anyio.run(train, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
