"""Central batched inference: asyncrl's AsyncBatchedCollector against TorchRL's, and per-worker.

    python -m benchmarks.inference                 # mlp64 and mlp256, 2 and 4 envs, 3 repeats
    python -m benchmarks.inference --quick         # one short repeat, 2 envs (smoke run)
    python -m benchmarks.inference --envs 4 --policies mlp256 --repeats 5
    python -m benchmarks.inference --device cuda --policies mlp1024 --envs 8,14 \
        --libraries torchrl,batched,batched-process,per-worker   # central on a GPU

Same run, same configuration for every library: ``Pendulum-v1``, N envs (one per env
worker process), the **same policy object** (``benchmarks.collect.make_policy``:
``3 -> W -> W -> 1`` MLP, Tanh, ``2 * tanh`` head, a ``TensorDictModule``; ``mlp64`` the
small one, ``mlp256`` the big one), the same frames per batch:

- ``torchrl``: ``torchrl.collectors.AsyncBatchedCollector([GymEnv] * N, policy=...,
  env_backend="multiprocessing")`` (env worker processes, the policy served from a
  thread of the trainer's process, its defaults otherwise), with the trainer's torch
  threads set as asyncrl sets its own (cores minus env worker processes);
- ``batched``: ``asyncrl.AsyncBatchedCollector("Pendulum-v1", num_envs=N, policy=...)``;
- ``batched-process``: the same with ``server_backend="process"`` (a dedicated
  inference process);
- ``per-worker``: ``asyncrl.MultiAsyncCollector("Pendulum-v1", num_workers=N, policy=...)``,
  a policy copy in each worker.

``--envs-per-worker E`` puts E envs in each worker process in all three (N / E processes).
The libraries ``batched-split`` and ``batched-process-split`` (named in ``--libraries``)
are ``batched`` and ``batched-process`` with ``worker_num_splits=S`` (``--worker-num-splits``,
default 2): each worker steps one split of its E envs while the policy serves another.
``--env-step-us U`` makes every env step burn U µs more CPU (a costlier simulator than
Pendulum), in every library.

``--device cuda`` serves the central policy on that device (``torchrl``, ``batched``,
``batched-process``: ``device=``), while ``per-worker`` keeps a CPU copy in each worker:
central GPU inference against per-worker CPU inference, same run. Without torchrl
installed its row is skipped (a message says so) and the others run.

Each repeat builds a fresh collector per library (interleaved, so drifts hit all alike);
the first batch is the warm-up; then ``--windows`` windows of at least ``--batches``
batches and 2 s each are timed, and the run's frames/s is their median; the table shows
the median over repeats, and ratios batched / torchrl and batched / per-worker. With
``--update-weights`` the trainer pushes the weights after every batch (TorchRL:
``update_policy_weights_(policy)``; asyncrl: ``await update_policy_weights()``). With
``--train-ms T`` the trainer holds its thread for T ms after every batch, as a
synchronous training step does (a Python loop: it holds the GIL and the event loop).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import shlex
import statistics
import sys
import time
import warnings
from typing import Any

import anyio
import torch

from benchmarks.collect import make_policy

ENV = "Pendulum-v1"
#: --env-step-us: CPU time (µs) each env step burns on top of Pendulum's (a costlier simulator).
_STEP_US = 0.0


def costly_pendulum(step_us: float) -> Any:
    """``Pendulum-v1`` whose every step also burns ``step_us`` µs of CPU (a busy loop)."""
    import gymnasium as gym

    class Costly(gym.Wrapper):  # type: ignore[misc]
        def step(self, action: Any) -> Any:
            end = time.perf_counter() + step_us * 1e-6
            while time.perf_counter() < end:
                pass
            return self.env.step(action)

    return Costly(gym.make(ENV))


def _torchrl_costly(step_us: float) -> Any:
    from torchrl.envs import GymWrapper

    return GymWrapper(costly_pendulum(step_us))


def asyncrl_env() -> Any:
    """What asyncrl's collectors get: the gym id, or the costly factory."""
    return ENV if not _STEP_US else functools.partial(costly_pendulum, _STEP_US)
LIBRARIES = ("torchrl", "batched", "batched-process", "per-worker")
#: Not run by default: the central ones with each worker's envs in splits (--worker-num-splits).
SPLIT_LIBRARIES = ("batched-split", "batched-process-split")


#: A timed window lasts at least this long (prefetched batches must not make a window).
MIN_SECONDS = 2.0


def train_step(ms: float) -> None:
    """Hold this thread (the GIL, the event loop) for ``ms`` milliseconds."""
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


def _window_rates(next_batch: Any, update: Any, windows: int, batches: int) -> list[float]:
    rates = []
    for _ in range(windows):
        frames, count, t0 = 0, 0, time.perf_counter()
        while count < batches or time.perf_counter() - t0 < MIN_SECONDS:
            frames, count = frames + next_batch().numel(), count + 1
            update()
        rates.append(frames / (time.perf_counter() - t0))
    return rates


def cores() -> int:
    """The cores this process may run on (``taskset`` honoured), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def torchrl_missing() -> str | None:
    """Why the torchrl row cannot run here (None: it can)."""
    try:
        import torchrl.collectors  # noqa: F401
    except Exception as exc:  # not installed, or broken against this torch
        return f"{type(exc).__name__}: {exc}"
    return None


def run_torchrl(policy_name: str, envs: int, frames: int, windows: int, batches: int,
                update_weights: bool, envs_per_worker: int = 1,
                train_ms: float = 0.0, device: str = "cpu") -> list[float]:
    from torchrl.collectors import AsyncBatchedCollector
    from torchrl.envs import GymEnv

    policy = make_policy(policy_name, ENV)
    # The trainer's torch threads as asyncrl sets them (the cores the env workers leave):
    # left at the machine's count, TorchRL's served policy was 5-50x slower on 2 busy cores.
    threads_before = torch.get_num_threads()
    torch.set_num_threads(max(1, cores() - envs // envs_per_worker))
    extra: dict[str, Any] = {} if device == "cpu" else {"device": device}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        factory = (functools.partial(GymEnv, ENV) if not _STEP_US
                   else functools.partial(_torchrl_costly, _STEP_US))
        collector = AsyncBatchedCollector([factory] * envs,
                                          policy=policy, frames_per_batch=frames,
                                          total_frames=-1, env_backend="multiprocessing",
                                          envs_per_worker=envs_per_worker, **extra)
    try:
        it = iter(collector)
        next(it)

        def update() -> None:
            train_step(train_ms)
            if update_weights:
                collector.update_policy_weights_(policy)

        return _window_rates(lambda: next(it), update, windows, batches)
    finally:
        collector.shutdown()
        torch.set_num_threads(threads_before)


async def _asyncrl(kind: str, policy_name: str, envs: int, frames: int, windows: int,
                   batches: int, update_weights: bool, envs_per_worker: int = 1,
                   train_ms: float = 0.0, device: str = "cpu", splits: int = 2) -> list[float]:
    from asyncrl import AsyncBatchedCollector, MultiAsyncCollector

    policy = make_policy(policy_name, ENV)
    collector: Any
    if kind.startswith("batched"):
        collector = AsyncBatchedCollector(
            asyncrl_env(), num_envs=envs, policy=policy, frames_per_batch=frames,
            max_batch_size=max(64, envs), envs_per_worker=envs_per_worker,
            worker_num_splits=splits if kind.endswith("-split") else 1,
            server_backend="process" if kind.startswith("batched-process") else "thread",
            device=None if device == "cpu" else device)
    else:
        collector = MultiAsyncCollector(asyncrl_env(), num_workers=envs // envs_per_worker,
                                        policy=policy,
                                        frames_per_batch=frames, envs_per_worker=envs_per_worker)
    rates = []
    async with collector:
        await collector.__anext__()
        for _ in range(windows):
            frames, count, t0 = 0, 0, time.perf_counter()
            while count < batches or time.perf_counter() - t0 < MIN_SECONDS:
                frames += (await collector.__anext__()).numel()
                count += 1
                train_step(train_ms)
                if update_weights:
                    await collector.update_policy_weights()
            rates.append(frames / (time.perf_counter() - t0))
    return rates


def run_one(library: str, policy: str, envs: int, args: argparse.Namespace) -> dict[str, Any]:
    start = time.perf_counter()
    try:
        if library == "torchrl":
            rates = run_torchrl(policy, envs, args.frames_per_batch, args.windows, args.batches,
                                args.update_weights, args.envs_per_worker, args.train_ms,
                                args.device)
        else:
            rates = anyio.run(_asyncrl, library, policy, envs, args.frames_per_batch,
                              args.windows, args.batches, args.update_weights,
                              args.envs_per_worker, args.train_ms, args.device,
                              args.worker_num_splits)
        error = None
    except Exception as exc:  # one library failing must not lose the others' numbers
        rates, error = [], f"{type(exc).__name__}: {exc}"
    fps = statistics.median(rates) if rates else float("nan")
    return {"library": library, "policy": policy, "envs": envs, "fps": fps, "rates": rates,
            "error": error, "seconds": time.perf_counter() - start}


def _median(runs: list[dict[str, Any]]) -> float:
    values = [r["fps"] for r in runs if r["error"] is None]
    return statistics.median(values) if values else float("nan")


def table(results: list[dict[str, Any]], policies: list[str], envs: list[int],
          libraries: list[str]) -> str:
    head = ["policy", "envs", *[f"{lib} fps" for lib in libraries]]
    ratios = [("batched", "torchrl"), ("batched-process", "torchrl"), ("batched", "per-worker"),
              ("batched-process", "per-worker"), ("batched-process", "batched"),
              ("batched-split", "per-worker"), ("batched-process-split", "per-worker"),
              ("batched-split", "batched"), ("batched-process-split", "batched-process")]
    ratios = [(a, b) for a, b in ratios if a in libraries and b in libraries]
    head += [f"{a} / {b}" for a, b in ratios]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for policy in policies:
        for n in envs:
            fps = {lib: _median([r for r in results if (r["library"], r["policy"], r["envs"])
                                 == (lib, policy, n)]) for lib in libraries}
            cells = [policy, str(n), *[f"{fps[lib]:,.0f}" for lib in libraries]]
            cells += [f"{fps[a] / fps[b]:.2f}x" for a, b in ratios]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.inference", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1 repeat, 2 envs, short windows")
    p.add_argument("--policies", default="mlp64,mlp256")
    p.add_argument("--envs", default="2,4", help="env counts (one env per worker process)")
    p.add_argument("--libraries", default=",".join(LIBRARIES))
    p.add_argument("--frames-per-batch", type=int, default=500)
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--batches", type=int, default=4, help="batches per timed window")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--envs-per-worker", type=int, default=1,
                   help="envs per env worker process (every library alike)")
    p.add_argument("--env-step-us", type=float, default=0.0,
                   help="CPU time each env step burns on top of Pendulum's (a costlier env)")
    p.add_argument("--worker-num-splits", type=int, default=2,
                   help="splits of each worker's envs in the *-split libraries")
    p.add_argument("--update-weights", action="store_true")
    p.add_argument("--train-ms", type=float, default=0.0,
                   help="hold the trainer's thread this long after each batch (a training step)")
    p.add_argument("--device", default="cpu",
                   help="where the central policy runs (torchrl, batched, batched-process); "
                        "per-worker keeps a CPU copy per worker")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    if args.quick:
        args.envs, args.repeats, args.windows, args.batches = "2", 1, 1, 2
        args.frames_per_batch = min(args.frames_per_batch, 200)
    return args


def main(argv: list[str] | None = None) -> int:
    global _STEP_US
    args = parse_args(argv)
    _STEP_US = args.env_step_us
    policies = [p for p in args.policies.split(",") if p]
    envs = [int(n) for n in args.envs.split(",") if n]
    libraries = [lib for lib in args.libraries.split(",") if lib]
    unknown = [lib for lib in libraries if lib not in LIBRARIES + SPLIT_LIBRARIES]
    if unknown or not all(p.startswith("mlp") and p[3:].isdigit() for p in policies):
        print(f"unknown libraries {unknown} or policies {policies}; libraries are "
              f"{LIBRARIES + SPLIT_LIBRARIES}, policies mlpN", file=sys.stderr)
        return 2
    try:
        device = torch.device(args.device)
    except (RuntimeError, TypeError) as exc:
        print(f"--device {args.device!r} is not a torch device: {exc}", file=sys.stderr)
        return 2
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"--device {args.device}: this machine has no CUDA device", file=sys.stderr)
        return 2
    if "torchrl" in libraries:
        missing = torchrl_missing()
        if missing is not None:
            print(f"# torchrl is not importable here ({missing}): its row is skipped",
                  flush=True)
            libraries.remove("torchrl")
    command = "python -m benchmarks.inference " + " ".join(map(shlex.quote, argv or sys.argv[1:]))
    gpu = f", {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""
    print(f"# {command}\n# {platform.node()}: {cores()} cores, torch "
          f"{torch.__version__}{gpu}, load {os.getloadavg()[0]:.1f}", flush=True)
    results = []
    for repeat in range(args.repeats):
        for policy in policies:
            for n in envs:
                for lib in libraries:
                    r = run_one(lib, policy, n, args)
                    r["repeat"] = repeat
                    results.append(r)
                    status = r["error"] or f"{r['fps']:,.0f} fps"
                    print(f"repeat {repeat} {policy} envs={n} {lib}: {status}", flush=True)
    print()
    print(table(results, policies, envs, libraries))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": command, "results": results}, f, indent=1)
    return 0 if all(r["error"] is None for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
