"""Per-host relay benchmark: weights once per host vs once per worker; batches with one hop more.

A. Weights. One simulated worker host: K=4 worker processes and a
:class:`~asyncrl._worker.relay.HostRelay` in a process of its own; the trainer (this
process) sends with ``ZmqWeightSyncScheme`` over tcp. Each size alternates
updates sent *direct* (one copy per worker) with updates sent *through the
relay* (one copy per host, which the relay forwards over ipc), on the same
processes, and reports the p50 of one blocking update + acks of all K workers
and the bytes that leave the trainer per version (copies x payload on
loopback; measured on the trainer's veth with ``--netns``).

B. Batches. A worker process sends TorchRL-layout TensorDict batches (1000
CartPole-like frames; 64 frames of 4x84x84 uint8) to the trainer's Hub (i)
directly over tcp and (ii) through a forwarder process that receives them on
an ipc Hub and re-sends the decoded body upstream on a Link (zero-copy
re-encode): what one extra hop costs a batch. p50 round trip (batch, tiny
answer), throughput with 4 batches in flight, and the forwarder's CPU time.

``--netns`` (root only) puts the host's processes in a network namespace
joined to this one by a veth pair shaped to 1 Gbit/s each way (``tc qdisc add
dev VETH root tbf rate 1gbit burst 1mb latency 50ms`` on both ends: a full-duplex
1 Gbit/s NIC), runs both again, and reads the bytes that left the trainer from
its veth's ``tx_bytes``.

    python -m benchmarks.relay            # full run, loopback tcp
    python -m benchmarks.relay --netns    # and again through an emulated 1 Gbit/s NIC
    python -m benchmarks.relay --quick    # smoke run (small sizes, few repetitions)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import torch
from tensordict import TensorDict

# The relay is timed on its own: a HostRelay in a process, and this trainer answers its
# hello as the coordinator would (internal, like scaling's coordinator).
from asyncrl._protocol import RelayHello, RelayWelcome
from asyncrl._worker.relay import ATTACHED_KIND, HostRelay
from asyncrl.weights import (
    WEIGHTS_KIND,
    WeightReceiverGroup,
    WeightSyncScheme,
    ZmqWeightSyncScheme,
)
from benchmarks import ROOT
from benchmarks.netns import Netns, netns
from benchmarks.weights import fill_, mlp, n_params, p50_ms, progress
from transports import Hub, Link, Message

#: name -> (layer widths, timed repetitions per path in the full run)
SIZES: dict[str, tuple[tuple[int, ...], int]] = {
    "4k": ((32, 64, 32, 4), 100),
    "4M": ((1024, 2048, 1024, 4), 20),
    "67M": ((4096, 8192, 4096, 4), 6),
}
QUICK_SIZES: dict[str, tuple[tuple[int, ...], int]] = {
    "4k": ((32, 64, 32, 4), 10),
    "1M": ((512, 1024, 512, 4), 3),
}
#: name -> (frames, observation shape, observation dtype, timed round trips, streamed batches)
BATCHES: dict[str, tuple[int, tuple[int, ...], torch.dtype, int, int]] = {
    "CartPole 1000 frames": (1000, (4,), torch.float32, 200, 400),
    "Atari 64 frames 4x84x84 uint8": (64, (4, 84, 84), torch.uint8, 100, 200),
}
QUICK_BATCHES = {name: (*spec[:3], 10, 20) for name, spec in BATCHES.items()}
WORKERS = 4
WARMUP = 2
WINDOW = 4  # batches in flight in the throughput run
LIVENESS: dict[str, Any] = {"heartbeat_interval": 1.0, "peer_timeout": 60.0}
RELAY = b"bench-relay"
FORWARDER = b"bench-forwarder"
BATCHER = b"bench-batcher"


def worker_name(index: int) -> bytes:
    return f"bench-w{index}".encode()


# ------------------------------------------------------------------ processes of the host
# Each runs ``_role(role, config)``: spawned with multiprocessing on loopback, or as
# ``ip netns exec NS python -m benchmarks.relay --role ROLE --config JSON`` in a netns.


def _role(role: str, config: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    main = {"worker": weights_worker_main, "relay": relay_main, "batcher": _batcher_main,
            "forwarder": _forwarder_main}[role]
    anyio.run(main, config)


async def weights_worker_main(config: dict[str, Any]) -> None:
    """A weights worker (here and in benchmarks.fanout): applies each version and acks it on
    the link it came from (a relay acks upstream for its members).

    ``config``: ``identity``, ``index`` (its rank for broadcast schemes), ``trainer``, an
    optional ``relay`` endpoint, and ``models``: ``[model_id, scheme config, widths]``.
    """
    receivers = [WeightSyncScheme.from_config(scheme).init_on_worker(model_id,
                                                                     model=mlp(tuple(widths)))
                 for model_id, scheme, widths in config["models"]]
    group = WeightReceiverGroup(receivers)
    ready = anyio.Event()

    def wake() -> None:
        ready.set()

    for receiver in receivers:
        receiver.on_ready = wake  # a broadcast's bytes came after its message
    identity = config["identity"].encode()
    async with contextlib.AsyncExitStack() as stack:
        trainer = await stack.enter_async_context(
            Link(config["trainer"], identity=identity, **LIVENESS))
        links = [trainer]
        if config.get("relay"):
            relay = await stack.enter_async_context(
                Link(config["relay"], identity=identity, **LIVENESS))
            with anyio.fail_after(120):
                while (await relay.recv()).kind != ATTACHED_KIND:
                    pass
            links.append(relay)
        await trainer.send({}, kind="hello")
        group.admitted(config["index"])  # broadcast receivers join their process groups
        lock = anyio.Lock()  # one version applied at a time, whichever link brought it

        async def serve(link: Link, scope: anyio.CancelScope) -> None:
            nonlocal ready
            while True:
                message = await link.recv()
                if message.kind == "stop":
                    scope.cancel()
                    return
                if message.kind != WEIGHTS_KIND:
                    continue
                async with lock:
                    group.on_message(message)
                    group.apply_pending()
                    while group.has_pending:  # a broadcast: its bytes are still coming
                        await ready.wait()
                        ready = anyio.Event()
                        group.apply_pending()
                    await group.flush_acks(link)

        async with anyio.create_task_group() as tg:
            for link in links:
                tg.start_soon(serve, link, tg.cancel_scope)
    await group.aclose()


async def relay_main(config: dict[str, Any]) -> None:
    """A host's relay: for ``config["workers"]`` bench workers, or the named ``members``
    (with its own ``name``: one of several hosts, benchmarks.fanout)."""
    members = ([m.encode() for m in config["members"]] if "members" in config
               else [worker_name(i) for i in range(config["workers"])])
    name = config["name"].encode() if "name" in config else RELAY
    async with HostRelay(config["trainer"], members, name=name, endpoint=config["endpoint"],
                         heartbeat_interval=LIVENESS["heartbeat_interval"],
                         peer_timeout=LIVENESS["peer_timeout"]):
        await anyio.sleep_forever()  # until terminated


def make_batch(frames: int, obs_shape: tuple[int, ...], dtype: torch.dtype) -> TensorDict:
    """A TorchRL-layout batch (root, ``next`` and ``collector`` entries)."""
    def obs() -> torch.Tensor:
        if dtype == torch.uint8:
            return torch.randint(0, 256, (frames, *obs_shape), dtype=torch.uint8)
        return torch.randn(frames, *obs_shape, dtype=dtype)

    flag = torch.zeros(frames, 1, dtype=torch.bool)
    return TensorDict({
        "observation": obs(),
        "action": torch.zeros(frames, 2 if dtype != torch.uint8 else 6, dtype=torch.int64),
        "done": flag.clone(), "terminated": flag.clone(), "truncated": flag.clone(),
        "next": {"observation": obs(), "reward": torch.ones(frames, 1),
                 "done": flag.clone(), "terminated": flag.clone(), "truncated": flag.clone()},
        "collector": {"traj_ids": torch.arange(frames), "worker_id": torch.zeros(frames,
                                                                                 dtype=torch.int64),
                      "policy_version": torch.zeros(frames, dtype=torch.int64)},
    }, batch_size=[frames])


def batch_nbytes(batch: TensorDict) -> int:
    return sum(t.numel() * t.element_size() for t in batch.values(True, True))


async def _batcher_main(config: dict[str, Any]) -> None:
    """Sends batches: ping-pong round trips, then a stream with WINDOW in flight."""
    frames, shape, dtype_name, reps, stream = config["batch"]
    batch = make_batch(frames, tuple(shape), getattr(torch, dtype_name))
    async with Link(config["connect"], identity=BATCHER, **LIVENESS) as link:
        await link.send({}, kind="hello")
        assert (await link.recv()).kind == "go"
        times = []
        for rep in range(WARMUP + reps):
            start = time.perf_counter()
            await link.send(batch, kind="batch")
            answer = await link.recv()
            assert answer.kind == "ok", answer.kind
            if rep >= WARMUP:
                times.append(time.perf_counter() - start)
        sent = acked = 0
        start = time.perf_counter()
        while acked < stream:
            while sent < stream and sent - acked < WINDOW:
                await link.send(batch, kind="batch")
                sent += 1
            assert (await link.recv()).kind == "ok"
            acked += 1
        elapsed = time.perf_counter() - start
        await link.send({"times": times, "stream_seconds": elapsed, "stream": stream,
                         "nbytes": batch_nbytes(batch), "batches": WARMUP + reps + stream},
                        kind="result")
        while (await link.recv()).kind != "stop":
            pass


async def _forwarder_main(config: dict[str, Any]) -> None:
    """The extra hop: an ipc Hub below, a Link above; bodies are re-sent as decoded."""
    async with Hub(config["endpoint"], **LIVENESS) as hub, \
            Link(config["upstream"], identity=FORWARDER, **LIVENESS) as link, \
            anyio.create_task_group() as tg:

        async def up() -> None:
            async for item in hub:
                if isinstance(item, Message):
                    await link.send(item.body, kind=item.kind, meta=item.meta or None)

        async def down() -> None:
            async for message in link:
                await hub.send(BATCHER, message.body, kind=message.kind,
                               meta=message.meta or None)
                if message.kind == "stop":
                    await anyio.sleep(0.5)  # let the batcher get it
                    tg.cancel_scope.cancel()

        tg.start_soon(up)
        tg.start_soon(down)


# ------------------------------------------------------------------ launching


class Proc:
    """A host process: multiprocessing (loopback) or ``ip netns exec`` subprocess."""

    def __init__(self, role: str, config: dict[str, Any], netns: str | None, *,
                 module: str = "benchmarks.relay") -> None:
        self.role = role
        if netns is None:
            if module != "benchmarks.relay":
                raise ValueError("a loopback Proc runs this module's roles only")
            self._proc: Any = mp.get_context("spawn").Process(target=_role, args=(role, config),
                                                              daemon=True)
            self._proc.start()
        else:
            self._proc = subprocess.Popen(
                ["ip", "netns", "exec", netns, sys.executable, "-m", module,
                 "--role", role, "--config", json.dumps(config)], cwd=ROOT)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def alive(self) -> bool:
        if isinstance(self._proc, subprocess.Popen):
            return self._proc.poll() is None
        return self._proc.is_alive()

    def cpu_seconds(self) -> float:
        """user + system CPU time so far (from /proc)."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self, timeout: float = 30.0, terminate: bool = False) -> None:
        if terminate and self.alive():
            self._proc.terminate()
        if isinstance(self._proc, subprocess.Popen):
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        else:
            self._proc.join(timeout)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join()


# ------------------------------------------------------------------ trainer: weights


@dataclass
class WeightRow:
    params: int
    times: dict[str, list[float]] = field(default_factory=lambda: {"direct": [], "relay": []})
    copies: dict[str, int] = field(default_factory=lambda: {"direct": 0, "relay": 0})
    wire: dict[str, int] = field(default_factory=lambda: {"direct": 0, "relay": 0})


async def bench_weights(sizes: dict[str, tuple[tuple[int, ...], int]], tmp: str,
                        ns: Netns | None, workers: int = WORKERS) -> dict[str, WeightRow]:
    """Alternate direct and relayed updates of each size to ``workers`` processes."""
    host = ns.outer_ip if ns else "127.0.0.1"
    scheme = ZmqWeightSyncScheme()
    relay_endpoint = f"ipc://{tmp}/relay"
    results: dict[str, WeightRow] = {}
    async with Hub(f"tcp://{host}:0", **LIVENESS) as hub, anyio.create_task_group() as tg:
        hellos: set[bytes] = set()
        registered = anyio.Event()
        ready = anyio.Event()

        async def drain() -> None:
            async for item in hub:
                if not isinstance(item, Message):
                    continue
                if item.kind == "hello":
                    hellos.add(item.peer)
                elif item.kind == RelayHello.KIND:
                    welcome = RelayWelcome(members=workers, instance=hub.instance)
                    await hub.send(item.peer, welcome.to_body(), kind=RelayWelcome.KIND)
                    registered.set()
                if len(hellos) == workers and registered.is_set():
                    ready.set()

        tg.start_soon(drain)
        netns_name = ns.name if ns else None
        relay = Proc("relay", {"trainer": hub.endpoint, "workers": workers,
                               "endpoint": relay_endpoint}, netns_name)
        procs = [Proc("worker", {"trainer": hub.endpoint, "index": i, "relay": relay_endpoint,
                                 "identity": worker_name(i).decode(),
                                 "models": [[name, scheme.to_config(), list(widths)]
                                            for name, (widths, _) in sizes.items()]},
                      netns_name) for i in range(workers)]
        try:
            with anyio.fail_after(300):
                await ready.wait()
            peers = {i: worker_name(i) for i in range(workers)}
            routes = dict.fromkeys(range(workers), RELAY)
            for name, (widths, reps) in sizes.items():
                progress(f"weights {name}{' (netns)' if ns else ''}: {reps} x 2 paths")
                model = mlp(widths)
                row = results[name] = WeightRow(n_params(model))
                sender = ZmqWeightSyncScheme().init_on_sender(name, hub=hub, model=model,
                                                              workers=peers)
                for rep in range(WARMUP + reps):
                    for path in ("direct", "relay") if rep % 2 else ("relay", "direct"):
                        sender.set_relay_routes((lambda: routes) if path == "relay" else None)
                        fill_(model, float(rep))
                        copies, wire = sender.copies_sent, ns.tx_bytes() if ns else 0
                        start = time.perf_counter()
                        await sender.send(timeout=600)
                        elapsed = time.perf_counter() - start
                        if rep >= WARMUP:
                            row.times[path].append(elapsed)
                            row.copies[path] += sender.copies_sent - copies
                            row.wire[path] += ns.tx_bytes() - wire if ns else 0
                assert sender.acked_versions == dict.fromkeys(range(workers), sender.version)
                await sender.aclose()
            for peer in peers.values():
                await hub.send(peer, {}, kind="stop")
        finally:
            for proc in procs:
                await anyio.to_thread.run_sync(proc.stop)
            await anyio.to_thread.run_sync(lambda: relay.stop(terminate=True))
            tg.cancel_scope.cancel()
    return results


# ------------------------------------------------------------------ trainer: batches


@dataclass
class BatchRun:
    times: list[float]
    stream_seconds: float
    stream: int
    nbytes: int
    forwarder_cpu_per_batch: float | None


async def bench_batches(spec: tuple[int, tuple[int, ...], torch.dtype, int, int], path: str,
                        tmp: str, ns: Netns | None) -> BatchRun:
    """One batcher process sending to this hub, directly or through a forwarder."""
    host = ns.outer_ip if ns else "127.0.0.1"
    frames, shape, dtype, reps, stream = spec
    netns_name = ns.name if ns else None
    async with Hub(f"tcp://{host}:0", **LIVENESS) as hub:
        procs = []
        forwarder = None
        connect = hub.endpoint
        if path == "hop":
            connect = f"ipc://{tmp}/forwarder-{time.monotonic_ns()}"
            forwarder = Proc("forwarder", {"endpoint": connect, "upstream": hub.endpoint},
                             netns_name)
            procs.append(forwarder)
        config = {"connect": connect,
                  "batch": [frames, list(shape), str(dtype).removeprefix("torch."), reps, stream]}
        procs.append(Proc("batcher", config, netns_name))
        cpu0 = 0.0
        cpu: float | None = None
        result: dict[str, Any] = {}
        try:
            with anyio.fail_after(900):
                async for item in hub:
                    if not isinstance(item, Message):
                        continue
                    if item.kind == "hello":
                        cpu0 = forwarder.cpu_seconds() if forwarder else 0.0
                        await hub.send(item.peer, None, kind="go")
                    elif item.kind == "batch":
                        await hub.send(item.peer, None, kind="ok")
                    elif item.kind == "result":
                        cpu = forwarder.cpu_seconds() - cpu0 if forwarder else None
                        result = item.body
                        await hub.send(item.peer, None, kind="stop")
                        break
        finally:
            for proc in procs:
                await anyio.to_thread.run_sync(proc.stop)
    return BatchRun(result["times"], result["stream_seconds"], result["stream"],
                    result["nbytes"], None if cpu is None else cpu / result["batches"])


# ------------------------------------------------------------------ report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.relay",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few repetitions")
    parser.add_argument("--netns", action="store_true",
                        help="also run through a network namespace and a 1 Gbit/s veth (root)")
    parser.add_argument("--role", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role:  # a host process started in a network namespace
        _role(args.role, json.loads(args.config))
        return 0
    sizes = QUICK_SIZES if args.quick else SIZES
    batches = QUICK_BATCHES if args.quick else BATCHES
    shown = sys.argv[1:] if argv is None else argv
    command = "python -m benchmarks.relay" + (" " + shlex.join(shown) if shown else "")
    started = time.monotonic()
    load_before = os.getloadavg()

    networks: list[str] = ["loopback"]
    skipped = None
    if args.netns:
        if os.geteuid() != 0:
            skipped = "--netns skipped: creating a network namespace needs root"
            progress(skipped)
        else:
            networks.append("netns")
    weights: dict[str, dict[str, WeightRow]] = {}
    hops: dict[str, dict[str, dict[str, BatchRun]]] = {}
    for network in networks:
        with tempfile.TemporaryDirectory(prefix="asyncrl-bench-relay-") as tmp, \
                (netns() if network == "netns" else contextlib.nullcontext()) as ns:
            weights[network] = anyio.run(bench_weights, sizes, tmp, ns)
            hops[network] = {}
            for name, spec in batches.items():
                hops[network][name] = {}
                for path in ("direct", "hop", "direct2", "hop2"):  # interleaved, twice
                    progress(f"batches {name} {path}{' (netns)' if ns else ''}")
                    run = anyio.run(bench_batches, spec, path.rstrip("2"), tmp, ns)
                    base = path.rstrip("2")
                    if base in hops[network][name]:
                        merged = hops[network][name][base]
                        merged.times += run.times
                        merged.stream_seconds += run.stream_seconds
                        merged.stream += run.stream
                        if merged.forwarder_cpu_per_batch is not None:
                            merged.forwarder_cpu_per_batch = (
                                merged.forwarder_cpu_per_batch
                                + (run.forwarder_cpu_per_batch or 0.0)) / 2
                    else:
                        hops[network][name][base] = run
    print(report(weights, hops, sizes, command, skipped, load_before,
                 time.monotonic() - started))
    return 0


def report(weights: dict[str, dict[str, WeightRow]],
           hops: dict[str, dict[str, dict[str, BatchRun]]],
           sizes: dict[str, tuple[tuple[int, ...], int]], command: str, skipped: str | None,
           load_before: tuple[float, float, float], elapsed: float) -> str:
    lines: list[str] = []
    titles = {"loopback": "tcp loopback",
              "netns": "netns + veth shaped to 1 Gbit/s each way (tbf)"}
    for network, rows in weights.items():
        lines += [f"A. Weights over {titles[network]}: update + ack of {WORKERS} worker "
                  "processes on one host (p50; relay/direct = ratio)", "",
                  "| size | direct p50 ms | relay p50 ms | relay/direct | "
                  "direct MB/version | relay MB/version | bytes ratio |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for name, row in rows.items():
            direct, relay = p50_ms(row.times["direct"]), p50_ms(row.times["relay"])
            reps = len(row.times["direct"])
            if network == "netns":
                d_mb, r_mb = (row.wire[p] / reps / 1e6 for p in ("direct", "relay"))
            else:  # copies handed to the hub x the payload
                d_mb, r_mb = (row.copies[p] / reps * row.params * 4 / 1e6
                              for p in ("direct", "relay"))
            lines.append(f"| {name} ({row.params:,} params, {reps} reps) | {direct:.2f} | "
                         f"{relay:.2f} | {relay / direct:.2f} | {d_mb:.3f} | {r_mb:.3f} | "
                         f"{r_mb / d_mb:.2f} |")
        copies = {p: sum(r.copies[p] for r in rows.values())
                  / sum(len(r.times[p]) for r in rows.values()) for p in ("direct", "relay")}
        lines += ["", f"copies handed to the hub per version: direct {copies['direct']:.0f}, "
                  f"relay {copies['relay']:.0f}; MB/version = "
                  + ("tx_bytes of the trainer's veth / versions (includes heartbeats, headers)"
                     if network == "netns" else "copies x 4 bytes x params (computed)"), ""]
    for network, table in hops.items():
        lines += [f"B. Batches over {titles[network]}: one worker process, direct vs "
                  "through a forwarder process (ipc Hub -> Link)", "",
                  "| batch | path | p50 round trip ms | batches/s (4 in flight) | MB/s | "
                  "forwarder CPU ms/batch | latency ratio | throughput ratio |",
                  "|---|---|---:|---:|---:|---:|---:|---:|"]
        for name, runs in table.items():
            base = runs["direct"]
            for path, run in runs.items():
                rate = run.stream / run.stream_seconds
                base_rate = base.stream / base.stream_seconds
                cpu = ("-" if run.forwarder_cpu_per_batch is None
                       else f"{run.forwarder_cpu_per_batch * 1e3:.2f}")
                label = "direct" if path == "direct" else "+1 hop (forwarder)"
                lines.append(f"| {name} ({run.nbytes / 1e6:.2f} MB) | {label} | "
                             f"{p50_ms(run.times):.2f} | {rate:.0f} | "
                             f"{rate * run.nbytes / 1e6:.0f} | {cpu} | "
                             f"{p50_ms(run.times) / p50_ms(base.times):.2f} | "
                             f"{rate / base_rate:.2f} |")
        lines.append("")
    if skipped:
        lines += [skipped, ""]
    load_after = os.getloadavg()
    lines += [
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load average "
        f"{load_before[0]:.1f} / {load_before[1]:.1f} / {load_before[2]:.1f} at start, "
        f"{load_after[0]:.1f} / {load_after[1]:.1f} / {load_after[2]:.1f} at end; "
        f"torch {torch.__version__}, python {platform.python_version()}; "
        f"run took {elapsed:.0f} s",
        f"command: {command}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
