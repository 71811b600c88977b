"""The ported PPO script's collection time: asyncrl vs TorchRL in the same run.

    python -m benchmarks.ppo_port                    # 3 rounds of 10 batches each
    python -m benchmarks.ppo_port --rounds 1 --total-frames 4000   # a quick look

Runs ``examples/ppo_pendulum.py`` (TorchRL's PPO tutorial on Pendulum-v1 with
DoubleToFloat + StepCounter + RewardSum, a TanhNormal ProbabilisticActor, GAE,
ClipPPOLoss) once with each library's ``MultiSyncCollector`` per round, rounds
interleaved (the machine drifts). What is timed is what the training loop
waits for: from the end of one update to the next batch, the first batch of a
run excluded (it also pays the workers' start). Prints each round, then the
medians of collected frames per second and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from examples.ppo_pendulum import main as ppo_main

LIBRARIES = ("asyncrl", "torchrl")


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ppo_port",
                                description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="runs of each library (default 3)")
    p.add_argument("--total-frames", type=int, default=10_000, help="per run (default 10000)")
    p.add_argument("--frames-per-batch", type=int, default=1000, help="(default 1000)")
    p.add_argument("--workers", type=int, default=2, help="(default 2)")
    args = p.parse_args(argv)
    print(f"command: python -m benchmarks.ppo_port {' '.join(argv or sys.argv[1:])}")
    rates: dict[str, list[float]] = {lib: [] for lib in LIBRARIES}
    for round_ in range(args.rounds):
        for lib in LIBRARIES:
            totals = ppo_main(["--collector", lib, "--total-frames", str(args.total_frames),
                               "--frames-per-batch", str(args.frames_per_batch),
                               "--workers", str(args.workers)])
            timed_frames = totals["frames"] - args.frames_per_batch  # the first batch is not timed
            rate = timed_frames / totals["collect_s"] if totals["collect_s"] else float("nan")
            rates[lib].append(rate)
            print(f"round {round_ + 1}: {lib:8s} {rate:8.0f} frames/s collected "
                  f"(return {totals['last_return']:.0f})", flush=True)
    medians = {lib: statistics.median(values) for lib, values in rates.items()}
    ratio = medians["asyncrl"] / medians["torchrl"]
    print(f"median frames/s while the loop waits for a batch: asyncrl {medians['asyncrl']:.0f}, "
          f"torchrl {medians['torchrl']:.0f}; asyncrl/torchrl {ratio:.2f}x")
    return {**medians, "ratio": ratio}


if __name__ == "__main__":
    main()
