"""CURVE keys on disk and in the environment; the key directory (hosts, revocation)."""

from __future__ import annotations

import os

import pytest
import zmq

from asyncrl.cli import main
from transports import (
    AuthorizedKeys,
    CurveClient,
    CurveServer,
    TransportError,
    add_host,
    generate_keys,
    list_keys,
    revoke_host,
)
from transports._keys import read_key_file


def bare(path, key: bytes) -> str:
    path.write_text(key.decode() + "\n")
    return str(path)


def test_a_key_file_is_a_zeromq_certificate_or_the_bare_key(tmp_path) -> None:
    keys = generate_keys(tmp_path / "keys")
    public, secret = zmq.auth.load_certificate(keys / "worker.key_secret")
    assert read_key_file(keys / "worker.key_secret", secret=True) == secret
    assert read_key_file(keys / "worker.key_secret", secret=False) == public
    assert read_key_file(keys / "worker.key", secret=False) == public
    assert read_key_file(bare(tmp_path / "tls.key", secret), secret=True) == secret
    with pytest.raises(TransportError, match="holds no secret-key"):
        read_key_file(keys / "worker.key", secret=True)
    with pytest.raises(TransportError, match="40-character"):
        read_key_file(bare(tmp_path / "short", b"abc"), secret=True)
    with pytest.raises(TransportError, match="cannot read"):
        read_key_file(tmp_path / "missing", secret=True)


def test_a_worker_takes_its_keys_from_the_environment(tmp_path) -> None:
    keys = generate_keys(tmp_path / "keys")
    from_dir = CurveClient.from_dir(keys)
    env = {"ASYNCRL_CURVE_SECRET_KEY": from_dir.secret_key.decode(),
           "ASYNCRL_CURVE_SERVER_KEY_FILE": str(keys / "coordinator.key")}
    assert CurveClient.from_env(env) == from_dir
    assert CurveClient.load(None, env) == from_dir
    # A secret mount of another layout: one bare key per file.
    env = {"ASYNCRL_CURVE_SECRET_KEY_FILE": bare(tmp_path / "secret", from_dir.secret_key),
           "ASYNCRL_CURVE_SERVER_KEY": from_dir.server_key.decode()}
    assert CurveClient.load(None, env) == from_dir
    assert CurveClient.load(keys, {}) == from_dir  # a directory wins
    assert CurveClient.load(None, {}) is None  # nothing set: no CURVE
    with pytest.raises(TransportError, match="SECRET_KEY"):
        CurveClient.from_env({"ASYNCRL_CURVE_SERVER_KEY": from_dir.server_key.decode()})
    with pytest.raises(TransportError, match="keep one"):
        CurveClient.from_env({**env, "ASYNCRL_CURVE_SERVER_KEY_FILE": "x"})


def test_a_collector_takes_its_keys_from_the_environment(tmp_path) -> None:
    keys = generate_keys(tmp_path / "keys")
    from_dir = CurveServer.from_dir(keys)
    env = {"ASYNCRL_CURVE_SECRET_KEY_FILE": str(keys / "coordinator.key_secret"),
           "ASYNCRL_CURVE_AUTHORIZED": str(keys / "authorized")}
    assert CurveServer.load(None, env) == from_dir
    worker = CurveClient.from_dir(keys).public_key
    fixed = CurveServer.from_env({"ASYNCRL_CURVE_SECRET_KEY": from_dir.secret_key.decode(),
                                  "ASYNCRL_CURVE_AUTHORIZED_KEYS": f" {worker.decode()} ,"})
    assert fixed is not None and fixed.authorized_keys().keys == {worker}
    assert CurveServer.load(None, {"ASYNCRL_CURVE_SECRET_KEY": "x" * 40}) is None
    with pytest.raises(TransportError, match="secret key is missing"):
        CurveServer.from_env({"ASYNCRL_CURVE_AUTHORIZED": str(keys / "authorized")})


def test_each_host_gets_its_own_pair_and_a_revoked_name_stays_taken(tmp_path) -> None:
    keys = generate_keys(tmp_path / "keys")
    host = add_host(keys, "gpu1")
    assert sorted(p.name for p in host.iterdir()) == [
        "coordinator.key", "worker.key", "worker.key_secret"]
    assert os.stat(host / "worker.key_secret").st_mode & 0o077 == 0
    client = CurveClient.from_dir(host)
    assert client.public_key != CurveClient.from_dir(keys).public_key
    assert client.server_key == CurveServer.from_dir(keys).public_key
    assert CurveServer.from_dir(keys).authorized_keys().allows(client.public_key)
    with pytest.raises(FileExistsError):
        add_host(keys, "gpu1")
    with pytest.raises(ValueError, match="host name"):
        add_host(keys, "../evil")

    revoke_host(keys, "gpu1")
    assert not CurveServer.from_dir(keys).authorized_keys().allows(client.public_key)
    assert not (host / "worker.key_secret").exists()
    assert [(e.name, e.state) for e in list_keys(keys)] == [
        ("worker", "authorized"), ("gpu1", "revoked")]
    with pytest.raises(FileExistsError):
        add_host(keys, "gpu1")
    with pytest.raises(FileNotFoundError, match="already revoked"):
        revoke_host(keys, "gpu1")


def test_a_revoked_key_stays_refused_even_if_copied_back(tmp_path) -> None:
    keys = generate_keys(tmp_path / "keys")
    host = add_host(keys, "gpu1")
    revoke_host(keys, "gpu1")
    (keys / "authorized" / "again.key").write_bytes((host / "worker.key").read_bytes())
    public = CurveClient.from_dir(keys).public_key
    authorized = CurveServer.from_dir(keys).authorized_keys()
    assert authorized.keys == {public}


def test_authorized_keys_follow_the_directory(tmp_path) -> None:
    keys = generate_keys(tmp_path / "keys")
    authorized = AuthorizedKeys(keys / "authorized")
    assert authorized.reload_if_changed() is None  # nothing changed
    new = CurveClient.from_dir(add_host(keys, "gpu1")).public_key
    assert authorized.reload_if_changed() == ({new}, set())
    assert authorized.allows(new) and authorized.name_of(new) == "gpu1"
    revoke_host(keys, "gpu1")
    assert authorized.reload_if_changed() == (set(), {new})
    (keys / "authorized" / "broken.key").write_text("not a key")
    assert authorized.reload_if_changed() == (set(), set())  # skipped, logged
    with pytest.raises(TransportError, match="missing"):
        AuthorizedKeys(tmp_path / "nowhere")


def test_cli_keys_add_host_revoke_and_list(tmp_path, capsys) -> None:
    keys = tmp_path / "keys"
    assert main(["keys", "generate", str(keys)]) == 0
    assert main(["keys", "add-host", str(keys), "gpu1"]) == 0
    assert "hosts/gpu1" in capsys.readouterr().out
    assert main(["keys", "add-host", str(keys), "gpu1"]) == 2
    assert "taken" in capsys.readouterr().err
    assert main(["keys", "revoke", str(keys), "gpu1"]) == 0
    assert main(["keys", "revoke", str(keys), "nobody"]) == 2
    capsys.readouterr()
    assert main(["keys", "list", str(keys)]) == 0
    lines = [line.split("\t")[:2] for line in capsys.readouterr().out.splitlines()]
    assert lines == [["worker", "authorized"], ["gpu1", "revoked"]]


def test_cli_worker_reads_its_keys_from_the_environment(monkeypatch, capsys) -> None:
    monkeypatch.setenv("ASYNCRL_CURVE_SERVER_KEY", "x" * 39)  # one short: not a key
    assert main(["worker", "--connect", "tcp://127.0.0.1:1", "--env", "CartPole-v1"]) == 2
    assert "$ASYNCRL_CURVE_SERVER_KEY: expected a 40-character" in capsys.readouterr().err
