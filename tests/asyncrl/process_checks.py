"""Checks on processes shared by the tests: is a pid still a live (non-zombie) process."""

from __future__ import annotations


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie or a pid that is gone counts as dead."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
