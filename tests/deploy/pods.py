"""Pods as processes, run from deploy/k8s as a kubelet runs them: for tests with no cluster.

A :class:`PodTemplate` is a manifest's container read as the kubelet reads it: the
image's ENTRYPOINT (deploy's Dockerfile) unless ``command`` replaces it, then
``args``; the ``env`` list (``fieldRef: metadata.name`` is the pod's name); the
readiness probe's path and named port; ``terminationGracePeriodSeconds``. On one
machine some of it must change, and only that: every pod shares one network, so
each containerPort gets a free loopback port (the same one for every pod of a
workload, as a Service's stays put) and ``0.0.0.0`` binds loopback; a Service's
name resolves to 127.0.0.1 and its port to the target pod's; a mount path in a
value is re-rooted under the pod's folder; ``python`` and ``asyncrl`` are this
interpreter (the image's ``WORKDIR /app`` is the repository root).
A :class:`Pod` is one process in a session of its own: start, ready?, stop
(SIGTERM to the container's first process, SIGKILL to all that is left after
the grace period, as a container's cgroup is killed).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .kubelet import mount_volumes, sync_volumes

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
DOCKERFILE = ROOT / "Dockerfile"
#: The image's programs, here: the same code from this interpreter.
PROGRAMS = {"python": [sys.executable], "asyncrl": [sys.executable, "-m", "asyncrl.cli"]}


_GIVEN: set[int] = set()  # ports handed out: the kernel may offer a closed one again


def free_port() -> int:
    """A port nobody listens on now, not given to another pod before, and below the
    kernel's ephemeral range: a connection's local port cannot take it before the pod
    that was given it binds it (seconds later: python and torch start first)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    while True:
        port = random.randrange(max(1024, low - 10000), low)
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


def entrypoint() -> list[str]:
    """The Dockerfile's ``ENTRYPOINT [...]`` (exec form)."""
    line = next(line for line in DOCKERFILE.read_text().splitlines()
                if line.startswith("ENTRYPOINT"))
    return list(json.loads(line.removeprefix("ENTRYPOINT")))


def workload(file: str, kind: str) -> dict[str, Any]:
    """The first document of ``kind`` in deploy/k8s/``file``."""
    documents = yaml.safe_load_all((K8S / file).read_text())
    return next(d for d in documents if d and d["kind"] == kind)


@dataclass
class PodTemplate:
    """A workload's pod template, ready to run as processes on this machine."""

    spec: dict[str, Any]  # the template's pod spec
    services: dict[str, tuple[dict[int, int], dict[int, int]]]  # name -> (port->target, ports)
    root: Path  # pods' folders go under it
    port_maps: dict[str, dict[int, int]] = field(default_factory=dict)  # pod name -> ports

    @classmethod
    def of(cls, file: str, kind: str, root: Path,
           services: dict[str, tuple[dict[int, int], dict[int, int]]] | None = None
           ) -> PodTemplate:
        spec = workload(file, kind)["spec"]["template"]["spec"]
        assert len(spec["containers"]) == 1, "one container per pod in deploy/k8s"
        return cls(spec, services or {}, root)

    def ports(self, name: str) -> dict[int, int]:
        """containerPort -> a loopback port, fixed per pod name (a Service's stays put)."""
        if name not in self.port_maps:
            self.port_maps[name] = {p["containerPort"]: free_port()
                                    for p in self.container.get("ports", [])}
        return self.port_maps[name]

    @property
    def container(self) -> dict[str, Any]:
        return dict(self.spec["containers"][0])

    @property
    def grace(self) -> float:
        return float(self.spec.get("terminationGracePeriodSeconds", 30))

    def named_port(self, port: int | str, name: str) -> int:
        if isinstance(port, int):
            return self.ports(name)[port]
        (number,) = [p["containerPort"] for p in self.container["ports"] if p["name"] == port]
        return self.ports(name)[number]

    def readiness(self, name: str) -> tuple[str, int]:
        """The readinessProbe's httpGet path and (loopback) port."""
        get = self.container["readinessProbe"]["httpGet"]
        return get["path"], self.named_port(get["port"], name)

    def rewrite(self, value: str, name: str, pod_root: Path) -> str:
        """A manifest's value as it must read on one machine (module docstring)."""
        for service, (targets, ports) in self.services.items():  # cluster DNS, Service ports
            for port, target in targets.items():
                value = value.replace(f"{service}:{port}", f"127.0.0.1:{ports[target]}")
        value = value.replace("0.0.0.0", "127.0.0.1")
        for port, here in self.ports(name).items():
            value = re.sub(rf"(?<=:){port}\b|^{port}$", str(here), value)
        mounts = sorted((m["mountPath"] for m in self.container.get("volumeMounts", [])),
                        key=len, reverse=True)
        for path in mounts:  # the deepest mount that holds the path, once
            if value == path or value.startswith(path + "/"):
                return str(pod_root / path.lstrip("/")) + value[len(path):]
        return value

    def command(self, name: str, pod_root: Path) -> list[str]:
        container = self.container
        words = list(container.get("command") or entrypoint()) + list(container.get("args", []))
        return PROGRAMS[words[0]] + [self.rewrite(w, name, pod_root) for w in words[1:]]

    def env(self, name: str, pod_root: Path, overrides: dict[str, str]) -> dict[str, str]:
        """The container's variables, then ``overrides`` (each must be one of them)."""
        variables: dict[str, str] = {}
        for item in self.container.get("env", []):
            if "value" in item:
                variables[item["name"]] = self.rewrite(item["value"], name, pod_root)
            else:
                assert item["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name", item
                variables[item["name"]] = name
        unknown = set(overrides) - set(variables)
        assert not unknown, f"overrides of variables the manifest does not set: {unknown}"
        return variables | overrides


@dataclass
class Pod:
    """One container as a process in a session of its own, its output in ``log``."""

    name: str
    template: PodTemplate
    env: dict[str, str]
    root: Path
    process: subprocess.Popen[bytes] | None = None
    readiness: list[int] = field(default_factory=list)  # each probe's status code, in order

    @property
    def log(self) -> Path:
        return self.root / "log"

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        environment = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCRL_")}
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                self.template.command(self.name, self.root), env=environment | self.env, cwd=ROOT,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def probe(self) -> int:
        """GET the readiness path: the status code, 0 when nothing answers."""
        path, port = self.template.readiness(self.name)
        if self.exited() is not None:  # a kubelet would restart it: here, a failure
            raise AssertionError(f"{self.name} exited {self.exited()}:\n{self.text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as reply:
                code = int(reply.status)
        except urllib.error.HTTPError as error:
            code = error.code
        except OSError:
            code = 0
        if not self.readiness or self.readiness[-1] != code:
            self.readiness.append(code)  # transitions only
        return code

    def get(self, path: str, port_name: str = "http") -> Any:
        port = self.template.named_port(port_name, self.name)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return json.loads(reply.read())

    def exited(self) -> int | None:
        assert self.process is not None
        return self.process.poll()

    def stop(self) -> int:
        """SIGTERM, SIGKILL after the grace period; then the rest of the container goes."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(self.template.grace)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.process.wait()
        self.kill()  # what the first process left behind: a container's cgroup dies whole
        return code

    def kill(self) -> None:
        if self.process is not None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait()

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.25) -> Any:
    """Poll ``predicate`` until it is truthy (and return it), or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := predicate():
            return result
        time.sleep(interval)
    raise AssertionError(f"not within {timeout} s: {what}")


@dataclass
class Workload:
    """A StatefulSet's or Deployment's pods, made by the kubelet of tests/deploy/kubelet.py.

    ``secrets`` is the cluster's Secrets (name -> key -> bytes), ``claims`` the
    folder of its PersistentVolumeClaims, ``overrides`` what must differ from the
    manifest's variables on one machine (the test says why, for each).
    """

    template: PodTemplate
    secrets: dict[str, dict[str, bytes]]
    claims: Path
    overrides: dict[str, str]
    pods: dict[str, Pod] = field(default_factory=dict)
    made: int = 0  # pods made so far: each gets fresh folders, as a new pod does

    def create(self, name: str) -> Pod:
        self.made += 1
        root = self.template.root / f"{name}.{self.made}"
        mount_volumes(self.template.spec, name, root, self.secrets, self.claims)
        pod = Pod(name, self.template, self.template.env(name, root, self.overrides), root)
        pod.start()
        self.pods[name] = pod
        return pod

    def delete(self, name: str) -> int:
        """Stop the pod (grace period, then SIGKILL): its exit status."""
        return self.pods.pop(name).stop()

    def sync(self) -> None:
        """The kubelet's Secret sync, for every running pod."""
        for pod in self.pods.values():
            sync_volumes(self.template.spec, pod.root, self.secrets)

    def kill_all(self) -> None:
        for pod in self.pods.values():
            pod.kill()
