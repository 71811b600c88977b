"""The rollout hot loop alone, in this process: frames/s of ``Rollout.collect()``.

    python -m benchmarks.rollout_loop CartPole-v1 random
    python -m benchmarks.rollout_loop Pendulum-v1 mlp256
    python -m benchmarks.rollout_loop CartPole-v1 lstm64

No worker process, socket or coordinator: one env (``num_envs=1``), 1,024-frame
batches for 1 s, seven times; prints the median. The MLP is obs-256-256-act with
Tanh (argmax on CartPole, ``2 * tanh`` on Pendulum), one torch thread; ``lstm64``
is TorchRL's ``LSTMModule`` (hidden 64) and a linear head, its state carried by
the rollout. Use it to
compare two trees' hot loops (run them interleaved: the machine drifts).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn

from asyncrl._rollout.envs import make_env_pool
from asyncrl._rollout.loop import Rollout


class _Head(nn.Module):
    def __init__(self, observations: int, actions: int) -> None:
        super().__init__()
        self.discrete = actions > 1
        self.net = nn.Sequential(nn.Linear(observations, 256), nn.Tanh(),
                                 nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, actions))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        y = self.net(observation)
        return y.argmax(-1) if self.discrete else 2 * torch.tanh(y)


def _lstm(observations: int, actions: int) -> TensorDictSequential:
    from torchrl.modules import LSTMModule

    discrete = actions > 1
    head = nn.Sequential(nn.Linear(64, actions), _Argmax() if discrete else nn.Tanh())
    return TensorDictSequential(
        LSTMModule(input_size=observations, hidden_size=64, in_key="observation",
                   out_key="embed"),
        TensorDictModule(head, in_keys=["embed"], out_keys=["action"]))


class _Argmax(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.argmax(-1)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.rollout_loop",
                                description=__doc__.splitlines()[0])
    p.add_argument("env", choices=("CartPole-v1", "Pendulum-v1"))
    p.add_argument("policy", choices=("random", "mlp256", "lstm64"))
    p.add_argument("--windows", type=int, default=7)
    p.add_argument("--torchrl", action="store_true",
                   help="also time TorchRL's Collector with the same policy (same windows)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    pool = make_env_pool(args.env, num_envs=1)
    policy = None
    if args.policy == "mlp256":
        cartpole = args.env.startswith("CartPole")
        policy = TensorDictModule(_Head(4 if cartpole else 3, 2 if cartpole else 1),
                                  in_keys=["observation"], out_keys=["action"])
    elif args.policy == "lstm64":
        policy = _lstm(4 if args.env.startswith("CartPole") else 3,
                       2 if args.env.startswith("CartPole") else 1)
    rollout = Rollout(pool, policy, 1024)
    rollout.set_seed(0)
    rollout.collect()  # warm-up
    rates = []
    for _ in range(args.windows):
        start, frames = time.perf_counter(), 0
        while time.perf_counter() - start < 1.0:
            rollout.collect()
            frames += 1024
        rates.append(frames / (time.perf_counter() - start))
    rollout.close()
    print(f"{args.env} {args.policy}: {statistics.median(rates):,.0f} frames/s "
          f"(median of {args.windows} windows of 1 s)")
    if args.torchrl:
        rate = _torchrl_rate(args.env, policy, args.windows)
        print(f"{args.env} {args.policy} TorchRL Collector: {rate:,.0f} frames/s")


def _torchrl_rate(env_name: str, policy: object, windows: int) -> float:
    """TorchRL's single-process Collector on the same env and policy, same windows."""
    from torchrl.collectors import Collector
    from torchrl.envs import Compose, GymEnv, InitTracker, TransformedEnv

    env = GymEnv(env_name, categorical_action_encoding=True)
    lstm = next((m for m in getattr(policy, "modules", list)() if hasattr(
        m, "make_tensordict_primer")), None)
    if lstm is not None:  # TorchRL carries the state in the env: InitTracker + primer
        env = TransformedEnv(env, Compose(InitTracker(), lstm.make_tensordict_primer()))
    collector = Collector(env, policy, frames_per_batch=1024, total_frames=-1)
    batches = iter(collector)
    next(batches)  # warm-up
    rates = []
    for _ in range(windows):
        start, frames = time.perf_counter(), 0
        while time.perf_counter() - start < 1.0:
            next(batches)
            frames += 1024
        rates.append(frames / (time.perf_counter() - start))
    collector.shutdown()
    return statistics.median(rates)


if __name__ == "__main__":
    main()
