"""Frames/s and CPU per frame of a 4-env pixel run: asyncrl's collectors against AsyncVectorEnv.

    python -m benchmarks.pixels_throughput                    # 3 repeats, interleaved
    python -m benchmarks.pixels_throughput --repeats 5 --batches 20 --cases vector,sync-shm

The env and the CNN of :mod:`benchmarks.pixels` (4x84x84 uint8 frames, a cheap
step; a small Nature-DQN CNN), 4 envs, batches of 512 frames. Each case runs in a
fresh interpreter, the cases in turn, repeated; a case collects ``--warmup``
batches, then times ``--batches`` more: frames/s (wall) and CPU-seconds per 10k
frames, summed over the trainer and every process below it (``/proc/<pid>/stat``
utime + stime, read before and after, so the workers count while alive):

- ``vector``: ``gymnasium.vector.AsyncVectorEnv(shared_memory=True)``, the CNN
  batched in the trainer (issue 38's baseline);
- ``sync-shm`` / ``sync-wire``: ``MultiSyncCollector`` 4 workers x 1 env, the CNN in
  each worker, ``shared_memory_batches`` True / False;
- ``async-shm`` / ``async-wire``: the same with ``MultiAsyncCollector``;
- ``batched``: ``AsyncBatchedCollector`` (4 envs, the CNN batched on the trainer);
- ``sync-2x2`` / ``async-2x2``: 2 workers x 2 envs (``envs_per_worker=2``), shared
  memory, each worker calling the CNN once for its two envs; ``async-1x4``: one worker
  stepping all 4 envs (one core).

``--phases`` adds where the trainer's time goes in the asyncrl cases (cProfile of
the trainer, top functions by own time). Target (issue 38 item 1): the best asyncrl
case >= 1.5x ``vector``'s frames/s at <= its CPU per frame.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from typing import Any

if os.environ.get("PIXELS_THROUGHPUT_CASE", "vector") != "vector":
    # As a training script does: at module level (the fork server starts early).
    import asyncrl  # noqa: F401

import torch

from benchmarks.pixels import (
    FRAMES_PER_BATCH,
    N_ENVS,
    descendants,
    interleave,
    make_cnn,
    make_env,
)

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds() -> float:
    """utime + stime of this process and every live process below it."""
    total = 0
    for pid in [os.getpid(), *descendants(os.getpid())]:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
        except (OSError, IndexError, ValueError):
            continue
    return total / _TICK


class Meter:
    """Wall and CPU time from the end of the warm-up to the last timed batch."""

    def __init__(self, warmup: int, batches: int) -> None:
        self.warmup, self.batches, self.seen, self.frames = warmup, batches, 0, 0
        self.start = (0.0, 0.0)
        self.result: dict[str, float] = {}

    def batch(self, frames: int) -> bool:
        """Count a batch; True when the run is done."""
        self.seen += 1
        if self.seen == self.warmup:
            self.start = (time.perf_counter(), cpu_seconds())
        elif self.seen > self.warmup:
            self.frames += frames
        if self.seen < self.warmup + self.batches:
            return False
        wall, cpu = time.perf_counter() - self.start[0], cpu_seconds() - self.start[1]
        self.result = {"fps": self.frames / wall, "cpu_per_10k": cpu / self.frames * 1e4,
                       "frames": self.frames, "wall": wall, "cpu": cpu}
        return True


def run_vector(meter: Meter) -> None:
    import gymnasium as gym

    cnn = make_cnn()
    envs = gym.vector.AsyncVectorEnv([make_env] * N_ENVS, shared_memory=True)
    obs, _ = envs.reset(seed=0)
    steps = FRAMES_PER_BATCH // N_ENVS
    with torch.no_grad():
        done = False
        while not done:
            for _ in range(steps):
                action = cnn(torch.from_numpy(obs)).numpy()
                obs, *_ = envs.step(action)
            done = meter.batch(FRAMES_PER_BATCH)
    envs.close()


def _policy() -> Any:
    from tensordict.nn import TensorDictModule

    return TensorDictModule(make_cnn(), in_keys=["observation"], out_keys=["action"])


def run_multi(meter: Meter, sync: bool, shared: bool, envs_per_worker: int = 1) -> None:
    import anyio

    from asyncrl import MultiAsyncCollector, MultiSyncCollector

    cls = MultiSyncCollector if sync else MultiAsyncCollector

    async def main() -> None:
        async with cls(make_env, _policy(), num_workers=N_ENVS // envs_per_worker,
                       envs_per_worker=envs_per_worker, frames_per_batch=FRAMES_PER_BATCH,
                       shared_memory_batches=shared) as collector:
            async for batch in collector:
                if meter.batch(batch.numel()):
                    break

    anyio.run(main)


def run_batched(meter: Meter) -> None:
    import anyio

    from asyncrl import AsyncBatchedCollector

    async def main() -> None:
        async with AsyncBatchedCollector(make_env, policy=_policy(), num_envs=N_ENVS,
                                         frames_per_batch=FRAMES_PER_BATCH) as collector:
            async for batch in collector:
                if meter.batch(batch.numel()):
                    break

    anyio.run(main)


CASES: dict[str, Any] = {
    "vector": run_vector,
    "sync-shm": lambda m: run_multi(m, True, True),
    "sync-wire": lambda m: run_multi(m, True, False),
    "async-shm": lambda m: run_multi(m, False, True),
    "async-wire": lambda m: run_multi(m, False, False),
    "batched": run_batched,
    "sync-2x2": lambda m: run_multi(m, True, True, 2),
    "async-2x2": lambda m: run_multi(m, False, True, 2),
    "async-1x4": lambda m: run_multi(m, False, True, 4),
}


def _child(case: str, warmup: int, batches: int, phases: bool) -> None:
    meter = Meter(warmup, batches)
    if phases and case != "vector":
        import cProfile
        import io
        import pstats

        profile = cProfile.Profile()
        profile.runcall(CASES[case], meter)
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(12)
        print(text.getvalue(), file=sys.stderr)
    else:
        CASES[case](meter)
    print("RESULT " + json.dumps(meter.result), flush=True)


def run_case(case: str, args: argparse.Namespace) -> dict[str, Any]:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PIXELS_THROUGHPUT_CASE": case}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "benchmarks.pixels_throughput", "--child", case,
               "--batches", str(args.batches), "--warmup", str(args.warmup)]
    out = subprocess.run(command + (["--phases"] if args.phases else []), capture_output=True,
                         text=True, env=env, cwd=root, timeout=900)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{case} exited with {out.returncode}:\n{out.stderr[-3000:]}")
    if args.phases:
        print(f"--- {case}: trainer profile\n{out.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(lines[0][len("RESULT "):])
    return result


def report(cases: list[str], results: dict[str, list[dict[str, Any]]]) -> None:
    print("\ncommand: python -m benchmarks.pixels_throughput " + shlex.join(sys.argv[1:]))
    print(f"load average at the end: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    fps = {c: statistics.median(r["fps"] for r in results[c]) for c in cases}
    cpu = {c: statistics.median(r["cpu_per_10k"] for r in results[c]) for c in cases}
    print("\n| case | frames/s | x vector | CPU-s / 10k frames | x vector | runs (frames/s) |")
    print("|---|---|---|---|---|---|")
    for case in cases:
        ratio = (f"{fps[case] / fps['vector']:.2f}", f"{cpu[case] / cpu['vector']:.2f}") \
            if "vector" in fps else ("", "")
        runs = ", ".join(f"{r['fps']:.0f}" for r in results[case])
        print(f"| {case} | {fps[case]:.0f} | {ratio[0]} | {cpu[case]:.2f} | {ratio[1]} | "
              f"{runs} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--phases", action="store_true",
                        help="print a cProfile of the trainer for each case")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="write every run's numbers here")
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.warmup, args.batches, args.phases)
        return
    cases = args.cases.split(",")
    results = interleave(cases, args.repeats, lambda case: run_case(case, args),
                         lambda row: f"{row['fps']:.0f}/s", args.json)
    report(cases, results)


if __name__ == "__main__":
    main()
