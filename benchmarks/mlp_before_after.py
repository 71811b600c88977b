"""asyncrl before/after on a realistic policy.

Pendulum-v1, 3-64-64-1 MLP, 2 workers, sync and async.
"""
import statistics
import time

import anyio
import torch
from tensordict.nn import TensorDictModule

from asyncrl import MultiAsyncCollector, MultiSyncCollector


def make_policy():
    net = torch.nn.Sequential(torch.nn.Linear(3, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                              torch.nn.Tanh(), torch.nn.Linear(64, 1))
    return TensorDictModule(net, in_keys=["observation"], out_keys=["action"])

async def run(cls):
    rates = []
    async with cls("Pendulum-v1", make_policy(), num_workers=2, frames_per_batch=2000,
                   total_frames=2000 * 9) as c:
        t = None
        async for batch in c:
            now = time.perf_counter()
            if t is not None:
                rates.append(batch.numel() / (now - t))
            t = now
            await c.update_policy_weights()
    return statistics.median(rates)

if __name__ == "__main__":
    torch.set_num_threads(1)
    for cls in (MultiSyncCollector, MultiAsyncCollector):
        r = [anyio.run(run, cls) for _ in range(5)]
        runs = [round(x) for x in r]
        print(f"{cls.__name__}: median {statistics.median(r):,.0f} frames/s (runs {runs})")
