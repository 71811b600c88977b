"""Chaos: nothing a peer sends reaches a log, an event, statistics or a metric raw (#35, 1).

One table of hostile strings (a fake log line with a screen-clearing escape, C1
CSI and a bidi override; the bidi embeddings, overrides and isolates; the line
and paragraph separators; 100 kB of escapes; a forged ``WARNING
asyncrl.coordinator:`` line) is fed through every way a peer's text comes in:
a stranger's hello on plain tcp (refused), an admitted worker's hello, its
forwarded log records, its error reports (one fatal: the error the trainer
raises), a transports error ack, and a peer's identity bytes. Every sink must
show each unsafe character escaped, keep lengths bounded, and let no line of a
peer's text start unindented.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import traceback
import unicodedata
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from asyncrl import MultiAsyncCollector
from asyncrl._protocol import (
    MAX_LOG_MESSAGE,
    MAX_LOG_TRACEBACK,
    PROTOCOL,
    ErrorReport,
    Hello,
    LogEntry,
    Refuse,
    Welcome,
    WorkerLog,
)
from asyncrl._rollout.envs import make_env_pool
from asyncrl._worker.simulated import make_specs
from asyncrl.metrics import CollectorMetrics
from transports import ErrorPayload, Hub, Link, Message, RemoteError, peer_name, printable
from transports._codec import encode_message
from transports._printable import INDENT, printable_block, printable_lines

from .helpers import LIMIT, LIVENESS

pytestmark = [pytest.mark.anyio, pytest.mark.chaos]

FAKE_LINE = "WARNING asyncrl.coordinator: all workers verified, nothing to see"
HOSTILE = {
    "issue": "x\n2026-01-01 00:00:00,000 INFO asyncrl.coordinator: all workers verified"
             "\x1b[2J\x9b31m\u202e",
    "c1-csi": "host\x9b2J\x85next\x90",
    "bidi-embed-override": "a\u202ab\u202bc\u202cd\u202de\u202ef",
    "bidi-isolates": "a\u2066b\u2067c\u2068d\u2069e",
    "line-separators": "one\u2028two\u2029three\r\nfour\x0bfive\x0cend",
    "100kB": "\x1b[2J" * 25_000,
    "fake-line": "ok\n" + FAKE_LINE + "\r" + FAKE_LINE + "\n\n" + FAKE_LINE,
}
#: What a multi-line text shows and one line never does: the line break itself.
NEWLINE = "\n"
UNSAFE = {"Cc", "Cf", "Zl", "Zp"}
#: The longest text any one sink may show for one record or field: a remote error's
#: message (its bound) with a record's prefix, or a forwarded record and its indented
#: traceback. The 100 kB string is 400 kB once escaped.
BOUND = ErrorPayload.MAX_MESSAGE + 2 * MAX_LOG_TRACEBACK


def unsafe_chars(text: str, *, multi_line: bool) -> list[str]:
    return [c for c in text if unicodedata.category(c) in UNSAFE
            and not (multi_line and c == NEWLINE)]


def assert_safe(text: str, where: str, *, multi_line: bool = False,
                bound: int = BOUND) -> None:
    """No unsafe character (a newline only where multi-line is allowed), no line after
    the first that starts unindented, and a bounded length."""
    assert not unsafe_chars(text, multi_line=multi_line), (where, text[:300])
    assert len(text) <= bound, (where, len(text))
    for line in text.split("\n")[1:]:
        assert not line or line.startswith(INDENT) or line == "--- remote traceback ---", (
            where, line[:200])


def strings(value: Any) -> Iterator[str]:
    """Every string inside a snapshot (dataclasses, named tuples, maps, sequences)."""
    if isinstance(value, str):
        yield value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from strings(getattr(value, f.name))
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from strings(k)
            yield from strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from strings(v)


def formatted(record: logging.LogRecord) -> str:
    """The record as a handler writes it (message, then its traceback on lines of its own)."""
    return logging.Formatter("%(levelname)s %(name)s: %(message)s").format(record)


# -- the one place -------------------------------------------------------------------------
@pytest.mark.parametrize("name", HOSTILE)
def test_printable_escapes_every_unsafe_character_and_bounds_the_length(name: str) -> None:
    hostile = HOSTILE[name]
    one_line = printable(hostile, limit=300)
    assert_safe(one_line, "printable", bound=300)
    assert "\n" not in one_line
    lines = printable_lines(hostile, limit=300)
    assert_safe(lines, "printable_lines", multi_line=True, bound=300)
    block = printable_block(hostile, limit=300)
    assert_safe(block, "printable_block", multi_line=True, bound=300)
    assert all(line.startswith(INDENT) for line in block.split("\n") if line)
    # Escaping again changes nothing: a text relayed reads as it was sent.
    assert printable(one_line, limit=300) == one_line
    assert printable_lines(lines, limit=300) == lines


def test_ordinary_text_stays_as_it_is() -> None:
    text = "café 中文 ✓ naïve — \\x1b stays a backslash"
    assert printable(text, limit=100) == text
    assert printable_lines("Traceback (most recent call last):\n  File 'x'\nValueError: é",
                           limit=100, indent="") == (
        "Traceback (most recent call last):\n  File 'x'\nValueError: é")
    assert printable("\x1b[2J\u202e\u2028", limit=100) == "\\x1b[2J\\u202e\\u2028"


def test_a_cut_says_so_and_keeps_within_the_limit() -> None:
    cut = printable("a" * 1000, limit=100)
    assert len(cut) == 100 and cut.endswith("[... cut, 1000 characters in all]")
    tail = printable_lines("head\n" + "t" * 1000 + "\nraise", limit=100, indent="", keep="tail")
    assert len(tail) <= 100 and tail.endswith("\nraise") and tail.startswith("[... cut")
    assert printable_lines("x" * 70, limit=100, indent="", keep="tail") == "x" * 70
    # A cut text read again is left as it is (a relay passes it on unchanged).
    for cut in (printable_lines("a\n" * 100, limit=50), printable_block("a\n" * 100, limit=50)):
        assert len(cut) <= 50 and printable_lines(cut, limit=50) == cut
        assert all(line.startswith(INDENT) for line in cut.split("\n")[1:] if line)


def test_a_peer_identity_is_shown_escaped() -> None:
    assert peer_name(b"w\x1b[2J\xe2\x80\xae\xff") == "w\\x1b[2J\\u202e\ufffd"


# -- the messages: read once, safe everywhere ----------------------------------------------
@pytest.mark.parametrize("name", HOSTILE)
def test_every_text_of_a_hello_an_error_and_a_log_record_is_read_printable(name: str) -> None:
    hostile = HOSTILE[name]
    specs = make_specs(4)
    specs["observation"][hostile] = {"shape": [1], "dtype": hostile}
    hello = Hello.from_body(Hello(protocol=PROTOCOL, name=hostile, host=hostile, pid=1,
                                  specs=specs, token=hostile, relay=hostile).to_body())
    for text in strings(dataclasses.asdict(hello)):
        assert_safe(text, "hello", bound=1100)
    report = ErrorReport.from_body({"type": hostile, "message": hostile, "traceback": hostile,
                                    "fatal": True, "slot": -1, "token": hostile})
    assert_safe(report.error.type, "error type", bound=ErrorPayload.MAX_TYPE)
    assert_safe(report.error.message, "error message", multi_line=True,
                bound=ErrorPayload.MAX_MESSAGE)
    assert not unsafe_chars(report.error.traceback, multi_line=True)
    log = WorkerLog.from_body(WorkerLog([LogEntry(30, hostile, hostile, hostile)]).to_body())
    entry = log.records[0]
    assert_safe(entry.logger, "logger name", bound=200)
    assert_safe(entry.message, "log message", multi_line=True, bound=MAX_LOG_MESSAGE)
    assert_safe(entry.traceback, "log traceback", multi_line=True, bound=MAX_LOG_TRACEBACK)
    assert all(line.startswith(INDENT) for line in entry.traceback.split("\n") if line)


# -- a real run: a stranger, admitted workers, their records and errors, every sink --------
async def recv_kind(link: Link, *kinds: str) -> Any:
    while True:
        message = await link.recv()
        if message.kind in kinds:
            return message


def cartpole_specs() -> dict[str, Any]:
    """The specs the collector checks remote workers against (it builds one env itself)."""
    pool = make_env_pool("CartPole-v1", num_envs=1)
    try:
        return pool.specs.to_dict()
    finally:
        pool.close()


def raw_error(text: str, *, fatal: bool) -> dict[str, Any]:
    """An error report as a hostile peer writes it (no ErrorPayload: nothing escaped)."""
    return {"type": text, "message": text, "traceback": text, "fatal": fatal, "slot": -1,
            "token": ""}


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_no_hostile_string_reaches_a_sink_raw(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    # The root's level is not enough: an earlier test in this process (a CLI's
    # --log-level) may have left asyncrl's loggers at WARNING, which drops the INFO
    # "joined" line before it propagates (caplog restores these levels afterwards).
    for name in ("asyncrl", "asyncrl.coordinator", "asyncrl.worker", "transports"):
        caplog.set_level(logging.DEBUG, logger=name)
    registry = CollectorRegistry()
    texts = list(HOSTILE.values())
    failure: BaseException | None = None
    with anyio.fail_after(LIMIT * 2):
        collector = MultiAsyncCollector("CartPole-v1", num_workers=0,
                                        remote_workers=len(texts) + 1,
                                        listen="tcp://127.0.0.1:0", frames_per_batch=10,
                                        total_frames=100, **LIVENESS)
        events = collector.events()
        async with collector, anyio.create_task_group() as tg:
            CollectorMetrics(collector, registry=registry)
            specs = cartpole_specs()
            links = [await tg.start(_hostile_worker, collector.endpoint, i, text, specs)
                     for i, text in enumerate(texts)]
            await _hostile_strangers(collector.endpoint, texts, specs)
            while sum("reported" in r.getMessage() for r in caplog.records) < len(texts) or \
                    sum(r.name == "asyncrl.worker" for r in caplog.records) < len(texts) or \
                    not any("refused worker" in r.getMessage() for r in caplog.records) or \
                    not any(" joined (" in r.getMessage() for r in caplog.records):
                # The coordinator handles them in its own time: a worker's "joined" line
                # comes after its weight catch-up, which may end after its first report.
                await anyio.sleep(0.05)
            stats = collector.statistics()
            metrics = generate_latest(registry).decode()
            await links[0].send(raw_error(HOSTILE["issue"], fatal=True), kind=ErrorReport.KIND)
            try:
                async for _ in collector:
                    pass
            except Exception as exc:
                failure = exc
            tg.cancel_scope.cancel()
    seen = []  # what a subscriber reads, without waiting
    while (event := events.get_nowait()) is not None:
        seen.append(event)

    for record in caplog.records:
        assert_safe(formatted(record), f"log record {record.name}", multi_line=True)
        for key, value in vars(record).items():
            if key.startswith("asyncrl_") and isinstance(value, str):
                assert_safe(value, f"record field {key}", bound=255)
    assert any("refused worker" in r.getMessage() for r in caplog.records)
    assert any(" joined (" in r.getMessage() for r in caplog.records)
    for text in strings(stats):
        assert_safe(text, "statistics()", bound=1100)
    assert {w.host for w in stats.workers} == {printable(t, limit=200) for t in texts}
    for event in seen:
        for text in strings(event):
            # A reason may quote a remote error's message: continuation lines indented.
            assert_safe(text, f"event {event.kind}", multi_line=True,
                        bound=ErrorPayload.MAX_MESSAGE + 1000)
    assert {"joined", "refused"} <= {e.kind for e in seen}
    assert "INFO asyncrl.coordinator: all workers verified" in metrics  # a host label
    for line in metrics.split("\n"):  # one line per series: its labels stay on it
        assert_safe(line, "metrics line", bound=10_000)
    assert failure is not None, "the fatal report did not fail the run"
    _assert_error_safe(failure)


async def _hostile_worker(endpoint: str, index: int, text: str, specs: dict[str, Any], *,
                          task_status: anyio.abc.TaskStatus[Link]) -> None:
    """A worker whose hello, log records and (non-fatal) error report all say ``text``."""
    async with Link(endpoint, identity=f"hostile-{index}", **LIVENESS) as link:
        await link.send(Hello(protocol=PROTOCOL, name=text, host=text, pid=os.getpid(),
                              specs=specs, slot=-1).to_body(), kind=Hello.KIND)
        welcome = await recv_kind(link, Welcome.KIND, Refuse.KIND)
        assert welcome.kind == Welcome.KIND, welcome.body
        records = WorkerLog([LogEntry(logging.WARNING, text, text, text)])
        await link.send(records.to_body(), kind=WorkerLog.KIND)
        await link.send(raw_error(text, fatal=False), kind=ErrorReport.KIND)
        task_status.started(link)
        await anyio.sleep_forever()


async def _hostile_strangers(endpoint: str, texts: list[str], specs: dict[str, Any]) -> None:
    """Strangers on the tcp port: a hello of another protocol, and one whose specs name
    a hostile key; both refused (and said so in the log, the events and their refusal)."""
    for i, text in enumerate(texts):
        hostile_specs = copy.deepcopy(specs)
        hostile_specs["observation"][text] = {"shape": [1], "dtype": "float32"}
        for protocol, stranger_specs in ((PROTOCOL + 99, specs), (PROTOCOL, hostile_specs)):
            async with Link(endpoint, identity=f"stranger-{i}-{protocol}", **LIVENESS) as link:
                await link.send(Hello(protocol=protocol, name=text, host=text, pid=1,
                                      specs=stranger_specs, slot=-1, token=text,
                                      relay=text).to_body(), kind=Hello.KIND)
                refused = await recv_kind(link, Refuse.KIND, Welcome.KIND)
                assert refused.kind == Refuse.KIND
                assert_safe(Refuse.from_body(refused.body).reason, "refusal", bound=20_000)


def _assert_error_safe(error: BaseException) -> None:
    """The error the trainer raises for a hostile fatal report: its text, its cause, its
    notes and the traceback a user's ``logging.exception`` would print."""
    assert_safe(str(error), "str(error)", multi_line=True, bound=3 * ErrorPayload.MAX_MESSAGE)
    cause = error if isinstance(error, RemoteError) else error.__cause__
    assert isinstance(cause, RemoteError)
    assert_safe(str(cause), "str(RemoteError)", multi_line=True,
                bound=ErrorPayload.MAX_MESSAGE + 2 * ErrorPayload.MAX_TRACEBACK)
    printed = "".join(traceback.format_exception(error))
    assert not unsafe_chars(printed, multi_line=True)
    assert not any(line.startswith(("2026-01-01", "WARNING asyncrl", "INFO asyncrl"))
                   for line in printed.split("\n")), printed[:2000]


@pytest.mark.parametrize("name", ["issue", "fake-line"])
def test_the_error_the_trainer_raises_prints_no_line_of_the_peers_own(name: str) -> None:
    from asyncrl._errors import rebuild_remote_exception

    hostile = HOSTILE[name]
    report = ErrorReport.from_body({**raw_error(hostile, fatal=True),
                                    "type": "builtins.ValueError"})
    _assert_error_safe(rebuild_remote_exception(report.error, peer="0 (w)"))


# -- transports: a peer's error ack and its identity ---------------------------------------
@pytest.mark.parametrize("name", HOSTILE)
async def test_a_hostile_error_ack_becomes_a_printable_remote_error(name: str) -> None:
    hostile = HOSTILE[name]
    identity = ("peer-" + hostile[:40]).encode()
    with anyio.fail_after(LIMIT):
        async with Hub("tcp://127.0.0.1:0") as hub, Link(hub.endpoint, identity=identity) as link:
            await link.send(None, kind="hi")
            while not isinstance(said := await hub.recv(), Message):
                pass  # the peer's "joined" event
            peer = said.peer
            ticket = await hub.send_async([peer], None, kind="work")
            message = await link.recv()
            body = {"type": hostile, "message": hostile, "traceback": hostile}
            # Written by hand: a hostile peer skips ErrorPayload (which would escape).
            await link._send_frames(encode_message(body, kind="ack", seq=message.seq,
                                                   meta={"error": True}))
            with pytest.raises(RemoteError) as caught:
                await hub.wait_ack(ticket, timeout=LIMIT)
            silent = await hub.send_async([peer], None, kind="ignored")
            with pytest.raises(TimeoutError) as timed_out:
                await hub.wait_ack(silent, timeout=0.2)
    error = caught.value
    assert_safe(str(error), "RemoteError", multi_line=True,
                bound=ErrorPayload.MAX_MESSAGE + 2 * ErrorPayload.MAX_TRACEBACK)
    assert_safe(error.peer or "", "RemoteError.peer", bound=255)
    assert_safe(error.remote_type, "RemoteError.remote_type", bound=ErrorPayload.MAX_TYPE)
    assert not unsafe_chars(error.remote_traceback, multi_line=True)
    assert_safe(str(timed_out.value), "TimeoutError", bound=1000)
