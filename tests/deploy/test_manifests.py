"""The Kubernetes and KubeRay manifests parse, and name only what exists.

No cluster runs here: these checks read deploy/**/*.yaml and hold them against
the code. Each ``asyncrl`` container's arguments and ``ASYNCRL_*`` variables
must make a command line the real parser accepts; the trainer's must be
settings and flags of examples/service.py; probe paths and ports must be the
ones the code serves; the Secret's items must make key directories that
transports' CURVE loaders accept; the workers' address must be the trainer's
Service and port.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import shlex
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml", reason="pyyaml (the dev extra) reads the manifests")

from asyncrl import cli  # noqa: E402
from asyncrl._cli_env import option_variables, subparsers  # noqa: E402
from asyncrl._observe.probes import LIVENESS_PATH, READINESS_PATH  # noqa: E402
from asyncrl._rollout.envs import resolve_import_path  # noqa: E402
from transports import CurveClient, CurveServer, generate_keys  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KUBERAY = ROOT / "deploy" / "kuberay"
SECRET = "asyncrl-curve-keys"


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def resources() -> list[dict[str, Any]]:
    return [d for p in sorted((ROOT / "deploy").rglob("*.yaml")) for d in documents(p)
            if d.get("kind") != "Kustomization"]


def by_name(kind: str, name: str) -> dict[str, Any]:
    found = [r for r in resources() if r["kind"] == kind and r["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def pod_spec(resource: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = resource["spec"]["template"]["spec"]
    return spec


def container(resource: dict[str, Any]) -> dict[str, Any]:
    (only,) = pod_spec(resource)["containers"]
    result: dict[str, Any] = only
    return result


def env_of(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: str(e["value"]) for e in c.get("env", [])}


def port_number(c: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in c["ports"] if p["name"] == port]
    return int(number)


def service_help() -> str:
    from examples.service import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["--help"])
    return out.getvalue()


# -- every file --------------------------------------------------------------------------------
def test_every_yaml_parses_into_named_resources() -> None:
    paths = sorted((ROOT / "deploy").rglob("*.yaml"))
    assert {p.relative_to(ROOT).as_posix() for p in paths} >= {
        "deploy/k8s/trainer.yaml", "deploy/k8s/worker-host.yaml",
        "deploy/k8s/kustomization.yaml", "deploy/kuberay/rayjob.yaml"}
    for path in paths:
        for doc in documents(path):
            assert {"apiVersion", "kind"} <= set(doc), path
            if doc["kind"] != "Kustomization":
                assert doc["metadata"]["name"], path


def test_kustomization_lists_every_manifest_beside_it() -> None:
    (kustomization,) = documents(K8S / "kustomization.yaml")
    listed = set(kustomization["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}


def test_selectors_match_their_pods() -> None:
    for r in resources():
        if r["kind"] == "Deployment":
            labels = r["spec"]["template"]["metadata"]["labels"]
            assert r["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = by_name("Service", "asyncrl-trainer")
    trainer = by_name("Deployment", "asyncrl-trainer")
    assert service["spec"]["selector"].items() <= \
        trainer["spec"]["template"]["metadata"]["labels"].items()
    # Workers join before the trainer is ready (ready = they joined).
    assert service["spec"]["publishNotReadyAddresses"] is True
    for port in service["spec"]["ports"]:
        port_number(container(trainer), port["targetPort"])  # names a container port


def test_pods_run_as_the_images_non_root_user() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    for r in resources():
        spec = pod_spec(r) if r["kind"] == "Deployment" else None
        if spec is not None:
            context = spec["securityContext"]
            assert context["runAsNonRoot"] is True
            assert f"USER {context['runAsUser']}:{context['runAsGroup']}" in dockerfile


# -- the worker hosts: `asyncrl worker` from ASYNCRL_* variables ------------------------------
def test_worker_host_is_a_valid_asyncrl_command() -> None:
    c = container(by_name("Deployment", "asyncrl-worker-host"))
    assert "command" not in c  # the image's ENTRYPOINT: asyncrl
    env = env_of(c)
    command = c["args"][0]
    known = option_variables(subparsers(cli.build_parser())[command])
    unknown = {k for k in env if k.startswith("ASYNCRL_")} - set(known)
    assert not unknown, f"variables no option of 'asyncrl {command}' reads: {unknown}"
    parser = cli.build_parser(env)
    args = parser.parse_args(c["args"])  # required options come from the environment
    from asyncrl._cli_env import check_environment

    check_environment(parser, args)
    assert args.reconnect is True  # pods start in any order
    resolve_import_path(args.policy)
    assert args.keys == c["volumeMounts"][0]["mountPath"]
    # probes: the paths the code serves, on the port it serves them
    for probe, path in (("livenessProbe", LIVENESS_PATH), ("readinessProbe", READINESS_PATH)):
        get = c[probe]["httpGet"]
        assert get["path"] == path
        assert port_number(c, get["port"]) == args.probe_port
    # one CPU per worker thread
    assert int(c["resources"]["requests"]["cpu"]) == args.workers * args.threads


def test_workers_connect_to_the_trainers_service_and_port() -> None:
    worker_env = env_of(container(by_name("Deployment", "asyncrl-worker-host")))
    trainer_env = env_of(container(by_name("Deployment", "asyncrl-trainer")))
    service = by_name("Service", "asyncrl-trainer")
    host, port = worker_env["ASYNCRL_CONNECT"].removeprefix("tcp://").rsplit(":", 1)
    assert host == service["metadata"]["name"]
    (collect,) = [p for p in service["spec"]["ports"] if p["port"] == int(port)]
    trainer = container(by_name("Deployment", "asyncrl-trainer"))
    assert port_number(trainer, collect["targetPort"]) == int(
        trainer_env["ASYNCRL_LISTEN"].rsplit(":", 1)[1])
    replicas = by_name("Deployment", "asyncrl-worker-host")["spec"]["replicas"]
    assert int(trainer_env["ASYNCRL_REMOTE_WORKERS"]) == replicas * int(
        worker_env["ASYNCRL_WORKERS"])


# -- the trainer: examples/service.py -----------------------------------------------------------
def test_trainer_runs_the_service_example_with_its_settings() -> None:
    from examples.service import Settings, app

    c = container(by_name("Deployment", "asyncrl-trainer"))
    assert c["command"] == ["python", "-m", "examples.service"]
    help_text = service_help()
    flags = [a for a in c["args"] if a.startswith("--")]
    assert all(f in help_text for f in flags), flags
    settings = {f"ASYNCRL_{f.name.upper()}" for f in dataclasses.fields(Settings)}
    unknown = set(env_of(c)) - settings - {"ASYNCRL_LOG_LEVEL"}
    assert not unknown, f"not settings of examples/service.py: {unknown}"
    env = env_of(c)
    assert env["ASYNCRL_ON_WORKER_LOSS"] in ("raise", "continue", "wait", "restart")
    assert env["ASYNCRL_CURVE_KEYS"] == c["volumeMounts"][0]["mountPath"]
    http = int(c["args"][c["args"].index("--port") + 1])
    routes = {route.path for route in app.routes}  # type: ignore[attr-defined]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] in routes
        assert port_number(c, get["port"]) == http
    assert {c["livenessProbe"]["httpGet"]["path"],
            c["readinessProbe"]["httpGet"]["path"]} == {LIVENESS_PATH, READINESS_PATH}


# -- keys from the Secret -----------------------------------------------------------------------
def secret_volume(spec: dict[str, Any]) -> dict[str, Any]:
    (volume,) = [v for v in spec["volumes"] if "secret" in v]
    assert volume["secret"]["secretName"] == SECRET
    result: dict[str, Any] = volume["secret"]
    return result


def materialize(secret: dict[str, Any], keys: Path, into: Path) -> Path:
    """What the kubelet mounts: each item's key (a file of `asyncrl keys generate`) at its path."""
    for item in secret["items"]:
        source = keys / item["key"]
        assert source.is_file(), f"the Secret's key {item['key']} is no file of asyncrl keys"
        target = into / item["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())
    return into


def key_mounts() -> list[tuple[str, dict[str, Any]]]:
    """(role, secret volume) of every pod that mounts the keys."""
    mounts = [("coordinator", secret_volume(pod_spec(by_name("Deployment", "asyncrl-trainer")))),
              ("worker", secret_volume(pod_spec(by_name("Deployment", "asyncrl-worker-host"))))]
    job = by_name("RayJob", "asyncrl-collect")["spec"]["rayClusterSpec"]
    mounts.append(("coordinator", secret_volume(job["headGroupSpec"]["template"]["spec"])))
    for group in job["workerGroupSpecs"]:
        mounts.append(("worker", secret_volume(group["template"]["spec"])))
    return mounts


def test_the_secrets_items_make_key_directories_that_load(tmp_path: Path) -> None:
    keys = generate_keys(tmp_path / "keys")  # what `asyncrl keys generate keys/` writes
    for i, (role, secret) in enumerate(key_mounts()):
        mounted = materialize(secret, keys, tmp_path / f"mount{i}")
        if role == "coordinator":
            server = CurveServer.from_dir(mounted)
            assert server.authorized_keys()  # the workers' public key is accepted
        else:
            CurveClient.from_dir(mounted)
        assert secret["defaultMode"] == 0o440  # readable by the pod's fsGroup, no one else


# -- KubeRay ------------------------------------------------------------------------------------
def test_rayjob_runs_the_ray_example_with_flags_it_has() -> None:
    from examples.ray_job import parse_args

    job = by_name("RayJob", "asyncrl-collect")
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[:3] == ["python", "-m", "examples.ray_job"]
    args = parse_args(argv[3:])
    cluster = job["spec"]["rayClusterSpec"]
    for group in cluster["workerGroupSpecs"]:
        # one asyncrl worker host fits each worker pod's CPUs; the head takes none
        assert int(group["rayStartParams"]["num-cpus"]) == args.workers_per_host
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert args.port in [p["containerPort"] for p in head["ports"]]
    assert head["volumeMounts"][0]["mountPath"] == args.keys
    resolve_import_path(args.policy)
