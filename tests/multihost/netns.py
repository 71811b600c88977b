"""Two Linux network namespaces joined by a veth pair: a trainer host and a worker host.

Needs root and iproute2; :func:`two_namespaces` skips the test otherwise. Every
address lives inside the namespaces it creates, and it deletes them (and checks
that they are gone) on the way out.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


def run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=30)


def namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


@contextmanager
def two_namespaces(prefix: str, subnet: str = "10.213.9") -> Iterator[dict[str, str]]:
    """``{"coord", "worker", "veth_w", "addr"}``: the namespaces, the worker's link, and
    the trainer's address (``SUBNET.1``; the worker host is ``SUBNET.2``)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 ('ip') to create network namespaces")
    tag = f"{os.getpid() % 100000}"
    coord, worker = f"{prefix}c{tag}", f"{prefix}w{tag}"
    veth_c, veth_w = f"{prefix}vc{tag}", f"{prefix}vw{tag}"
    try:
        run("ip", "netns", "add", coord)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot create network namespaces here: {exc.stderr!r}")
    try:
        run("ip", "netns", "add", worker)
        run("ip", "link", "add", veth_c, "type", "veth", "peer", "name", veth_w)
        run("ip", "link", "set", veth_c, "netns", coord)
        run("ip", "link", "set", veth_w, "netns", worker)
        for ns, dev, addr in ((coord, veth_c, f"{subnet}.1/30"),
                              (worker, veth_w, f"{subnet}.2/30")):
            run("ip", "netns", "exec", ns, "ip", "addr", "add", addr, "dev", dev)
            run("ip", "netns", "exec", ns, "ip", "link", "set", dev, "up")
            run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield {"coord": coord, "worker": worker, "veth_w": veth_w, "addr": f"{subnet}.1"}
    finally:
        for ns in (coord, worker):
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True, timeout=30)
    left = namespaces() & {coord, worker}
    assert not left, f"network namespaces left behind: {left}"


@contextmanager
def switched_namespaces(prefix: str, hosts: int,
                        subnet: str = "10.213.11") -> Iterator[dict[str, object]]:
    """A trainer namespace holding a bridge (the switch) and ``hosts`` worker namespaces
    plugged into it: ``{"coord", "workers": [names], "addr"}``. The trainer is
    ``SUBNET.1``, worker host *h* ``SUBNET.(h + 2)``; the hosts reach each other through
    the bridge, inside the trainer's namespace (no forwarding, no address outside)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 ('ip') to create network namespaces")
    tag = f"{os.getpid() % 100000}"
    coord = f"{prefix}c{tag}"
    workers = [f"{prefix}h{h}{tag}" for h in range(hosts)]
    try:
        run("ip", "netns", "add", coord)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot create network namespaces here: {exc.stderr!r}")
    inside = ("ip", "netns", "exec", coord)
    try:
        run(*inside, "ip", "link", "add", "br0", "type", "bridge")
        run(*inside, "ip", "addr", "add", f"{subnet}.1/24", "dev", "br0")
        run(*inside, "ip", "link", "set", "br0", "up")
        run(*inside, "ip", "link", "set", "lo", "up")
        for h, ns in enumerate(workers):
            port, end = f"{prefix}p{h}{tag}", f"{prefix}e{h}{tag}"
            run("ip", "netns", "add", ns)
            run("ip", "link", "add", port, "type", "veth", "peer", "name", end)
            run("ip", "link", "set", port, "netns", coord)
            run("ip", "link", "set", end, "netns", ns)
            run(*inside, "ip", "link", "set", port, "master", "br0")
            run(*inside, "ip", "link", "set", port, "up")
            run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{subnet}.{h + 2}/24",
                "dev", end)
            run("ip", "netns", "exec", ns, "ip", "link", "set", end, "up")
            run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield {"coord": coord, "workers": workers, "addr": f"{subnet}.1"}
    finally:
        for ns in (coord, *workers):
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True, timeout=30)
    left = namespaces() & {coord, *workers}
    assert not left, f"network namespaces left behind: {left}"
