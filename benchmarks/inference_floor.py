"""The floor of central inference's round trip: one request and its answer between two processes.

    python -m benchmarks.inference_floor                      # every signal, 1 / 4 / 16 envs
    python -m benchmarks.inference_floor --signals eventfd,zmq --envs 4 --steps 3000

An "env worker" (this process) and a "server" (a child process) share two
:class:`transports.SharedTensorBlock` s, as central inference's local env workers
do: the worker writes ``E`` Pendulum observations (``[E, 3]`` float32), signals,
waits; the server reads them, writes ``E`` actions (``[E, 1]`` float32) and a
version, signals back; the worker reads the actions. No policy, no env: what is
timed is the signal and the shared-memory copies, per round trip.

Signals (each way):

- ``pipe``: one byte through an ``os.pipe`` (for reference);
- ``eventfd``: ``os.eventfd_write`` / a blocking ``os.eventfd_read``;
- ``spinN``: spin N microseconds on the block's sequence number, then block on the
  eventfd (``asyncrl._inference.doorbell.spin_then_block``: the local path's wait);
- ``spin``: spin only, never sleep (the hardware's floor when both sides own a core;
  on an oversubscribed machine it can be far worse than sleeping);
- ``zmq``: the local path before issue #25: a ZeroMQ ``obs`` message from a
  :class:`transports.Link` to a :class:`transports.Hub` and an ``act`` answer back,
  both ends on an anyio event loop (what every env step cost then, less the batching).

Prints the median and the 90th percentile of the round trip in microseconds, per
signal and env count, with the command and the machine's load.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from typing import Any

import torch

from asyncrl._inference.doorbell import EventFd, spin_then_block
from transports import SharedTensorBlock

SIGNALS = ("pipe", "eventfd", "spin20", "spin100", "spin", "zmq")


def _never() -> bool:
    return False


def _waiter(signal: str, bell: Any) -> Any:
    """``wait(word, target)``: return once ``word[0] >= target``."""
    if signal == "pipe":
        def wait_pipe(word: memoryview, target: int) -> None:
            os.read(bell, 1)
        return wait_pipe
    spin = {"eventfd": 0.0, "spin": float("inf")}.get(signal)
    if spin is None:
        spin = int(signal.removeprefix("spin")) * 1e-6

    def wait(word: memoryview, target: int) -> None:
        spin_then_block(lambda: word[0] >= target, bell, spin=spin, stopped=_never)
    return wait


def _ringer(signal: str, bell: Any) -> Any:
    if signal == "pipe":
        return lambda: os.write(bell, b"x")
    if signal == "spin":
        return lambda: None
    return bell.ring


def _server(signal: str, obs_name: str, act_name: str, request: Any, answer: Any,
            steps: int) -> None:
    torch.set_num_threads(1)
    obs, act = SharedTensorBlock.attach(obs_name), SharedTensorBlock.attach(act_name)
    got = {k: torch.empty(s, dtype=d) for k, (d, s) in obs.layout.items()}
    out = {k: torch.zeros(s, dtype=d) for k, (d, s) in act.layout.items()}
    wait, ring = _waiter(signal, request), _ringer(signal, answer)
    word = obs.control(0)
    seq = 0  # fresh blocks; the other side may have written already
    for step in range(steps):
        seq += 2
        wait(word, seq)
        obs.read_into(got, 0, seq)
        out["action"][:, 0] = got["o0"][:, 0]
        act.write(out, version=step, slot=0)
        ring()
    obs.close()
    act.close()


def _client(signal: str, obs: SharedTensorBlock, act: SharedTensorBlock, request: Any,
            answer: Any, steps: int) -> list[float]:
    src = {k: torch.randn(s).to(d) for k, (d, s) in obs.layout.items()}
    dst = {k: torch.empty(s, dtype=d) for k, (d, s) in act.layout.items()}
    wait, ring = _waiter(signal, answer), _ringer(signal, request)
    word = act.control(0)
    seq = 0  # fresh blocks; the other side may have written already
    times = [0.0] * steps
    clock = time.perf_counter
    for step in range(steps):
        t0 = clock()
        obs.write(src, version=step, slot=0)
        ring()
        seq += 2
        wait(word, seq)
        act.read_into(dst, 0, seq)
        times[step] = clock() - t0
    return times


def _zmq_server(endpoint: str, obs_name: str, act_name: str, steps: int) -> None:
    import anyio

    from transports import Hub

    async def main() -> None:
        obs, act = SharedTensorBlock.attach(obs_name), SharedTensorBlock.attach(act_name)
        got = {k: torch.empty(s, dtype=d) for k, (d, s) in obs.layout.items()}
        out = {k: torch.zeros(s, dtype=d) for k, (d, s) in act.layout.items()}
        async with Hub(endpoint, peer_timeout=120) as hub:
            served = 0
            async for item in hub:
                if getattr(item, "kind", None) != "obs":
                    continue
                obs.read_into(got, 0)
                out["action"][:, 0] = got["o0"][:, 0]
                act.write(out, version=served, slot=0)
                await hub.send(item.peer, served, kind="act")
                served += 1
                if served == steps:
                    await anyio.sleep(0.5)  # let the last answer leave
                    return

    torch.set_num_threads(1)
    anyio.run(main)


async def _zmq_client(endpoint: str, obs: SharedTensorBlock, act: SharedTensorBlock,
                      steps: int) -> list[float]:
    from transports import Link

    src = {k: torch.randn(s).to(d) for k, (d, s) in obs.layout.items()}
    dst = {k: torch.empty(s, dtype=d) for k, (d, s) in act.layout.items()}
    times = [0.0] * steps
    clock = time.perf_counter
    async with Link(endpoint, peer_timeout=120) as link:  # the child imports torch first
        for step in range(steps):
            t0 = clock()
            obs.write(src, version=step, slot=0)
            await link.send(None, kind="obs")
            await link.recv()
            act.read_into(dst, 0)
            times[step] = clock() - t0
    return times


def measure(signal: str, envs: int, steps: int) -> list[float]:
    """Round-trip times (seconds) of ``steps`` requests, the first 10 % dropped (warm-up)."""
    ctx = mp.get_context("spawn")
    obs = SharedTensorBlock.create({"o0": torch.zeros(envs, 3)}, slots=1)
    act = SharedTensorBlock.create({"action": torch.zeros(envs, 1)}, slots=1)
    warm = steps // 10
    try:
        if signal == "zmq":
            import anyio
            endpoint = f"ipc://{tempfile.mkdtemp(prefix='asyncrl-floor-')}/hub"
            proc = ctx.Process(target=_zmq_server, args=(endpoint, obs.name, act.name,
                                                         steps + warm))
            proc.start()
            times = anyio.run(_zmq_client, endpoint, obs, act, steps + warm)
        else:
            request: Any
            answer: Any
            if signal == "pipe":
                (req_r, req_w), (ans_r, ans_w) = os.pipe(), os.pipe()
                proc = ctx.Process(target=_server, args=(
                    signal, obs.name, act.name, _Fd(req_r), _Fd(ans_w), steps + warm))
                request, answer = req_w, ans_r
            else:
                request, answer = EventFd(), EventFd()
                proc = ctx.Process(target=_server, args=(signal, obs.name, act.name, request,
                                                         answer, steps + warm))
            proc.start()
            times = _client(signal, obs, act, request, answer, steps + warm)
        proc.join(30)
        return times[warm:]
    finally:
        for block in (obs, act):
            block.close()
            block.unlink()


class _Fd:
    """A pipe end for the spawned server (DupFd, as EventFd does)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> Any:
        from multiprocessing import reduction
        return _fd_rebuild, (reduction.DupFd(self.fd),)


def _fd_rebuild(dup: Any) -> int:
    return int(dup.detach())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.inference_floor", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--signals", default=",".join(SIGNALS))
    p.add_argument("--envs", default="1,4,16", help="envs per env worker (payload rows)")
    p.add_argument("--steps", type=int, default=3000, help="round trips per measurement")
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)
    signals = [s for s in args.signals.split(",") if s]
    bad = [s for s in signals if s not in SIGNALS and not (
        s.startswith("spin") and s[4:].isdigit())]
    if bad:
        print(f"unknown signals {bad}; known: {SIGNALS} (or spinN)", file=sys.stderr)
        return 2
    envs = [int(n) for n in args.envs.split(",") if n]
    command = "python -m benchmarks.inference_floor " + " ".join(
        map(shlex.quote, argv if argv is not None else sys.argv[1:]))
    print(f"# {command}\n# {platform.node()}: {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    results: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.repeats):
        for n in envs:
            for signal in signals:  # interleaved: drifts in the load hit all alike
                times = measure(signal, n, args.steps)
                results.setdefault((signal, n), []).extend(times)
                print(f"{signal} envs={n}: median {statistics.median(times) * 1e6:.1f} us",
                      flush=True)
    print()
    print("| signal | " + " | ".join(f"{n} env(s): median / p90 (us)" for n in envs) + " |")
    print("|---|" + "---|" * len(envs))
    for signal in signals:
        cells = []
        for n in envs:
            t = sorted(results[(signal, n)])
            cells.append(f"{statistics.median(t) * 1e6:.1f} / {t[int(0.9 * len(t))] * 1e6:.1f}")
        print(f"| {signal} | " + " | ".join(cells) + " |")
    print(f"# load at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
