"""The public faces agree, and every error a user catches from asyncrl is an AsyncRLError."""

from __future__ import annotations

import types

import anyio
import pytest

import asyncrl
import asyncrl.collectors
import asyncrl.weights
import transports
from asyncrl._errors import as_asyncrl_error, translated_errors


def _public(face: types.ModuleType) -> dict[str, object]:
    return {name: getattr(face, name) for name in face.__all__ if not name.startswith("__")}


def test_every_collectors_name_is_on_asyncrl_as_the_same_object() -> None:
    top, collectors = _public(asyncrl), _public(asyncrl.collectors)
    missing = sorted(set(collectors) - set(top))
    assert not missing, f"asyncrl.collectors exports {missing}; asyncrl does not"
    different = sorted(name for name in collectors if top[name] is not collectors[name])
    assert not different, f"asyncrl and asyncrl.collectors export different {different}"


def test_every_collector_name_on_asyncrl_is_on_asyncrl_collectors() -> None:
    # What is defined under asyncrl.collectors is exported from there too.
    top, collectors = _public(asyncrl), _public(asyncrl.collectors)
    defined_there = {name for name, obj in top.items()
                     if getattr(obj, "__module__", "").startswith("asyncrl.collectors")}
    missing = sorted(defined_there - set(collectors))
    assert not missing, f"asyncrl exports {missing} from asyncrl.collectors' modules only"


@pytest.mark.parametrize("name", ["UpdateRatio", "BaseCollector", "Pausing", "Started",
                                  "NoLengthError"])
def test_the_names_the_faces_disagreed_on_are_on_both(name: str) -> None:
    assert getattr(asyncrl, name) is getattr(asyncrl.collectors, name)


def _exported_exceptions() -> list[tuple[str, type[BaseException]]]:
    found = []
    for face in (asyncrl, asyncrl.collectors, asyncrl.weights):
        for name, obj in _public(face).items():
            if isinstance(obj, type) and issubclass(obj, BaseException):
                found.append((f"{face.__name__}.{name}", obj))
    return found


def test_every_exported_exception_is_an_asyncrl_error() -> None:
    exported = _exported_exceptions()
    assert len(exported) >= 10  # the walk found the tree
    outside = sorted(name for name, cls in exported if not issubclass(cls, asyncrl.AsyncRLError))
    assert not outside, f"exported errors outside asyncrl.AsyncRLError: {outside}"


@pytest.mark.parametrize("name", ["TransportError", "ProtocolError", "PeerLostError",
                                  "RemoteError"])
def test_the_wire_errors_on_asyncrl_are_also_the_transports_classes(name: str) -> None:
    cls = getattr(asyncrl, name)
    assert issubclass(cls, asyncrl.AsyncRLError)
    assert issubclass(cls, getattr(transports, name))  # except transports.X still catches it


def test_errors_that_kept_their_builtin_bases() -> None:
    assert issubclass(asyncrl.NoLengthError, TypeError)
    assert issubclass(asyncrl.NoLengthError, RuntimeError)  # TorchRL's habit
    from asyncrl._errors import JoinTimeout

    assert issubclass(JoinTimeout, asyncrl.AsyncRLError)
    assert issubclass(JoinTimeout, TimeoutError)


def test_a_translated_remote_error_keeps_what_it_said() -> None:
    error = transports.RemoteError("boom", peer="w0", remote_type="builtins.ValueError",
                                   remote_traceback="tb")
    error.add_note("a note")
    translated = as_asyncrl_error(error)
    assert type(translated) is asyncrl.RemoteError
    assert (translated.peer, translated.remote_type, translated.remote_traceback) == \
        ("w0", "builtins.ValueError", "tb")
    assert str(translated) == str(error)
    assert translated.__notes__ == ["a note"]


def test_a_transports_class_of_its_own_gets_a_class_that_is_both() -> None:
    from transports._shm import TornReadError

    translated = as_asyncrl_error(TornReadError("torn"))
    assert isinstance(translated, TornReadError)
    assert isinstance(translated, asyncrl.AsyncRLError)
    assert type(as_asyncrl_error(TornReadError("again"))) is type(translated)  # made once


def test_a_closed_channel_stays_an_anyio_closed_resource_error() -> None:
    translated = as_asyncrl_error(transports.ClosedResourceError("closed"))
    assert isinstance(translated, anyio.ClosedResourceError)
    assert isinstance(translated, asyncrl.AsyncRLError)


def test_other_errors_pass_through_untouched() -> None:
    error = KeyError("obs")
    assert as_asyncrl_error(error) is error
    with pytest.raises(KeyError), translated_errors():
        raise error


def test_a_wire_error_leaving_the_block_is_caught_as_an_asyncrl_error() -> None:
    with pytest.raises(asyncrl.AsyncRLError) as info, translated_errors():
        raise transports.PeerLostError([b"w1"], "while collecting")
    assert isinstance(info.value, transports.PeerLostError)
    assert info.value.peers == [b"w1"]
    assert info.value.__traceback__ is not None


@pytest.mark.anyio
async def test_a_started_call_that_failed_on_the_wire_raises_an_asyncrl_error() -> None:
    from asyncrl.collectors._started import StartedCalls

    async def work() -> None:
        raise transports.RemoteError("no such attribute", peer="w0")

    calls = StartedCalls()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            started = calls.start(tg, "getattr_env", work, before_next_batch=False)
            with pytest.raises(asyncrl.RemoteError) as info:
                await started
    assert info.value.peer == "w0"
