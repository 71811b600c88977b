"""The loop's two groups of workers on a CPU: a policy call of fixed cost, the GIL free.

Stands in for a GPU call (a fixed launch-and-wait cost, the GIL released meanwhile) on
a machine without one. ``N`` Pendulum envs, one per env worker process; each run is 4 s
after a warm-up batch; 2 repeats of three settings: ``min_batch_size=1`` (the default:
serve whatever waits), and ``min_batch_size=N`` with ``server_timeout`` 0.2 ms and
0.5 ms (wait for the group of workers that is still stepping). Prints frames/s and
observations per policy call.

    python -m benchmarks.inference_pingpong 8 process
"""

from __future__ import annotations

import sys
import time

import anyio
import torch
from tensordict.nn import TensorDictModule
from torch import nn

from asyncrl import AsyncBatchedCollector

#: Seconds each call sleeps (a GPU call's fixed cost, order of magnitude).
CALL_COST = 0.00025


class FixedCost(nn.Module):
    """A small MLP behind a fixed cost that releases the GIL (as a GPU call's wait does)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        time.sleep(CALL_COST)
        return 2 * torch.tanh(self.lin(obs))


def make() -> TensorDictModule:
    return TensorDictModule(FixedCost(), in_keys=["observation"], out_keys=["action"])


async def run(envs: int, min_batch: int, timeout: float | None,
              backend: str) -> tuple[float, float]:
    """Frames/s over 4 s, and observations per policy call meanwhile."""
    async with AsyncBatchedCollector("Pendulum-v1", num_envs=envs, policy_factory=make,
                                     frames_per_batch=400, max_batch_size=64,
                                     min_batch_size=min_batch, server_timeout=timeout,
                                     server_backend=backend) as collector:
        await collector.__anext__()
        before = collector.inference_statistics()
        frames, start = 0, time.perf_counter()
        while time.perf_counter() - start < 4:
            frames += (await collector.__anext__()).numel()
        fps = frames / (time.perf_counter() - start)
        await anyio.sleep(0.3)  # the inference process reports every 0.2 s
        after = collector.inference_statistics()
        calls = max(1, after.calls - before.calls)
        return fps, (after.observations - before.observations) / calls


def main(argv: list[str]) -> int:
    envs, backend = int(argv[0]), argv[1] if len(argv) > 1 else "process"
    for _ in range(2):
        for min_batch, timeout in ((1, None), (envs, 0.0002), (envs, 0.0005)):
            fps, per_call = anyio.run(run, envs, min_batch, timeout, backend)
            print(f"envs={envs} {backend} min_batch_size={min_batch} server_timeout={timeout}: "
                  f"{fps:,.0f} frames/s, {per_call:.1f} observations per call", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
