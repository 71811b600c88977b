"""Compact batches on the wire (issue 38 item 2): bytes per frame, and frames/s before/after.

    python -m benchmarks.compact_obs --before /path/to/a/checkout/of/main
    python -m benchmarks.compact_obs --repeats 3 --batches 20 --modes sync,async

The pixel env and CNN of :mod:`benchmarks.pixels` (4x84x84 uint8 frames, 4 envs).

- **bytes**: one 512-frame batch of 4 envs, encoded as a worker sends it: the full
  form (every ``("next", "observation")``, as before) and the compact one; bytes per
  frame and the observation's own size.
- **frames/s**: ``MultiSyncCollector`` / ``MultiAsyncCollector``, 4 workers x 1 env, the
  CNN in each worker, each case in a fresh interpreter, interleaved (before, after,
  before, ...), ``--repeats`` times; after 2 warm-up batches, ``--batches`` batches of 512
  frames are timed, and the CPU seconds of the trainer and its workers counted. With
  ``--before PATH`` the same cases also run on the code at PATH (``PYTHONPATH=PATH``).
  Medians and the after/before ratio are printed with this command.
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

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def wire_bytes() -> dict[str, float]:
    """Bytes per frame of one batch in the full form and in the compact one."""
    from asyncrl._protocol import Batch, compact
    from asyncrl._rollout.envs import make_env_pool
    from asyncrl._rollout.loop import Rollout
    from benchmarks.pixels import FRAMES_PER_BATCH, N_ENVS, OBS_SHAPE, make_env
    from transports import encode

    def size(body: dict[str, Any]) -> int:
        return sum(len(memoryview(part)) for part in encode(body))

    with Rollout(make_env_pool(make_env, num_envs=N_ENVS), None, FRAMES_PER_BATCH) as rollout:
        frames = rollout.collect()
        full = size(Batch(0, frames.clone()).to_body())
        compacted = size(Batch(0, *compact(frames)).to_body())
    obs = 1
    for dim in OBS_SHAPE:
        obs *= dim
    return {"full": full / FRAMES_PER_BATCH, "compact": compacted / FRAMES_PER_BATCH,
            "observation": float(obs)}


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` (``/proc/<pid>/stat``; gone: 0)."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def run_collector(mode: str, batches: int) -> dict[str, float]:
    """One timed window of a 4x1 collector on the pixel env (this interpreter's asyncrl)."""
    import anyio
    from tensordict.nn import TensorDictModule

    from asyncrl import MultiCollector
    from benchmarks.pixels import FRAMES_PER_BATCH, N_ENVS, make_cnn, make_env

    policy = TensorDictModule(make_cnn(), in_keys=["observation"], out_keys=["action"])
    result: dict[str, float] = {}

    async def main() -> None:
        async with MultiCollector(make_env, policy, sync=mode == "sync", num_workers=N_ENVS,
                                  frames_per_batch=FRAMES_PER_BATCH) as collector:
            count, start, trainer, workers = 0, 0.0, 0.0, 0.0
            async for _ in collector:
                count += 1
                if count == 2:  # warm: workers up, first batches out of the way
                    pids = collector.worker_pids
                    start = time.perf_counter()
                    trainer, workers = cpu_seconds([os.getpid()]), cpu_seconds(pids)
                elif count == batches + 2:
                    seconds = time.perf_counter() - start
                    per_10k = 10_000 / (batches * FRAMES_PER_BATCH)
                    result["fps"] = batches * FRAMES_PER_BATCH / seconds
                    result["trainer_cpu"] = (cpu_seconds([os.getpid()]) - trainer) * per_10k
                    result["workers_cpu"] = (cpu_seconds(pids) - workers) * per_10k
                    result["cpu_per_10k"] = result["trainer_cpu"] + result["workers_cpu"]
                    break

    anyio.run(main)
    return result


def run_case(tree: str, mode: str, batches: int) -> dict[str, float]:
    """``mode`` in a fresh interpreter whose asyncrl (and benchmarks.pixels) is ``tree``'s."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
        tree, HERE, os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", mode,
                          "--batches", str(batches)], capture_output=True, text=True,
                         env=env, cwd=tree, timeout=900)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{mode} in {tree} exited with {out.returncode}:\n"
                           f"{out.stderr[-3000:]}")
    return dict(json.loads(lines[0][len("RESULT "):]))


def report(results: dict[str, list[dict[str, float]]], wire: dict[str, float]) -> None:
    print("\ncommand: python -m benchmarks.compact_obs " + shlex.join(sys.argv[1:]))
    print(f"load average at the end: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    print(f"wire bytes per frame: full {wire['full']:.0f}, compact {wire['compact']:.0f} "
          f"({wire['compact'] / wire['full']:.2f}x; one observation is "
          f"{wire['observation']:.0f})")
    def median(runs: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in runs)

    print("\n| case | frames/s (median) | CPU-s per 10k frames: all (trainer + workers) "
          "| runs (frames/s) |")
    print("|---|---|---|---|")
    for case, runs in results.items():
        fps = median(runs, "fps")
        before = results.get(case.replace("after", "before"))
        ratio = f" ({fps / median(before, 'fps'):.2f}x before)" \
            if before and "after" in case else ""
        runs_text = ", ".join(f"{r['fps']:.0f}" for r in runs)
        print(f"| {case} | {fps:.0f}{ratio} | {median(runs, 'cpu_per_10k'):.2f} "
              f"({median(runs, 'trainer_cpu'):.2f} + {median(runs, 'workers_cpu'):.2f}) "
              f"| {runs_text} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--modes", default="sync,async")
    parser.add_argument("--before", help="a checkout of the code to compare with (e.g. main)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(run_collector(args.child, args.batches)), flush=True)
        return
    sys.path.insert(0, HERE)
    wire = wire_bytes()
    trees = [("before", args.before)] if args.before else []
    trees.append(("after", HERE))
    results: dict[str, list[dict[str, float]]] = {}
    for repeat in range(args.repeats):
        for mode in args.modes.split(","):
            for name, tree in trees:
                case = f"{mode} 4x1 {name}"
                results.setdefault(case, []).append(run_case(tree, mode, args.batches))
                print(f"repeat {repeat}: {case} {results[case][-1]['fps']:.0f} frames/s",
                      flush=True)
    report(results, wire)


if __name__ == "__main__":
    main()
