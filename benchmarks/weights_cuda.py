"""Weights from a CUDA learner: to CPU workers (pinned staging) and to GPU workers (CUDA IPC).

p50 of one blocking update (send, then every worker applied and acked) to 2
local worker processes, for MLPs of about 4 thousand, 2 million and 50
million float32 parameters (issue #24's sizes), the learner's model on
``cuda:0``:

* **CPU workers**: asyncrl ``ZmqWeightSyncScheme`` (ipc; the learner's weights
  are staged through pinned memory) and ``SharedMemWeightSyncScheme`` (pinned
  staging, then one memcpy into the shared buffer), against TorchRL's
  ``MultiProcessWeightSyncScheme`` and ``SharedMemWeightSyncScheme`` with the
  same CUDA model and CPU workers;
* **GPU workers** (their policy on ``cuda:0``): asyncrl
  ``CudaIpcWeightSyncScheme`` (one device copy into a free buffer; workers view
  it) against TorchRL's ``SharedMemWeightSyncScheme`` with CUDA workers (CUDA
  IPC into the workers' live parameters: no snapshot, no version);
* the limits, same run: one device-to-pinned-host copy of the parameters
  (CPU workers) and one device-to-device copy (GPU workers).

Needs a CUDA device; TorchRL rows are skipped (with the reason) when torchrl
is missing or fails on this machine.

    python -m benchmarks.weights_cuda                 # 4k / 2M / 50M
    python -m benchmarks.weights_cuda --sizes 4k,2M   # fewer sizes
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import time
import traceback
from typing import Any

import anyio
import torch

from asyncrl.weights import (
    CudaIpcWeightSyncScheme,
    SharedMemWeightSyncScheme,
    WeightSyncScheme,
    ZmqWeightSyncScheme,
)
from benchmarks import weights
from benchmarks.weights import (
    EXTRA_SIZES,
    PUSH,
    SIZES,
    mlp,
    n_params,
    p50_ms,
    progress,
)

WORKERS = 2
ALL_SIZES = {**SIZES, **EXTRA_SIZES}


async def bench_asyncrl(scheme: WeightSyncScheme, sizes: dict[str, tuple[tuple[int, ...], int]],
                        worker_device: str) -> dict[str, list[float]]:
    """Seconds per blocking update from a CUDA learner, per size."""
    with tempfile.TemporaryDirectory(prefix="asyncrl-bench-") as tmp:
        results = await weights.bench_asyncrl(scheme, sizes, f"ipc://{tmp}/weights", WORKERS,
                                              learner="cuda", worker_device=worker_device)
    return {name: times for name, times in results.items() if not name.startswith(PUSH)}


def bench_torchrl(kind: str, sizes: dict[str, tuple[tuple[int, ...], int]],
                  worker_device: str) -> dict[str, list[float]]:
    """TorchRL's scheme from a CUDA learner to 2 workers on ``worker_device``."""
    results = weights.bench_torchrl(kind, sizes, learner="cuda", worker_device=worker_device)
    if results is None:
        raise RuntimeError("torchrl is not installed")
    return results


def bench_copy(sizes: dict[str, tuple[tuple[int, ...], int]], to: str) -> dict[str, list[float]]:
    """One copy of the parameters from ``cuda:0`` into warm memory: pinned host or device."""
    results: dict[str, list[float]] = {}
    for name, (widths, reps) in sizes.items():
        source = [p.detach() for p in mlp(widths).to("cuda").parameters()]
        if to == "pinned":
            destination = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in source]
        else:
            destination = [torch.empty_like(t) for t in source]
        times = []
        for rep in range(reps + 2):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for dst, src in zip(destination, source, strict=True):
                dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            if rep >= 2:
                times.append(time.perf_counter() - start)
        results[name] = times
    return results


def run_row(label: str, run: Any) -> dict[str, list[float]] | str:
    progress(label)
    try:
        return run()  # type: ignore[no-any-return]
    except Exception as exc:  # a row that fails here says why and the others still run
        traceback.print_exc()
        return f"failed: {type(exc).__name__}: {str(exc)[:120]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="4k,2M,50M")
    parser.add_argument("--no-torchrl", action="store_true")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks.weights_cuda needs a CUDA device; this machine has none")
        return 2
    # TorchRL's schemes make their locks and queues in the default context: spawn, since a
    # forked child of a process that initialised CUDA cannot use it.
    mp.set_start_method("spawn", force=True)
    sizes = {name: ALL_SIZES[name] for name in args.sizes.split(",")}
    groups: list[tuple[str, str, list[tuple[str, Any]]]] = [
        ("CPU workers", "cpu", [
            ("limit: one copy cuda -> pinned host", lambda: bench_copy(sizes, "pinned")),
            ("asyncrl ZmqWeightSyncScheme (ipc, pinned staging)",
             lambda: anyio.run(bench_asyncrl, ZmqWeightSyncScheme(), sizes, "cpu")),
            ("asyncrl SharedMemWeightSyncScheme (pinned staging)",
             lambda: anyio.run(bench_asyncrl, SharedMemWeightSyncScheme(), sizes, "cpu")),
        ]),
        ("GPU workers (cuda:0)", "cuda", [
            ("limit: one copy cuda -> cuda", lambda: bench_copy(sizes, "cuda")),
            ("asyncrl CudaIpcWeightSyncScheme",
             lambda: anyio.run(bench_asyncrl, CudaIpcWeightSyncScheme(), sizes, "cuda")),
        ]),
    ]
    if not args.no_torchrl:
        groups[0][2].extend([
            ("TorchRL MultiProcessWeightSyncScheme", lambda: bench_torchrl("mp", sizes, "cpu")),
            ("TorchRL SharedMemWeightSyncScheme", lambda: bench_torchrl("shm", sizes, "cpu"))])
        groups[1][2].append(
            ("TorchRL SharedMemWeightSyncScheme", lambda: bench_torchrl("shm", sizes, "cuda")))
    params = {name: n_params(mlp(widths)) for name, (widths, _) in sizes.items()}
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, learner on cuda:0, "
          f"{WORKERS} worker processes; p50 of send -> all acked (TorchRL: send())")
    print(f"# python -m benchmarks.weights_cuda {' '.join(argv or sys.argv[1:])}".rstrip())
    for title, _, rows in groups:
        print(f"\n### {title}\n")
        print("| row | " + " | ".join(f"{n} ({params[n]:,} params)" for n in sizes) + " |")
        print("|---|" + "---:|" * len(sizes))
        for label, run in rows:
            result = run_row(f"{title}: {label}", run)
            if isinstance(result, str):
                print(f"| {label} | {result} |", flush=True)
            else:
                cells = [f"{p50_ms(result[n]):.3f} ms" for n in sizes]
                print(f"| {label} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
