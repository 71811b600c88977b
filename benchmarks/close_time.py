"""How long ``aclose()`` takes on a MultiAsyncCollector closed mid-collection.

    python -m benchmarks.close_time            # 7 runs, 2 local workers, CartPole-v1

Each run opens a collector (2 workers, 256-frame batches, ``prefetch=2``, so work is
in flight), takes 5 batches, then times ``await collector.aclose()``: the close
broadcast, the workers' goodbyes, their processes' exits. Prints the median, min
and max, and the workers' exit codes (0: they exited on the close order, not
SIGTERMed by the collector's stop()).
"""

from __future__ import annotations

import argparse
import statistics
import time

import anyio

import asyncrl


async def one_close(workers: int) -> tuple[float, list[int | None]]:
    collector = asyncrl.MultiAsyncCollector("CartPole-v1", num_workers=workers,
                                            frames_per_batch=256, total_frames=-1, prefetch=2)
    async with collector:
        batches = 0
        async for _ in collector:
            batches += 1
            if batches == 5:
                break
        start = time.perf_counter()
        await collector.aclose()
        seconds = time.perf_counter() - start
    assert collector._run.workers is not None
    return seconds, collector._run.workers.exitcodes


async def run(runs: int, workers: int) -> None:
    times, codes = [], set()
    for _ in range(runs):
        seconds, exitcodes = await one_close(workers)
        times.append(seconds)
        codes.update(exitcodes)
    print(f"aclose() mid-collection, {workers} workers, {runs} runs: median "
          f"{statistics.median(times) * 1000:.0f} ms (min {min(times) * 1000:.0f}, max "
          f"{max(times) * 1000:.0f}); worker exit codes {sorted(codes, key=str)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    anyio.run(run, args.runs, args.workers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
