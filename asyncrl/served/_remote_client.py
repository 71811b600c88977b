"""The caller's end on a remote host: the same call as :class:`~._client.ServedModuleClient`,
over the worker's link.

A worker that joined over the network (``asyncrl worker --connect``) learns in its
welcome how to call each served module its collector registered
(``weight_sync_schemes={name: ServedModuleScheme(served)}``): a
:class:`~asyncrl._protocol.ServedRoute` (name, layouts, ``call_timeout``), kept by the
worker's :class:`~asyncrl._worker.served_calls.ServedCalls`. :func:`connect` is what
the wrappers call the first time an env steps: that route when this process has one,
else the shared-memory client of the handle (a worker spawned on the trainer's host).

>>> client = connect("env.transform[0]")   # on a remote host, once welcomed  # doctest: +SKIP
>>> reward, version = client({"next_observation": obs})                      # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._protocol import ServedRoute
from .._worker.served_calls import ServedCallError, ServedCalls, route_for
from ._client import ServedModuleClient, fill_inputs
from ._errors import ServedModuleError, ServedModuleTimeout
from ._handle import ServedModuleHandle

__all__ = ["RemoteServedClient", "connect"]


class RemoteServedClient:
    """One env's calls to a served module over its worker's link: ``output, version =
    client(inputs)``, checked and cast as the shared-memory client's."""

    def __init__(self, route: ServedRoute, calls: ServedCalls) -> None:
        self.route = route
        self.calls = calls
        self._fields = [(n, d, tuple(s)) for n, d, s in route.inputs]
        self._sources = [np.zeros(s, dtype=np.dtype(d)) for _, d, s in self._fields]
        self._closed = False

    @property
    def name(self) -> str:
        """The module's name (model id)."""
        return self.route.name

    @property
    def input_names(self) -> tuple[str, ...]:
        """The module's inputs, in order."""
        return tuple(n for n, _, _ in self._fields)

    @property
    def output_shape(self) -> tuple[int, ...]:
        """One env's output's shape."""
        return tuple(self.route.output[2])

    @property
    def closed(self) -> bool:
        return self._closed

    def __call__(self, inputs: Mapping[str, Any] | Sequence[Any]) -> tuple[np.ndarray, int]:
        if self._closed:
            raise ServedModuleError(f"this client of served module {self.name!r} is closed")
        fill_inputs(self.name, self._fields, self._sources, inputs)
        try:
            output, version = self.calls.call(self.name, dict(zip(
                self.input_names, self._sources, strict=True)))
        except ServedCallError as exc:
            raise (ServedModuleTimeout if exc.timeout else ServedModuleError)(str(exc)) \
                from None
        return np.asarray(output).reshape(self.output_shape), version

    def close(self) -> None:
        self._closed = True


def connect(handle: ServedModuleHandle | str) -> ServedModuleClient | RemoteServedClient:
    """A client of served module ``handle`` (or its name) for this process: over the
    worker's link when its welcome gave a route, else through shared memory."""
    name = handle if isinstance(handle, str) else handle.name
    wire = route_for(name)
    if wire is not None:
        return RemoteServedClient(*wire)
    if isinstance(handle, str):
        raise ServedModuleError(
            f"served module {name!r} is not reachable from this process: a remote worker "
            "reaches the modules its welcome named (a MultiCollector's weight_sync_schemes="
            f"{{{name!r}: ServedModuleScheme(served)}}; an AsyncBatchedCollector's, every "
            "module open in the trainer's process when the collector opened: open the "
            "ServedModule before the collector, a module opened later is offered to no "
            "host); an env of the trainer's host needs the module's handle "
            "(served.handle), not its name")
    return ServedModuleClient(handle)
