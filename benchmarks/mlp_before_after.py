"""asyncrl's frames/s on a realistic policy, to compare before and after a change.

Pendulum-v1, a 3-64-64-1 MLP ``TensorDictModule``, 2 workers, 2,000 frames per batch,
``update_policy_weights()`` after every batch; ``MultiSyncCollector`` then
``MultiAsyncCollector``, ``--runs`` fresh collectors each, the median frames/s of each.
Run it on both commits, on the same quiet machine, one after the other.

    python -m benchmarks.mlp_before_after
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import anyio
import torch
from tensordict.nn import TensorDictModule

from asyncrl import MultiAsyncCollector, MultiSyncCollector


def make_policy() -> TensorDictModule:
    net = torch.nn.Sequential(torch.nn.Linear(3, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                              torch.nn.Tanh(), torch.nn.Linear(64, 1))
    return TensorDictModule(net, in_keys=["observation"], out_keys=["action"])


async def run(cls: Any) -> float:
    """The median frames/s between consecutive batches of one collector (9 batches)."""
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.mlp_before_after",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="fresh collectors per class")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for cls in (MultiSyncCollector, MultiAsyncCollector):
        r = [anyio.run(run, cls) for _ in range(args.runs)]
        runs = [round(x) for x in r]
        print(f"{cls.__name__}: median {statistics.median(r):,.0f} frames/s (runs {runs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
