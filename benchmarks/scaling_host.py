"""Worker host process of the scaling benchmark: many simulated workers on raw pyzmq sockets.

One process holds many DEALER sockets, one per simulated worker, under a plain
epoll loop: no env, no policy, no event loop, and each batch's frames are encoded
once (per request id and worker) and re-sent. A simulated worker speaks the real
protocol (hello with env specs and ``slot=-1``, welcome, collect credits, batch,
heartbeats) and answers a credit after ``delay`` seconds (one batch at a time, like
a real worker) or at once (``delay`` 0). Its specs and batches are
:func:`asyncrl._worker.simulated.make_specs` and ``make_share``.

Why raw sockets, and why private imports: a :class:`transports.Link` per simulated
worker (a pump, a heartbeat task and a decode per message each) costs as much as
the coordinator being measured, so the host frames messages itself with
``transports._codec`` and ``asyncrl._protocol``, and sets the socket options
(heartbeats) a Link would set with ``transports._socket.configure``.

:class:`HostProcess` (the benchmark's side) starts ``python -m benchmarks.scaling_host``
and drives it over stdin/stdout, one JSON line per command and answer.
"""

from __future__ import annotations

import contextlib
import faulthandler
import heapq
import json
import math
import os
import select
import signal
import subprocess
import sys
import time
from typing import Any

import torch
import zmq
from tensordict import TensorDict

from asyncrl._protocol import PROTOCOL, Batch, Collect, Hello, Welcome
from asyncrl._worker.simulated import make_share, make_specs
from benchmarks import ROOT
from transports._codec import decode_message, encode_message
from transports._socket import configure


class _Host:
    """Many simulated workers in one process: raw DEALER sockets under one epoll loop.

    Commands (one JSON line each on stdin, answered on stdout): ``start`` opens
    ``n`` sockets and sends their hellos; ``stop`` closes them and reports the
    CPU time and message counts since ``start``.
    """

    def __init__(self) -> None:
        self.zmq = zmq
        self.encode = encode_message
        self.context = zmq.Context()
        self.epoll = select.epoll()
        self.epoll.register(sys.stdin.fileno(), select.EPOLLIN)
        self.sockets: list[Any] = []
        self.by_fd: dict[int, int] = {}
        self.busy_until: list[float] = []
        self.welcomed: list[int] = []  # each socket's worker index (its batches carry it)
        self.due: list[tuple[float, int, int, int]] = []
        self.counter = 0
        self.cache: dict[tuple[int, int], list[bytes]] = {}
        self.ping = [bytes(f) for f in encode_message(None, kind="ping")]
        self.next_ping = math.inf
        self.delay = 0.0
        self.share: TensorDict | None = None
        self.received = self.sent = 0
        self.cpu0 = self.wall0 = 0.0

    def serve(self) -> None:
        print(json.dumps({"ready": os.getpid()}), flush=True)
        while True:
            now = time.monotonic()
            timeout = min(self.next_ping, self.due[0][0] if self.due else math.inf) - now
            for fd, _ in self.epoll.poll(max(0.0, min(timeout, 1.0))):
                if fd == sys.stdin.fileno():
                    line = sys.stdin.readline()
                    if not line or not self.command(json.loads(line)):
                        return
                elif fd in self.by_fd:  # not a socket closed by `stop` in this batch
                    self.drain(self.by_fd[fd])
            now = time.monotonic()
            while self.due and self.due[0][0] <= now:
                _, _, index, request = heapq.heappop(self.due)
                self.send_batch(index, request)
            if now >= self.next_ping:
                self.next_ping = now + 1.0
                for index, sock in enumerate(self.sockets):
                    with contextlib.suppress(self.zmq.ZMQError):
                        sock.send_multipart(self.ping, self.zmq.NOBLOCK)
                    self.drain(index)  # any call may consume the edge of a waiting message

    def command(self, cmd: dict[str, Any]) -> bool:
        if cmd["cmd"] == "start":
            self.start(cmd)
            reply: dict[str, Any] = {"started": len(self.sockets)}
        elif cmd["cmd"] == "stop":
            reply = {"cpu": time.process_time() - self.cpu0,
                     "wall": time.perf_counter() - self.wall0,
                     "received": self.received, "sent": self.sent}
            self.close_sockets()
        else:
            return False
        print(json.dumps(reply), flush=True)
        return True

    def start(self, cmd: dict[str, Any]) -> None:
        zmq = self.zmq
        self.delay = cmd["delay"]
        self.share = make_share(cmd["frames"], cmd["obs_dim"])
        self.cache.clear()
        specs = make_specs(cmd["obs_dim"])
        for i in range(cmd["n"]):
            sock = self.context.socket(zmq.DEALER)
            configure(sock, max_bytes=None, heartbeat_interval=1.0, peer_timeout=10.0)
            name = f"{cmd['prefix']}-{i}"
            sock.setsockopt(zmq.IDENTITY, name.encode())
            sock.connect(cmd["endpoint"])
            hello = Hello(protocol=PROTOCOL, name=name, host="sim-host", pid=os.getpid(),
                          specs=specs, slot=-1)
            sock.send_multipart(self.encode(hello.to_body(), kind=Hello.KIND, seq=1))
            fd = int(sock.getsockopt(zmq.FD))
            self.by_fd[fd] = len(self.sockets)
            self.epoll.register(fd, 1)  # EPOLLIN
            self.sockets.append(sock)
            self.welcomed.append(-1)
            self.busy_until.append(0.0)
            self.drain(len(self.sockets) - 1)
        self.next_ping = time.monotonic() + 1.0
        self.received = self.sent = 0
        self.cpu0, self.wall0 = time.process_time(), time.perf_counter()

    def close_sockets(self) -> None:
        for sock in self.sockets:
            self.epoll.unregister(sock.getsockopt(self.zmq.FD))
            sock.close(linger=0)
        self.sockets.clear()
        self.by_fd.clear()
        self.busy_until.clear()
        self.welcomed.clear()
        self.due.clear()
        self.next_ping = math.inf

    def drain(self, index: int) -> None:
        # ZeroMQ's descriptor is edge-triggered: read until EVENTS says nothing is left.
        zmq = self.zmq
        sock = self.sockets[index]
        while sock.get(zmq.EVENTS) & zmq.POLLIN:
            frames = sock.recv_multipart(zmq.NOBLOCK)
            self.received += 1
            self.on_message(index, frames)

    def on_message(self, index: int, frames: list[bytes]) -> None:
        message = decode_message(frames)
        if message.kind == Welcome.KIND:
            self.welcomed[index] = Welcome.from_body(message.body).index
            return
        if message.kind != Collect.KIND:
            return  # welcome, ping, bye, preempt: nothing to do for a simulated worker
        collect = Collect.from_body(message.body)
        for _ in range(collect.credits):
            if not self.delay:
                self.send_batch(index, collect.request)
                continue
            start = max(time.monotonic(), self.busy_until[index])
            self.busy_until[index] = start + self.delay
            self.counter += 1
            heapq.heappush(self.due, (start + self.delay, self.counter, index, collect.request))

    def send_batch(self, index: int, request: int) -> None:
        key = (request, self.welcomed[index])  # the scheduler checks ("collector", "worker_id")
        frames = self.cache.get(key)
        if frames is None:
            assert self.share is not None
            if len(self.cache) > 4 * len(self.sockets):
                self.cache.clear()
            self.share["collector", "worker_id"].fill_(self.welcomed[index])
            encoded = self.encode(Batch(request, self.share).to_body(), kind=Batch.KIND)
            frames = self.cache[key] = [bytes(f) for f in encoded]
        try:
            self.sockets[index].send_multipart(frames, self.zmq.NOBLOCK)
        except self.zmq.Again:  # the coordinator's queue is full: try again in 1 ms
            self.counter += 1
            heapq.heappush(self.due, (time.monotonic() + 0.001, self.counter, index, request))
            return
        self.sent += 1
        self.drain(index)  # the send may have consumed the edge of a waiting message


def main() -> int:
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID` prints where a host is
    torch.set_num_threads(1)
    host = _Host()
    try:
        host.serve()
    finally:
        host.close_sockets()
        host.context.destroy(linger=0)
    return 0


class HostProcess:
    """A worker host process, driven over its stdin/stdout (blocking: setup and teardown only)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.scaling_host"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        self.pid = self.call(None)["ready"]

    def call(self, cmd: dict[str, Any] | None) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if cmd is not None:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker host {self.proc.pid} exited ({self.proc.poll()})")
        return json.loads(line)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    sys.exit(main())
