"""Weight-sync benchmark: update + ack latency to 2 worker processes, and tcp bandwidth.

Latency: p50 of one blocking update (``await sender.send()`` / TorchRL's
``scheme.send()`` with ``sync=True``) to 2 local worker processes that apply
the weights and acknowledge, for MLPs of about 4 thousand, 4 million and 67
million float32 parameters, with

* asyncrl ``ZmqWeightSyncScheme`` (ipc socket, the local-worker default),
* asyncrl ``SharedMemWeightSyncScheme`` (double-buffered seqlock block),
* asyncrl ``DistributedWeightSyncScheme`` (one gloo broadcast over 127.0.0.1 per
  update, the version over the ipc socket; a process group per model size),
* TorchRL ``MultiProcessWeightSyncScheme`` (mp queues, torch shared storage),
* TorchRL ``SharedMemWeightSyncScheme`` (in-place writes into shared params),

The live row's first two sends are warm-ups, and the first of them attaches each worker
(a message, acked); every timed send after that is the real ``send_async()`` +
``wait_ack()`` of attached workers: a version word written in shared memory, no
message, acknowledged at once. The workers' share of it (about 20 µs at the step
that sees a new version) is not in the row: these bench workers do not step.

TorchRL rows are skipped when torchrl is not installed. Bandwidth: the 67M
model (268 MB) sent to one worker over tcp loopback with the ZeroMQ scheme
(streamed in chunks, and in one message as before) against bare pyzmq
ROUTER/DEALER round trips of the same bytes (send, the peer receives them
all, answers a few bytes), in one message and in messages of the same chunk
size; rows interleaved, the order reversed every other round.

    python -m benchmarks.weights            # full run, a few minutes
    python -m benchmarks.weights --quick    # smoke run (small sizes)
    python -m benchmarks.weights --sizes 4k,2M,50M --no-bandwidth   # issue #11's sizes
    python -m benchmarks.weights --rapid    # memory of 50 rapid sends (newest wins)
    python -m benchmarks.weights --sizes 67M --bandwidth-only --rounds 4 --reps 4   # tcp only

``--rapid``: 50 ``send_async()`` in a row of a 16 MB model to 2 live worker
processes that take 100 ms per update, then one ``wait_ack()``: the trainer's
RSS growth (peak while sending, over the RSS before), the weight messages
handed to ZeroMQ and the versions acknowledged. Newest wins: a version
superseded before it was transmitted is dropped, not queued.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import itertools
import multiprocessing as mp
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import anyio
import numpy as np
import torch
import zmq
from torch import nn

from asyncrl.weights import (
    DistributedWeightSyncScheme,
    LiveSharedMemWeightSyncScheme,
    SharedMemWeightSyncScheme,
    WeightReceiverGroup,
    WeightSyncScheme,
    ZmqWeightSyncScheme,
)
from benchmarks import netns
from transports import Hub, Link, Message, copy_into

#: name -> (layer widths, repetitions in the full run)
SIZES: dict[str, tuple[tuple[int, ...], int]] = {
    "4k": ((32, 64, 32, 4), 200),
    "4M": ((1024, 2048, 1024, 4), 40),
    "67M": ((4096, 8192, 4096, 4), 8),
}
#: More sizes for ``--sizes``: those of issue #11's GPU-learner measurement (2.1M, 50M).
EXTRA_SIZES: dict[str, tuple[tuple[int, ...], int]] = {
    "1M": ((512, 1024, 512, 4), 20),
    "2M": ((1024, 1024, 1024, 4), 40),
    "50M": ((4096, 6144, 4096, 4), 10),
}
QUICK_SIZES: dict[str, tuple[tuple[int, ...], int]] = {
    "4k": ((32, 64, 32, 4), 20),
    "1M": ((512, 1024, 512, 4), 5),
}
WORKERS = 2
#: Prefix of the result keys holding the ``send_async`` (push) times.
PUSH = "push:"
WORKER_RSS = "worker RSS: "  # results key: the worker processes' RSS after the updates (bytes)
LIVENESS: dict[str, Any] = {"heartbeat_interval": 1.0, "peer_timeout": 60.0}


def mlp(widths: tuple[int, ...]) -> nn.Module:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(widths)):
        layers.append(nn.Linear(a, b))
        if i < len(widths) - 2:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def fill_(module: nn.Module, value: float) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.fill_(value)


# ------------------------------------------------------------------ asyncrl workers


def _asyncrl_worker(endpoint: str, index: int, configs: dict[str, dict[str, Any]],
                    sizes: dict[str, tuple[tuple[int, ...], int]], device: str = "cpu",
                    namespace: str | None = None) -> None:
    if namespace is not None:
        netns.enter(namespace)  # the worker's "host" (--link)
    torch.set_num_threads(1)
    anyio.run(_asyncrl_worker_main, endpoint, index, configs, sizes, device)


async def _asyncrl_worker_main(endpoint: str, index: int, configs: dict[str, dict[str, Any]],
                               sizes: dict[str, tuple[tuple[int, ...], int]],
                               device: str) -> None:
    receivers = [WeightSyncScheme.from_config(configs[name]).init_on_worker(
        name, model=mlp(widths).to(device)) for name, (widths, _) in sizes.items()]
    await _serve_weights(endpoint, index, receivers, delay=0.0)  # idle: applies at once


def _configs(scheme: WeightSyncScheme, sizes: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """One config per model size: a broadcast scheme gets a process group (a port) each."""
    configs = {}
    for name in sizes:
        config = scheme.to_config()
        if isinstance(scheme, DistributedWeightSyncScheme):
            planned = WeightSyncScheme.from_config(config)
            planned.plan(workers=WORKERS)
            config = planned.to_config()
        configs[name] = config
    return configs


async def _serve_weights(endpoint: str, index: int, receivers: list[Any], *,
                         delay: float) -> None:
    """A bench worker: apply each weight message ``delay`` s after it came, ack it."""
    group = WeightReceiverGroup(receivers)
    ready = anyio.Event()

    def wake() -> None:
        ready.set()

    for receiver in receivers:
        receiver.on_ready = wake  # a broadcast arrived after its message
    async with Link(endpoint, identity=f"bench-{index}".encode(), **LIVENESS) as link:
        await link.send({}, kind="hello")
        group.admitted(index)  # broadcast receivers join their process groups
        while True:
            message = await link.recv()
            if message.kind == "stop":
                # RSS of this process once the allocator gave back what is free: what
                # holding the model costs between updates (a receive buffer, or none).
                ctypes.CDLL(None).malloc_trim(0)
                await link.send({"rss": rss_bytes()}, kind="rss")
                break
            group.on_message(message)
            if delay:
                await anyio.sleep(delay)  # a worker busy stepping its envs
            group.park()  # idle: a version written in place goes in as its chunks come
            group.apply_pending()
            while group.has_pending and not group.needs_park:  # bytes still coming (broadcast)
                await ready.wait()
                ready = anyio.Event()
                group.apply_pending()
            await group.flush_acks(link)
        await group.aclose()


async def _drain(hub: Hub, joined: anyio.Event, count: int,
                 rss: tuple[list[int], anyio.Event] | None = None) -> None:
    seen = 0
    while True:
        item = await hub.recv()
        if isinstance(item, Message) and item.kind == "hello":
            seen += 1
            if seen == count:
                joined.set()
        elif isinstance(item, Message) and item.kind == "rss" and rss is not None:
            rss[0].append(int(item.body["rss"]))
            if len(rss[0]) == count:
                rss[1].set()


async def bench_asyncrl(scheme: WeightSyncScheme, sizes: dict[str, tuple[tuple[int, ...], int]],
                        endpoint: str, workers: int = WORKERS, *, learner: str = "cpu",
                        worker_device: str = "cpu",
                        namespace: str | None = None) -> dict[str, list[float]]:
    """Seconds per blocking update for each size, ``workers`` worker processes.

    ``learner`` / ``worker_device``: where the trainer's and the workers' models live;
    ``namespace``: the network namespace the workers run in (see :mod:`benchmarks.netns`).
    """
    ctx = mp.get_context("spawn")
    results: dict[str, list[float]] = {}
    rss: tuple[list[int], anyio.Event] = ([], anyio.Event())  # each worker's, at the end
    async with Hub(endpoint, **LIVENESS) as hub, anyio.create_task_group() as tg:
        joined = anyio.Event()
        tg.start_soon(_drain, hub, joined, workers, rss)
        configs = _configs(scheme, sizes)
        procs = [ctx.Process(target=_asyncrl_worker, daemon=True,
                             args=(hub.endpoint, i, configs, sizes, worker_device, namespace))
                 for i in range(workers)]
        for proc in procs:
            proc.start()
        try:
            with anyio.fail_after(300):
                await joined.wait()
            peers = {i: f"bench-{i}".encode() for i in range(workers)}
            for name, (widths, reps) in sizes.items():
                model = mlp(widths).to(learner)
                sender = WeightSyncScheme.from_config(configs[name]).init_on_sender(
                    name, hub=hub, model=model, workers=peers)
                times, pushes = [], []
                for rep in range(reps + 2):  # two warm-up rounds
                    fill_(model, float(rep))
                    if learner != "cpu":
                        torch.cuda.synchronize()  # the fill is done: time the send only
                    start = time.perf_counter()
                    await sender.send_async()
                    pushed = time.perf_counter()
                    await sender.wait_ack(timeout=120)
                    if rep >= 2:
                        times.append(time.perf_counter() - start)
                        pushes.append(pushed - start)
                await sender.aclose()
                results[name] = times
                results[PUSH + name] = pushes
            await _stop(hub, peers)
            with anyio.move_on_after(30):
                await rss[1].wait()
            results[WORKER_RSS] = [float(max(rss[0], default=0))]
        finally:
            await _reap(procs)
            tg.cancel_scope.cancel()
    return results


async def _stop(hub: Any, peers: dict[int, bytes]) -> None:
    for peer in peers.values():
        await hub.send(peer, {}, kind="stop")


async def _reap(procs: list[Any]) -> None:
    """Wait for the bench's worker processes to exit (they were told to stop); kill stragglers."""
    for proc in procs:
        await anyio.to_thread.run_sync(proc.join, 30)
        if proc.is_alive():
            proc.kill()


# ------------------------------------------------------------------ rapid sends


RAPID_WIDTHS = (1024, 2048, 1024, 4)  # 4.2M float32 parameters: 16.8 MB
RAPID_SENDS = 50
RAPID_DELAY = 0.1


def _slow_worker(endpoint: str, index: int, delay: float) -> None:
    torch.set_num_threads(1)
    anyio.run(_slow_worker_main, endpoint, index, delay)


async def _slow_worker_main(endpoint: str, index: int, delay: float) -> None:
    receivers = [ZmqWeightSyncScheme().init_on_worker("rapid", model=mlp(RAPID_WIDTHS))]
    await _serve_weights(endpoint, index, receivers, delay=delay)


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def bench_rapid(endpoint: str, sends: int = RAPID_SENDS,
                      delay: float = RAPID_DELAY) -> dict[str, Any]:
    """``sends`` rapid ``send_async`` to 2 slow workers: RSS growth, copies, acks."""
    ctx = mp.get_context("spawn")
    async with Hub(endpoint, **LIVENESS) as hub, anyio.create_task_group() as tg:
        joined = anyio.Event()
        tg.start_soon(_drain, hub, joined, WORKERS)
        procs = [ctx.Process(target=_slow_worker, args=(hub.endpoint, i, delay), daemon=True)
                 for i in range(WORKERS)]
        for proc in procs:
            proc.start()
        try:
            with anyio.fail_after(300):
                await joined.wait()
            model = mlp(RAPID_WIDTHS)
            peers = {i: f"bench-{i}".encode() for i in range(WORKERS)}
            sender = ZmqWeightSyncScheme().init_on_sender("rapid", hub=hub, model=model,
                                                          workers=peers)
            await sender.send(timeout=120)  # warm: the first snapshot exists on both sides
            sent_before, base = sender.copies_sent, rss_bytes()
            peak = base
            start = time.perf_counter()
            for rep in range(sends):
                fill_(model, float(rep))
                version = await sender.send_async()
                peak = max(peak, rss_bytes())
            queued = time.perf_counter() - start
            acked = await sender.wait_ack(timeout=300)
            peak = max(peak, rss_bytes())
            result = {"model_mb": n_params(model) * 4 / 1e6, "sends": sends,
                      "copies": sender.copies_sent - sent_before, "growth_mb": (peak - base) / 1e6,
                      "queue_s": queued, "total_s": time.perf_counter() - start,
                      "newest": version, "acked": acked}
            await sender.aclose()
            await _stop(hub, peers)
        finally:
            await _reap(procs)
            tg.cancel_scope.cancel()
    return result


def rapid_report(result: dict[str, Any], command: str) -> str:
    return "\n".join([
        f"{result['sends']} rapid send_async() of a {result['model_mb']:.1f} MB model to "
        f"{WORKERS} worker processes taking {RAPID_DELAY * 1e3:.0f} ms per update:",
        f"  trainer RSS growth (peak): {result['growth_mb']:.0f} MB",
        f"  weight messages handed to ZeroMQ: {result['copies']} "
        f"(one per worker per transmitted version)",
        f"  send_async x{result['sends']}: {result['queue_s'] * 1e3:.0f} ms; until acked: "
        f"{result['total_s'] * 1e3:.0f} ms",
        f"  wait_ack(): {result['acked']} (newest version {result['newest']})",
        f"command: {command}",
    ])


# ------------------------------------------------------------------ TorchRL


def _torchrl_worker(schemes: dict[str, Any], index: int,
                    sizes: dict[str, tuple[tuple[int, ...], int]], stop: Any,
                    device: str = "cpu") -> None:
    torch.set_num_threads(1)
    models = {name: mlp(widths).to(device) for name, (widths, _) in sizes.items()}
    for name, scheme in schemes.items():
        scheme.init_on_receiver(model_id=name, model=models[name], worker_idx=index)
        scheme.connect(worker_idx=index)
    stop.wait()


def bench_torchrl(kind: str, sizes: dict[str, tuple[tuple[int, ...], int]], *,
                  learner: str = "cpu", worker_device: str = "cpu",
                  ) -> dict[str, list[float]] | None:
    """TorchRL's ``kind`` scheme ("mp" or "shm"), ``send()`` times per size; None without torchrl.

    ``learner`` / ``worker_device``: where the trainer's and the workers' models live
    (``benchmarks.weights_cuda`` runs a CUDA learner).
    """
    try:
        from torchrl.weight_update import (
            MultiProcessWeightSyncScheme as TorchRLMultiProcess,
        )
        from torchrl.weight_update import SharedMemWeightSyncScheme as TorchRLSharedMem
    except ImportError:
        return None
    # TorchRL's schemes create their queues in the default context: use it too.
    ctx = mp.get_context()
    devices = [torch.device(worker_device)] * WORKERS
    models = {name: mlp(widths).to(learner) for name, (widths, _) in sizes.items()}
    schemes: dict[str, Any] = {}
    for name, model in models.items():
        if kind == "mp":
            scheme = TorchRLMultiProcess()
            scheme.init_on_sender(model_id=name, model=model, devices=devices, ctx=ctx)
        else:
            scheme = TorchRLSharedMem()
            scheme.init_on_sender(model_id=name, model=model, devices=devices)
        schemes[name] = scheme
    stop = ctx.Event()
    procs = [ctx.Process(target=_torchrl_worker, daemon=True,
                         args=(schemes, i, sizes, stop, worker_device))
             for i in range(WORKERS)]
    for proc in procs:
        proc.start()
    results: dict[str, list[float]] = {}
    try:
        for scheme in schemes.values():
            scheme.connect()
        for name, (_, reps) in sizes.items():
            times = []
            for rep in range(reps + 2):
                fill_(models[name], float(rep))
                if learner != "cpu":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                schemes[name].send()
                if rep >= 2:
                    times.append(time.perf_counter() - start)
            results[name] = times
    finally:
        stop.set()
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
        for scheme in schemes.values():
            try:
                scheme.shutdown()
            except Exception:
                pass
    return results


# ------------------------------------------------------------------ bandwidth


@dataclass(frozen=True)
class Bare:
    """A bare pyzmq row: one message (``chunk_bytes=0``) or chunks; ``copy``: the peer also
    copies each chunk into a buffer of the payload's size (what any apply must do)."""

    chunk_bytes: int = 0
    copy: bool = False


def _bare_peer(endpoint: str, namespace: str | None = None, copy_bytes: int = 0) -> None:
    if namespace is not None:
        netns.enter(namespace)
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, b"bare")
    sock.connect(endpoint)
    sock.send(b"hello")
    into = np.empty(copy_bytes, dtype=np.uint8)
    at = 0
    while True:
        frames = sock.recv_multipart(copy=False)
        head = frames[0].bytes
        if head == b"stop":
            break
        if copy_bytes:
            chunk = np.frombuffer(frames[1].buffer, dtype=np.uint8)
            np.copyto(into[at:at + len(chunk)], chunk)
            at += len(chunk)
        if head != b"more":  # the last (or only) message of a payload
            at = 0
            sock.send(b"ack")
    sock.close(linger=0)


def bench_bare_zmq(nbytes: int, reps: int, chunk_bytes: int = 0,
                   link: netns.Netns | None = None, copy: bool = False) -> list[float]:
    """Round trips of ``nbytes``: one message, or messages of ``chunk_bytes`` (the wire limit).

    ``link``: the peer runs in that namespace, across its veth pair (else over loopback).
    ``copy``: the peer copies what it receives into a buffer of ``nbytes``.
    """
    ctx = mp.get_context("spawn")
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
    sock.bind(f"tcp://{link.outer_ip if link else '127.0.0.1'}:0")
    endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    proc = ctx.Process(target=_bare_peer, args=(endpoint, link.name if link else None,
                                                nbytes if copy else 0), daemon=True)
    proc.start()
    payload = torch.ones(nbytes // 4).numpy().view("uint8")  # the same bytes as the weights
    step = chunk_bytes or len(payload)
    pieces = [payload[i:i + step] for i in range(0, len(payload), step)]
    times = []
    try:
        peer, _ = sock.recv_multipart()
        for rep in range(reps + 2):
            start = time.perf_counter()
            for i, piece in enumerate(pieces):
                head = b"last" if i == len(pieces) - 1 else b"more"
                sock.send_multipart([peer, head, piece], copy=False)  # type: ignore[list-item]
            sock.recv_multipart()
            if rep >= 2:
                times.append(time.perf_counter() - start)
        sock.send_multipart([peer, b"stop"])
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
        sock.close(linger=0)
    return times


BARE_ONE = "bare pyzmq ROUTER/DEALER, one message + 3-byte answer"


#: Rows of the bandwidth table: label -> how to measure it (a bare pyzmq row, or a scheme).
def bandwidth_rows(chunk_bytes: int) -> dict[str, Bare | WeightSyncScheme]:
    mib = f"{chunk_bytes / (1 << 20):g} MiB"
    return {
        BARE_ONE: Bare(),
        f"bare pyzmq ROUTER/DEALER, {mib} messages + 3-byte answer": Bare(chunk_bytes),
        f"bare pyzmq ROUTER/DEALER, {mib} messages, each copied into a buffer + 3-byte answer":
            Bare(chunk_bytes, copy=True),
        f"asyncrl ZmqWeightSyncScheme(chunk_bytes={mib}) send + apply + ack":
            ZmqWeightSyncScheme(chunk_bytes=chunk_bytes),
        f"asyncrl ZmqWeightSyncScheme(chunk_bytes={mib}, in_place=True) send + apply + ack":
            ZmqWeightSyncScheme(chunk_bytes=chunk_bytes, in_place=True),
        "asyncrl ZmqWeightSyncScheme(chunk_bytes=0) (one message, as before) send + apply + ack":
            ZmqWeightSyncScheme(chunk_bytes=0),
    }


# ------------------------------------------------------------------ report


def progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def p50_ms(times: list[float]) -> float:
    return statistics.median(times) * 1e3


def bench_memcpy(sizes: dict[str, tuple[tuple[int, ...], int]]) -> dict[str, list[float]]:
    """The limit of a safe push: one copy of the parameters into warm, preallocated memory.

    The same per-tensor ``copy_into`` (one plain memcpy each) that a shared-memory
    send makes into its buffer.
    """
    results: dict[str, list[float]] = {}
    for name, (widths, reps) in sizes.items():
        source = [p.detach() for p in mlp(widths).parameters()]
        destination = [torch.empty_like(t) for t in source]
        times = []
        for rep in range(reps + 2):
            start = time.perf_counter()
            for dst, src in zip(destination, source, strict=True):
                copy_into(dst, src)
            if rep >= 2:
                times.append(time.perf_counter() - start)
        results[name] = times
    return results


#: The latency rows: label -> what runs them (an asyncrl scheme, or a TorchRL kind).
def latency_rows(torchrl: bool) -> list[tuple[str, WeightSyncScheme | str]]:
    rows: list[tuple[str, WeightSyncScheme | str]] = [
        ("asyncrl ZmqWeightSyncScheme (ipc)", ZmqWeightSyncScheme()),
        ("asyncrl SharedMemWeightSyncScheme (safe, zero-copy)", SharedMemWeightSyncScheme()),
        ("asyncrl LiveSharedMemWeightSyncScheme (live, opt-in)",
         LiveSharedMemWeightSyncScheme()),
        ("asyncrl DistributedWeightSyncScheme (gloo broadcast)", DistributedWeightSyncScheme()),
        ("asyncrl DistributedWeightSyncScheme (gloo chain)",
         DistributedWeightSyncScheme(algorithm="chain")),
    ]
    if torchrl:
        rows += [("TorchRL MultiProcessWeightSyncScheme", "mp"),
                 ("TorchRL SharedMemWeightSyncScheme", "shm")]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.weights",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few repetitions")
    parser.add_argument("--no-torchrl", action="store_true", help="skip the TorchRL rows")
    parser.add_argument("--sizes", help="comma-separated size names, e.g. 4k,2M,50M "
                        f"(known: {', '.join(dict.fromkeys([*SIZES, *EXTRA_SIZES]))})")
    parser.add_argument("--reps", type=int, help="repetitions per size (default: per size)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="interleaved rounds over all rows (medians pool them; default 2)")
    parser.add_argument("--no-bandwidth", action="store_true", help="skip the tcp bandwidth rows")
    parser.add_argument("--bandwidth-only", action="store_true",
                        help="only the tcp bandwidth rows (of the last size given)")
    parser.add_argument("--chunk-bytes", type=int, default=ZmqWeightSyncScheme().chunk_bytes,
                        help="chunk size of the chunked bandwidth rows (default: the scheme's)")
    parser.add_argument("--link", metavar="RATE",
                        help="bandwidth rows across a veth pair into a network namespace (a "
                        "second host; root only) shaped to RATE each way, e.g. 1gbit, 10gbit; "
                        "'veth': unshaped (default: tcp loopback)")
    parser.add_argument("--rapid", action="store_true",
                        help="only the memory of 50 rapid sends to 2 slow workers")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    command = "python -m benchmarks.weights" + (" " + shlex.join(argv) if argv else "")
    if args.rapid:
        with tempfile.TemporaryDirectory(prefix="asyncrl-bench-") as tmp:
            print(rapid_report(anyio.run(bench_rapid, f"ipc://{tmp}/rapid"), command))
        return 0
    sizes = QUICK_SIZES if args.quick else SIZES
    if args.sizes:
        known = {**SIZES, **EXTRA_SIZES}
        unknown = [n for n in args.sizes.split(",") if n not in known]
        if unknown:
            parser.error(f"unknown size(s) {unknown}; known: {sorted(known)}")
        sizes = {n: known[n] for n in args.sizes.split(",")}
    if args.reps:
        sizes = {n: (widths, args.reps) for n, (widths, _) in sizes.items()}
    rounds = 1 if args.quick else max(1, args.rounds)
    started = time.monotonic()
    torchrl = not args.no_torchrl and _has_torchrl()
    biggest = list(sizes)[-1]
    widths = sizes[biggest][0]
    nbytes = n_params(mlp(widths)) * 4

    rows: dict[str, dict[str, list[float]] | None] = {}
    memcpy: dict[str, list[float]] = {}
    bandwidth: dict[str, list[float]] = {}
    if args.link and args.no_bandwidth:
        parser.error("--link moves the bandwidth rows across a link: drop --no-bandwidth")
    if args.link and os.geteuid() != 0:
        parser.error("--link creates a network namespace and a veth pair: run it as root")
    link_rate = None if args.link in (None, "veth") else args.link
    if link_rate is not None:
        try:
            netns.burst_for(link_rate)
        except ValueError as exc:
            parser.error(f"--link {link_rate}: {exc} (or 'veth': unshaped)")
    with tempfile.TemporaryDirectory(prefix="asyncrl-bench-") as tmp, \
            (netns.netns(link_rate) if args.link else contextlib.nullcontext()) as link:
        for round_ in range(rounds):
            order = [] if args.bandwidth_only else latency_rows(torchrl)
            if round_ % 2:
                order.reverse()  # interleaved: drift hits every row alike
            for label, runner in order:
                progress(f"round {round_ + 1}/{rounds}: {label}")
                if isinstance(runner, str):
                    result = bench_torchrl(runner, sizes)
                else:
                    result = anyio.run(bench_asyncrl, runner, sizes,
                                       f"ipc://{tmp}/{round_}-{len(rows)}-{label[8:11]}")
                rows[label] = _pool(rows.get(label), result)
            if not args.bandwidth_only:
                progress(f"round {round_ + 1}/{rounds}: memcpy")
                memcpy = _pool(memcpy, bench_memcpy(sizes)) or {}
            if not args.no_bandwidth:
                progress(f"round {round_ + 1}/{rounds}: bandwidth over tcp")
                bandwidth = _pool(bandwidth, bench_bandwidth(
                    biggest, sizes[biggest], nbytes, args.chunk_bytes,
                    reverse=bool(round_ % 2), link=link)) or {}

    print(report(rows, memcpy, sizes, biggest, nbytes, bandwidth, command,
                 time.monotonic() - started, rounds, link=args.link))
    return 0


def bench_bandwidth(name: str, size: tuple[tuple[int, ...], int], nbytes: int, chunk_bytes: int,
                    *, reverse: bool, link: netns.Netns | None = None) -> dict[str, list[float]]:
    """Round trips of ``nbytes`` over tcp for each of :func:`bandwidth_rows` (in reverse order).

    ``link``: across a veth pair into that namespace (see ``--link``); None: loopback.
    """
    rows = list(bandwidth_rows(chunk_bytes).items())
    results: dict[str, list[float]] = {}
    host = link.outer_ip if link else "127.0.0.1"
    for label, how in reversed(rows) if reverse else rows:
        if isinstance(how, Bare):
            results[label] = bench_bare_zmq(nbytes, size[1], how.chunk_bytes, link, how.copy)
        else:
            measured = anyio.run(functools.partial(
                bench_asyncrl, how, {name: size}, f"tcp://{host}:0", 1,
                namespace=link.name if link else None))
            results[label] = measured[name]
            results[WORKER_RSS + label] = measured[WORKER_RSS]
    return results


def _has_torchrl() -> bool:
    try:
        import torchrl.weight_update  # noqa: F401
    except ImportError:
        return False
    return True


def _pool(into: dict[str, list[float]] | None,
          more: dict[str, list[float]] | None) -> dict[str, list[float]] | None:
    if more is None:
        return into
    pooled = {k: list(v) for k, v in (into or {}).items()}
    for key, times in more.items():
        pooled.setdefault(key, []).extend(times)
    return pooled


def report(rows: dict[str, dict[str, list[float]] | None], memcpy: dict[str, list[float]],
           sizes: dict[str, tuple[tuple[int, ...], int]], biggest: str, nbytes: int,
           bandwidth: dict[str, list[float]], command: str, elapsed: float,
           rounds: int = 1, link: str | None = None) -> str:
    params = {name: n_params(mlp(widths)) for name, (widths, _) in sizes.items()}
    columns = " | ".join(f"{name} ({params[name]:,} params)" for name in sizes)
    rule = "|" + "---|" * (len(sizes) + 1)
    lines = [f"Weight sync: p50 of send -> every ack, {WORKERS} worker processes, ms "
             f"(lower is better; {rounds} interleaved round(s) pooled)",
             "", f"| scheme | {columns} |", rule]
    reference = rows.get("TorchRL SharedMemWeightSyncScheme")
    for label, result in rows.items():
        if result is None:
            lines.append(f"| {label} | " + " | ".join("n/a" for _ in sizes) + " |")
            continue
        cells = []
        for name in sizes:
            cell = f"{p50_ms(result[name]):.2f}"
            if reference is not None and result is not reference:
                cell += f" ({p50_ms(result[name]) / p50_ms(reference[name]):.2f}x)"
            cells.append(cell)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if reference is not None:
        lines += ["", "(N.NNx) = p50 / TorchRL SharedMemWeightSyncScheme's p50 at that size."]
    safe = rows.get("asyncrl SharedMemWeightSyncScheme (safe, zero-copy)")
    if safe is not None and memcpy:
        lines += ["", "Push: p50 of `send_async()` (the trainer's cost) against one memcpy of "
                  "the parameters, ms", "", f"| | {columns} |", rule,
                  "| one memcpy of the parameters (limit) | "
                  + " | ".join(f"{p50_ms(memcpy[n]):.3f}" for n in sizes) + " |"]
        for label, result in rows.items():
            if result is None or PUSH + next(iter(sizes)) not in result:
                continue
            cells = [(p50_ms(result[PUSH + n]), p50_ms(memcpy[n])) for n in sizes]
            lines.append(f"| {label} push | " + " | ".join(
                f"{push:.3f} ({push / limit:.2f}x)" for push, limit in cells) + " |")
        lines += ["", "(N.NNx) = push p50 / memcpy p50 at that size."]
    lines += ["", "CUDA learner -> CPU workers, CUDA IPC: "
              + ("not measured by this benchmark yet" if torch.cuda.is_available()
                 else "no CUDA device in this run")]
    mb = nbytes / 1e6
    if bandwidth:
        rss = {k[len(WORKER_RSS):]: v for k, v in bandwidth.items() if k.startswith(WORKER_RSS)}
        timed = {k: v for k, v in bandwidth.items() if not k.startswith(WORKER_RSS)}
        bare = {k: timed[k] for k in timed if k.startswith("bare pyzmq")}
        one = bare.pop(BARE_ONE)
        copied = next(v for k, v in bare.items() if "copied" in k)
        chunked = next(v for k, v in bare.items() if "copied" not in k)
        lines += [
            "",
            f"Bandwidth over tcp {_link_words(link)}, {biggest} model = {mb:.0f} MB, "
            "1 worker process "
            "(median of the round trip; ratios against each bare pyzmq row; the worker "
            "process's RSS after the updates, freed memory given back: the model and what it "
            "keeps for the next update):",
            "",
            "| path | p50 ms | MB/s | / bare, one message | / bare, same chunks "
            "| / bare, same chunks copied | worker RSS after (MB) |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for label, times in timed.items():
            peak = f"{max(rss[label]) / 1e6:.0f}" if label in rss else "n/a"
            lines.append(f"| {label} | {p50_ms(times):.1f} | {mb / statistics.median(times):.0f} "
                         f"| {statistics.median(one) / statistics.median(times):.2f} "
                         f"| {statistics.median(chunked) / statistics.median(times):.2f} "
                         f"| {statistics.median(copied) / statistics.median(times):.2f} "
                         f"| {peak} |")
    return "\n".join([*lines, "", _machine(elapsed), f"command: {command}"])


def _link_words(link: str | None) -> str:
    if link is None:
        return "loopback"
    if link == "veth":
        return "across an unshaped veth pair into a network namespace"
    return f"across a veth pair into a network namespace, shaped to {link} each way (tbf)"


def _machine(elapsed: float) -> str:
    return (f"machine: {platform.machine()}, {os.cpu_count()} CPUs, "
            f"load average {os.getloadavg()[0]:.1f}; torch {torch.__version__}, "
            f"python {platform.python_version()}; run took {elapsed:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
