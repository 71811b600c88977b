"""A served module's calls over the network: the route a welcome gives, a call, its answer.

A worker on a remote host (``asyncrl worker --connect``) cannot reach a served
module's shared memory. Its envs call the module over its own link to the
coordinator, the connection it was admitted on: the coordinator passes a call from
a live admitted worker to the module and sends the answer back the same way.

- :class:`ServedRoute`: what the worker learns in its welcome (inside the scheme's
  config, ``Welcome.schemes[name]["route"]``): the module's name, the layout of its
  inputs and output, and ``call_timeout``. Data, never code; the worker checks it.
- :class:`ServedCall` (worker -> coordinator): one env's inputs, inline, with a call
  number the answer repeats. The trainer decodes it against the module's own layout
  (dtype and shape of every input, exactly): a peer's claim never sizes anything.
- :class:`ServedAnswer` (coordinator -> worker): the output and the version of the
  weights that computed it, or why there is none (``error``: the module failed, was
  closed, timed out, or the call was refused). The worker decodes it against the
  route's output layout.

>>> route = ServedRoute("env.transform[0]", [("next_observation", "float32", [4])],
...                     ("output", "float32", [1]), 10.0)
>>> ServedRoute.from_config(route.to_config()) == route
True
>>> try:
...     ServedCall.from_body({"name": "r", "call": 1, "inputs": {"x": 1}},
...                          layout={"x": ("float32", (4,))})
... except ProtocolError as exc:
...     print(exc)
served_call message field 'inputs' must hold exactly {'x': float32[4]}, got {'x': int}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Self

from msgspec import Meta

from transports import ProtocolError

from .central_inference import MAX_ELEMENTS, DtypeName, Key, Shape, _arrays
from .decoding import Text, read

__all__ = ["MAX_CALL", "MAX_INPUTS", "ServedAnswer", "ServedCall", "ServedRoute"]

#: Most inputs a served module may take.
MAX_INPUTS = 64
#: Call numbers are an int64's.
MAX_CALL = (1 << 63) - 1
#: Longest model id a served call names.
MAX_NAME = 200
#: Longest reason an answer without output carries.
MAX_ERROR = 4000

Name = Annotated[str, Meta(min_length=1, max_length=MAX_NAME)]
Field = tuple[Key, DtypeName, Shape]
Layout = Mapping[str, tuple[str, tuple[int, ...]]]


@dataclass(slots=True)
class ServedRoute:
    """How a remote worker calls served module ``name`` (its welcome's scheme config).

    ``inputs``: ``(name, dtype, shape)`` of each input, one env's (no batch dimension);
    ``output``: the same for the output; ``call_timeout``: seconds a call waits.
    """

    KIND: ClassVar[str] = "served route"
    name: Name
    inputs: Annotated[list[Field], Meta(min_length=1, max_length=MAX_INPUTS)]
    output: Field
    call_timeout: Annotated[float, Meta(gt=0, le=86400)]

    def __post_init__(self) -> None:
        self.inputs = [(n, d, list(s)) for n, d, s in self.inputs]
        self.output = (self.output[0], self.output[1], list(self.output[2]))
        names = [n for n, _, _ in self.inputs]
        if len(set(names)) != len(names):
            raise ProtocolError(f"served route field 'inputs' names an input twice: {names}")
        total = sum(math.prod(s) for _, _, s in [*self.inputs, self.output])
        if total > MAX_ELEMENTS:
            raise ProtocolError(f"served route: {total} elements in all, more than the "
                                f"{MAX_ELEMENTS} a layout may hold")

    def to_config(self) -> dict[str, Any]:
        return {"name": self.name, "inputs": [[n, d, list(s)] for n, d, s in self.inputs],
                "output": [self.output[0], self.output[1], list(self.output[2])],
                "call_timeout": self.call_timeout}

    @classmethod
    def from_config(cls, config: Any) -> Self:
        return read(cls, config, "served route")

    @property
    def input_layout(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """``{input name: (dtype, shape)}``: what a call must hold."""
        return {n: (d, tuple(s)) for n, d, s in self.inputs}

    @property
    def output_layout(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """``{"output": (dtype, shape)}``: what an answer must hold."""
        return {"output": (self.output[1], tuple(self.output[2]))}


@dataclass(slots=True)
class ServedCall:
    """Worker -> coordinator: one env's inputs for served module ``name``.

    ``call``: the worker's number for it (the answer repeats it); ``inputs``:
    ``{input name: array}``, checked against ``layout`` (the module's, never the
    peer's word) on receipt.
    """

    KIND: ClassVar[str] = "served_call"
    name: Annotated[str, Text(MAX_NAME)]
    call: Annotated[int, Meta(ge=0, le=MAX_CALL)]
    inputs: Any

    def to_body(self) -> dict[str, Any]:
        return {"name": self.name, "call": self.call, "inputs": self.inputs}

    @classmethod
    def header(cls, body: Any) -> Self:
        """Name and call number only (which module's layout the inputs are checked
        against); :meth:`from_body` checks the inputs."""
        if not isinstance(body, Mapping):
            raise ProtocolError(f"served_call message body must be a map, got "
                                f"{type(body).__name__}")
        return read(cls, {"name": body.get("name"), "call": body.get("call"), "inputs": None},
                    "served_call")

    @classmethod
    def from_body(cls, body: Any, *, layout: Layout,
                  convert: Callable[[Any], Any] | None = None) -> Self:
        call = cls.header(body)
        call.inputs = _arrays(body.get("inputs"), layout, "served_call message field "
                              "'inputs'", convert)
        return call


@dataclass(slots=True)
class ServedAnswer:
    """Coordinator -> worker: the answer to call ``call`` of module ``name``.

    ``output`` (checked against the route's layout) and the ``version`` of the weights
    that computed it; or ``error`` (no output): why the call failed. ``timeout``: the
    error is the module's lateness (the caller raises its timeout error).
    """

    KIND: ClassVar[str] = "served_answer"
    name: Annotated[str, Text(MAX_NAME)]
    call: Annotated[int, Meta(ge=0, le=MAX_CALL)]
    version: Annotated[int, Meta(ge=0, le=MAX_CALL)] = 0
    output: Any = None
    error: Annotated[str, Text(MAX_ERROR)] = ""
    timeout: bool = False

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"name": self.name, "call": self.call, "version": self.version}
        if self.error:
            body.update(error=self.error, timeout=self.timeout)
        else:
            body["output"] = self.output
        return body

    @classmethod
    def from_body(cls, body: Any, *, layout: Layout,
                  convert: Callable[[Any], Any] | None = None) -> Self:
        if not isinstance(body, Mapping):
            raise ProtocolError(f"served_answer message body must be a map, got "
                                f"{type(body).__name__}")
        answer = read(cls, {**body, "output": None}, "served_answer")
        if not answer.error:
            answer.output = _arrays({"output": body.get("output")}, layout,
                                    "served_answer message field 'output'",
                                    convert)["output"]
        return answer
