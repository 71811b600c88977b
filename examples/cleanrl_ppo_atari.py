"""CleanRL's ``ppo_atari.py`` on asyncrl: Breakout from pixels, the rollout in workers.

    python examples/cleanrl_ppo_atari.py                                # 10M frames, as CleanRL
    python examples/cleanrl_ppo_atari.py --total-timesteps 200000 --num-workers 4
    python examples/cleanrl_ppo_atari.py --total-timesteps 2048 --num-steps 128   # a smoke run

Needs the atari extra (``pip install "asyncrl[atari]"``: ale-py with its ROMs, headless
OpenCV for the resize). What stays CleanRL's: the Nature CNN ``Agent`` with its
``get_value`` and ``get_action_and_value``, the hyperparameters (8 envs x 128 steps,
learning rate 2.5e-4 annealed, 4 minibatches, 4 epochs, clip 0.1, entropy 0.01), GAE
and the clipped update, and the per-iteration line (shared with
``examples/cleanrl_ppo.py``). What changes:

- the envs are ale-py's ``ALE/<Game>-v5`` with gymnasium's wrappers, not Stable
  Baselines 3's on ``*NoFrameskip-v4``: ``frameskip=1``, ``AtariPreprocessing``
  (30 no-ops, frame skip 4 with the max of the last two frames, 84 x 84 grayscale),
  rewards clipped to their sign, ``FrameStackObservation(4)``. v5's sticky actions (0.25)
  stay on; a life lost is not an episode's end and FIRE is not pressed at reset (the
  agent learns to press it): the same numbers as CleanRL's need its wrappers;
- the rollout runs in ``--num-workers`` processes of ``--num-envs`` envs each (8 envs
  in all by default, CleanRL's count), each with a copy of the agent, and comes back
  as one batch; ``update_policy_weights_()`` after each update sends the new weights,
  so every batch is on-policy, as CleanRL's is.

Observations stay uint8 ``[4, 84, 84]`` in the batch (the agent divides by 255, as
CleanRL's does): 1,024 frames hold 58 MB with their next observations.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass

import ale_py
import gymnasium as gym
import numpy as np
import torch
from torch import nn, optim
from torch.distributions.categorical import Categorical

from asyncrl import BlockingCollector, MultiSyncCollector

try:  # run as a script: examples/ is the first entry of sys.path
    from cleanrl_ppo import batches, ended_returns, parse_args, report, train_on
except ModuleNotFoundError:  # imported as examples.cleanrl_ppo_atari (tests, docs)
    from examples.cleanrl_ppo import batches, ended_returns, parse_args, report, train_on

gym.register_envs(ale_py)  # the ALE/* ids


@dataclass
class Args:
    seed: int = 1
    """seed of the experiment (torch, numpy, the envs)"""
    env_id: str = "ALE/Breakout-v5"
    """the id of the environment"""
    total_timesteps: int = 10_000_000
    """total timesteps of the experiment"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_workers: int = 2
    """worker processes, each stepping --num-envs envs (asyncrl's addition)"""
    num_envs: int = 4
    """envs per worker (CleanRL's 8 in all with 2 workers)"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """toggles advantages normalization"""
    clip_coef: float = 0.1
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """toggles whether or not to use a clipped loss for the value function"""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    json: bool = False
    """print the results as one JSON line at the end"""


def make_env(env_id: str) -> gym.Env:
    """The env a worker steps: ale-py's env with the standard preprocessing (see the top)."""
    env = gym.make(env_id, frameskip=1)
    env = gym.wrappers.RecordEpisodeStatistics(env)  # the raw return, before clipping
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84,
                                          grayscale_obs=True)
    env = gym.wrappers.TransformReward(env, np.sign)  # CleanRL's ClipRewardEnv
    return gym.wrappers.FrameStackObservation(env, 4)


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """CleanRL's Atari agent: the Nature CNN, a categorical actor and a critic."""

    def __init__(self, num_actions: int) -> None:
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)), nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(), nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)), nn.ReLU())
        self.actor = layer_init(nn.Linear(512, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(self.network(x / 255.0))

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden = self.network(x / 255.0)
        probs = Categorical(logits=self.actor(hidden))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(hidden)


def main(args: Args) -> dict[str, float]:
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    probe = make_env(args.env_id)  # the action count, for Agent
    agent = Agent(int(probe.action_space.n))
    probe.close()
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    frames_per_batch, num_iterations = batches(args)
    collector = BlockingCollector(MultiSyncCollector(
        make_env, agent, create_env_kwargs={"env_id": args.env_id},
        num_workers=args.num_workers, envs_per_worker=args.num_envs,
        frames_per_batch=frames_per_batch, total_frames=num_iterations * frames_per_batch,
        policy_method="get_action_and_value",
        policy_out_keys=("action", "logprob", "entropy", "value"),
        info_keys=["episode"]))  # RecordEpisodeStatistics' raw returns, as CleanRL logs them
    collector.set_seed(args.seed)  # starts the workers, seeds their envs and RNGs

    global_step, start_time, returns = 0, time.time(), []
    losses = {"policy_loss": float("nan"), "value_loss": float("nan")}
    for iteration, batch in enumerate(collector, start=1):
        global_step += batch.numel()
        losses = train_on(args, agent, optimizer, batch, iteration, num_iterations)
        collector.update_policy_weights_()  # the next batch is collected with these weights
        raw = ended_returns(batch)  # the raw game scores of the episodes that ended here
        returns += raw.tolist()
        report(iteration, num_iterations, global_step, raw, losses, start_time)
    collector.shutdown()
    last = returns[-20:]
    return {"frames": global_step, "seconds": round(time.time() - start_time, 1),
            "episodes": len(returns),
            "last_returns_mean": float(np.mean(last)) if last else float("nan"),
            **losses}


if __name__ == "__main__":
    arguments = parse_args(Args, __doc__)
    outcome = main(arguments)
    print(json.dumps(outcome) if arguments.json else
          f"{outcome['frames']} frames in {outcome['seconds']} s, {outcome['episodes']} "
          f"episodes; mean raw return of the last 20: {outcome['last_returns_mean']:.1f}")
