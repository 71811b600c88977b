"""Collection throughput, start-up time and worker memory: asyncrl against TorchRL.

    python -m asyncrl.bench.collect                 # full run (about 2 minutes on 2 idle cores)
    python -m asyncrl.bench.collect --repeats 1 --batches 3     # smoke run

CartPole-v1, random policy, 2 worker processes, in the same run for both libraries:

- ``sync  2x1``: ``MultiSyncCollector``, 1 env per worker, 1,000 frames per batch;
- ``async 2x1``: ``MultiAsyncCollector``, 1 env per worker, 1,000 frames per batch;
- ``sync 2x16``: ``MultiSyncCollector``, 16 envs per worker (TorchRL: ``SerialEnv(16, ...)``
  per worker; asyncrl: ``envs_per_worker=16``), 1,024 frames per batch.

For each configuration and repeat, a fresh collector is built; the time from the
constructor call to the first batch is "first batch"; the first batch is also the
warm-up; frames/s is measured over the next ``--batches`` batches (and at least one
second); "peak RSS" is ``VmHWM`` of each worker process (``/proc/<pid>/status``), read
before shutdown.
Medians over ``--repeats``; ratios are asyncrl / TorchRL. Targets (issue 4): frames/s
>= 5x, first batch <= 0.3x, peak RSS per worker <= 1x.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import platform
import shlex
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

ENV_ID = "CartPole-v1"
NUM_WORKERS = 2
MIN_SECONDS = 1.0  # a timed window is at least --batches batches and this long


@dataclass(frozen=True)
class Case:
    name: str
    sync: bool
    envs_per_worker: int
    frames_per_batch: int


CASES = {
    "sync": Case("sync 2x1", True, 1, 1000),
    "async": Case("async 2x1", False, 1, 1000),
    "sync16": Case("sync 2x16", True, 16, 1024),
    "async16": Case("async 2x16", False, 16, 1024),
}
DEFAULT_CASES = ("sync", "async", "sync16")


@dataclass
class Run:
    """One repeat of one case with one library."""

    fps: float
    first_batch_s: float
    worker_rss_mb: list[float]
    frames: int
    batch_shape: list[int]
    close_error: str | None = None  # raised while closing, after the measurement
    leftover_pids: list[int] = field(default_factory=list)  # workers alive 10 s after close


@dataclass
class Result:
    library: str
    case: str
    runs: list[Run] = field(default_factory=list)
    error: str | None = None

    def median(self, attr: str) -> float:
        if not self.runs:
            return float("nan")
        if attr == "worker_rss_mb":
            return statistics.median(max(r.worker_rss_mb, default=float("nan"))
                                     for r in self.runs)
        return statistics.median(getattr(r, attr) for r in self.runs)


# -- process inspection ------------------------------------------------------------------------
def peak_rss_mb(pid: int) -> float:
    """``VmHWM`` (peak resident set size) of ``pid`` in MiB; NaN if unreadable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


HELPERS = (b"resource_tracker", b"forkserver")  # multiprocessing's own helper processes


def spawned_children() -> set[int]:
    """Pids of this process's worker children (not multiprocessing's helper processes)."""
    me = os.getpid()
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid != me:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if not any(helper in cmdline for helper in HELPERS):
            pids.add(int(entry))
    return pids


def _wait_children_gone(before: set[int], timeout: float = 10.0) -> list[int]:
    """Wait for the workers started since ``before`` to exit; return those still alive."""
    deadline = time.monotonic() + timeout
    while spawned_children() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    return sorted(spawned_children() - before)


# -- TorchRL -------------------------------------------------------------------------------------
def _torchrl_env_factory(envs_per_worker: int) -> Callable[[], Any]:
    from torchrl.envs import GymEnv, SerialEnv

    single = functools.partial(GymEnv, ENV_ID)
    if envs_per_worker == 1:
        return single
    return functools.partial(SerialEnv, envs_per_worker, single)


def run_torchrl(case: Case, batches: int) -> Run:
    from torchrl.collectors import MultiAsyncCollector, MultiSyncCollector

    cls = MultiSyncCollector if case.sync else MultiAsyncCollector
    before = spawned_children()
    start = time.perf_counter()
    collector = cls(
        [_torchrl_env_factory(case.envs_per_worker)] * NUM_WORKERS, None,
        frames_per_batch=case.frames_per_batch, total_frames=-1,
    )
    try:
        it = iter(collector)
        first = next(it)
        first_batch_s = time.perf_counter() - start
        frames, count, t0 = 0, 0, time.perf_counter()
        while count < batches or time.perf_counter() - t0 < MIN_SECONDS:
            frames, count = frames + next(it).numel(), count + 1
        fps = frames / (time.perf_counter() - t0)
        workers = sorted(spawned_children() - before)
        run = Run(fps, first_batch_s, [peak_rss_mb(pid) for pid in workers], frames,
                  list(first.shape))
    finally:
        collector.shutdown()
    run.leftover_pids = _wait_children_gone(before)
    return run


# -- asyncrl -------------------------------------------------------------------------------------
async def _asyncrl_once(case: Case, batches: int) -> Run:
    from asyncrl import MultiCollector

    run: Run | None = None
    start = time.perf_counter()
    try:
        async with MultiCollector(
            ENV_ID, None, num_workers=NUM_WORKERS, sync=case.sync,
            envs_per_worker=case.envs_per_worker, frames_per_batch=case.frames_per_batch,
            total_frames=-1,
        ) as collector:
            it = collector.__aiter__()
            first = await it.__anext__()
            first_batch_s = time.perf_counter() - start
            frames, count, t0 = 0, 0, time.perf_counter()
            while count < batches or time.perf_counter() - t0 < MIN_SECONDS:
                frames, count = frames + (await it.__anext__()).numel(), count + 1
            fps = frames / (time.perf_counter() - t0)
            run = Run(fps, first_batch_s, [peak_rss_mb(p) for p in collector.worker_pids],
                      frames, list(first.shape))
    except Exception as exc:
        if run is None:
            raise
        # The numbers are in; report a failing close next to them instead of losing them.
        run.close_error = f"{type(exc).__name__}: {exc}"
    assert run is not None
    return run


def run_asyncrl(case: Case, batches: int) -> Run:
    import anyio

    before = spawned_children()
    run = anyio.run(_asyncrl_once, case, batches)
    run.leftover_pids = _wait_children_gone(before)
    return run


RUNNERS: dict[str, Callable[[Case, int], Run]] = {"asyncrl": run_asyncrl,
                                                  "torchrl": run_torchrl}


# -- report --------------------------------------------------------------------------------------
def _ratio(ours: float, theirs: float) -> float:
    return ours / theirs if theirs and theirs == theirs else float("nan")


def _verdict(ratio: float, target: float, higher_is_better: bool) -> str:
    if ratio != ratio:
        return "n/a"
    ok = ratio >= target if higher_is_better else ratio <= target
    return "yes" if ok else "**no**"


METRICS = (  # attribute, label, format, target ratio, higher is better
    ("fps", "frames/s", "{:,.0f}", 5.0, True),
    ("first_batch_s", "first batch (s)", "{:.2f}", 0.3, False),
    ("worker_rss_mb", "peak RSS / worker (MiB)", "{:.0f}", 1.0, False),
)


def markdown_table(results: dict[tuple[str, str], Result], cases: list[Case]) -> str:
    lines = ["| case | metric | asyncrl | TorchRL | asyncrl / TorchRL | target | met |",
             "|---|---|---:|---:|---:|---:|:---:|"]
    for case in cases:
        ours, theirs = results.get(("asyncrl", case.name)), results.get(("torchrl", case.name))
        for attr, label, fmt, target, higher in METRICS:
            a = ours.median(attr) if ours else float("nan")
            t = theirs.median(attr) if theirs else float("nan")
            r = _ratio(a, t)
            sign = ">=" if higher else "<="
            lines.append(f"| {case.name} | {label} | {_fmt(fmt, a)} | {_fmt(fmt, t)} | "
                         f"{_fmt('{:.2f}x', r)} | {sign} {target:g}x | "
                         f"{_verdict(r, target, higher)} |")
    return "\n".join(lines)


def _fmt(fmt: str, value: float) -> str:
    return "n/a" if value != value else fmt.format(value)


def environment() -> str:
    import torch

    versions = [f"python {platform.python_version()}", f"torch {torch.__version__}"]
    for name in ("tensordict", "torchrl", "gymnasium", "zmq"):
        try:
            module = __import__(name)
            versions.append(f"{name} {getattr(module, '__version__', '?')}")
        except ImportError:
            versions.append(f"{name} missing")
    import multiprocessing as mp

    versions.append(f"TorchRL start method {mp.get_start_method(allow_none=True)}")
    return f"{os.cpu_count()} CPUs, {platform.machine()}, " + ", ".join(versions)


def _problems(run: Run) -> list[str]:
    problems = []
    if run.close_error:
        problems.append(f"closing the collector raised {run.close_error}")
    if run.leftover_pids:
        problems.append(f"worker processes {run.leftover_pids} still alive 10 s after close")
    return problems


# -- main ------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m asyncrl.bench.collect",
                                description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="fresh collectors per case")
    p.add_argument("--batches", type=int, default=10,
                   help="timed batches per repeat, after the first (warm-up) batch")
    p.add_argument("--cases", default=",".join(DEFAULT_CASES),
                   help=f"comma-separated, from {', '.join(CASES)}")
    p.add_argument("--libraries", default="asyncrl,torchrl",
                   help="comma-separated: asyncrl, torchrl")
    p.add_argument("--torchrl-start-method", choices=("spawn", "fork", "forkserver"),
                   help="multiprocessing start method for TorchRL's workers (default: "
                        "TorchRL's own, spawn; asyncrl always spawns)")
    p.add_argument("--json", metavar="PATH", help="also write every run to PATH")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python -m asyncrl.bench.collect " + shlex.join(
        sys.argv[1:] if argv is None else argv)
    cases = [CASES[name.strip()] for name in args.cases.split(",") if name.strip()]
    libraries = [lib.strip() for lib in args.libraries.split(",") if lib.strip()]
    unknown = set(libraries) - set(RUNNERS)
    if unknown:
        print(f"unknown libraries {sorted(unknown)}; expected asyncrl and/or torchrl",
              file=sys.stderr)
        return 2
    if "torchrl" in libraries:
        # TorchRL picks its start method (spawn) when imported; import it before anything
        # fixes multiprocessing's default context, or it silently falls back to fork.
        import multiprocessing as mp

        import torchrl  # noqa: F401

        if args.torchrl_start_method:
            mp.set_start_method(args.torchrl_start_method, force=True)
    warnings.filterwarnings("ignore")
    results: dict[tuple[str, str], Result] = {}
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    for case in cases:
        for repeat in range(args.repeats):
            for library in libraries:  # interleaved, so drifts hit both alike
                result = results.setdefault((library, case.name), Result(library, case.name))
                if result.error is not None:
                    continue
                try:
                    run = RUNNERS[library](case, args.batches)
                except Exception as exc:
                    result.error = f"{type(exc).__name__}: {exc}"
                    print(f"{library:8} {case.name:10} #{repeat}: FAILED {result.error}",
                          file=sys.stderr, flush=True)
                    continue
                result.runs.append(run)
                print(f"{library:8} {case.name:10} #{repeat}: {run.fps:9,.0f} frames/s  "
                      f"first batch {run.first_batch_s:5.2f} s  worker RSS "
                      f"{', '.join(f'{m:.0f}' for m in run.worker_rss_mb)} MiB  "
                      f"batch {run.batch_shape}", file=sys.stderr, flush=True)
                for problem in _problems(run):
                    print(f"{'':8} {'':10}     {problem}", file=sys.stderr, flush=True)
                gc.collect()
    print(f"\n{command}\n\n{environment()}; {args.repeats} repeats x {args.batches} "
          f"timed batches; total {time.perf_counter() - started:.0f} s; 1-min load average "
          f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after\n")
    print(markdown_table(results, cases))
    failed = [r for r in results.values() if r.error]
    for r in failed:
        print(f"\n{r.library} {r.case}: {r.error}")
    for r in results.values():
        problems = sorted({p for run in r.runs for p in _problems(run)})
        failed += [r] if problems else []
        for problem in problems:
            print(f"\n{r.library} {r.case}: {problem}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": command, "environment": environment(),
                       "results": [{**asdict(r)} for r in results.values()]}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
