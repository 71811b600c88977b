"""A full /dev/shm is a clear error where a block is made, never a SIGBUS later (issue #35.3).

tmpfs hands out pages on first touch: a segment sized with ``ftruncate`` alone on a
/dev/shm too small for it is created fine and kills whoever writes its far pages
with SIGBUS. The real test runs Python in a mount namespace of its own
(``unshare --mount``) with a 4 MiB tmpfs on its /dev/shm, so that glibc's
``shm_open`` path is the one exercised and no other test sees the small tmpfs;
it is skipped where mounting is refused (not root, no user namespaces). The
unit tests fake ``posix_fallocate``'s answer and run anywhere. The collectors'
side (weights, central inference) is in ``tests/chaos/test_full_dev_shm.py``.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import transports
from transports import SharedMemoryFullError, TransportError
from transports._shm import SharedTensorBlock
from transports._shm_segment import NAME_PREFIX

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20


def in_small_shm(code: str, *, size: str = "4m", timeout: float = 120) -> dict[str, Any]:
    """Run ``code`` (which prints one JSON line last) with a ``size`` tmpfs as /dev/shm."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here to give a process a /dev/shm of its own")
    script = f"mount -t tmpfs -o size={size} tmpfs /dev/shm && exec \"$0\" -c \"$1\""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(["unshare", "--mount", "sh", "-c", script, sys.executable,
                           textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    if done.returncode != 0 and "mount" in done.stderr and "Traceback" not in done.stderr:
        pytest.skip(f"cannot mount a tmpfs in a mount namespace here: {done.stderr.strip()}")
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_block_larger_than_a_small_dev_shm_fails_at_creation_and_leaves_nothing() -> None:
    result = in_small_shm("""
        import json, os, torch
        from transports import SharedMemoryFullError
        from transports._shm import SharedTensorBlock

        fits = SharedTensorBlock.create({"w": torch.zeros(256 * 1024)}, slots=1,  # 1 MiB
                                        sealed=False)
        try:
            SharedTensorBlock.create({"w": torch.zeros(2 * 1024 * 1024)}, slots=1,  # 8 MiB
                                     sealed=False)
            raised = None
        except SharedMemoryFullError as exc:
            raised = {"message": str(exc), "needed": exc.needed, "free": exc.free}
        left = sorted(os.listdir("/dev/shm"))
        # The block that fits still works after the refusal.
        fits.write({"w": torch.full((256 * 1024,), 7.0)}, version=1)
        version, out = fits.read(0)
        ok = version == 1 and bool((out["w"] == 7.0).all())
        name = fits.name
        fits.close(); fits.unlink()
        print(json.dumps({"raised": raised, "left": left, "fits": name, "ok": ok,
                          "after": sorted(os.listdir("/dev/shm"))}))
    """)
    raised = result["raised"]
    assert raised is not None, "an 8 MiB block on a 4 MiB /dev/shm was created (SIGBUS later)"
    assert raised["needed"] > 8 * MIB and 2 * MIB < raised["free"] < 3 * MIB
    message = raised["message"]
    for words in ("/dev/shm", str(raised["needed"]), str(raised["free"]), "--shm-size",
                  "emptyDir", "sizeLimit"):
        assert words in message, (words, message)
    assert result["left"] == [result["fits"]], "the refused block left a segment behind"
    assert result["ok"] and result["after"] == []


def test_blocks_that_fit_fill_a_small_dev_shm_to_the_last_page_without_sigbus() -> None:
    # Three 1 MiB blocks on a 4 MiB tmpfs are written in full (every page touched).
    result = in_small_shm("""
        import json, torch
        from transports._shm import SharedTensorBlock

        blocks = [SharedTensorBlock.create({"w": torch.zeros(256 * 1024)}, slots=1,
                                           sealed=False)
                  for _ in range(3)]
        versions = []
        for i, block in enumerate(blocks):
            block.write({"w": torch.full((256 * 1024,), float(i))}, version=i + 1)
            versions.append(block.read(0)[0])
            block.close(); block.unlink()
        print(json.dumps({"versions": versions}))
    """)
    assert result["versions"] == [1, 2, 3]


def _no_room(fd: int, offset: int, length: int) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _our_segments() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith(f"{NAME_PREFIX}{os.getpid()}_")}


@pytest.mark.skipif(not hasattr(os, "posix_fallocate"), reason="no posix_fallocate here")
def test_no_room_to_reserve_raises_the_full_error_and_unlinks_the_segment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    before = _our_segments()
    monkeypatch.setattr(os, "posix_fallocate", _no_room)
    with pytest.raises(SharedMemoryFullError) as caught:
        SharedTensorBlock.create({"w": torch.zeros(1024)}, sealed=False)
    error = caught.value
    assert isinstance(error, TransportError) and error.needed > 4096 and error.free > 0
    assert error.directory == "/dev/shm" and "/dev/shm is too small" in str(error)
    assert _our_segments() == before


def test_another_reservation_failure_propagates_and_unlinks_the_segment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.EIO, "disk on fire")

    before = _our_segments()
    monkeypatch.setattr(os, "posix_fallocate", failing, raising=False)
    with pytest.raises(OSError, match="disk on fire"):
        SharedTensorBlock.create({"w": torch.zeros(1024)}, sealed=False)
    assert _our_segments() == before


def test_without_fallocate_a_plainly_too_big_block_is_refused_from_the_free_space(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def unsupported(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.EOPNOTSUPP, "not here")

    class Tiny:
        f_bavail, f_frsize = 1, 4096

    monkeypatch.setattr(os, "posix_fallocate", unsupported, raising=False)
    monkeypatch.setattr(os, "fstatvfs", lambda fd: Tiny())
    before = _our_segments()
    with pytest.raises(SharedMemoryFullError, match="4096 bytes"):
        SharedTensorBlock.create({"w": torch.zeros(1024)}, sealed=False)
    assert _our_segments() == before


def test_the_full_error_is_part_of_the_public_face() -> None:
    assert transports.SharedMemoryFullError is SharedMemoryFullError
    assert "SharedMemoryFullError" in transports.__all__
