"""The Kubernetes and KubeRay manifests parse, and name only what exists.

No cluster runs here: these checks read deploy/**/*.yaml and hold them against
the code. Each ``asyncrl`` container's arguments and ``ASYNCRL_*`` variables
must make a command line the real parser accepts; the trainer's must be
settings and flags of examples/service.py; probe paths and ports must be the
ones the code serves; the Secret's items must make key directories that
transports' CURVE loaders accept; the workers' address must be the trainer's
Service and port. And the properties a platform team asks of a workload: an update
that cannot surge past the run, a key per worker host, key folders that a Secret update
reaches live, and the hardening (NetworkPolicy, seccomp, read-only root, no service
account token, a PodDisruptionBudget, a sized /dev/shm).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml", reason="pyyaml (the dev extra) reads the manifests")

from asyncrl import cli  # noqa: E402
from asyncrl._cli_env import option_variables, subparsers  # noqa: E402
from asyncrl._observe.probes import LIVENESS_PATH, READINESS_PATH  # noqa: E402
from asyncrl._rollout.envs import resolve_import_path  # noqa: E402
from transports import (  # noqa: E402
    CurveClient,
    CurveServer,
    add_host,
    generate_keys,
    revoke_host,
)
from transports._keys import AUTHORIZED, ENV_PREFIX, SECRET_KEY  # noqa: E402

from .kubelet import atomic_write, secret_payload  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KUBERAY = ROOT / "deploy" / "kuberay"
SECRET = "asyncrl-curve-keys"  # the shared pair: the RayJob only
WORKLOADS = ("Deployment", "StatefulSet")
HOSTS = "asyncrl-worker-host"


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


def pod_specs(resource: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pod template's spec of a workload or a RayJob."""
    if resource["kind"] in WORKLOADS:
        return [pod_spec(resource)]
    if resource["kind"] == "RayJob":
        cluster = resource["spec"]["rayClusterSpec"]
        groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
        return [g["template"]["spec"] for g in groups]
    return []


def container(resource: dict[str, Any]) -> dict[str, Any]:
    (only,) = pod_spec(resource)["containers"]
    result: dict[str, Any] = only
    return result


def env_of(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: str(e["value"]) for e in c.get("env", []) if "value" in e}


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
        if r["kind"] in WORKLOADS:
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
        spec = pod_spec(r) if r["kind"] in WORKLOADS else None
        if spec is not None:
            context = spec["securityContext"]
            assert context["runAsNonRoot"] is True
            assert f"USER {context['runAsUser']}:{context['runAsGroup']}" in dockerfile


# -- the worker hosts: `asyncrl worker` from ASYNCRL_* variables ------------------------------
def test_worker_host_is_a_valid_asyncrl_command() -> None:
    c = container(by_name("StatefulSet", HOSTS))
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
    worker_env = env_of(container(by_name("StatefulSet", HOSTS)))
    trainer_env = env_of(container(by_name("Deployment", "asyncrl-trainer")))
    service = by_name("Service", "asyncrl-trainer")
    host, port = worker_env["ASYNCRL_CONNECT"].removeprefix("tcp://").rsplit(":", 1)
    assert host == service["metadata"]["name"]
    (collect,) = [p for p in service["spec"]["ports"] if p["port"] == int(port)]
    trainer = container(by_name("Deployment", "asyncrl-trainer"))
    assert port_number(trainer, collect["targetPort"]) == int(
        trainer_env["ASYNCRL_LISTEN"].rsplit(":", 1)[1])
    replicas = by_name("StatefulSet", HOSTS)["spec"]["replicas"]
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
    unknown = set(env_of(c)) - settings - {"ASYNCRL_LOG_LEVEL"} - set(TRAINER_KEY_VARIABLES)
    assert not unknown, f"not settings of examples/service.py nor CURVE variables: {unknown}"
    env = env_of(c)
    assert env["ASYNCRL_ON_WORKER_LOSS"] in ("raise", "continue", "wait", "restart")
    assert "ASYNCRL_CURVE_KEYS" not in env  # the keys come as three mounts (see below)
    http = int(c["args"][c["args"].index("--port") + 1])
    routes = {route.path for route in app.routes}  # type: ignore[attr-defined]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] in routes
        assert port_number(c, get["port"]) == http
    assert {c["livenessProbe"]["httpGet"]["path"],
            c["readinessProbe"]["httpGet"]["path"]} == {LIVENESS_PATH, READINESS_PATH}


# -- keys from Secrets ----------------------------------------------------------------------------
TRAINER_KEY_VARIABLES = (f"{ENV_PREFIX}{SECRET_KEY}_FILE", f"{ENV_PREFIX}{AUTHORIZED}")


def secret_data(keys: Path) -> dict[str, dict[str, bytes]]:
    """The Secrets docs/deploy.md makes from ``asyncrl keys`` DIR: {name: {key: content}}."""
    def files(*paths: Path) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in paths if p.is_file()}

    data = {
        "asyncrl-coordinator-key": files(keys / "coordinator.key", keys / "coordinator.key_secret"),
        "asyncrl-authorized-keys": files(*sorted((keys / "authorized").glob("*.key"))),
        "asyncrl-revoked-keys": files(*sorted((keys / "revoked").glob("*.key"))),
        SECRET: files(*(keys / n for n in ("coordinator.key", "coordinator.key_secret",
                                           "worker.key", "worker.key_secret"))),
    }
    for host in sorted((keys / "hosts").glob("*")):
        data[host.name] = files(*sorted(host.iterdir()))
    data["asyncrl-control-token"] = {"token": b"a-bearer-token"}  # not a key: docs/deploy.md
    return data


def volume_named(spec: dict[str, Any], name: str) -> dict[str, Any]:
    (volume,) = [v for v in spec["volumes"] if v["name"] == name]
    result: dict[str, Any] = volume
    return result


def mount(volume: dict[str, Any], data: dict[str, dict[str, bytes]], into: Path) -> Path:
    """What the kubelet makes of a secret or projected volume, ..data symlinks and all."""
    payload: dict[str, bytes] = {}
    if "secret" in volume:
        sources = [{"secret": {"name": volume["secret"]["secretName"],
                               **{k: v for k, v in volume["secret"].items() if k != "secretName"}}}]
    else:
        sources = volume["projected"]["sources"]
    for source in sources:
        secret = source["secret"]
        if secret["name"] not in data:
            assert secret.get("optional") is True, f"Secret {secret['name']} is missing"
            continue
        payload.update(secret_payload(data[secret["name"]], secret.get("items")))
    atomic_write(into, payload)
    return into


def trainer_key_dirs(data: dict[str, dict[str, bytes]], into: Path) -> dict[str, str]:
    """The trainer's key mounts under ``into``; returns its CURVE variables, re-rooted."""
    trainer = by_name("Deployment", "asyncrl-trainer")
    c, spec = container(trainer), pod_spec(trainer)
    for m in c["volumeMounts"]:
        volume = volume_named(spec, m["name"])
        if "secret" in volume:
            assert "subPath" not in m and "subPathExpr" not in m  # a subPath never updates
            mount(volume, data, into / m["mountPath"].lstrip("/"))
    env = env_of(c)
    return {name: str(into / env[name].lstrip("/")) for name in TRAINER_KEY_VARIABLES}


def worker_key_dir(data: dict[str, dict[str, bytes]], ordinal: int, into: Path) -> Path:
    """What worker host ``ordinal`` sees at its keys' mount path (its subPathExpr folder)."""
    hosts = by_name("StatefulSet", HOSTS)
    c, spec = container(hosts), pod_spec(hosts)
    (keys_mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == env_of(c)["ASYNCRL_KEYS"]]
    assert keys_mount["subPathExpr"] == "$(POD_NAME)"
    volume = mount(volume_named(spec, keys_mount["name"]), data, into)
    return volume / f"{HOSTS}-{ordinal}"  # POD_NAME of a StatefulSet's pod: NAME-ORDINAL


def documented_keys(tmp_path: Path, hosts: int) -> Path:
    """docs/deploy.md's commands: generate, a key per worker host, the shared pair revoked."""
    keys = generate_keys(tmp_path / "keys")
    for ordinal in range(hosts):
        add_host(keys, f"{HOSTS}-{ordinal}")
    revoke_host(keys, "worker")
    return keys


def test_each_worker_host_has_a_key_of_its_own_that_the_trainer_accepts(tmp_path: Path) -> None:
    hosts = by_name("StatefulSet", HOSTS)
    replicas = hosts["spec"]["replicas"]
    data = secret_data(documented_keys(tmp_path, replicas))
    server = CurveServer.from_env(trainer_key_dirs(data, tmp_path / "trainer"))
    assert server is not None
    accepted = server.authorized_keys()
    seen = set()
    for ordinal in range(replicas):
        client = CurveClient.from_dir(worker_key_dir(data, ordinal, tmp_path / f"pod{ordinal}"))
        assert client.server_key == server.public_key
        assert accepted.allows(client.public_key)
        assert accepted.name_of(client.public_key) == f"{HOSTS}-{ordinal}"  # the log's name
        seen.add(client.public_key)
    assert len(seen) == replicas  # no two hosts share a key
    shared = CurveClient.from_dir(tmp_path / "keys" / "hosts" / f"{HOSTS}-0")
    assert shared.public_key in seen  # (the pair of `asyncrl keys generate` is revoked:)
    assert not (tmp_path / "keys" / "worker.key_secret").exists()


def test_the_key_volume_has_a_secret_per_ordinal_and_each_pod_sees_only_its_own() -> None:
    hosts = by_name("StatefulSet", HOSTS)
    c, spec = container(hosts), pod_spec(hosts)
    (pod_name,) = [e for e in c["env"] if e["name"] == "POD_NAME"]
    assert pod_name["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    sources = [s["secret"] for s in volume_named(spec, "host-keys")["projected"]["sources"]]
    names = [s["name"] for s in sources]
    assert names == [f"{HOSTS}-{i}" for i in range(len(names))]
    assert len(names) >= hosts["spec"]["replicas"]
    for secret in sources:
        assert secret["optional"] is True  # the ordinals not running need no Secret
        assert {i["path"] for i in secret["items"]} == {
            f"{secret['name']}/worker.key_secret", f"{secret['name']}/coordinator.key"}


def test_the_trainer_mounts_authorized_and_revoked_whole_beside_each_other() -> None:
    trainer = by_name("Deployment", "asyncrl-trainer")
    c, spec = container(trainer), pod_spec(trainer)
    env = env_of(c)
    mounts = {m["mountPath"]: volume_named(spec, m["name"]) for m in c["volumeMounts"]}
    authorized = Path(env["ASYNCRL_CURVE_AUTHORIZED"])
    revoked = authorized.parent / "revoked"  # where transports looks for it
    for path in (authorized, revoked):
        secret = mounts[str(path)]["secret"]
        assert "items" not in secret  # whole: a Secret update reaches the running trainer
    assert mounts[str(revoked)]["secret"]["optional"] is True  # nothing revoked yet: empty
    assert env["ASYNCRL_CURVE_SECRET_KEY_FILE"].startswith(
        next(p for p, v in mounts.items() if v["secret"]["secretName"] ==
             "asyncrl-coordinator-key"))


def key_mounts() -> list[tuple[str, dict[str, Any]]]:
    """(role, secret volume) of every RayJob pod: they share the pair of SECRET."""
    mounts = []
    job = by_name("RayJob", "asyncrl-collect")["spec"]["rayClusterSpec"]
    mounts.append(("coordinator", volume_named(job["headGroupSpec"]["template"]["spec"],
                                               "curve-keys")))
    for group in job["workerGroupSpecs"]:
        mounts.append(("worker", volume_named(group["template"]["spec"], "curve-keys")))
    return mounts


def test_the_rayjobs_secret_items_make_key_directories_that_load(tmp_path: Path) -> None:
    data = secret_data(generate_keys(tmp_path / "keys"))
    for i, (role, volume) in enumerate(key_mounts()):
        assert volume["secret"]["secretName"] == SECRET
        mounted = mount(volume, data, tmp_path / f"mount{i}")
        if role == "coordinator":
            assert CurveServer.from_dir(mounted).authorized_keys().keys
        else:
            CurveClient.from_dir(mounted)


def test_key_files_are_readable_by_the_pods_group_only() -> None:
    for r in resources():
        specs = pod_specs(r)
        for spec in specs:
            for volume in spec.get("volumes", []):
                source = volume.get("secret") or volume.get("projected")
                if source is not None:
                    assert source["defaultMode"] == 0o440, volume["name"]


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


# -- rolling updates: never more hosts than the run has places ---------------------------------
def most_pods_during_an_update(workload: dict[str, Any]) -> int:
    """The most pods of ``workload`` that an update may run at once (replicas + surge)."""
    replicas = int(workload["spec"]["replicas"])
    if workload["kind"] == "StatefulSet":
        # A StatefulSet deletes a pod before it makes the pod's replacement (same name).
        assert workload["spec"]["updateStrategy"]["type"] == "RollingUpdate"
        return replicas
    strategy = workload["spec"]["strategy"]
    if strategy["type"] == "Recreate":
        return replicas
    surge = strategy.get("rollingUpdate", {}).get("maxSurge", "25%")  # Kubernetes' default
    assert isinstance(surge, int), f"maxSurge {surge!r}: a percentage rounds up (a surge pod)"
    return replicas + surge


def test_an_update_of_the_worker_hosts_cannot_surge_past_the_run() -> None:
    hosts = by_name("StatefulSet", HOSTS)
    trainer_env = env_of(container(by_name("Deployment", "asyncrl-trainer")))
    per_host = int(env_of(container(hosts))["ASYNCRL_WORKERS"])
    places = int(trainer_env["ASYNCRL_REMOTE_WORKERS"])
    # A surge pod would be refused as "the run is full" and never get ready: the update
    # would stall at its deadline (issue #36). One pod at a time, the old one gone first:
    assert most_pods_during_an_update(hosts) * per_host <= places
    assert "maxUnavailable" not in hosts["spec"]["updateStrategy"].get("rollingUpdate", {})
    # ... and the update waits for each new host's readiness (= admitted) before the next.
    assert container(hosts)["readinessProbe"]["httpGet"]["path"] == READINESS_PATH


def test_the_trainer_is_never_two() -> None:
    trainer = by_name("Deployment", "asyncrl-trainer")
    assert trainer["spec"]["replicas"] == 1
    assert most_pods_during_an_update(trainer) == 1  # Recreate: old one stopped first


def test_a_surging_deployment_would_be_caught() -> None:
    surging = {"kind": "Deployment", "spec": {"replicas": 2, "strategy": {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}}}
    assert most_pods_during_an_update(surging) == 2
    surging["spec"]["strategy"] = {"type": "RollingUpdate"}
    with pytest.raises(AssertionError, match="maxSurge '25%'"):
        most_pods_during_an_update(surging)


# -- hardening ----------------------------------------------------------------------------------
def every_pod() -> list[tuple[str, dict[str, Any]]]:
    pods = [(r["metadata"]["name"], spec) for r in resources() for spec in pod_specs(r)]
    assert len(pods) == 4  # trainer, worker hosts, Ray head, Ray workers
    return pods


def test_every_pod_is_locked_down() -> None:
    for name, spec in every_pod():
        assert spec["automountServiceAccountToken"] is False, name
        assert spec["enableServiceLinks"] is False, name  # no ASYNCRL_* from Services
        context = spec["securityContext"]
        assert context["runAsNonRoot"] is True, name
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for c in spec["containers"]:
            own = c["securityContext"]
            assert own["runAsNonRoot"] is True, name
            assert own["allowPrivilegeEscalation"] is False, name
            assert own["readOnlyRootFilesystem"] is True, name
            assert own["capabilities"] == {"drop": ["ALL"]}, name
            assert c["imagePullPolicy"] == "Always", name
            limits, requests = c["resources"]["limits"], c["resources"]["requests"]
            assert {"cpu", "memory"} <= set(limits) and {"cpu", "memory"} <= set(requests)


def test_what_is_written_goes_to_bounded_emptydirs_and_shm_is_sized() -> None:
    for name, spec in every_pod():
        (c,) = spec["containers"]
        mounts = {m["mountPath"]: volume_named(spec, m["name"]) for m in c["volumeMounts"]}
        tmp, shm = mounts["/tmp"]["emptyDir"], mounts["/dev/shm"]["emptyDir"]
        assert tmp["sizeLimit"], name
        assert shm["medium"] == "Memory", name
        shm_bytes = quantity(shm["sizeLimit"])
        # tmpfs counts as the container's memory: room for it under the limit
        assert shm_bytes < quantity(c["resources"]["limits"]["memory"]), name


def quantity(text: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    for unit, factor in units.items():
        if text.endswith(unit):
            return int(text.removesuffix(unit)) * factor
    return int(text)


def test_rays_object_store_fits_in_its_shm() -> None:
    cluster = by_name("RayJob", "asyncrl-collect")["spec"]["rayClusterSpec"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        spec = group["template"]["spec"]
        store = int(group["rayStartParams"]["object-store-memory"])
        assert store < quantity(volume_named(spec, "shm")["emptyDir"]["sizeLimit"])


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return bool(selector.get("matchLabels")) and selector["matchLabels"].items() <= labels.items()


def test_network_policies_admit_only_the_runs_own_traffic() -> None:
    policies = [r for r in resources() if r["kind"] == "NetworkPolicy"]
    trainer, hosts = by_name("Deployment", "asyncrl-trainer"), by_name("StatefulSet", HOSTS)
    labels_of = {w["metadata"]["name"]: w["spec"]["template"]["metadata"]["labels"]
                 for w in (trainer, hosts)}
    for name, labels in labels_of.items():
        (policy,) = [p for p in policies if selects(p["spec"]["podSelector"], labels)]
        assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"], name  # default deny
    (to_trainer,) = [p for p in policies if selects(p["spec"]["podSelector"],
                                                    labels_of["asyncrl-trainer"])]
    collect = [rule for rule in to_trainer["spec"]["ingress"]
               if {"port": "collect", "protocol": "TCP"} in rule["ports"]]
    (rule,) = collect
    assert [selects(peer["podSelector"], labels_of[HOSTS]) for peer in rule["from"]] == [True]
    (from_hosts,) = [p for p in policies if selects(p["spec"]["podSelector"], labels_of[HOSTS])]
    listen = int(env_of(container(trainer))["ASYNCRL_LISTEN"].rsplit(":", 1)[1])
    assert any(rule["ports"] == [{"port": listen, "protocol": "TCP"}]
               and selects(rule["to"][0]["podSelector"], labels_of["asyncrl-trainer"])
               for rule in from_hosts["spec"]["egress"])


def test_a_disruption_takes_one_worker_host_at_a_time() -> None:
    hosts = by_name("StatefulSet", HOSTS)
    (budget,) = [r for r in resources() if r["kind"] == "PodDisruptionBudget"
                 and selects(r["spec"]["selector"], hosts["spec"]["template"]["metadata"][
                     "labels"])]
    assert budget["spec"]["maxUnavailable"] == 1


def test_the_statefulsets_service_is_headless_and_governs_it() -> None:
    hosts = by_name("StatefulSet", HOSTS)
    service = by_name("Service", hosts["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"
    assert selects({"matchLabels": service["spec"]["selector"]},
                   hosts["spec"]["template"]["metadata"]["labels"])


def test_docs_deploy_md_creates_every_secret_the_manifests_need() -> None:
    text = (ROOT / "docs" / "deploy.md").read_text()
    created = set(re.findall(r"kubectl create secret generic (\S+)", text))
    needed = set()
    for r in resources():
        for spec in pod_specs(r):
            for volume in spec.get("volumes", []):
                if "secret" in volume and not volume["secret"].get("optional"):
                    needed.add(volume["secret"]["secretName"])
    replicas = by_name("StatefulSet", HOSTS)["spec"]["replicas"]
    needed |= {f"{HOSTS}-{i}" for i in range(replicas)}  # the ordinals that run
    assert needed - created == set(), "docs/deploy.md never makes these Secrets"
    assert "asyncrl-revoked-keys" in created  # optional, but the revocation applies it
