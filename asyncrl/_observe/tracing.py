"""Optional OpenTelemetry spans: a batch, a weight update, an admission.

With the ``otel`` extra (``pip install "asyncrl[otel]"``, which installs
``opentelemetry-api``) asyncrl makes three kinds of span with the tracer
``"asyncrl"`` of the global tracer provider; the application configures the
provider and its exporter (the SDK, an OTLP exporter...), as OpenTelemetry
intends for libraries:

* ``asyncrl.batch``: a batch handed to the trainer, from the wait for it to its
  hand-over; attributes ``asyncrl.worker`` (the index; in sync mode the indices
  of the round), ``asyncrl.frames``, ``asyncrl.policy_version`` (the newest
  version sent) and ``asyncrl.batch_policy_version`` (the oldest version among
  its frames);
* ``asyncrl.weight_update``: a ``send_async`` until its last acknowledgement,
  attributes ``asyncrl.model_id``, ``asyncrl.version``, ``asyncrl.worker`` (the
  indices it reached);
* ``asyncrl.admission``: a hello until the worker was welcomed and caught up
  with the latest weights, attributes ``asyncrl.worker``, ``asyncrl.host``,
  ``asyncrl.pid``, ``asyncrl.admitted`` (False: refused, ``asyncrl.reason``).

Without the extra, the import is tried once, when this module loads, and
:func:`span` returns one shared do-nothing context manager: no tracer, no
attribute is built. Attributes that cost a computation are only computed while
the span records (``span.is_recording()``: a provider with a sampler that kept it).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any

try:
    from opentelemetry import trace as _trace
except ImportError:  # the 'otel' extra is absent: every span is the shared null one
    _trace = None  # type: ignore[assignment]

#: True when opentelemetry-api is installed (spans may then record).
ENABLED = _trace is not None
_NULL: AbstractContextManager[Any] = contextlib.nullcontext(None)
_tracer: Any = _trace.get_tracer("asyncrl") if _trace is not None else None


def span(name: str) -> AbstractContextManager[Any]:
    """A context manager giving the current span named ``name`` (None without the extra).

    >>> with span("asyncrl.batch") as current:
    ...     if current is not None and current.is_recording():
    ...         current.set_attribute("asyncrl.frames", 64)
    """
    if _tracer is None:
        return _NULL
    return _span(name)


@contextlib.contextmanager
def _span(name: str) -> Iterator[Any]:
    with _tracer.start_as_current_span(name, record_exception=False,
                                       set_status_on_exception=False) as current:
        try:
            yield current
        except (StopAsyncIteration, StopIteration):
            raise  # the end of an iteration, not an error
        except Exception as exc:
            current.record_exception(exc)
            current.set_status(_trace.Status(_trace.StatusCode.ERROR, f"{type(exc).__name__}: "
                                             f"{exc}"[:500]))
            raise


def record_span(name: str, seconds: float, attributes: Mapping[str, Any]) -> None:
    """A span named ``name`` that ended now and lasted ``seconds`` (for a duration that
    was measured without holding a span open, such as a weight update's acks)."""
    if _tracer is None:
        return
    now = time.time_ns()
    finished = _tracer.start_span(name, start_time=now - int(seconds * 1e9),
                                  attributes=dict(attributes))
    finished.end(end_time=now)


def trace_batch(current: Any, batch: Any, frames: int, version: int, lag: int) -> None:
    """Set a recording ``asyncrl.batch`` span's attributes from the batch handed over."""
    ids = batch.get(("collector", "worker_id"), None)
    workers = sorted({int(i) for i in ids.unique().tolist()}) if ids is not None else []
    current.set_attributes({
        "asyncrl.worker": workers[0] if len(workers) == 1 else workers,
        "asyncrl.frames": frames, "asyncrl.policy_version": version,
        "asyncrl.batch_policy_version": version - lag})


__all__ = ["ENABLED", "record_span", "span", "trace_batch"]
