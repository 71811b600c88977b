"""Optional OpenTelemetry spans: a batch, a weight update, an admission (issue #26).

With opentelemetry-sdk installed (the dev extra) the spans are read back from
an ``InMemorySpanExporter``; without the ``otel`` extra (an ImportError,
simulated in a fresh interpreter) nothing is traced and collecting works.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import anyio
import pytest

from asyncrl import MultiAsyncCollector, MultiSyncCollector
from asyncrl._observe import tracing
from asyncrl.testing import CountingEnv, ParamPolicy

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

LIMIT = 90


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    """One SDK provider for the process (OpenTelemetry allows one global provider)."""
    memory = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, sdk_trace.TracerProvider):
        provider = sdk_trace.TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return memory


def spans(exporter: InMemorySpanExporter, name: str) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_batches_weight_updates_and_admissions_are_spans(
        anyio_backend: str, exporter: InMemorySpanExporter) -> None:
    exporter.clear()
    assert tracing.ENABLED
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(CountingEnv, ParamPolicy(), num_workers=2,
                                      frames_per_batch=40, total_frames=120) as collector:
            versions = []
            pids = set()
            async for batch in collector:
                pids.update(collector.worker_pids)
                versions.append(int(batch["collector", "policy_version"].min()))
                await collector.update_policy_weights()
    admissions = spans(exporter, "asyncrl.admission")
    assert sorted(s.attributes["asyncrl.worker"] for s in admissions) == [0, 1]
    assert all(s.attributes["asyncrl.admitted"] is True for s in admissions)
    assert {s.attributes["asyncrl.pid"] for s in admissions} == pids
    assert all(s.attributes["asyncrl.version"] == 0 for s in admissions)
    batches = spans(exporter, "asyncrl.batch")
    assert len(batches) == 3
    for i, span in enumerate(batches):
        assert tuple(span.attributes["asyncrl.worker"]) == (0, 1)  # a sync round: both
        assert span.attributes["asyncrl.frames"] == 40
        assert span.attributes["asyncrl.policy_version"] == i  # sent before this batch
        assert span.attributes["asyncrl.batch_policy_version"] == versions[i] == i
        assert span.end_time >= span.start_time
    updates = spans(exporter, "asyncrl.weight_update")
    assert [s.attributes["asyncrl.version"] for s in updates] == [1, 2, 3]
    assert all(s.attributes["asyncrl.model_id"] == "policy" for s in updates)
    assert all(tuple(s.attributes["asyncrl.worker"]) == (0, 1) for s in updates)
    assert all(s.end_time >= s.start_time for s in updates)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_async_batch_names_its_one_worker(
        anyio_backend: str, exporter: InMemorySpanExporter) -> None:
    exporter.clear()
    with anyio.fail_after(LIMIT):
        async with MultiAsyncCollector("CartPole-v1", num_workers=2, frames_per_batch=32,
                                       total_frames=96) as collector:
            workers = [int(b["collector", "worker_id"][0]) async for b in collector]
    batches = spans(exporter, "asyncrl.batch")
    assert [s.attributes["asyncrl.worker"] for s in batches] == workers


def test_a_refused_hello_is_an_admission_span_that_says_why(
        exporter: InMemorySpanExporter) -> None:
    from asyncrl._coordinator.coordinator import trace_admission
    from asyncrl._coordinator.state import Send
    from asyncrl._protocol import Hello, Refuse

    tracer = trace.get_tracer("test")
    exporter.clear()
    with tracer.start_as_current_span("asyncrl.admission") as current:
        trace_admission(current, Hello(2, "w", "h", 5, {}), [
            Send(b"p", Refuse("the run is full"), None)])
    (span,) = spans(exporter, "asyncrl.admission")
    assert span.attributes["asyncrl.admitted"] is False
    assert span.attributes["asyncrl.reason"] == "the run is full"


def test_without_the_extra_nothing_is_traced_and_collecting_works() -> None:
    program = textwrap.dedent("""
        import sys
        sys.modules["opentelemetry"] = None  # what an absent package looks like to import
        import anyio
        from asyncrl import Collector
        from asyncrl._observe import tracing

        assert not tracing.ENABLED and tracing._tracer is None
        assert tracing.span("a") is tracing.span("b")  # one shared no-op, nothing built
        tracing.record_span("x", 1.0, {})  # does nothing

        async def main():
            async with Collector("CartPole-v1", frames_per_batch=16, total_frames=32) as c:
                print(sum([b.numel() async for b in c]))

        anyio.run(main)
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=LIMIT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "32"
