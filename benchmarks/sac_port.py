"""The ported SAC script end to end: asyncrl vs TorchRL in the same run.

    python -m benchmarks.sac_port                          # 3 rounds of 10,000 frames
    python -m benchmarks.sac_port --rounds 1 --total-frames 3000   # a quick look

Runs ``examples/sac_pendulum.py`` (TorchRL's SACLoss, SoftUpdate and
ReplayBuffer on Pendulum-v1, the UTD ratio kept by ``asyncrl.UpdateRatio``)
once with each library's ``AsyncCollector`` per round, rounds interleaved (the
machine drifts). Both runs make exactly the same number of gradient updates;
what differs is how collection overlaps them. Timed: from the first batch to
the end (the worker's start excluded). Prints each round, then the medians of
frames per second and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from examples.sac_pendulum import main as sac_main

LIBRARIES = ("asyncrl", "torchrl")


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sac_port",
                                description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="runs of each library (default 3)")
    p.add_argument("--total-frames", type=int, default=10_000, help="per run (default 10000)")
    p.add_argument("--frames-per-batch", type=int, default=200, help="(default 200)")
    p.add_argument("--init-random-frames", type=int, default=1_000, help="(default 1000)")
    p.add_argument("--utd", type=float, default=0.25, help="updates per frame (default 0.25)")
    args = p.parse_args(argv)
    print(f"command: python -m benchmarks.sac_port {' '.join(argv or sys.argv[1:])}")
    rates: dict[str, list[float]] = {lib: [] for lib in LIBRARIES}
    for round_ in range(args.rounds):
        for lib in LIBRARIES:
            totals = sac_main(["--collector", lib, "--total-frames", str(args.total_frames),
                               "--frames-per-batch", str(args.frames_per_batch),
                               "--init-random-frames", str(args.init_random_frames),
                               "--utd", str(args.utd), "--quiet"])
            timed = totals["frames"] - args.frames_per_batch  # the first batch is not timed
            rate = timed / totals["steady_s"] if totals["steady_s"] else float("nan")
            rates[lib].append(rate)
            print(f"round {round_ + 1}: {lib:8s} {rate:8.0f} frames/s "
                  f"({int(totals['updates'])} updates, return {totals['last_return']:.0f})",
                  flush=True)
    medians = {lib: statistics.median(values) for lib, values in rates.items()}
    ratio = medians["asyncrl"] / medians["torchrl"]
    print(f"median frames/s (training included): asyncrl {medians['asyncrl']:.0f}, "
          f"torchrl {medians['torchrl']:.0f}; asyncrl/torchrl {ratio:.2f}x")
    return {**medians, "ratio": ratio}


if __name__ == "__main__":
    main()
