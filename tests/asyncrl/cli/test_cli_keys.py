"""``asyncrl keys``: the forms docs/security.md and the CLI help write work as written."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl import cli
from transports import CurveClient, CurveServer


def keys(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["keys", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def listed(capsys: pytest.CaptureFixture[str], directory: Path) -> dict[str, str]:
    code, out, _ = keys(capsys, "list", str(directory))
    assert code == 0
    return {line.split("\t")[0]: line.split("\t")[1] for line in out.splitlines()}


def test_the_shared_pair_is_revoked_as_security_md_writes_it(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    root = tmp_path / "keys"
    assert keys(capsys, "generate", str(root))[0] == 0
    assert keys(capsys, "add-host", str(root), "gpu1")[0] == 0
    shared = CurveClient.from_dir(root).public_key
    # docs/security.md: `asyncrl keys revoke keys/ worker  # no host uses the shared pair`
    code, out, err = keys(capsys, "revoke", str(root), "worker")
    assert (code, err) == (0, "")
    assert out.startswith(f"revoked worker ({root / 'revoked' / 'worker.key'})")
    assert listed(capsys, root) == {"gpu1": "authorized", "worker": "revoked"}
    assert not (root / "worker.key_secret").exists()  # nobody can use the pair any more
    accepted = CurveServer.from_dir(root).authorized_keys()
    assert not accepted.allows(shared)
    assert accepted.allows(CurveClient.from_dir(root / "hosts" / "gpu1").public_key)


def test_revoking_the_shared_pair_twice_says_it_is_already_revoked(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    root = tmp_path / "keys"
    keys(capsys, "generate", str(root))
    assert keys(capsys, "revoke", str(root), "worker")[0] == 0
    code, _, err = keys(capsys, "revoke", str(root), "worker")
    assert code == 2
    assert err.startswith("asyncrl keys: 'worker' is already revoked")


def test_no_host_may_take_the_reserved_names(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    root = tmp_path / "keys"
    keys(capsys, "generate", str(root))
    for name in ("worker", "coordinator"):
        code, _, err = keys(capsys, "add-host", str(root), name)
        assert code == 2 and "other than 'coordinator' and 'worker'" in err
    code, _, err = keys(capsys, "revoke", str(root), "coordinator")
    assert code == 2 and "other than 'coordinator' and 'worker'" in err
