"""Weights fan-out to many hosts: one copy per worker, per host (relay), or a gloo broadcast.

The trainer (this process) and H worker hosts (network namespaces, K worker
processes each) hang off one switch (:func:`benchmarks.netns.star`): every NIC,
the trainer's included, is shaped to ``--rate`` each way, so what the trainer
sends to all hosts shares one link, as on a real cluster. Each size is sent
four ways, interleaved on the same processes:

* ``direct``: ``ZmqWeightSyncScheme``, one copy per worker through the trainer's NIC;
* ``relay``: the same scheme through each host's ``HostRelay``, one copy per host
  (the relay forwards over ipc);
* ``broadcast``: ``DistributedWeightSyncScheme`` (gloo), one process group of the
  trainer and all H x K workers, gloo's own broadcast;
* ``chain``: the same with ``algorithm="chain"``: each rank forwards pieces
  (``--chunk-bytes``, 1 MiB) to the next as they come. Worker indices interleave
  the hosts, as when hosts start together; the chain visits them host by host.

Each row: p50 of one blocking update (send -> every worker applied and acked)
and the bytes that left the trainer's NIC per update (its bridge's
``tx_bytes``), with the link's time for one copy as the floor.

    python -m benchmarks.fanout                      # 1, 2, 4 hosts x 2 workers, 1 Gbit/s
    python -m benchmarks.fanout --hosts 4 --rate 10gbit
    python -m benchmarks.fanout --quick              # smoke run
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import torch

from asyncrl._protocol import RelayHello, RelayWelcome
from asyncrl.weights import (
    DistributedWeightSyncScheme,
    WeightSyncScheme,
    ZmqWeightSyncScheme,
)
from asyncrl.weights._collective import CHAIN_CHUNK_BYTES, free_port
from benchmarks.netns import Star, rate_bytes, star
from benchmarks.relay import LIVENESS, Proc, relay_main, weights_worker_main
from benchmarks.weights import fill_, mlp, n_params, p50_ms, progress
from transports import Hub, Message

#: name -> (layer widths, timed repetitions per path)
SIZES: dict[str, tuple[tuple[int, ...], int]] = {
    "4M": ((1024, 2048, 1024, 4), 8),
    "16M": ((2048, 4096, 2048, 4), 3),
}
QUICK_SIZES: dict[str, tuple[tuple[int, ...], int]] = {"1M": ((512, 1024, 512, 4), 2)}
PATHS = ("direct", "relay", "broadcast", "chain")
GROUPS = ("broadcast", "chain")  # the paths with a process group each
WARMUP = 1


def worker_name(index: int) -> bytes:
    return f"fan-w{index}".encode()


def relay_name(host: int) -> bytes:
    return f"fan-relay{host}".encode()


# ------------------------------------------------------------------ a host's processes


def _role(role: str, config: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    anyio.run({"worker": weights_worker_main, "relay": relay_main}[role], config)


# ------------------------------------------------------------------ the trainer


@dataclass
class Row:
    params: int
    times: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PATHS})
    wire: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PATHS, 0))
    reps: int = 0


async def bench(sizes: dict[str, tuple[tuple[int, ...], int]], net: Star,
                per_host: int, chunk_bytes: int = CHAIN_CHUNK_BYTES) -> dict[str, Row]:
    """Every size, the four paths interleaved, to ``per_host`` workers on each host."""
    hosts = len(net.hosts)
    workers = hosts * per_host
    zmq = {name: ZmqWeightSyncScheme().to_config() for name in sizes}
    groups: dict[str, dict[str, Any]] = {path: {} for path in GROUPS}
    for name in sizes:
        for path in GROUPS:
            chain: dict[str, Any] = ({"algorithm": "chain", "chunk_bytes": chunk_bytes}
                                     if path == "chain" else {})
            scheme = DistributedWeightSyncScheme(
                init_method=f"tcp://{net.trainer_ip}:{free_port(net.trainer_ip)}", timeout=600,
                **chain)
            scheme.plan(workers=workers, remote_workers=workers)
            groups[path][name] = scheme.to_config()
    results: dict[str, Row] = {}
    async with Hub(f"tcp://{net.trainer_ip}:0", **LIVENESS) as hub, \
            anyio.create_task_group() as tg:
        hellos: set[bytes] = set()
        relays: set[bytes] = set()
        ready = anyio.Event()

        async def drain() -> None:
            async for item in hub:
                if not isinstance(item, Message):
                    continue
                if item.kind == "hello":
                    hellos.add(item.peer)
                elif item.kind == RelayHello.KIND:
                    welcome = RelayWelcome(members=per_host, instance=hub.instance)
                    await hub.send(item.peer, welcome.to_body(), kind=RelayWelcome.KIND)
                    relays.add(item.peer)
                if len(hellos) == workers and len(relays) == hosts:
                    ready.set()

        tg.start_soon(drain)
        procs: list[Proc] = []
        routes: dict[int, bytes] = {}
        for h, ns in enumerate(net.hosts):
            # indices interleave hosts, as when hosts start together (the chain regroups)
            members = [k * hosts + h for k in range(per_host)]
            endpoint = f"ipc:///tmp/asyncrl-fanout-{os.getpid()}-{h}"
            procs.append(Proc("relay", {
                "trainer": hub.endpoint, "name": relay_name(h).decode(), "endpoint": endpoint,
                "members": [worker_name(i).decode() for i in members]}, ns.name,
                module="benchmarks.fanout"))
            for index in members:
                routes[index] = relay_name(h)
                procs.append(Proc("worker", {
                    "trainer": hub.endpoint, "index": index, "relay": endpoint,
                    "identity": worker_name(index).decode(),
                    "models": [[f"{scheme}-{name}", configs[name], list(widths)]
                               for scheme, configs in (("zmq", zmq), *groups.items())
                               for name, (widths, _) in sizes.items()]},
                    ns.name, module="benchmarks.fanout"))
        try:
            with anyio.fail_after(300):
                await ready.wait()
            peers = {i: worker_name(i) for i in range(workers)}
            for name, (widths, reps) in sizes.items():
                progress(f"{hosts} hosts x {per_host} workers, {name}: {reps} x {len(PATHS)}")
                model = mlp(widths)
                row = results[name] = Row(n_params(model), reps=reps)
                senders = {"zmq": WeightSyncScheme.from_config(zmq[name]).init_on_sender(
                    f"zmq-{name}", hub=hub, model=model, workers=peers)}
                for path in GROUPS:
                    senders[path] = WeightSyncScheme.from_config(
                        groups[path][name]).init_on_sender(f"{path}-{name}", hub=hub,
                                                           model=model, workers=peers)
                for rep in range(WARMUP + reps):
                    order = PATHS if rep % 2 else PATHS[::-1]
                    for path in order:
                        sender = senders[path if path in GROUPS else "zmq"]
                        if path not in GROUPS:
                            sender.set_relay_routes(  # type: ignore[attr-defined]
                                (lambda: routes) if path == "relay" else None)
                        fill_(model, float(rep))
                        wire = net.tx_bytes()
                        start = time.perf_counter()
                        await sender.send(timeout=600)
                        elapsed = time.perf_counter() - start
                        if rep >= WARMUP:
                            row.times[path].append(elapsed)
                            row.wire[path] += net.tx_bytes() - wire
                for sender in senders.values():
                    assert sender.acked_versions == dict.fromkeys(range(workers), sender.version)
                    await sender.aclose()
            for peer in peers.values():
                await hub.send(peer, {}, kind="stop")
        finally:
            for proc in procs:  # the workers were told to stop; the relays are not
                await anyio.to_thread.run_sync(functools.partial(
                    proc.stop, timeout=30, terminate=proc.role == "relay"))
            tg.cancel_scope.cancel()
    return results


def report(runs: dict[int, dict[str, Row]], per_host: int, rate: str, command: str,
           load: tuple[float, float], elapsed: float) -> str:
    link = rate_bytes(rate)
    lines = [f"    {command}", "",
             f"Every NIC (the trainer's and each host's) shaped to {rate} each way (tbf), "
             f"{per_host} worker processes per host; p50 of send -> every worker applied "
             "and acked; MB that left the trainer's NIC per update; floor = one copy at "
             "the link's rate.", "",
             "| hosts x workers | size | floor | direct | relay | broadcast (gloo) "
             "| chain (gloo) |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for hosts, rows in runs.items():
        for name, row in rows.items():
            nbytes = row.params * 4
            cells = []
            for path in PATHS:
                wire = row.wire[path] / max(row.reps, 1) / 1e6
                cells.append(f"{p50_ms(row.times[path]):.0f} ms, {wire:.0f} MB")
            lines.append(f"| {hosts} x {per_host} | {name} ({nbytes / 1e6:.0f} MB) | "
                         f"{nbytes / link * 1e3:.0f} ms | " + " | ".join(cells) + " |")
    lines += ["", f"Load average {load[0]:.1f} before, {os.getloadavg()[0]:.1f} after; "
              f"{elapsed:.0f} s; {os.cpu_count()} CPUs, torch {torch.__version__}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fanout",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="1,2,4", help="comma-separated host counts")
    parser.add_argument("--workers-per-host", type=int, default=2)
    parser.add_argument("--rate", default="1gbit", help="every NIC's rate, e.g. 1gbit, 10gbit")
    parser.add_argument("--chunk-bytes", type=int, default=CHAIN_CHUNK_BYTES,
                        help="the chain's piece (DistributedWeightSyncScheme chunk_bytes)")
    parser.add_argument("--quick", action="store_true", help="one small size, 2 repetitions")
    parser.add_argument("--role", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role:  # a host process, started in its namespace
        _role(args.role, json.loads(args.config))
        return 0
    if os.geteuid() != 0:
        print("benchmarks.fanout needs root (it makes network namespaces)", file=sys.stderr)
        return 2
    sizes = QUICK_SIZES if args.quick else SIZES
    shown = sys.argv[1:] if argv is None else argv
    command = "python -m benchmarks.fanout" + (" " + shlex.join(shown) if shown else "")
    started, load = time.monotonic(), os.getloadavg()
    runs: dict[int, dict[str, Row]] = {}
    for hosts in (int(h) for h in args.hosts.split(",")):
        with star(hosts, args.rate) as net:
            runs[hosts] = anyio.run(bench, sizes, net, args.workers_per_host, args.chunk_bytes)
    print(report(runs, args.workers_per_host, args.rate, command, load[:2],
                 time.monotonic() - started))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
