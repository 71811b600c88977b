"""Coordinator scaling by simulation: one real coordinator, up to 512 simulated workers.

What is real: the coordinator side, exactly as :class:`~asyncrl.MultiCollector`
runs it -- a :class:`transports.Hub` (ROUTER, pump, codec decode of every batch,
heartbeats, liveness), the :class:`~asyncrl._coordinator.coordinator.Coordinator` (handshake
with ``check_specs``, credits, sync rounds with ``next_round``, async
first-come with ``next_batch``) and, in sync mode, the assembly of the shares
with ``asyncrl.collectors._assemble.assemble``. Batches have TorchRL's layout
(``observation``, ``action``, ``("next", ...)``, ``("collector", ...)``) of
``[1, frames]`` per message.

What is simulated: the workers. They speak the real protocol (hello with env
specs and ``slot=-1``, welcome, collect credits, batch, heartbeats) over real
ZeroMQ ``ipc://`` connections, one DEALER socket per simulated worker, but
they live in one or more *worker host* processes (``--hosts``,
``benchmarks/scaling_host.py``) that hold many
sockets each and run a plain epoll loop over raw pyzmq: no env, no policy, no
event loop, and each batch's frames are encoded once (per request id) and
re-sent. A simulated worker answers a credit after ``--delay-ms`` (its
"collection time", one batch at a time, like a real worker) or at once
(``delay 0``: flat out, the coordinator is the only limit).

Why separate processes: simulated workers in the coordinator's process would
steal its CPU and its event loop, and their cost (a Link pump, a heartbeat
task and a decode per message each) is as large as the coordinator's. In a
separate process they cost the coordinator nothing but the bytes they send,
so ``time.thread_time()`` of the event-loop thread is the coordinator's own
cost (Python: hub pump, decode, scheduler, trainer loop) and
``time.process_time()`` adds libzmq's I/O thread. The host's CPU use is
reported too: a host near 100 % would mean the host, not the coordinator,
was the limit. ``--inproc`` runs the simulated workers as anyio tasks
(:func:`asyncrl._worker.simulated.sim_worker`, what the tests use) with their own
:class:`transports.Link` in this process instead (the figures then mix both sides).

    python -m benchmarks.scaling            # full run (~2 min on 2 cores)
    python -m benchmarks.scaling --quick    # ~30 s
    python -m benchmarks.scaling --profile sync:512   # cProfile of one case
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import math
import os
import platform
import pstats
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import torch
from tensordict import TensorDictBase

# The coordinator is timed on its own, without MultiCollector around it: internal.
from asyncrl._coordinator.admission import AdmissionTerms
from asyncrl._coordinator.config import CoordinatorConfig
from asyncrl._coordinator.coordinator import Coordinator, check_specs
from asyncrl._worker.simulated import SimRecord, sim_worker
from asyncrl.collectors._assemble import assemble
from benchmarks.scaling_host import HostProcess
from transports import Hub

# -------------------------------------------------------------------------- coordinator


@dataclass(frozen=True)
class Case:
    mode: str  # "sync" | "async"
    workers: int
    prefetch: int = 1
    delay_ms: float = 20.0
    backend: str = "asyncio"

    @property
    def label(self) -> str:
        return "sync" if self.mode == "sync" else f"async p{self.prefetch}"


@dataclass
class Row:
    case: Case
    batches: int = 0
    frames: int = 0
    wall: float = 0.0
    cpu_loop: float = 0.0  # event-loop thread
    cpu_process: float = 0.0  # + libzmq I/O thread
    msgs: int = 0  # data messages through the hub, both directions (no heartbeats)
    batch_frames: int = 0
    batch_bytes: int = 0
    assemble: float = 0.0  # sync: loop CPU spent in assemble()
    host_busy: float = 0.0  # most loaded worker host: CPU / wall
    error: str | None = None

    @property
    def offered(self) -> float:
        """Batches/s the workers would deliver to an infinitely fast coordinator."""
        if not self.case.delay_ms:
            return math.inf
        per_worker = 1000.0 / self.case.delay_ms
        return per_worker if self.case.mode == "sync" else per_worker * self.case.workers


class _Clock:
    def __init__(self) -> None:
        self.wall, self.loop, self.process = (time.perf_counter(), time.thread_time(),
                                              time.process_time())


def td_nbytes(td: TensorDictBase) -> int:
    return sum(t.numel() * t.element_size()
               for t in td.values(include_nested=True, leaves_only=True))


async def _trainer(scheduler: Any, sync: bool, until: float, row: Row | None) -> None:
    while time.perf_counter() < until:
        if sync:
            shares = [frames for _, frames in await scheduler.next_round()]
            t0 = time.thread_time()
            batch = assemble(shares, 0)
            if row is not None:
                row.assemble += time.thread_time() - t0
        else:
            _, batch = await scheduler.next_batch()
        if row is not None:
            row.batches += 1
            row.frames += batch.numel()
            if not row.batch_bytes:
                row.batch_frames, row.batch_bytes = batch.numel(), td_nbytes(batch)


async def measure(case: Case, hosts: list[HostProcess], *, workdir: str, frames: int,
                  obs_dim: int, warmup: float, duration: float, tag: str,
                  inproc: bool = False) -> Row:
    """Admit ``case.workers`` simulated workers, warm up, then time the trainer loop."""
    row = Row(case)
    endpoint = f"inproc://scaling-{tag}" if inproc else f"ipc://{workdir}/hub-{tag}"
    async with Hub(endpoint) as hub:
        scheduler = Coordinator(hub, CoordinatorConfig(
            sync=case.mode == "sync", share_frames=[frames] * case.workers,
            prefetch=case.prefetch, accept_remote=True), AdmissionTerms(check_specs=check_specs))
        async with anyio.create_task_group() as tg:
            tg.start_soon(scheduler.run)
            if inproc:
                for i in range(case.workers):
                    await tg.start(_inproc_worker, hub.endpoint, f"{tag}-{i}", frames, obs_dim,
                                   case.delay_ms / 1000)
            else:
                for h, share in enumerate(_split(case.workers, len(hosts))):
                    hosts[h].call({"cmd": "start", "endpoint": hub.endpoint, "n": share,
                                   "prefix": f"{tag}-h{h}", "delay": case.delay_ms / 1000,
                                   "frames": frames, "obs_dim": obs_dim})
            with anyio.fail_after(120):
                await scheduler.wait_for_workers(case.workers)
            sync = case.mode == "sync"
            await _trainer(scheduler, sync, time.perf_counter() + warmup, None)
            stats0, start = hub.statistics(), _Clock()
            await _trainer(scheduler, sync, time.perf_counter() + duration, row)
            stats1, end = hub.statistics(), _Clock()
            tg.cancel_scope.cancel()
        if not inproc:
            reports = [host.call({"cmd": "stop"}) for host in hosts[:case.workers]]
            row.host_busy = max(r["cpu"] / max(r["wall"], 1e-9) for r in reports)
    row.wall, row.cpu_loop = end.wall - start.wall, end.loop - start.loop
    row.cpu_process = end.process - start.process
    row.msgs = (stats1.messages_received - stats0.messages_received
                + stats1.messages_sent - stats0.messages_sent)
    return row


async def _inproc_worker(endpoint: str, name: str, frames: int, obs_dim: int, delay: float,
                         *, task_status: anyio.abc.TaskStatus[SimRecord]) -> None:
    await sim_worker(endpoint, name, frames=frames, obs_dim=obs_dim, delay=delay,
                     task_status=task_status)


def _split(total: int, parts: int) -> list[int]:
    return [n for n in (total // parts + (i < total % parts) for i in range(parts)) if n]


# ------------------------------------------------------------------------------ report


def _us(seconds: float, count: int) -> str:
    return f"{seconds / count * 1e6:,.0f}" if count else "-"


def table(rows: list[Row]) -> str:
    head = ("| mode | backend | workers | worker delay ms | batch frames | batch KiB "
            "| batches/s | of offered | frames/s | msgs/s | wall ms/batch "
            "| loop CPU ms/batch | loop CPU us/msg | assemble ms/batch | loop busy "
            "| process CPU | host busy |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        c = r.case
        if r.error:
            lines.append(f"| {c.label} | {c.backend} | {c.workers} | {c.delay_ms:g} | "
                         f"FAILED: {r.error} |")
            continue
        rate = r.batches / r.wall if r.wall else 0.0
        offered = "-" if math.isinf(r.offered) else f"{100 * rate / r.offered:.0f} %"
        assemble = f"{r.assemble / r.batches * 1e3:.2f}" if c.mode == "sync" and r.batches \
            else "-"
        lines.append(
            f"| {c.label} | {c.backend} | {c.workers} | {c.delay_ms:g} | {r.batch_frames:,} "
            f"| {r.batch_bytes / 1024:,.1f} | {rate:,.1f} | {offered} "
            f"| {r.frames / r.wall:,.0f} | {r.msgs / r.wall:,.0f} "
            f"| {r.wall / max(r.batches, 1) * 1e3:.2f} "
            f"| {r.cpu_loop / max(r.batches, 1) * 1e3:.3f} | {_us(r.cpu_loop, r.msgs)} "
            f"| {assemble} | {100 * r.cpu_loop / r.wall:.0f} % "
            f"| {100 * r.cpu_process / r.wall:.0f} % "
            f"| {'-' if not r.host_busy else f'{100 * r.host_busy:.0f} %'} |")
    return "\n".join(lines)


def saturation(rows: list[Row]) -> list[str]:
    """Per mode and backend: the first paced case whose loop is >= 90 % busy or falls behind.

    Falling behind means < 90 % of the offered batch rate, counted with
    ``prefetch > 1`` only: a sync round, and an async worker holding a single
    credit, wait a round trip to the trainer on top of the workers' delay, so
    their rate is below the offered one at any size.
    """
    notes = []
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        if r.case.delay_ms and not r.error:
            groups.setdefault((r.case.label, r.case.backend), []).append(r)
    for (label, backend), group in groups.items():
        group.sort(key=lambda r: r.case.workers)
        hit = next((r for r in group if r.cpu_loop / r.wall >= 0.9 or (
            r.case.mode == "async" and r.case.prefetch > 1
            and r.batches / r.wall < 0.9 * r.offered)), None)
        if hit is None:
            notes.append(f"- {label} / {backend}: not saturated up to {group[-1].case.workers} "
                         "workers")
        else:
            notes.append(f"- {label} / {backend}: saturated at {hit.case.workers} workers "
                         f"({hit.msgs / hit.wall:,.0f} msgs/s, loop "
                         f"{100 * hit.cpu_loop / hit.wall:.0f} % busy, "
                         f"{100 * hit.batches / hit.wall / hit.offered:.0f} % of offered)")
    return notes


# --------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scaling", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="~30 s smoke run")
    p.add_argument("--workers", default=None,
                   help="comma-separated worker counts (default 8,32,64,128,256,512)")
    p.add_argument("--backends", default=None, help="asyncio,trio (quick: asyncio)")
    p.add_argument("--frames", type=int, default=64, help="frames per worker batch (T)")
    p.add_argument("--obs-dim", type=int, default=4, help="observation size (float32)")
    p.add_argument("--delay-ms", type=float, default=20.0,
                   help="simulated collection time of one batch per worker (paced runs)")
    p.add_argument("--flat-out", default=None,
                   help="worker counts also run with delay 0 (default 8,64,512; quick 8,256)")
    p.add_argument("--hosts", type=int, default=1, help="worker host processes")
    p.add_argument("--duration", type=float, default=None, help="timed seconds per case")
    p.add_argument("--inproc", action="store_true",
                   help="simulated workers as in-process anyio tasks (figures mix both sides)")
    p.add_argument("--profile", default=None, metavar="MODE:N",
                   help="cProfile one case (sync:512, async1:512, async4:512) and print it")
    return p.parse_args(argv)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def cases(args: argparse.Namespace) -> list[Case]:
    workers = _ints(args.workers or ("8,64,256" if args.quick else "8,32,64,128,256,512"))
    backends = (args.backends or ("asyncio" if args.quick else "asyncio,trio")).split(",")
    flat = _ints(args.flat_out or ("8,256" if args.quick else "8,64,512"))
    modes = [("sync", 1), ("async", 1), ("async", 4)]
    out = [Case(m, n, p, args.delay_ms, b) for b in backends for m, p in modes for n in workers]
    out += [Case(m, n, p, 0.0, backends[0]) for m, p in modes for n in flat]
    return out


@contextlib.contextmanager
def _hosts(count: int, inproc: bool) -> Iterator[list[HostProcess]]:
    hosts: list[HostProcess] = []
    try:
        if not inproc:
            hosts = [HostProcess() for _ in range(count)]
        yield hosts
    finally:
        for host in hosts:
            host.close()


def _run_case(case: Case, hosts: list[HostProcess], args: argparse.Namespace, workdir: str,
              tag: str, wrap: Callable[[Callable[[], Any]], Any] = lambda f: f()) -> Row:
    warmup, duration = (0.2, args.duration or 0.5) if args.quick else (0.5, args.duration or 2.0)

    async def run() -> Row:
        return await measure(case, hosts, workdir=workdir, frames=args.frames,
                             obs_dim=args.obs_dim, warmup=warmup, duration=duration, tag=tag,
                             inproc=args.inproc)

    return wrap(lambda: anyio.run(run, backend=case.backend))


def _profile(spec: str, hosts: list[HostProcess], args: argparse.Namespace,
             workdir: str) -> None:
    mode, _, n = spec.partition(":")
    prefetch = int(mode[5:] or 1) if mode.startswith("async") else 1
    case = Case("sync" if mode == "sync" else "async", int(n or 512), prefetch, args.delay_ms)
    profiler = cProfile.Profile()

    def wrap(f: Callable[[], Any]) -> Any:
        return profiler.runcall(f)

    row = _run_case(case, hosts, args, workdir, "profile", wrap)
    print(table([row]))
    out = io.StringIO()
    # PROFILE_SORT=cumulative PROFILE_ROWS=70 shows the coordinator's own functions.
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats(os.environ.get("PROFILE_SORT", "tottime"))
    stats.print_stats(int(os.environ.get("PROFILE_ROWS", "30")))
    print(out.getvalue())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python -m benchmarks.scaling " + shlex.join(
        sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(1)  # the coordinator's tensor work is small; no OpenMP spinning
    rows: list[Row] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="asyncrl-scaling-") as workdir, \
            _hosts(args.hosts, args.inproc) as hosts:
        if args.profile:
            _profile(args.profile, hosts, args, workdir)
            return 0
        for i, case in enumerate(cases(args)):
            try:
                row = _run_case(case, hosts, args, workdir, f"c{i}")
            except Exception as exc:  # one failed case must not hide the others
                row = Row(case, error=f"{type(exc).__name__}: {exc}")
            rows.append(row)
            print(table([row]).splitlines()[-1], file=sys.stderr, flush=True)
    print(f"\n## Coordinator scaling (simulated workers, {args.frames} frames x "
          f"obs {args.obs_dim} per worker batch)\n")
    print(table(rows))
    print("\nSaturation (paced cases: loop >= 90 % busy, or async prefetch > 1 below 90 % "
          "of the offered rate):\n")
    print("\n".join(saturation(rows)))
    print(f"\nMachine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}, torch {torch.__version__}, load average "
          f"{os.getloadavg()[0]:.2f}; workers in "
          f"{'this process' if args.inproc else f'{args.hosts} host process(es)'}; "
          f"total {time.perf_counter() - started:.0f} s")
    print(f"\nCommand: `{command}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
