"""Central inference on a GPU against per-worker inference on the CPU (issue #25's GPU target).

Same run, ``Pendulum-v1``, N envs (one per env worker process), the same
``3 -> W -> W -> 1`` MLP (``benchmarks.collect.make_policy``, ``mlp1024`` by
default), the same frames per batch:

- ``batched-cuda``: ``AsyncBatchedCollector(num_envs=N, device="cuda")``, the
  policy served on the GPU from a thread of the trainer's process;
- ``batched-process-cuda``: the same with ``server_backend="process"``;
- ``batched-cuda-graph`` / ``batched-process-cuda-graph``: the same two with
  ``static_batch_size`` = every env (the policy replayed from one CUDA graph);
- ``per-worker-cpu``: ``MultiAsyncCollector(num_workers=N)``, a copy of the
  policy in each worker process, on its CPU.

Each library runs ``--repeats`` times, interleaved; the first batch is the
warm-up, then ``--windows`` windows of at least ``--batches`` batches and 2 s
are timed; the table shows the median frames/s and the ratio to per-worker.

    python -m benchmarks.inference_gpu                    # mlp1024, 8 and 14 envs
    python -m benchmarks.inference_gpu --policies mlp256,mlp1024 --envs 14
    python -m benchmarks.inference_gpu --envs 14 --envs-per-worker 2   # 28 envs, 14 processes
    python -m benchmarks.inference_gpu --envs 14 --min-batch-size 14 --server-timeout 0.0002
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import anyio
import torch

from benchmarks.collect import make_policy
from benchmarks.inference import ENV, MIN_SECONDS

LIBRARIES = ("batched-cuda", "batched-cuda-graph", "batched-process-cuda",
             "batched-process-cuda-graph", "per-worker-cpu")


async def _run(library: str, policy_name: str, envs: int, frames: int, windows: int,
               batches: int, per_worker: int = 1, profile: float = 0.0,
               profile_to: str = "", min_batch: int | None = None,
               server_timeout: float | None = None) -> list[float]:
    from asyncrl import AsyncBatchedCollector, MultiAsyncCollector

    policy = make_policy(policy_name, ENV)
    collector: Any
    if library.startswith("batched"):
        graphed = library.endswith("-graph")
        collector = AsyncBatchedCollector(
            ENV, num_envs=envs * per_worker, envs_per_worker=per_worker, policy=policy,
            frames_per_batch=frames, device="cuda",
            max_batch_size=envs * per_worker if graphed else max(64, envs * per_worker),
            static_batch_size=envs * per_worker if graphed else None,
            min_batch_size=min_batch, server_timeout=server_timeout,
            server_backend="process" if "process" in library else "thread")
    else:
        collector = MultiAsyncCollector(ENV, num_workers=envs, envs_per_worker=per_worker,
                                        policy=policy, frames_per_batch=frames)
    rates = []
    async with collector:
        await collector.__anext__()
        before = collector.inference_statistics() if library.startswith("batched") else None
        spy = _start_profile(collector, profile, profile_to) if profile else None
        for _ in range(windows):
            count, n, t0 = 0, 0, time.perf_counter()
            while count < batches or time.perf_counter() - t0 < MIN_SECONDS:
                n += (await collector.__anext__()).numel()
                count += 1
            rates.append(n / (time.perf_counter() - t0))
        if spy is not None:
            await anyio.to_thread.run_sync(spy.wait)
        if before is not None:
            await anyio.sleep(0.3)  # the inference process reports every 0.2 s
            after = collector.inference_statistics()
            calls = after.calls - before.calls
            print(f"#   {library}: {calls:,} policy calls, "
                  f"{(after.observations - before.observations) / max(calls, 1):.1f} "
                  "observations per call", flush=True)
    return rates


def _start_profile(collector: Any, seconds: float, path: str) -> Any:
    """py-spy (if installed) on the inference process for ``seconds``: collapsed stacks."""
    import shutil
    import subprocess

    server = getattr(collector, "_server", None)
    pid = server.pid if server is not None else os.getpid()
    spy = shutil.which("py-spy")
    if spy is None or pid is None:
        print("#   no py-spy on PATH (or no process): not profiled", flush=True)
        return None
    return subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", "200", "--threads",
                             "--duration", str(max(1, round(seconds))), "--format", "raw",
                             "-o", path], stdout=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.inference_gpu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policies", default="mlp1024")
    p.add_argument("--envs", default="8,14")
    p.add_argument("--libraries", default=",".join(LIBRARIES))
    p.add_argument("--frames-per-batch", type=int, default=1000)
    p.add_argument("--windows", type=int, default=2)
    p.add_argument("--batches", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--min-batch-size", type=int, default=None,
                   help="central inference: observations a call waits for (default 1)")
    p.add_argument("--server-timeout", type=float, default=None,
                   help="central inference: seconds a call waits for --min-batch-size")
    p.add_argument("--profile", type=float, default=0.0,
                   help="seconds of py-spy (collapsed stacks) on the inference process of "
                        "each central run, to --profile-dir")
    p.add_argument("--profile-dir", default=".")
    p.add_argument("--envs-per-worker", type=int, default=1,
                   help="K envs in each of the N worker processes (N x K envs in all): "
                        "central inference batches them all, per-worker inference K at a time")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks.inference_gpu needs a CUDA device; this machine has none")
        return 2
    libraries = args.libraries.split(",")
    print(f"# python -m benchmarks.inference_gpu {' '.join(argv or sys.argv[1:])}".rstrip())
    print(f"# {torch.cuda.get_device_name(0)}, {os.cpu_count()} cores, torch {torch.__version__}",
          flush=True)
    if args.envs_per_worker > 1:
        print(f"# {args.envs_per_worker} envs in each worker process, every library",
              flush=True)
    fps: dict[tuple[str, int, str], list[float]] = {}
    for _ in range(args.repeats):
        for policy in args.policies.split(","):
            for envs in (int(n) for n in args.envs.split(",")):
                for library in libraries:
                    try:
                        where = os.path.join(args.profile_dir, f"{policy}-{envs}-{library}.txt")
                        profile = args.profile if library.startswith("batched") else 0.0
                        rates = anyio.run(_run, library, policy, envs, args.frames_per_batch,
                                          args.windows, args.batches, args.envs_per_worker,
                                          profile, where, args.min_batch_size,
                                          args.server_timeout)
                        value = statistics.median(rates)
                        print(f"{policy} envs={envs} {library}: {value:,.0f} fps", flush=True)
                    except Exception as exc:  # one failing must not lose the others' numbers
                        value = float("nan")
                        print(f"{policy} envs={envs} {library}: {type(exc).__name__}: {exc}",
                              flush=True)
                    fps.setdefault((policy, envs, library), []).append(value)
    print("\n| policy | envs | " + " | ".join(libraries) + " | best batched / per-worker |")
    print("|---|---:|" + "---:|" * (len(libraries) + 1))
    for policy in args.policies.split(","):
        for envs in (int(n) for n in args.envs.split(",")):
            medians = {lib: statistics.median(fps[(policy, envs, lib)]) for lib in libraries}
            cells = [f"{medians[lib]:,.0f}" for lib in libraries]
            base = medians.get("per-worker-cpu", float("nan"))
            best = max((v for k, v in medians.items() if k.startswith("batched")),
                       default=float("nan"))
            print(f"| {policy} | {envs} | " + " | ".join(cells) + f" | {best / base:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
