"""A worker's malloc gives batch-sized buffers back when freed (asyncrl/_spawn/malloc.py)."""

from __future__ import annotations

import os

import pytest

from asyncrl._spawn.malloc import ENV_VARIABLE, MMAP_THRESHOLD, return_large_buffers

glibc = pytest.mark.skipif(os.confstr("CS_GNU_LIBC_VERSION") is None, reason="glibc only")


@glibc
def test_the_threshold_is_set_on_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VARIABLE, raising=False)
    assert return_large_buffers() is True
    assert MMAP_THRESHOLD == 1 << 20


def test_a_threshold_the_user_set_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VARIABLE, "65536")
    assert return_large_buffers() is False
