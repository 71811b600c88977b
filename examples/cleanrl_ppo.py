"""CleanRL's ``ppo_continuous_action.py`` on asyncrl: the same loop, the rollout in workers.

    python examples/cleanrl_ppo.py                                   # Pendulum-v1, 2 workers
    python examples/cleanrl_ppo.py --total-timesteps 200000 --num-workers 4
    python examples/cleanrl_ppo.py --total-timesteps 61440 --num-envs 4 --num-steps 128 \
        --num-minibatches 2 --learning-rate 3e-3 --gamma 0.9     # the test's budget

The defaults are CleanRL's (tuned for MuJoCo) but for a shorter rollout; the
last line is tuned for Pendulum on a small budget.

What stays CleanRL's: ``make_env`` and its gymnasium wrappers, a
``SyncVectorEnv`` (SAME_STEP autoreset), the plain torch ``Agent`` with
``get_value`` and ``get_action_and_value`` (no ``forward``), the annealed
learning rate, GAE and the clipped PPO update, written as CleanRL writes them.
What changes: instead of stepping ``envs`` in a ``for step`` loop that fills
``obs``, ``actions``, ``logprobs``, ``rewards``, ``dones`` and ``values``,
a :class:`~asyncrl.MultiSyncCollector` steps one vector env per worker
process with a copy of the agent (``policy_method="get_action_and_value"``)
and hands back the same tensors as one batch; ``update_policy_weights_()``
after each update sends the new weights, so every batch is on-policy, as
CleanRL's is. docs/gymnasium.md puts the two scripts side by side.

Wrapper state lives where the envs live: each sub-env's ``NormalizeObservation``
and ``NormalizeReward`` keep their running statistics in its worker, as each
sub-env of CleanRL's ``SyncVectorEnv`` keeps its own. Training needs nothing
else: the batch holds the observations the policy saw. The evaluation at the
end is CleanRL's ``cleanrl_utils.evals.ppo_eval`` (a fresh env from
``make_env``, sampled actions, the raw return from ``RecordEpisodeStatistics``)
with one fix: the trained agent is evaluated with the observation statistics
it was trained with, read from worker 0's first env (``getattr_env("obs_rms.mean")``)
and frozen, where CleanRL's evaluation starts fresh ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import random
import time
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDictBase
from torch import nn, optim
from torch.distributions.normal import Normal

from asyncrl import BlockingCollector, MultiSyncCollector


@dataclass
class Args:
    seed: int = 1
    """seed of the experiment (torch, numpy, the envs)"""
    env_id: str = "Pendulum-v1"
    """the id of the environment"""
    total_timesteps: int = 100_000
    """total timesteps of the experiment"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_workers: int = 2
    """worker processes, each stepping its own vector env (asyncrl's addition)"""
    num_envs: int = 2
    """the number of parallel game environments per worker"""
    num_steps: int = 512
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 32
    """the number of mini-batches"""
    update_epochs: int = 10
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """toggles advantages normalization"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """toggles whether or not to use a clipped loss for the value function"""
    ent_coef: float = 0.0
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    eval_episodes: int = 10
    """episodes of the evaluation before and after training (0: none)"""
    json: bool = False
    """print the results as one JSON line at the end"""


def make_env(env_id: str, gamma: float) -> gym.Env:
    """CleanRL's ``make_env(...)()`` thunk, minus video capture."""
    env = gym.make(env_id)
    env = gym.wrappers.FlattenObservation(env)
    env = gym.wrappers.RecordEpisodeStatistics(env)
    env = gym.wrappers.ClipAction(env)
    env = gym.wrappers.NormalizeObservation(env)
    env = gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10),
                                           env.observation_space)
    env = gym.wrappers.NormalizeReward(env, gamma=gamma)
    return gym.wrappers.TransformReward(env, lambda reward: np.clip(reward, -10, 10))


def make_envs(env_id: str, num_envs: int, gamma: float,
              seed: int | None = None) -> gym.vector.SyncVectorEnv:
    """CleanRL's vector env; module level, so each worker process builds its own.

    ``seed``: the envs' random generators are seeded as they are made. A worker resets
    its envs once when it starts, before ``collector.set_seed`` reaches it, and
    ``NormalizeObservation`` keeps that first observation in its statistics: unseeded,
    it would make every run differ (measured: trained returns from -634 to -1082 with
    the same ``--seed``). Seeded here, a run repeats.
    """
    envs = gym.vector.SyncVectorEnv(
        [functools.partial(make_env, env_id, gamma) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    if seed is not None:
        for i, env in enumerate(envs.envs):  # the generators only: no reset, no statistics
            env.unwrapped.np_random = np.random.default_rng(seed + i)
    return envs


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """CleanRL's continuous-action agent: a critic, an actor mean and a state-free log-std."""

    def __init__(self, envs: gym.vector.VectorEnv) -> None:
        super().__init__()
        obs_size = int(np.prod(envs.single_observation_space.shape))
        act_size = int(np.prod(envs.single_action_space.shape))
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_size, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0))
        self.actor_mean = nn.Sequential(
            layer_init(nn.Linear(obs_size, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, act_size), std=0.01))
        self.actor_logstd = nn.Parameter(torch.zeros(1, act_size))

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        action_mean = self.actor_mean(x)
        action_std = torch.exp(self.actor_logstd.expand_as(action_mean))
        probs = Normal(action_mean, action_std)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action).sum(1), probs.entropy().sum(1), self.critic(x)


def read_batch(batch: TensorDictBase) -> dict[str, torch.Tensor]:
    """CleanRL's rollout storage, ``[num_steps, envs]``, from a ``[workers, envs, steps]`` batch.

    ``next_obs`` is the observation after the last step (CleanRL's ``next_obs``
    when the rollout ends), for the bootstrap value.
    """
    def steps_first(x: torch.Tensor) -> torch.Tensor:
        return x.flatten(0, batch.batch_dims - 2).transpose(0, 1)

    return {"obs": steps_first(batch["observation"]),
            "actions": steps_first(batch["action"]),
            "logprobs": steps_first(batch["logprob"]),
            "values": steps_first(batch["value"].squeeze(-1)),
            "rewards": steps_first(batch["next", "reward"].squeeze(-1)),
            "next_dones": steps_first(batch["next", "done"].squeeze(-1)).float(),
            "next_obs": steps_first(batch["next", "observation"])[-1]}


def compute_gae(args: Args, rewards: torch.Tensor, values: torch.Tensor,
                next_dones: torch.Tensor, next_value: torch.Tensor) -> torch.Tensor:
    """CleanRL's GAE over ``[num_steps, envs]`` tensors.

    CleanRL keeps ``dones[t]`` (was the env reset before step t) and reads
    ``dones[t + 1]``; the batch stores that flag with step t, as
    ``("next", "done")``: the same numbers, one index earlier.
    """
    advantages = torch.zeros_like(rewards)
    lastgaelam = torch.zeros_like(next_value)
    num_steps = rewards.shape[0]
    for t in reversed(range(num_steps)):
        nextnonterminal = 1.0 - next_dones[t]
        nextvalues = next_value if t == num_steps - 1 else values[t + 1]
        delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = (
            delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam)
    return advantages


def ppo_update(args: Args, agent: Agent, optimizer: optim.Optimizer,
               b: dict[str, torch.Tensor]) -> dict[str, float]:
    """CleanRL's clipped PPO update on the flattened batch ``b``; returns the last losses."""
    batch_size = b["obs"].shape[0]
    minibatch_size = batch_size // args.num_minibatches
    b_inds = np.arange(batch_size)
    for _epoch in range(args.update_epochs):
        np.random.shuffle(b_inds)
        for start in range(0, batch_size, minibatch_size):
            mb_inds = b_inds[start:start + minibatch_size]
            _, newlogprob, entropy, newvalue = agent.get_action_and_value(
                b["obs"][mb_inds], b["actions"][mb_inds])
            logratio = newlogprob - b["logprobs"][mb_inds]
            ratio = logratio.exp()
            mb_advantages = b["advantages"][mb_inds]
            if args.norm_adv:
                mb_advantages = (mb_advantages - mb_advantages.mean()) / (
                    mb_advantages.std() + 1e-8)
            pg_loss = torch.max(-mb_advantages * ratio, -mb_advantages * torch.clamp(
                ratio, 1 - args.clip_coef, 1 + args.clip_coef)).mean()
            v_loss = value_loss(args, newvalue.view(-1), b["values"][mb_inds],
                                b["returns"][mb_inds])
            loss = pg_loss - args.ent_coef * entropy.mean() + v_loss * args.vf_coef
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()
    return {"policy_loss": pg_loss.item(), "value_loss": v_loss.item()}


def value_loss(args: Args, newvalue: torch.Tensor, values: torch.Tensor,
               returns: torch.Tensor) -> torch.Tensor:
    if not args.clip_vloss:
        return 0.5 * ((newvalue - returns) ** 2).mean()
    v_clipped = values + torch.clamp(newvalue - values, -args.clip_coef, args.clip_coef)
    return 0.5 * torch.max((newvalue - returns) ** 2, (v_clipped - returns) ** 2).mean()


def evaluate(args: Args, agent: Agent, episodes: int,
             obs_rms: dict[str, np.ndarray] | None = None, deterministic: bool = False) -> float:
    """Mean raw episodic return over a fresh ``make_env`` env, as CleanRL's ``ppo_eval``.

    ``obs_rms``: the observation statistics training ended with (``mean``,
    ``var``, ``count``), used frozen; without them the env starts fresh ones,
    as CleanRL's evaluation does. ``deterministic``: the action mean instead
    of a sample (SB3's ``evaluate_policy(deterministic=True)``).
    """
    envs = make_envs(args.env_id, 1, args.gamma)
    if obs_rms is not None:
        running = envs.envs[0].get_wrapper_attr("obs_rms")  # NormalizeObservation's
        running.mean, running.var, running.count = (obs_rms["mean"], obs_rms["var"],
                                                    obs_rms["count"])
        envs.envs[0].set_wrapper_attr("update_running_mean", False)
    returns: list[float] = []
    obs, _ = envs.reset(seed=args.seed + 10_000)
    while len(returns) < episodes:
        with torch.no_grad():
            x = torch.as_tensor(obs)
            action = agent.actor_mean(x) if deterministic else agent.get_action_and_value(x)[0]
        obs, _, _, _, infos = envs.step(action.numpy())
        if "final_info" in infos and "episode" in infos["final_info"]:
            final = infos["final_info"]
            returns += final["episode"]["r"][final["_episode"]].tolist()
    envs.close()
    return float(np.mean(returns[:episodes]))


def worker_obs_rms(collector: BlockingCollector) -> dict[str, np.ndarray]:
    """Worker 0's first env's ``NormalizeObservation`` statistics (they live in the workers)."""
    return {name: np.asarray(collector.getattr_env(f"obs_rms.{name}"), dtype=np.float64)
            for name in ("mean", "var", "count")}


def train_on(args: Any, agent: Any, optimizer: optim.Optimizer, batch: TensorDictBase,
             iteration: int, num_iterations: int) -> dict[str, float]:
    """One of CleanRL's iterations on a collected batch: the annealed learning rate, GAE
    with the bootstrap value, the clipped update; returns the last losses."""
    if args.anneal_lr:
        frac = 1.0 - (iteration - 1.0) / num_iterations
        optimizer.param_groups[0]["lr"] = frac * args.learning_rate
    r = read_batch(batch)  # CleanRL's storage: obs, actions, logprobs, rewards, ...
    # bootstrap value if not done
    with torch.no_grad():
        next_value = agent.get_value(r["next_obs"]).reshape(-1)
        advantages = compute_gae(args, r["rewards"], r["values"], r["next_dones"], next_value)
        returns = advantages + r["values"]
    # flatten the batch
    flat = {"obs": r["obs"].flatten(0, 1), "actions": r["actions"].flatten(0, 1),
            "logprobs": r["logprobs"].reshape(-1), "advantages": advantages.reshape(-1),
            "returns": returns.reshape(-1), "values": r["values"].reshape(-1)}
    return ppo_update(args, agent, optimizer, flat)


def ended_returns(batch: TensorDictBase) -> torch.Tensor:
    """CleanRL's ``episodic_return``: the raw return (``RecordEpisodeStatistics``', before
    reward normalisation or clipping) of the episodes that ended in ``batch``."""
    ended = batch["next", "done"].reshape(-1)
    return batch["next", "episode", "r"].reshape(-1)[ended]


def report(iteration: int, num_iterations: int, global_step: int, raw: torch.Tensor,
           losses: dict[str, float], start_time: float) -> None:
    """CleanRL's line per iteration."""
    episodic = f"episodic_return={raw.mean().item():.1f} " if raw.numel() else ""
    print(f"iteration={iteration}/{num_iterations} global_step={global_step} {episodic}"
          f"value_loss={losses['value_loss']:.3f} "
          f"SPS={int(global_step / (time.time() - start_time))}", flush=True)


def batches(args: Any) -> tuple[int, int]:
    """Frames per batch (workers x envs x steps) and how many batches the budget holds."""
    frames_per_batch = args.num_workers * args.num_envs * args.num_steps
    if args.total_timesteps < frames_per_batch:
        raise SystemExit(f"--total-timesteps {args.total_timesteps} is less than one batch "
                         f"({frames_per_batch} frames: --num-workers {args.num_workers} x "
                         f"--num-envs {args.num_envs} x --num-steps {args.num_steps}): raise it "
                         "or lower those")
    return frames_per_batch, args.total_timesteps // frames_per_batch


def main(args: Args) -> dict[str, float]:
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    probe = make_envs(args.env_id, 1, args.gamma)  # the spaces, for Agent(envs)
    agent = Agent(probe)
    probe.close()
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    results = {"untrained_return": evaluate(args, agent, args.eval_episodes, deterministic=True)
               if args.eval_episodes else float("nan")}

    # The rollout: CleanRL's `for step in range(num_steps)` loop, in the workers.
    frames_per_batch, num_iterations = batches(args)
    collector = BlockingCollector(MultiSyncCollector(
        functools.partial(make_envs, args.env_id, args.num_envs, args.gamma, args.seed), agent,
        num_workers=args.num_workers, frames_per_batch=frames_per_batch,
        total_frames=num_iterations * frames_per_batch,
        policy_method="get_action_and_value",
        policy_out_keys=("action", "logprob", "entropy", "value"),
        info_keys=["episode"]))  # RecordEpisodeStatistics' raw returns, as CleanRL logs them
    collector.set_seed(args.seed)  # starts the workers, seeds their envs and RNGs

    global_step, start_time = 0, time.time()
    for iteration, batch in enumerate(collector, start=1):
        global_step += batch.numel()
        losses = train_on(args, agent, optimizer, batch, iteration, num_iterations)
        collector.update_policy_weights_()  # the next batch is collected with these weights
        report(iteration, num_iterations, global_step, ended_returns(batch), losses,
               start_time)
    obs_rms = worker_obs_rms(collector)
    collector.shutdown()

    results["trained_return"] = results["trained_return_sampled"] = float("nan")
    if args.eval_episodes:
        results["trained_return"] = evaluate(args, agent, args.eval_episodes, obs_rms,
                                             deterministic=True)
        results["trained_return_sampled"] = evaluate(args, agent, args.eval_episodes, obs_rms)
    results["frames"] = global_step
    results["seconds"] = round(time.time() - start_time, 1)
    return results


def parse_args(fields: type[Any] = Args, description: str = __doc__) -> Any:
    """CleanRL's ``tyro.cli(Args)``, with argparse: ``--total-timesteps 200000`` (``fields``:
    another example's ``Args`` dataclass, as ``cleanrl_ppo_atari.py`` passes its own)."""
    parser = argparse.ArgumentParser(description=description.splitlines()[0])
    for field in dataclasses.fields(fields):
        flag = "--" + field.name.replace("_", "-")
        if field.type == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=field.default)
        else:
            kind = {"int": int, "float": float, "str": str}[str(field.type)]
            parser.add_argument(flag, type=kind, default=field.default)
    return fields(**vars(parser.parse_args()))


if __name__ == "__main__":
    arguments = parse_args()
    outcome = main(arguments)
    print(json.dumps(outcome) if arguments.json else
          f"mean episodic return (action mean): untrained {outcome['untrained_return']:.1f}, "
          f"trained {outcome['trained_return']:.1f} (sampled: "
          f"{outcome['trained_return_sampled']:.1f}); {outcome['frames']} frames in "
          f"{outcome['seconds']} s")
