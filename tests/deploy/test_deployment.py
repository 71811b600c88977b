"""deploy/k8s run as processes, the way a kubelet runs them, through a day of operations.

No cluster is reachable here, so tests/deploy/pods.py plays the kubelet and the
controllers: each container's command, args and variables come from the
manifests (tests/deploy/pods.py says what is re-rooted for one machine, and
the overrides below say which values change and why), the Secret volumes are
laid out and swapped as the kubelet's AtomicWriter does (tests/deploy/kubelet.py),
readiness is the readinessProbe's GET, and a stop is SIGTERM then SIGKILL after
terminationGracePeriodSeconds. One scenario, to start as few processes as it can:

1. the trainer Deployment and 2 worker-host pods (Parallel pod management);
2. (a) a StatefulSet rolling update: highest ordinal first, the old pod deleted
   before its replacement is created, the next one only once it is Ready;
3. (b, d) ``ASYNCRL_REMOTE_WORKERS`` raised to 4, which recreates the trainer
   (SIGTERM, checkpoint, a new trainer restoring it; the hosts wait and rejoin),
   then the StatefulSet scaled to 4 (docs/deploy.md, "Scaling");
4. (d) scaled back to 2, and the trainer's variable lowered again (a second
   graceful restart);
5. (c) host 1's key revoked: the two key Secrets applied, the trainer's volumes
   synced; host 1 is out (exit 4) and the run goes on with host 0.

Throughout: frames = batches x frames_per_batch exactly, counters and the policy
version continue over each restart from exactly what was checkpointed, every
SIGTERM exits 0.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml", reason="pyyaml (the dev extra) reads the manifests")

from transports import add_host, generate_keys, revoke_host  # noqa: E402

from .pods import Pod, PodTemplate, Workload, wait_for, workload  # noqa: E402

pytestmark = pytest.mark.slow  # 3 trainers and 6 worker hosts start: ~2 minutes
LIMIT = 90  # seconds for any one step on a loaded 2-core machine
HOSTS = "asyncrl-worker-host"
TRAINER = "asyncrl-trainer"  # one name for its pods: its Service's ports stay put
FRAMES_PER_BATCH = 32
SAVED = re.compile(r"checkpoint saved: (\d+) frames, (\d+) updates, policy version (\d+)")
RESTORED = re.compile(r"run restored from .*: (\d+) frames, (\d+) updates, policy version (\d+)")


def folder(path: Path, pattern: str = "*") -> dict[str, bytes]:
    """A Secret made with ``kubectl create secret generic --from-file=DIR/``."""
    return {p.name: p.read_bytes() for p in sorted(path.glob(pattern)) if p.is_file()}


def key_secrets(keys: Path) -> dict[str, dict[str, bytes]]:
    """The Secrets of docs/deploy.md, section 4, from the key folder."""
    return {
        "asyncrl-coordinator-key": {name: (keys / name).read_bytes()
                                    for name in ("coordinator.key", "coordinator.key_secret")},
        "asyncrl-authorized-keys": folder(keys / "authorized", "*.key"),
        "asyncrl-revoked-keys": folder(keys / "revoked", "*.key"),
        **{path.name: folder(path) for path in (keys / "hosts").iterdir()},
    }


def service_ports(trainer: PodTemplate) -> dict[str, tuple[dict[int, int], dict[int, int]]]:
    """The trainer Service: its port -> the pod's containerPort (by targetPort's name)."""
    service = workload("trainer.yaml", "Service")
    named = {p["name"]: p["containerPort"] for p in trainer.container["ports"]}
    targets = {p["port"]: named[p["targetPort"]] for p in service["spec"]["ports"]}
    return {service["metadata"]["name"]: (targets, trainer.ports(TRAINER))}


def ready(pod: Pod) -> bool:
    return pod.probe() == 200


def status(trainer: Pod) -> dict[str, Any]:
    """/status, checked: every batch is whole (no frame lost or counted twice)."""
    report = trainer.get("/status")
    assert report["frames"] == report["batches"] * FRAMES_PER_BATCH, report
    assert report["error"] is None, report
    return report


def more_batches(trainer: Pod, than: int) -> dict[str, Any]:
    """Wait until the trainer counted more than ``than`` batches."""
    return wait_for(lambda: (s := status(trainer))["batches"] > than and s, LIMIT,
                    f"batches beyond {than}")


def counters(pattern: re.Pattern[str], pod: Pod) -> tuple[int, ...]:
    found = pattern.findall(pod.text())
    assert found, f"no {pattern.pattern!r} in {pod.name}'s log:\n{pod.text()[-3000:]}"
    return tuple(int(n) for n in found[-1])


def restart_trainer(trainers: Workload, hosts: Workload, remote_workers: int) -> Pod:
    """``kubectl set env ... ASYNCRL_REMOTE_WORKERS=N``: the Recreate strategy's restart."""
    old = trainers.pods[TRAINER]
    before = status(old)
    trainers.overrides["ASYNCRL_REMOTE_WORKERS"] = str(remote_workers)
    assert trainers.delete(TRAINER) == 0, old.text()[-3000:]
    saved = counters(SAVED, old)  # (frames, updates, policy version) at SIGTERM
    assert saved[0] >= before["frames"] and saved[2] >= before["policy_version"]
    # Every batch counted was learned from, but for the one a SIGTERM may have cut short.
    assert saved[0] - saved[1] * FRAMES_PER_BATCH in (0, FRAMES_PER_BATCH), saved
    for host in hosts.pods.values():  # --reconnect: they wait, unready, for the next trainer
        wait_for(lambda h=host: h.probe() == 503, LIMIT, f"{host.name} unready")
        assert host.exited() is None, host.text()[-3000:]
    new = trainers.create(TRAINER)
    wait_for(lambda: RESTORED.search(new.text()), LIMIT, "the checkpoint restored")
    assert counters(RESTORED, new) == saved  # the run goes on from exactly there
    first = wait_for(lambda: new.probe() and status(new), LIMIT, "the new trainer's /status")
    assert first["frames"] >= saved[0] and first["policy_version"] >= saved[2], (first, saved)
    return new


def test_the_manifests_run_through_a_rollout_a_restart_a_scale_and_a_revocation(
        tmp_path: Path) -> None:
    keys = generate_keys(tmp_path / "keys")
    for ordinal in range(4):
        add_host(keys, f"{HOSTS}-{ordinal}")
    revoke_host(keys, "worker")  # every host has a key of its own (docs/deploy.md, section 4)
    secrets = key_secrets(keys) | {"asyncrl-control-token": {"token": b"0" * 64}}
    trainer_template = PodTemplate.of("trainer.yaml", "Deployment", tmp_path / "pods")
    host_template = PodTemplate.of("worker-host.yaml", "StatefulSet", tmp_path / "pods",
                                   service_ports(trainer_template))
    trainers = Workload(trainer_template, secrets, tmp_path / "claims", {
        # The manifest's 4 is 2 replicas x 2 workers; here each host runs 1 (below).
        "ASYNCRL_REMOTE_WORKERS": "2",
        # 2048 frames a batch is seconds of CartPole per batch; small batches keep it short.
        "ASYNCRL_FRAMES_PER_BATCH": str(FRAMES_PER_BATCH)})
    hosts = Workload(host_template, secrets, tmp_path / "claims", {
        "ASYNCRL_WORKERS": "1"})  # one process per host: the machine has 2 cores
    try:
        scenario(trainers, hosts, keys, secrets)
    finally:
        hosts.kill_all()
        trainers.kill_all()


def scenario(trainers: Workload, hosts: Workload, keys: Path,
             secrets: dict[str, dict[str, bytes]]) -> None:
    names = [f"{HOSTS}-{ordinal}" for ordinal in range(4)]
    trainer = trainers.create(TRAINER)
    assert wait_for(lambda: trainer.probe(), LIMIT, "the trainer answering") == 503  # no hosts
    for name in names[:2]:
        hosts.create(name)
    wait_for(lambda: all([ready(pod) for pod in [trainer, *hosts.pods.values()]]), LIMIT,
             "the trainer and 2 hosts Ready")
    batches = more_batches(trainer, 0)["batches"]

    # (a) The StatefulSet's RollingUpdate: ordinal 1, then 0; delete, create, wait Ready.
    for name in reversed(names[:2]):
        assert hosts.delete(name) == 0  # SIGTERM: the workers say goodbye and leave
        wait_for(lambda: trainer.probe() == 503, LIMIT, "the trainer unready, a host short")
        batches = more_batches(trainer, batches)["batches"]  # the other host goes on
        pod = hosts.create(name)
        wait_for(lambda p=pod: ready(p) and ready(trainer), LIMIT, f"{name} updated and Ready")
    batches = more_batches(trainer, batches)["batches"]
    assert trainer.readiness == [0, 503, 200, 503, 200, 503, 200], trainer.readiness

    # (b, d) A graceful trainer restart that raises the run to 4 workers, then 4 hosts.
    trainer = restart_trainer(trainers, hosts, 4)
    for name in names[2:]:
        hosts.create(name)
    wait_for(lambda: all([ready(pod) for pod in [trainer, *hosts.pods.values()]]), LIMIT,
             "the new trainer and 4 hosts Ready")
    report = more_batches(trainer, status(trainer)["batches"])
    assert sum(w["state"] in ("collecting", "idle") for w in report["workers"]) == 4, report
    for name in names[:2]:  # the rejoined hosts went unready and back
        assert hosts.pods[name].readiness[-3:] == [200, 503, 200], hosts.pods[name].readiness

    # (d) Scaled back to 2 (highest ordinals go), then the trainer's variable lowered.
    for name in reversed(names[2:]):
        assert hosts.delete(name) == 0
    wait_for(lambda: trainer.probe() == 503, LIMIT, "the trainer unready with 2 of 4")
    more_batches(trainer, status(trainer)["batches"])
    trainer = restart_trainer(trainers, hosts, 2)
    wait_for(lambda: all([ready(pod) for pod in [trainer, *hosts.pods.values()]]), LIMIT,
             "the trainer and 2 hosts Ready again")
    batches = more_batches(trainer, status(trainer)["batches"])["batches"]

    # (c) Host 1 revoked: `asyncrl keys revoke`, both key Secrets applied, the kubelet syncs.
    revoke_host(keys, names[1])
    secrets |= key_secrets(keys)
    trainers.sync()
    revoked = hosts.pods[names[1]]
    code = wait_for(revoked.exited, LIMIT, f"{names[1]} out")
    assert code == 4, revoked.text()[-3000:]
    assert "revoked this host's CURVE key" in revoked.text(), revoked.text()[-3000:]
    hosts.pods.pop(names[1]).kill()
    batches = more_batches(trainer, batches)["batches"]  # host 0 goes on
    batches = more_batches(trainer, batches)["batches"]

    # `kubectl delete -k deploy/k8s`, worker hosts first (docs/deploy.md, "Stopping").
    assert hosts.delete(names[0]) == 0
    final = status(trainer)
    assert trainers.delete(TRAINER) == 0
    assert counters(SAVED, trainer)[0] >= final["frames"]
