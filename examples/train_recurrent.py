"""Learn CartPole-v1 without velocities: an LSTM policy, PPO, asyncrl worker processes.

    python examples/train_recurrent.py                 # default budget, prints returns per batch
    python examples/train_recurrent.py --frames 2048   # a smoke run

The cart and pole velocities are masked out (`MaskVelocity`): one observation
says where the pole is, not where it is going, so a memoryless policy cannot
balance it for long; an LSTM can, by remembering the previous positions.

The actor is TorchRL's ``LSTMModule`` followed by a categorical head. asyncrl
finds its state keys (``recurrent_state_h``/``_c``), carries them step to step
in each env of each worker, zeroes them and sets ``is_init`` at every reset,
and stores them in the batch in TorchRL's layout. The loss replays each env's
row of the ``[envs, T]`` batch in ``set_recurrent_mode(True)``, starting from
the stored state at the row's first frame (truncated backprop through time
over the batch). The value head shares the LSTM; the bootstrap value of a
``("next", "observation")`` is one LSTM step from the stored next state.
Needs the torchrl extra.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque

import anyio
import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.modules import LSTMModule, ProbabilisticActor, set_recurrent_mode

N_ACTIONS = 2


class MaskVelocity(gym.ObservationWrapper):
    """CartPole's ``[x, x_dot, theta, theta_dot]`` -> ``[x, theta]``."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        low, high = env.observation_space.low, env.observation_space.high
        self.observation_space = gym.spaces.Box(low[[0, 2]], high[[0, 2]], dtype=np.float32)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[[0, 2]]


def make_env() -> gym.Env:
    """The workers' env factory (module level: it travels to them by reference)."""
    return MaskVelocity(gym.make("CartPole-v1"))


def make_modules(hidden: int = 64, obs_dim: int = 2) -> tuple[TensorDictSequential, nn.Module]:
    """The collector's actor (LSTM -> logits -> sampled action) and the value head."""
    lstm = LSTMModule(input_size=obs_dim, hidden_size=hidden, in_key="observation", out_key="embed")
    head = TensorDictModule(nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(),
                                          nn.Linear(hidden, N_ACTIONS)),
                            in_keys=["embed"], out_keys=["logits"])
    actor = ProbabilisticActor(
        TensorDictSequential(lstm, head), in_keys=["logits"], out_keys=["action"],
        distribution_class=torch.distributions.Categorical, return_log_prob=True,
        log_prob_key="action_log_prob",
    )
    value = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1))
    return actor, value


def lstm_of(actor: TensorDictSequential) -> LSTMModule:
    return next(m for m in actor.modules() if isinstance(m, LSTMModule))


@torch.no_grad()
def gae(reward: torch.Tensor, value: torch.Tensor, next_value: torch.Tensor,
        terminated: torch.Tensor, done: torch.Tensor, gamma: float = 0.99,
        lmbda: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over the last dim of ``[envs, T]`` tensors; returns (advantage, value target)."""
    delta = reward + gamma * next_value * (~terminated).float() - value
    advantage, running = torch.zeros_like(delta), torch.zeros_like(delta[:, 0])
    for t in range(delta.shape[1] - 1, -1, -1):
        running = delta[:, t] + gamma * lmbda * (~done[:, t]).float() * running
        advantage[:, t] = running
    return advantage, advantage + value


class RecurrentPPO:
    """Clipped PPO whose minibatches are whole env rows, replayed in recurrent mode."""

    def __init__(self, actor: TensorDictSequential, value: nn.Module, lr: float,
                 epochs: int = 4, rows_per_minibatch: int = 4) -> None:
        self.actor, self.value, self.epochs = actor, value, epochs
        self.rows = rows_per_minibatch
        self.optimizer = torch.optim.Adam([*actor.parameters(), *value.parameters()], lr=lr)

    @torch.no_grad()
    def _bootstrap(self, batch: TensorDictBase) -> torch.Tensor:
        # one LSTM step from the stored next state: the value of ("next", "observation")
        nxt = batch["next"].reshape(-1).select("observation", "recurrent_state_h",
                                                "recurrent_state_c", "is_init").clone()
        lstm_of(self.actor)(nxt)
        return self.value(nxt["embed"]).reshape(batch.shape)

    def update(self, batch: TensorDictBase) -> None:
        batch = batch.select("observation", "action", "action_log_prob", "is_init",
                             "recurrent_state_h", "recurrent_state_c", "next").clone()
        with torch.no_grad(), set_recurrent_mode(True):
            value = self.value(self.actor.module[0](batch.clone())["embed"]).squeeze(-1)
        advantage, target = gae(
            batch["next", "reward"].squeeze(-1), value, self._bootstrap(batch).squeeze(-1),
            batch["next", "terminated"].squeeze(-1), batch["next", "done"].squeeze(-1))
        batch.set("advantage", advantage)
        batch.set("target", target)
        for _ in range(self.epochs):
            for rows in torch.randperm(batch.shape[0]).split(self.rows):
                self._step(batch[rows])

    def _step(self, mb: TensorDictBase) -> None:
        old_log_prob, action = mb["action_log_prob"], mb["action"]
        with set_recurrent_mode(True):
            out = self.actor.module[0](mb.exclude("action", "action_log_prob").clone())
        dist = torch.distributions.Categorical(logits=out["logits"])
        adv = mb["advantage"]
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        ratio = (dist.log_prob(action) - old_log_prob).exp()
        policy_loss = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
        # The value head reads the LSTM's features but does not train them: its
        # squared error (returns of tens to hundreds) would swamp the policy's
        # gradient in a shared clip.
        value_loss = (self.value(out["embed"].detach()).squeeze(-1) - mb["target"]).pow(2).mean()
        loss = policy_loss + 0.5 * value_loss - 0.01 * dist.entropy().mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.actor.parameters(), 0.5)
        self.optimizer.step()


class Returns:
    """Episode returns from ``("collector", "traj_ids")`` across batches."""

    def __init__(self, window: int = 20) -> None:
        self.partial: dict[int, float] = {}
        self.last: deque[float] = deque(maxlen=window)

    def add(self, batch: TensorDictBase) -> None:
        reward = batch["next", "reward"].reshape(-1).tolist()
        done = batch["next", "done"].reshape(-1).tolist()
        for tid, r, d in zip(batch["collector", "traj_ids"].reshape(-1).tolist(), reward, done,
                             strict=True):
            self.partial[tid] = self.partial.get(tid, 0.0) + r
            if d:
                self.last.append(self.partial.pop(tid))

    @property
    def mean(self) -> float:
        return sum(self.last) / len(self.last) if self.last else float("nan")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--frames", type=int, default=150_000, help="total frames (default 150k)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--envs-per-worker", type=int, default=4)
    p.add_argument("--frames-per-batch", type=int, default=1024)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


async def train(args: argparse.Namespace) -> float:
    """Train; print the mean return of the last 20 episodes per batch; return the last mean."""
    from asyncrl import MultiSyncCollector

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    actor, value = make_modules()
    ppo = RecurrentPPO(actor, value, lr=args.lr)
    returns, frames, start = Returns(), 0, time.perf_counter()
    async with MultiSyncCollector(make_env, actor, num_workers=args.workers,
                                  envs_per_worker=args.envs_per_worker,
                                  frames_per_batch=args.frames_per_batch,
                                  total_frames=args.frames) as collector:
        await collector.set_seed(args.seed)
        async for batch in collector:
            frames += batch.numel()
            returns.add(batch)
            print(f"frames={frames} mean_return(last {len(returns.last)})={returns.mean:6.1f}"
                  f" seconds={time.perf_counter() - start:6.1f}", flush=True)
            ppo.update(batch)
            await collector.update_policy_weights()
    return returns.mean


def main(argv: list[str] | None = None) -> int:
    anyio.run(train, parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
