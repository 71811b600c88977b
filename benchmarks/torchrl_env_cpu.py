"""CPU time per 1000 frames of the ported PPO script's collection, in one process, no workers.

    python -m benchmarks.torchrl_env_cpu                     # 3 rounds x 5 batches per case
    python -m benchmarks.torchrl_env_cpu --rounds 1 --batches 3

``time.process_time`` around each 1000-frame batch (so other processes on a
loaded machine do not count), with the script's env (``examples/ppo_pendulum.py``:
TransformedEnv(GymEnv("Pendulum-v1"), DoubleToFloat + StepCounter + RewardSum)),
its TanhNormal ``ProbabilisticActor`` and one torch thread. Each case runs in a
fresh interpreter, cases interleaved per round; the median is printed.

- ``torchrl``: TorchRL's single-process ``Collector`` (what each TorchRL worker runs);
- ``torchrl+probe``: the same, with pandas marked absent (``asyncrl._spawn.absent_modules``):
  what that change alone would give TorchRL;
- ``asyncrl-generic``: asyncrl's ``Rollout`` on the generic ``TorchRLPool`` (every
  step through ``TransformedEnv.step``: the path before the fast path);
- ``asyncrl-fast``: ``Rollout`` on the pool ``make_env_pool`` picks
  (``TorchRLGymFastPool``);
- ``asyncrl-worker``: the fast path plus the probe mark, as in an asyncrl worker process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

CASES = ("torchrl", "torchrl+probe", "asyncrl-generic", "asyncrl-fast", "asyncrl-worker")


def _measure(case: str, batches: int, frames: int) -> list[float]:
    import torch

    torch.set_num_threads(1)
    if case in ("torchrl+probe", "asyncrl-worker"):
        from asyncrl._spawn.absent_modules import remember_absent_modules

        remember_absent_modules()
    from examples.ppo_pendulum import make_actor, make_env

    torch.manual_seed(0)
    actor = make_actor()
    if case.startswith("torchrl"):
        import warnings

        from torchrl.collectors import Collector

        warnings.simplefilter("ignore", FutureWarning)
        collector = Collector(make_env, actor, frames_per_batch=frames, total_frames=-1)
        it = iter(collector)

        def collect() -> None:
            next(it)
    else:
        from asyncrl._rollout.envs import make_env_pool
        from asyncrl._rollout.loop import Rollout
        from asyncrl._rollout.torchrl_pools import TorchRLPool

        pool = TorchRLPool(make_env()) if case == "asyncrl-generic" else make_env_pool(make_env)
        assert pool.fast_path == (case != "asyncrl-generic"), type(pool)
        rollout = Rollout(pool, actor, frames)
        collect = rollout.collect  # type: ignore[assignment]
    collect()  # warm-up: first-call costs are not per-frame costs
    out = []
    for _ in range(batches):
        t0 = time.process_time()
        collect()
        out.append((time.process_time() - t0) * 1000 / frames)
    return out


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.torchrl_env_cpu",
                                description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batches", type=int, default=5, help="timed batches per run (default 5)")
    p.add_argument("--frames", type=int, default=1000, help="frames per batch (default 1000)")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--case", help=argparse.SUPPRESS)  # one run, in a child interpreter
    args = p.parse_args(argv)
    if args.case:
        print(json.dumps(_measure(args.case, args.batches, args.frames)))
        return {}
    cases = args.cases.split(",")
    print(f"command: python -m benchmarks.torchrl_env_cpu {' '.join(argv or sys.argv[1:])}")
    results: dict[str, list[float]] = {c: [] for c in cases}
    for round_ in range(args.rounds):
        for case in cases:
            out = subprocess.run(
                [sys.executable, "-m", "benchmarks.torchrl_env_cpu", "--case", case,
                 "--batches", str(args.batches), "--frames", str(args.frames)],
                check=True, capture_output=True, text=True).stdout
            values = json.loads(out.strip().splitlines()[-1])
            results[case] += values
            print(f"round {round_ + 1}: {case:16s} "
                  f"{statistics.median(values):.3f} CPU s per 1000 frames", flush=True)
    medians = {c: statistics.median(v) for c, v in results.items()}
    base = medians.get("torchrl")
    for case, m in medians.items():
        ratio = f"  torchrl/this {base / m:.2f}x" if base else ""
        print(f"median {case:16s} {m:.3f} CPU s per 1000 frames{ratio}")
    return medians


if __name__ == "__main__":
    main()
