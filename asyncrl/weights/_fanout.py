"""Weights sent once to a host's relay, which fans them out to that host's workers.

The sender adds ``RELAY_TO`` to a weight message's meta: the peer identities
of the workers the relay must deliver it to. The relay acks with
:func:`relay_ack_body`: the version each member applied and, for the others,
why not. :func:`parse_relay_ack` reads that answer on the trainer, as hostile
input: anything malformed counts as a failure of every member, never a crash.
"""

from __future__ import annotations

from typing import Any

from transports import PeerLostError, RemoteError

__all__ = ["RELAY_TO", "parse_relay_ack", "relay_ack_body", "relay_failure"]

#: Meta key of a relayed weight message: the list of member identities (bytes).
RELAY_TO = "relay_to"

#: ``failed[member]["type"]`` of a member the relay does not reach (lost, never attached).
LOST_TYPE = "transports.PeerLostError"

_TEXT_LIMIT = 65536


def relay_failure(error: BaseException | None, *, lost: str | None = None) -> dict[str, str]:
    """The msgpack form of why a member did not apply: its own error, or ``lost``."""
    if lost is not None:
        return {"type": LOST_TYPE, "message": lost, "traceback": ""}
    assert error is not None
    if isinstance(error, RemoteError):  # the worker's own error: pass its type and traceback on
        return {"type": error.remote_type, "message": error.remote_message,
                "traceback": error.remote_traceback}
    kind = type(error)
    return {"type": f"{kind.__module__}.{kind.__qualname__}", "message": str(error),
            "traceback": ""}


def relay_ack_body(model_id: str, versions: dict[bytes, int],
                   failed: dict[bytes, dict[str, str]]) -> dict[str, Any]:
    """What a relay acks a relayed weight message with."""
    return {"model_id": model_id, "versions": versions, "failed": failed}


def parse_relay_ack(result: Any, members: dict[bytes, int], relay: bytes, sent: int,
                    latest: int) -> tuple[dict[int, int], dict[int, BaseException]]:
    """Read a relay's ack: ``({worker_id: version}, {worker_id: error})`` over ``members``.

    ``members`` maps each member identity the message was relayed to onto its
    worker id. A member the answer does not account for, or one that claims a
    version outside ``sent..latest`` (newest wins: a worker may ack version
    ``sent`` with a newer one it applied), is a failure, so a faulty relay cannot
    make ``wait_ack`` report an update nobody applied.
    """
    versions = result.get("versions") if isinstance(result, dict) else None
    failed = result.get("failed") if isinstance(result, dict) else None
    versions = versions if isinstance(versions, dict) else {}
    failed = failed if isinstance(failed, dict) else {}
    via = relay.decode(errors="replace")
    applied: dict[int, int] = {}
    errors: dict[int, BaseException] = {}
    for member, worker_id in members.items():
        version = versions.get(member)
        if type(version) is int and sent <= version <= latest:
            applied[worker_id] = version
        elif member in failed:
            errors[worker_id] = _failure_error(member, failed[member], via)
        else:
            errors[worker_id] = RemoteError(
                f"relay {via} acknowledged without a valid version for this worker "
                f"(got {version!r}); expected an int in {sent}..{latest}",
                peer=member, remote_type="asyncrl.weights.RelayProtocolError")
    return applied, errors


def _failure_error(member: bytes, failure: Any, via: str) -> BaseException:
    fields = failure if isinstance(failure, dict) else {}

    def text(key: str, default: str) -> str:
        value = fields.get(key, default)
        return value[:_TEXT_LIMIT] if isinstance(value, str) else default

    kind, message = text("type", "Exception"), text("message", "(no message)")
    if kind == LOST_TYPE:
        return PeerLostError([member], f"(relay {via}: {message})")
    error = RemoteError(message, peer=member, remote_type=kind,
                        remote_traceback=text("traceback", ""))
    error.add_note(f"reported by relay {via}")
    return error
