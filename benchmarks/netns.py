"""A second "host" for benchmarks: a network namespace joined to this one by a veth pair.

``netns(rate)`` creates the namespace and the pair (root only), optionally
shaped with ``tbf`` to ``rate`` each way (an emulated NIC), and removes both
on exit. A process gets into it either with ``ip netns exec NAME ...`` or, for
a spawned ``multiprocessing`` child, by calling :func:`enter` before it opens
a socket.

    with netns("10gbit") as ns:       # trainer binds ns.outer_ip, workers enter ns.name
        ...
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Netns", "Star", "burst_for", "enter", "netns", "rate_bytes", "star"]

_CLONE_NEWNET = 0x40000000


@dataclass
class Netns:
    """A namespace joined by a veth pair; ``outer`` is the trainer's end, ``inner`` the host's."""

    name: str
    outer: str
    inner: str
    outer_ip: str
    inner_ip: str
    rate: str | None = None  # tbf rate each way, e.g. "1gbit"; None: unshaped

    def tx_bytes(self) -> int:
        with open(f"/sys/class/net/{self.outer}/statistics/tx_bytes") as f:
            return int(f.read())


def _ip(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True)


def _shape(rate: str) -> tuple[str, ...]:
    """A ``tbf`` root qdisc of ``rate`` (an emulated NIC's limit, one way)."""
    return ("root", "tbf", "rate", rate, "burst", burst_for(rate), "latency", "50ms")


def _host_namespace(ns: Netns, *, prefix: int, outer: tuple[str, ...]) -> None:
    """Make ``ns`` and its veth pair: ``ip OUTER...`` sets the outer end (an address, or a
    bridge port); the inner end gets ``inner_ip/prefix``; both shaped to ``ns.rate``."""
    _ip("ip", "netns", "add", ns.name)
    _ip("ip", "link", "add", ns.outer, "type", "veth", "peer", "name", ns.inner)
    _ip("ip", "link", "set", ns.inner, "netns", ns.name)
    _ip("ip", *outer)
    _ip("ip", "link", "set", ns.outer, "up")
    inside = ("ip", "netns", "exec", ns.name)
    _ip(*inside, "ip", "addr", "add", f"{ns.inner_ip}/{prefix}", "dev", ns.inner)
    _ip(*inside, "ip", "link", "set", ns.inner, "up")
    _ip(*inside, "ip", "link", "set", "lo", "up")
    if ns.rate is not None:
        _ip("tc", "qdisc", "add", "dev", ns.outer, *_shape(ns.rate))  # towards the host
        _ip(*inside, "tc", "qdisc", "add", "dev", ns.inner, *_shape(ns.rate))  # from it


def rate_bytes(rate: str) -> float:
    """Bytes per second of a ``tc`` rate such as ``"1gbit"``."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return float(rate[:-len(unit)]) * scale / 8
    raise ValueError(f"rate must end in one of {sorted(units)}, got {rate!r}")


def burst_for(rate: str) -> str:
    """A tbf bucket big enough for ``rate`` at a 4 ms timer tick (1 MiB at least)."""
    return f"{max(1 << 20, int(rate_bytes(rate) * 0.004))}b"


@contextlib.contextmanager
def netns(rate: str | None = "1gbit") -> Iterator[Netns]:
    """A fresh namespace and veth pair shaped to ``rate`` each way (None: unshaped); root only."""
    tag = f"{os.getpid() % 100000}{random.randrange(100):02d}"
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    third = next(n for n in random.sample(range(1, 255), 254) if f"10.231.{n}." not in used)
    ns = Netns(f"arlbench{tag}", f"arlb{tag}o", f"arlb{tag}i", f"10.231.{third}.1",
               f"10.231.{third}.2", rate)
    try:
        _host_namespace(ns, prefix=30, outer=("addr", "add", f"{ns.outer_ip}/30", "dev",
                                              ns.outer))
        yield ns
    finally:
        subprocess.run(["ip", "link", "del", ns.outer], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns.name], capture_output=True)


@dataclass
class Star:
    """Several hosts on one switch: a bridge in this namespace, one namespace per host.

    The trainer (this namespace) speaks through the bridge at ``trainer_ip``; with a
    ``rate``, the bridge's own qdisc is the trainer's NIC (what it sends to every host
    shares it) and each host's veth is shaped both ways (its NIC). Host-to-host traffic
    (a broadcast tree) crosses the bridge without touching the trainer's NIC.
    """

    bridge: str
    trainer_ip: str
    hosts: list[Netns]
    rate: str | None = None

    def tx_bytes(self) -> int:
        """Bytes this namespace sent into the switch (the trainer's NIC)."""
        with open(f"/sys/class/net/{self.bridge}/statistics/tx_bytes") as f:
            return int(f.read())


@contextlib.contextmanager
def star(hosts: int, rate: str | None = "1gbit") -> Iterator[Star]:
    """``hosts`` fresh namespaces bridged with this one, NICs shaped to ``rate``; root only."""
    tag = f"{os.getpid() % 100000}{random.randrange(100):02d}"
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    third = next(n for n in random.sample(range(1, 255), 254) if f"10.232.{n}." not in used)
    net = f"10.232.{third}"
    bridge = f"arlsb{tag}"
    made: list[Netns] = []
    try:
        _ip("ip", "link", "add", bridge, "type", "bridge")
        _ip("ip", "addr", "add", f"{net}.1/24", "dev", bridge)
        _ip("ip", "link", "set", bridge, "up")
        if rate is not None:
            _ip("tc", "qdisc", "add", "dev", bridge, *_shape(rate))  # the trainer's NIC
        for h in range(hosts):
            ns = Netns(f"arlsb{tag}h{h}", f"arls{tag}p{h}", f"arls{tag}h{h}", f"{net}.1",
                       f"{net}.{h + 2}", rate)
            made.append(ns)  # (removed on exit even if its setup fails half way)
            _host_namespace(ns, prefix=24, outer=("link", "set", ns.outer, "master", bridge))
        yield Star(bridge, f"{net}.1", made, rate)
    finally:
        for ns in made:
            subprocess.run(["ip", "link", "del", ns.outer], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns.name], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


def enter(name: str) -> None:
    """Move the calling process (single-threaded: a fresh spawned child) into namespace ``name``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into network namespace {name!r}: {os.strerror(errno)}")
    finally:
        os.close(fd)
