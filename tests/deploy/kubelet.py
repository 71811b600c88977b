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
