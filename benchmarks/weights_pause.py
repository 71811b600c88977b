"""What an update costs a *stepping* worker: receive buffer against ``in_place=True``.

A worker process steps its model in a thread (a "step" is one forward pass of
a small net, then the hook the rollout calls at every step boundary,
``WeightApplier.before_step``) while the trainer sends versions of a big
model over tcp loopback with ``ZmqWeightSyncScheme()`` (chunks into a receive
buffer, swapped in at a boundary) or ``ZmqWeightSyncScheme(in_place=True)``
(chunks into the model itself while the rollout waits at a boundary). Per
update it reports the longest time one step boundary took (the pause a
frame saw), the worker's steps per second while updates stream against
while none do, and the round trip of the update.

    python -m benchmarks.weights_pause                      # 67M params, 8 updates
    python -m benchmarks.weights_pause --size 4M --updates 20
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import threading
import time
from typing import Any

import anyio
import torch

from asyncrl.weights import WeightApplier, WeightSyncScheme, ZmqWeightSyncScheme
from transports import Hub, Link, Message

from .weights import EXTRA_SIZES, LIVENESS, SIZES, fill_, mlp, progress

#: Seconds of stepping with no update, then between two updates.
QUIET, GAP = 2.0, 0.5


class _Rollout:
    """What WeightApplier drives: a hook at every step boundary and the stamped version."""

    def __init__(self) -> None:
        self.before_step: Any = None
        self.policy_version = 0


def _worker(endpoint: str, config: dict[str, Any], widths: tuple[int, ...]) -> None:
    torch.set_num_threads(1)
    anyio.run(_worker_main, endpoint, config, widths)


async def _worker_main(endpoint: str, config: dict[str, Any], widths: tuple[int, ...]) -> None:
    model = mlp(widths)
    net, obs = torch.nn.Linear(64, 64), torch.zeros(1, 64)
    stepping, stop = threading.Event(), threading.Event()
    boundaries: list[tuple[float, float]] = []  # (when it ended, how long it took)

    def step() -> None:
        while not stop.is_set():
            start = time.perf_counter()
            rollout.before_step()
            end = time.perf_counter()
            boundaries.append((end, end - start))
            with torch.no_grad():
                net(obs)  # the step's own work: a small policy

    async with Link(endpoint, identity=b"w0", **LIVENESS) as link:
        applier = WeightApplier(link, busy=stepping.is_set)
        applier.add(WeightSyncScheme.from_config(config).init_on_worker("policy", model=model))
        rollout = _Rollout()
        applier.attach(rollout)
        stepped_out = anyio.Event()

        async def run_steps() -> None:
            await anyio.to_thread.run_sync(step)
            stepped_out.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(applier.send_acks)
            stepping.set()
            tg.start_soon(run_steps)
            await link.send({}, kind="hello")
            while True:
                message = await link.recv()
                if message.kind == "stop":
                    stop.set()
                    break
                if not applier.instance:  # (a worker learns it from its welcome)
                    applier.follow(str(message.meta.get("instance", "")))
                applier.deliver(message)
            with anyio.fail_after(10):
                await stepped_out.wait()  # its last boundary is in the list
            await link.send({"boundaries": [list(b) for b in boundaries]}, kind="report")
            applier.close()
            tg.cancel_scope.cancel()


async def bench(scheme: ZmqWeightSyncScheme, widths: tuple[int, ...],
                updates: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    async with Hub("tcp://127.0.0.1:0", **LIVENESS) as hub:
        proc = ctx.Process(target=_worker, args=(hub.endpoint, scheme.to_config(), widths),
                           daemon=True)
        proc.start()
        try:
            with anyio.fail_after(60 + 30 * updates):  # a worker that died never answers
                boundaries, windows, trips = await _run(hub, scheme, widths, updates)
        finally:
            await anyio.to_thread.run_sync(proc.join, 30)
            if proc.is_alive():
                proc.kill()
    return _summary(boundaries, windows, trips)


async def _run(hub: Hub, scheme: ZmqWeightSyncScheme, widths: tuple[int, ...],
               updates: int) -> tuple[list[Any], list[tuple[float, float]], list[float]]:
    """The trainer's side: wait for the worker, send ``updates`` versions, get its report."""
    await _receive(hub, "hello")
    model = mlp(widths)
    sender = scheme.init_on_sender("policy", hub=hub, model=model, workers={0: b"w0"})
    await anyio.sleep(QUIET)  # the worker steps with no update: the baseline rate
    windows, trips = [], []
    for version in range(1, updates + 1):
        fill_(model, float(version))
        start = time.perf_counter()
        await sender.send(timeout=120)
        end = time.perf_counter()
        windows.append((start, end))
        trips.append(end - start)
        await anyio.sleep(GAP)  # steps between two updates (not measured)
    await hub.send(b"w0", {}, kind="stop")
    report = await _receive(hub, "report")
    return report.body["boundaries"], windows, trips


async def _receive(hub: Hub, kind: str) -> Message:
    while not (isinstance(item := await hub.recv(), Message) and item.kind == kind):
        pass
    return item


def _summary(boundaries: list[Any], windows: list[tuple[float, float]],
             trips: list[float]) -> dict[str, Any]:
    first = windows[0][0]
    quiet = [b for b in boundaries if first - QUIET + 0.2 < b[0] < first]
    pauses, rates = [], []
    for start, end in windows:
        inside = [b for b in boundaries if start <= b[0] <= end + 0.001]
        pauses.append(max((took for _, took in inside), default=0.0))
        rates.append(len(inside) / (end - start))
    return {"trip": statistics.median(trips), "pause": statistics.median(pauses),
            "max_pause": max(pauses), "rate": statistics.median(rates),
            "quiet_rate": len(quiet) / (QUIET - 0.2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.weights_pause",
                                     description=__doc__.splitlines()[0])
    known = {**SIZES, **EXTRA_SIZES}
    parser.add_argument("--size", default="67M", choices=sorted(known))
    parser.add_argument("--updates", type=int, default=8)
    args = parser.parse_args(argv)
    widths = known[args.size][0]
    nbytes = sum(p.numel() for p in mlp(widths).parameters()) * 4
    rows = {"ZmqWeightSyncScheme() (receive buffer)": ZmqWeightSyncScheme(),
            "ZmqWeightSyncScheme(in_place=True)": ZmqWeightSyncScheme(in_place=True)}
    results = {}
    for label, scheme in rows.items():
        progress(label)
        results[label] = anyio.run(bench, scheme, widths, args.updates)
    print(f"\n{args.size} model ({nbytes / 1e6:.0f} MB) to one stepping worker process over "
          f"tcp loopback, {args.updates} updates (medians; the pause is the longest step "
          "boundary during an update):\n")
    print("| scheme | update round trip (ms) | pause per update (ms), median / max "
          "| steps/s during updates | steps/s with none |")
    print("|---|---:|---:|---:|---:|")
    for label, r in results.items():
        print(f"| {label} | {r['trip'] * 1e3:.0f} | {r['pause'] * 1e3:.1f} / "
              f"{r['max_pause'] * 1e3:.1f} | {r['rate']:,.0f} | {r['quiet_rate']:,.0f} |")
    print(f"\ncommand: python -m benchmarks.weights_pause {' '.join(argv or sys.argv[1:])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
