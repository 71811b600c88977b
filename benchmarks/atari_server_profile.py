"""Where central inference's time goes on real Atari, per frame: the server and the env workers.

    python -m benchmarks.atari_server_profile                          # atari.py's batched case
    python -m benchmarks.atari_server_profile --envs-per-worker 4 --splits 2

The other half of issue 45's item 5 (``benchmarks.atari_profile`` is one per-worker
worker). The workload is ``benchmarks.atari``'s ``asyncrl-batched`` case:
``AsyncBatchedCollector`` on ``ALE/Breakout-v5`` (uint8 [4, 84, 84]), CleanRL's Nature CNN
served from the trainer's inference thread, one torch thread, 8 torch-free env workers by
default (``--envs-per-worker``, ``--splits`` for other layouts). Nothing is simulated: the
run is the collector's own, with two probes that cost a few µs per call:

* the inference loop is :class:`TimedLoop`, the loop with each part of a call timed
  (the thread's CPU time and the wall clock): the wait for requests (scans, spin and
  sleep on the request bell), the gather (copies of the requests into the batch), the
  policy call, the scatter (answers into the answer blocks), the bells; the rest of the
  serving thread's CPU is the loop's own Python (lock, statistics, back-pressure);
* each env is ``benchmarks.atari_env:make_timed_atari`` (torch-free): its steps and resets
  timed in the env worker's stepping thread, counters in a mapped file.

From ``/proc/<pid>/task/<tid>/schedstat`` (time on a CPU, time waiting on a run queue) and
``status`` (context switches) of every thread of the trainer and the env workers, over the
timed window, per frame:

- the env workers: env step (the wrapper's CPU), the stepper's own work (its thread's
  CPU less the env: observation copies into the request block, answer reads, chunk
  writes, bells, Python), their other threads (the link's event loop), the time their
  stepping threads were runnable but not running (run-queue wait: the machine's cores
  were busy), and the time they slept (waiting for an answer or for room in the ring);
- the server thread: each part above, its run-queue wait, the batch sizes;
- the trainer's other threads (its event loop: chunks from the rings into batches);
- the bare CNN at the batch sizes the loop ran, timed here afterwards: the policy call
  less it is the policy's Python wrapping.
"""

from __future__ import annotations

import os
import tempfile

# The env workers read it where their envs are built: set before any collector starts.
os.environ.setdefault("ATARI_PROFILE_DIR", tempfile.mkdtemp(prefix="atari-profile-"))

import argparse
import collections
import platform
import shlex
import shutil
import sys
import threading
import time
from typing import Any

import numpy as np
import torch

from asyncrl._inference import inference_loop, thread_server
from benchmarks.atari import N_ENVS, OBS_SHAPE, make_cnn, make_policy, run_floor
from benchmarks.atari_env import COUNTERS, ENV_ID, PROFILE_DIR

PARTS = ("wait", "gather", "policy", "scatter", "bells")


class TimedLoop(inference_loop.InferenceLoop):
    """The inference loop, each part of a call timed: ``(cpu_s, wall_s, count)`` per part."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts: dict[str, list[float]] = {p: [0.0, 0.0, 0.0] for p in PARTS}
        self.thread_id: int | None = None

    def _timed(self, part: str, call: Any, *args: Any) -> Any:
        cpu, wall = time.thread_time(), time.perf_counter()
        out = call(*args)
        acc = self.parts[part]
        acc[0] += time.thread_time() - cpu
        acc[1] += time.perf_counter() - wall
        acc[2] += 1
        return out

    def serve(self) -> None:
        self.thread_id = threading.get_native_id()
        super().serve()

    def _next_requests(self) -> list[int] | None:
        return self._timed("wait", super()._next_requests)  # type: ignore[no-any-return]

    def _gather(self, lanes: list[int]) -> int:
        return self._timed("gather", super()._gather, lanes)  # type: ignore[no-any-return]

    def _compute(self, row: int) -> list[Any]:
        return self._timed("policy", super()._compute, row)  # type: ignore[no-any-return]

    def _scatter(self, lanes: list[int], outputs: list[Any], version: int) -> None:
        self._timed("scatter", super()._scatter, lanes, outputs, version)

    def _answer(self, lanes: list[int], version: int) -> None:
        self._timed("bells", super()._answer, lanes, version)

    def snapshot(self) -> dict[str, list[float]]:
        return {p: list(v) for p, v in self.parts.items()}


# -- /proc ---------------------------------------------------------------------------------------
def thread_sched(pid: int, tid: int) -> tuple[float, float, int, int, int]:
    """(on-CPU s, run-queue wait s, voluntary, involuntary context switches, minor page
    faults) of a thread."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            run_ns, wait_ns, _ = (int(x) for x in f.read().split())
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            minflt = int(f.read().rsplit(")", 1)[1].split()[7])
        voluntary = involuntary = 0
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches"):
                    voluntary = int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    involuntary = int(line.split()[1])
        return run_ns / 1e9, wait_ns / 1e9, voluntary, involuntary, minflt
    except (OSError, ValueError, IndexError):
        return 0.0, 0.0, 0, 0, 0


def process_threads(pid: int) -> dict[int, tuple[float, float, int, int, int]]:
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return {}
    return {tid: thread_sched(pid, tid) for tid in tids}


def env_counters(folder: str) -> np.ndarray:
    """Every timed env's counters, one row each (steps, step CPU-s, resets, reset CPU-s, tid)."""
    rows = [np.fromfile(os.path.join(folder, name), dtype=np.float64)
            for name in sorted(os.listdir(folder))]
    return np.array([r for r in rows if r.size == len(COUNTERS)]).reshape(-1, len(COUNTERS))


class Window:
    """Everything measured at one moment: the loop's parts, env counters, every thread."""

    def __init__(self, loop: TimedLoop, pids: list[int], folder: str) -> None:
        self.wall = time.perf_counter()
        self.parts = loop.snapshot()
        stats = loop.statistics()
        self.calls, self.observations = stats.calls, stats.observations
        self.sizes = collections.Counter(stats.batch_sizes)
        self.envs = env_counters(folder)
        self.trainer = process_threads(os.getpid())
        self.workers = {pid: process_threads(pid) for pid in pids}


def renice(pids: list[int], nice: int) -> None:
    """Every thread of ``pids`` to ``nice`` (Linux keeps a nice level per thread)."""
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)


def diff(a: tuple[float, ...], b: tuple[float, ...]) -> list[float]:
    return [y - x for x, y in zip(a, b, strict=True)]


# -- the run ---------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> tuple[Window, Window, TimedLoop, int]:
    import anyio

    from asyncrl import AsyncBatchedCollector

    loops: list[TimedLoop] = []

    class Recorded(TimedLoop):
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            loops.append(self)

    setattr(thread_server, "InferenceLoop", Recorded)  # noqa: B010 (what ThreadPolicyServer builds)
    folder = os.environ[PROFILE_DIR]
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with AsyncBatchedCollector(
                "benchmarks.atari_env:make_timed_atari", policy=make_policy(), num_envs=N_ENVS,
                frames_per_batch=args.frames_per_batch, num_threads=1,
                envs_per_worker=args.envs_per_worker, worker_num_splits=args.splits,
                min_batch_size=args.min_batch_size) as collector:
            batches, frames = 0, 0
            async for batch in collector:
                batches += 1
                if batches == 1 and args.worker_nice:
                    renice(collector.worker_pids, args.worker_nice)
                if batches == args.warmup:
                    seen["start"] = Window(loops[0], collector.worker_pids, folder)
                elif batches > args.warmup:
                    frames += batch.numel()
                    if time.perf_counter() - seen["start"].wall >= args.seconds:
                        seen["end"] = Window(loops[0], collector.worker_pids, folder)
                        seen["frames"] = frames
                        break

    anyio.run(main)
    return seen["start"], seen["end"], loops[0], seen["frames"]


def bare_cnn_us(sizes: collections.Counter[int], seconds: float) -> float:
    """CPU µs per frame of the bare CNN over the loop's batch sizes (weighted by frames)."""
    cnn, rng = make_cnn(), np.random.default_rng(0)
    total_frames = sum(n * c for n, c in sizes.items()) or 1
    per_frame = 0.0
    with torch.no_grad():
        for size, count in sizes.items():
            obs = torch.from_numpy(rng.integers(0, 256, (size, *OBS_SHAPE), np.uint8))
            cnn(obs)
            calls, start = 0, time.process_time()
            while time.process_time() - start < seconds / max(1, len(sizes)):
                cnn(obs)
                calls += 1
            us = (time.process_time() - start) / (calls * size) * 1e6
            per_frame += us * size * count / total_frames
    return per_frame


def report(args: argparse.Namespace, start: Window, end: Window, loop: TimedLoop,
           frames: int) -> None:
    wall = end.wall - start.wall
    us = 1e6 / frames
    calls = end.calls - start.calls
    sizes = end.sizes - start.sizes
    served = end.observations - start.observations
    parts = {p: diff(tuple(start.parts[p]), tuple(end.parts[p])) for p in PARTS}
    tid = loop.thread_id
    assert tid is not None
    serve = diff(start.trainer.get(tid, (0, 0, 0, 0, 0)), end.trainer[tid])
    others = [diff(start.trainer.get(t, (0.0, 0.0, 0, 0, 0)), v) for t, v in end.trainer.items()
              if t != tid]
    trainer_rest = sum(o[0] for o in others)
    trainer_faults = sum(o[4] for o in others)
    # Env workers: env counters, stepping threads (the tid the wrapper saw), other threads.
    envs = end.envs[:, :4].sum(0) - start.envs[:, :4].sum(0)
    step_tids = {int(t) for t in end.envs[:, 4]}
    stepping = [0.0, 0.0, 0.0, 0.0, 0.0]
    worker_other = 0.0
    for pid, threads in end.workers.items():
        before = start.workers.get(pid, {})
        for t, v in threads.items():
            d = diff(before.get(t, (0.0, 0.0, 0, 0, 0)), v)
            if t in step_tids:
                stepping = [a + b for a, b in zip(stepping, d, strict=True)]
            else:
                worker_other += d[0]
    n_workers = len(end.workers)
    env_cpu = envs[1] + envs[3]
    floor = run_floor(args.floor_seconds)
    cnn_bare = bare_cnn_us(sizes, args.floor_seconds / 2)
    fps = frames / wall

    print(f"\n`python -m benchmarks.atari_server_profile {shlex.join(args.argv)}`\n")
    print(f"{ENV_ID}, Nature CNN in the trainer's inference thread, {N_ENVS} envs in "
          f"{n_workers} env workers ({args.envs_per_worker} per worker, {args.splits} "
          f"split(s), min_batch_size {args.min_batch_size}, env workers' nice "
          f"{args.worker_nice}, yield after calls over {inference_loop.YIELD_AFTER * 1e3:g} ms); "
          f"python {platform.python_version()}, torch {torch.__version__}, "
          f"{len(os.sched_getaffinity(0))} cores, load average {os.getloadavg()[0]:.1f} at "
          f"the end; {frames:,} frames in {wall:.1f} s: **{fps:,.0f} frames/s** "
          f"({envs[0]:,.0f} env steps)")
    mean = served / max(1, calls)
    hist = ", ".join(f"{n}: {100 * n * c / max(1, served):.0f}%"
                     for n, c in sorted(sizes.items()))
    print(f"\nInference loop: {calls:,} calls, {mean:.2f} observations per call "
          f"(frames by batch size: {hist})\n")
    print("| server thread, per frame | CPU µs | wall µs |")
    print("|---|---:|---:|")
    names = {"wait": "wait for requests (scan, spin, sleep on the request bell)",
             "gather": "gather: requests' observations copied into the batch",
             "policy": "policy call (CNN + its Python)",
             "scatter": "scatter: answers into the answer blocks",
             "bells": "answer bells (one eventfd write per lane)"}
    timed = sum(parts[p][0] for p in PARTS)
    for p in PARTS:
        print(f"| {names[p]} | {parts[p][0] * us:.1f} | {parts[p][1] * us:.1f} |")
    print(f"| of the policy call: the bare CNN at these batch sizes (timed apart) | "
          f"{cnn_bare:.1f} | |")
    print(f"| loop's own Python (thread CPU less the parts above) | "
          f"{max(0.0, serve[0] - timed) * us:.1f} | |")
    print(f"| **server thread** (on a CPU; run-queue wait {serve[1] * us:.1f} µs; "
          f"{serve[2] / calls:.2f} voluntary, {serve[3] / calls:.2f} involuntary switches "
          f"per call) | **{serve[0] * us:.1f}** | {wall * us:.1f} |")
    print(f"| trainer's other threads (event loop: chunks into batches; "
          f"{trainer_faults / frames:.1f} minor page faults per frame) | "
          f"{trainer_rest * us:.1f} | |")

    print(f"\n| env workers ({n_workers}), per frame | CPU µs | wall µs per stepping "
          "thread |")
    print("|---|---:|---:|")
    rest = stepping[0] - env_cpu
    print(f"| env step (emulator, preprocessing, stack) | {envs[1] * us:.1f} | |")
    print(f"| env resets | {envs[3] * us:.1f} | |")
    print(f"| stepper's own work (obs copies into the request block, answers into "
          f"chunks, bells, Python; stepping thread less env) | {rest * us:.1f} | |")
    print(f"| other threads of the env workers (the link's event loop) | "
          f"{worker_other * us:.1f} | |")
    print(f"| stepping threads runnable, not running (run-queue wait) | | "
          f"{stepping[1] * us / n_workers:.1f} |")
    asleep = n_workers * wall - stepping[0] - stepping[1]
    print(f"| stepping threads asleep (waiting for answers, or room in the ring) | | "
          f"{asleep * us / n_workers:.1f} |")
    print(f"| context switches of the stepping threads per frame | "
          f"{stepping[2] / frames:.2f} voluntary, {stepping[3] / frames:.2f} involuntary | |")
    print(f"| minor page faults per frame: stepping threads / server thread | "
          f"{stepping[4] / frames:.2f} / {serve[4] / frames:.2f} | |")

    total = serve[0] + trainer_rest + stepping[0] + worker_other
    floor_us = floor["env_ms"] * 1e3 + floor["cnn_ms"]["8"] * 1e3
    print(f"\nAll threads: {total * us:.1f} CPU µs per frame; the floor (env "
          f"{floor['env_ms'] * 1e3:.0f} + CNN at batch 8 {floor['cnn_ms']['8'] * 1e3:.0f}, "
          f"measured here afterwards) {floor_us:.0f}; at batch 4 "
          f"{floor['env_ms'] * 1e3 + floor['cnn_ms']['4'] * 1e3:.0f}. CPU busy "
          f"{total / wall:.2f} of {len(os.sched_getaffinity(0))} cores.")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.atari_server_profile",
                                description=(__doc__ or "").split("\n")[0])
    p.add_argument("--envs-per-worker", type=int, default=1)
    p.add_argument("--splits", type=int, default=1, help="worker_num_splits")
    p.add_argument("--min-batch-size", type=int, default=None)
    p.add_argument("--worker-nice", type=int, default=0,
                   help="renice the env workers' threads (0: leave them)")
    p.add_argument("--yield-after", type=float, default=None,
                   help="the loop's YIELD_AFTER in seconds (default: the module's)")
    p.add_argument("--seconds", type=float, default=12.0, help="the timed window")
    p.add_argument("--warmup", type=int, default=2, help="batches before it")
    p.add_argument("--frames-per-batch", type=int, default=1024)
    p.add_argument("--floor-seconds", type=float, default=4.0,
                   help="the env and bare CNN timed afterwards")
    args = p.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    if args.yield_after is not None:
        inference_loop.YIELD_AFTER = args.yield_after
    try:
        start, end, loop, frames = run(args)
        report(args, start, end, loop, frames)
    finally:
        shutil.rmtree(os.environ[PROFILE_DIR], ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
