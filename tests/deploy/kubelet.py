"""What the kubelet does with a Secret volume, for tests that have no cluster.

:func:`atomic_write` is the kubelet's AtomicWriter (pkg/volume/util/atomic_writer.go):
the payload goes into a fresh timestamped folder ``..2026_11_28_17_30_00.NNN``, a
symlink ``..data_tmp`` to it is renamed over ``..data`` (the one atomic step), the
visible names are symlinks into ``..data``, and stale names and the old folder go.
A process that watches the mount sees the old files or the new ones, never a mix.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

DATA = "..data"


def atomic_write(target: Path, payload: dict[str, bytes], mode: int = 0o440) -> None:
    """Make ``target`` hold exactly ``payload`` ({relative path: content}), as a kubelet."""
    target.mkdir(parents=True, exist_ok=True)
    data = target / DATA
    old = os.readlink(data) if data.is_symlink() else None
    stamp = time.strftime("..%Y_%m_%d_%H_%M_%S.", time.gmtime())
    fresh = Path(tempfile.mkdtemp(prefix=stamp, dir=target))
    fresh.chmod(0o755)
    for relative, content in payload.items():
        path = fresh / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        path.chmod(mode)
    visible = {relative.split("/", 1)[0] for relative in payload}
    for name in visible:  # new names first: they dangle until ..data is swapped
        if not (target / name).is_symlink():
            os.symlink(f"{DATA}/{name}", target / name)
    os.symlink(fresh.name, target / "..data_tmp")
    os.rename(target / "..data_tmp", data)
    for entry in target.iterdir():
        if not entry.name.startswith("..") and entry.name not in visible:
            entry.unlink()
    if old is not None:
        shutil.rmtree(target / old)


def secret_payload(secret: dict[str, bytes], items: list[dict[str, str]] | None
                   ) -> dict[str, bytes]:
    """A Secret's data as a volume lays it out: every key by its name, or ``items`` only."""
    if items is None:
        return dict(secret)
    return {item["path"]: secret[item["key"]] for item in items}


def volume_payload(volume: dict[str, Any], secrets: dict[str, dict[str, bytes]]
                   ) -> dict[str, bytes] | None:
    """A Secret or projected volume's files from ``secrets``; None for other volumes.

    A missing Secret is an error unless the manifest says ``optional: true`` (an
    empty folder then, filled once it exists), as the kubelet does.
    """
    if "secret" in volume:
        sources = [dict(volume["secret"], name=volume["secret"]["secretName"])]
    elif "projected" in volume:
        sources = [source["secret"] for source in volume["projected"]["sources"]]
    else:
        return None
    payload: dict[str, bytes] = {}
    for source in sources:
        if source["name"] not in secrets:
            assert source.get("optional"), f"Secret {source['name']} is missing (not optional)"
            continue
        payload |= secret_payload(secrets[source["name"]], source.get("items"))
    return payload


def mount_volumes(spec: dict[str, Any], pod: str, root: Path,
                  secrets: dict[str, dict[str, bytes]], claims: Path) -> None:
    """Lay out a pod's volumes under ``root``, each at its mount path (re-rooted).

    Secret volumes are written by :func:`atomic_write`; a ``subPathExpr`` mount is
    bound once, at the start, to the folder ``..data`` points to then (so it never
    sees an update, as with a real subPath); a claim is a folder under ``claims``
    that outlives the pod; an emptyDir is a fresh folder.
    """
    volumes = {v["name"]: v for v in spec["volumes"]}
    (container,) = spec["containers"]
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        target = root / mount["mountPath"].lstrip("/")
        payload = volume_payload(volume, secrets)
        if "subPathExpr" in mount:
            assert mount["subPathExpr"] == "$(POD_NAME)", mount
            folder = root / "volumes" / mount["name"]
            atomic_write(folder, payload or {})
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to((folder / pod).resolve())
        elif payload is not None:
            atomic_write(target, payload)
        elif "persistentVolumeClaim" in volume:
            claim = claims / volume["persistentVolumeClaim"]["claimName"]
            claim.mkdir(parents=True, exist_ok=True)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(claim)
        else:
            target.mkdir(parents=True, exist_ok=True)


def sync_volumes(spec: dict[str, Any], root: Path, secrets: dict[str, dict[str, bytes]]) -> None:
    """The kubelet's periodic sync: whole Secret volumes rewritten (subPath ones unseen)."""
    volumes = {v["name"]: v for v in spec["volumes"]}
    for mount in spec["containers"][0].get("volumeMounts", []):
        payload = volume_payload(volumes[mount["name"]], secrets)
        if payload is not None and "subPathExpr" not in mount:
            atomic_write(root / mount["mountPath"].lstrip("/"), payload)
