"""Channel benchmark: our Hub/Link against bare pyzmq, peer in another process.

Latency: round trips of a small message (64-byte body by default) over ipc
and tcp loopback.

* ``asyncrl Link->Hub->Link`` -- this process sends with a :class:`Link` and
  waits for the reply; a :class:`Hub` in a child process echoes every message
  back from an async task. Run on asyncio and on trio.
* ``pyzmq REQ/REP (blocking)`` -- the baseline of the issue: a blocking REQ
  loop here, a blocking REP echo loop in a child process, the same 64 bytes.
* ``pyzmq DEALER/ROUTER (zmq.asyncio)`` -- for reference, pyzmq's own asyncio
  integration in the same echo shape as ours (asyncio only).

Fairness: every variant has its peer in a separate process started the same
way, sends the same body size over the same transport, runs the same number of
warm-up and timed round trips, and times each round trip with
``perf_counter_ns`` in the sending loop. The variants are interleaved
repetition by repetition, so a noisy neighbour hits them all alike; the table
reports the median over repetitions of each repetition's p50 and p99. The
baseline is blocking on both ends (no event loop, no codec): the ratio is the
whole cost of being async, typed and hostile-input safe.

Throughput: 1 MiB tensors streamed one way, ours (``Link.send`` of a tensor,
decoded over the received frame by the hub) against a blocking pyzmq
DEALER->ROUTER stream of 1 MiB numpy buffers sent with ``copy=False``; each
repetition ends with a small message answered by the receiver.

    python -m benchmarks.channels            # full run
    python -m benchmarks.channels --quick    # smoke run
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from benchmarks import ROOT

MB = 1 << 20

# ------------------------------------------------------------------ servers (child side)


def _serve_ours(endpoint: str, backend: str) -> None:
    import anyio

    from transports import Hub, Message

    async def main() -> None:
        async with Hub(endpoint) as hub:
            print(hub.endpoint, flush=True)
            async for item in hub:
                if not isinstance(item, Message):
                    continue
                if item.kind == "echo":
                    await hub.send(item.peer, item.body, kind="echo")
                elif item.kind == "fin":
                    await hub.send(item.peer, None, kind="done")
                # "blob": decoded (tensors over the received frames) and dropped

    anyio.run(main, backend=backend)


def _serve_zmq_rep(endpoint: str) -> None:
    import zmq

    sock: Any = zmq.Context.instance().socket(zmq.REP)
    sock.bind(endpoint)
    print(sock.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
    while True:
        sock.send(sock.recv(copy=False), copy=False)


def _serve_zmq_router(endpoint: str) -> None:
    import zmq

    sock: Any = zmq.Context.instance().socket(zmq.ROUTER)
    sock.bind(endpoint)
    print(sock.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
    while True:
        peer, kind, *payload = sock.recv_multipart(copy=False)
        if kind.bytes == b"echo":
            sock.send_multipart([peer, kind, *payload], copy=False)
        elif kind.bytes == b"fin":
            sock.send_multipart([peer, b"done"])


def _serve_zmq_asyncio(endpoint: str) -> None:
    import asyncio

    import zmq
    import zmq.asyncio

    async def main() -> None:
        sock: Any = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
        sock.bind(endpoint)
        print(sock.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
        while True:
            frames = await sock.recv_multipart(copy=False)
            await sock.send_multipart(frames, copy=False)

    asyncio.run(main())


SERVERS: dict[str, Callable[[str], None]] = {
    "ours-asyncio": lambda ep: _serve_ours(ep, "asyncio"),
    "ours-trio": lambda ep: _serve_ours(ep, "trio"),
    "zmq-rep": _serve_zmq_rep,
    "zmq-router": _serve_zmq_router,
    "zmq-asyncio": _serve_zmq_asyncio,
}


@contextmanager
def server(kind: str, endpoint: str) -> Iterator[str]:
    """Run a server in a child process; yield the endpoint it bound."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.channels", "--serve", kind, endpoint],
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line:
            raise RuntimeError(f"server {kind} on {endpoint} exited with {proc.wait()}")
        yield line
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------ clients (this process)


def _ours_latency(endpoint: str, backend: str, body: bytes, warmup: int, n: int) -> list[int]:
    import anyio

    from transports import Link

    async def main() -> list[int]:
        async with Link(endpoint) as link:
            samples = []
            for i in range(warmup + n):
                t0 = time.perf_counter_ns()
                await link.send(body, kind="echo")
                await link.recv()
                if i >= warmup:
                    samples.append(time.perf_counter_ns() - t0)
            return samples

    return anyio.run(main, backend=backend)


def _zmq_req_latency(endpoint: str, body: bytes, warmup: int, n: int) -> list[int]:
    import zmq

    sock: Any = zmq.Context.instance().socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        samples = []
        for i in range(warmup + n):
            t0 = time.perf_counter_ns()
            sock.send(body)
            sock.recv()
            if i >= warmup:
                samples.append(time.perf_counter_ns() - t0)
        return samples
    finally:
        sock.close()


def _zmq_asyncio_latency(endpoint: str, body: bytes, warmup: int, n: int) -> list[int]:
    import asyncio

    import zmq
    import zmq.asyncio

    async def main() -> list[int]:
        sock: Any = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        try:
            samples = []
            for i in range(warmup + n):
                t0 = time.perf_counter_ns()
                await sock.send_multipart([b"echo", body])
                await sock.recv_multipart()
                if i >= warmup:
                    samples.append(time.perf_counter_ns() - t0)
            return samples
        finally:
            sock.close()

    return asyncio.run(main())


def _ours_stream(endpoint: str, count: int, size: int) -> float:
    import anyio
    import torch

    from transports import Link

    payload = torch.ones(size // 4, dtype=torch.float32)

    async def main() -> float:
        async with Link(endpoint) as link:
            await link.send(None, kind="fin")  # connected and warm
            await link.recv()
            t0 = time.perf_counter()
            for _ in range(count):
                await link.send(payload, kind="blob")
            await link.send(None, kind="fin")
            await link.recv()
            return time.perf_counter() - t0

    return anyio.run(main, backend="asyncio")


def _zmq_stream(endpoint: str, count: int, size: int) -> float:
    import numpy as np
    import zmq

    payload = np.ones(size, dtype=np.uint8)
    sock: Any = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send_multipart([b"fin"])
        sock.recv_multipart()
        t0 = time.perf_counter()
        for _ in range(count):
            sock.send_multipart([b"blob", payload], copy=False)
        sock.send_multipart([b"fin"])
        sock.recv_multipart()
        return time.perf_counter() - t0
    finally:
        sock.close()


# ------------------------------------------------------------------ orchestration


@dataclass
class Latency:
    """Per-repetition p50/p99 (microseconds) of one variant on one transport."""

    name: str
    transport: str
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)

    def add(self, samples: list[int]) -> None:
        ordered = sorted(samples)
        self.p50.append(ordered[len(ordered) // 2] / 1e3)
        self.p99.append(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] / 1e3)


@dataclass
class Throughput:
    name: str
    transport: str
    seconds: list[float] = field(default_factory=list)


LATENCY_VARIANTS: dict[str, tuple[str, Callable[..., list[int]]]] = {
    "asyncrl Link->Hub->Link (asyncio)":
        ("ours-asyncio", lambda ep, *a: _ours_latency(ep, "asyncio", *a)),
    "asyncrl Link->Hub->Link (trio)":
        ("ours-trio", lambda ep, *a: _ours_latency(ep, "trio", *a)),
    "pyzmq REQ/REP (blocking)": ("zmq-rep", _zmq_req_latency),
    "pyzmq DEALER/ROUTER (zmq.asyncio)": ("zmq-asyncio", _zmq_asyncio_latency),
}
BASELINE = "pyzmq REQ/REP (blocking)"


def endpoints(transports: Sequence[str], workdir: str) -> Iterator[tuple[str, Callable[[], str]]]:
    counter = iter(range(1 << 30))
    for transport in transports:
        if transport == "ipc":
            yield transport, lambda: f"ipc://{workdir}/s{next(counter)}.sock"
        else:
            yield transport, lambda: "tcp://127.0.0.1:0"


def run_latency(args: argparse.Namespace, workdir: str) -> list[Latency]:
    body = b"x" * args.size
    results: list[Latency] = []
    for transport, make_endpoint in endpoints(args.transports, workdir):
        rows = {name: Latency(name, transport) for name in LATENCY_VARIANTS}
        with _servers({name: kind for name, (kind, _) in LATENCY_VARIANTS.items()},
                      make_endpoint) as bound:
            for rep in range(args.repeats):
                # Rotate the order each repetition: no variant always runs first.
                names = list(LATENCY_VARIANTS)
                names = names[rep % len(names):] + names[:rep % len(names)]
                for name in names:
                    client = LATENCY_VARIANTS[name][1]
                    rows[name].add(client(bound[name], body, args.warmup, args.iterations))
                print(f"  latency {transport} repetition {rep + 1}/{args.repeats} done",
                      file=sys.stderr, flush=True)
        results.extend(rows.values())
    return results


def run_throughput(args: argparse.Namespace, workdir: str) -> list[Throughput]:
    variants = {
        "asyncrl Link->Hub (1 MiB tensor)": ("ours-asyncio", _ours_stream),
        "pyzmq DEALER->ROUTER (blocking, copy=False)": ("zmq-router", _zmq_stream),
    }
    results: list[Throughput] = []
    for transport, make_endpoint in endpoints(args.transports, workdir):
        rows = {name: Throughput(name, transport) for name in variants}
        with _servers({name: kind for name, (kind, _) in variants.items()},
                      make_endpoint) as bound:
            for _ in range(args.repeats):
                for name, (_, client) in variants.items():
                    rows[name].seconds.append(client(bound[name], args.blobs, MB))
        results.extend(rows.values())
    return results


@contextmanager
def _servers(kinds: dict[str, str], make_endpoint: Callable[[], str]) -> Iterator[dict[str, str]]:
    from contextlib import ExitStack

    with ExitStack() as stack:
        yield {name: stack.enter_context(server(kind, make_endpoint()))
               for name, kind in kinds.items()}


# ------------------------------------------------------------------ report


def latency_table(results: list[Latency]) -> str:
    lines = [
        "| transport | variant | p50 (µs) | p99 (µs) | p50 / baseline | p99 / baseline |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for transport in dict.fromkeys(r.transport for r in results):
        rows = [r for r in results if r.transport == transport]
        base = next(r for r in rows if r.name == BASELINE)
        b50, b99 = statistics.median(base.p50), statistics.median(base.p99)
        for r in rows:
            p50, p99 = statistics.median(r.p50), statistics.median(r.p99)
            lines.append(f"| {transport} | {r.name} | {p50:.1f} | {p99:.1f} | "
                         f"{p50 / b50:.2f}x | {p99 / b99:.2f}x |")
    return "\n".join(lines)


def throughput_table(results: list[Throughput], count: int) -> str:
    lines = [
        "| transport | variant | median time (ms) | MiB/s (= messages/s) | vs baseline |",
        "|---|---|---:|---:|---:|",
    ]
    for transport in dict.fromkeys(r.transport for r in results):
        rows = [r for r in results if r.transport == transport]
        base = statistics.median(rows[-1].seconds)
        for r in rows:
            t = statistics.median(r.seconds)
            lines.append(f"| {transport} | {r.name} | {t * 1e3:.1f} | {count / t:.0f} | "
                         f"{base / t:.2f}x |")
    return "\n".join(lines)


def environment() -> str:
    import anyio  # noqa: F401  (imported for its version below)
    import zmq

    try:
        from importlib.metadata import version

        anyio_version = version("anyio")
        trio_version = version("trio")
    except Exception:  # pragma: no cover
        anyio_version = trio_version = "?"
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"Python {platform.python_version()}, pyzmq {zmq.__version__}, libzmq "
            f"{zmq.zmq_version()}, anyio {anyio_version}, trio {trio_version}, "
            f"{os.cpu_count()} CPU(s), {platform.machine()} {platform.system()}; "
            f"load average at the end {load} (1/5/15 min)")


# ------------------------------------------------------------------ main


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.channels",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--transports", default="ipc,tcp",
                        type=lambda s: [t for t in s.split(",") if t])
    parser.add_argument("--size", type=int, default=64, help="small message body (bytes)")
    parser.add_argument("--iterations", type=int, default=5000, help="timed round trips")
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--blobs", type=int, default=200, help="1 MiB messages per repetition")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--quick", action="store_true", help="smoke run")
    parser.add_argument("--serve", nargs=2, metavar=("KIND", "ENDPOINT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.iterations, args.warmup, args.repeats, args.blobs = 500, 100, 2, 20
    bad = set(args.transports) - {"ipc", "tcp"}
    if bad:
        parser.error(f"unknown transport(s) {sorted(bad)}: use ipc and/or tcp")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.serve:
        kind, endpoint = args.serve
        try:
            SERVERS[kind](endpoint)
        except KeyboardInterrupt:
            pass
        return 0
    command = "python -m benchmarks.channels " + shlex.join(
        sys.argv[1:] if argv is None else list(argv))
    with tempfile.TemporaryDirectory(prefix="asyncrl-bench-") as workdir:
        latency = run_latency(args, workdir)
        throughput = [] if args.skip_throughput else run_throughput(args, workdir)
    print(f"Command: `{command.strip()}`\n")
    print(environment() + "\n")
    print(f"Round trip of a {args.size}-byte message, peer in another process "
          f"({args.repeats} repetitions x {args.iterations} round trips, "
          "medians of the per-repetition percentiles):\n")
    print(latency_table(latency))
    if throughput:
        print(f"\nOne-way stream of {args.blobs} x 1 MiB messages, receiver in another "
              f"process (median of {args.repeats}; ratio = baseline time / time):\n")
        print(throughput_table(throughput, args.blobs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
