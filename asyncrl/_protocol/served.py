"""A served module's calls over the network: the route a welcome gives, a call, its answer.

A worker on a remote host (``asyncrl worker --connect``) cannot reach a served
module's shared memory. Its envs call the module over its own link to the
coordinator, the connection it was admitted on: the coordinator passes a call from
a live admitted worker to the module and sends the answer back the same way.

- :class:`ServedRoute`: what the worker learns in its welcome (inside the scheme's
  config, ``Welcome.schemes[name]["route"]``): the module's name, the layout of its
  inputs and output, and ``call_timeout``. Data, never code; the worker checks it.
- :class:`ServedCall` (worker -> coordinator): one env's inputs, inline, with a call
  number the answer repeats. Each input travels as ``[dtype, shape, raw bytes]`` in
  the message's header, not as a tensor frame: the transport builds no array from it,
  and the trainer checks dtype, shape and byte count against the module's own layout
  before it makes an array (a view of those bytes): a peer's claim never sizes
  anything, and a refusal names what was expected and what came.
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
>>> huge = ServedCall("r", 1, {"x": ["float32", [1 << 40], b""]}).to_body()
>>> try:  # a claim of 4 TiB in a message of a few bytes: refused before any array is made
...     ServedCall.from_body(huge, layout={"x": ("float32", (4,))})
... except ProtocolError as exc:
...     print(str(exc).split(", got ")[1])
{'x': float32[1099511627776]}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Self

import numpy as np
from msgspec import Meta

from transports import ProtocolError, printable

from .central_inference import MAX_ELEMENTS, DtypeName, Key, Shape, checked_entries
from .decoding import Text, read

__all__ = ["MAX_CALL", "MAX_CALL_BYTES", "MAX_INPUTS", "ServedAnswer", "ServedCall",
           "ServedRoute", "inline_inputs"]

#: Most inputs a served module may take.
MAX_INPUTS = 64
#: Call numbers are an int64's.
MAX_CALL = (1 << 63) - 1
#: Longest model id a served call names.
MAX_NAME = 200
#: Longest reason an answer without output carries.
MAX_ERROR = 4000
#: Most bytes one call's inputs may hold: they travel in the message's header, which
#: the transport caps at 64 MiB (``transports._codec.MAX_HEADER_BYTES``).
MAX_CALL_BYTES = 48 << 20

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
        sizes = [_nbytes(d, s) for _, d, s in self.inputs]
        if sum(sizes) > MAX_CALL_BYTES:
            raise ProtocolError(f"served route: one call's inputs hold {sum(sizes)} bytes, "
                                f"more than the {MAX_CALL_BYTES} a call over the network may "
                                "carry: give the module smaller inputs, or run the envs that "
                                "call it on the trainer's host (shared memory)")

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
        """The wire form: each array input as ``[dtype, shape, bytes]`` (see
        :func:`inline_inputs`); an input already in that form (or anything else) as is."""
        inputs = inline_inputs(self.inputs) if isinstance(self.inputs, Mapping) \
            else self.inputs
        return {"name": self.name, "call": self.call, "inputs": inputs}

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
    def from_body(cls, body: Any, *, layout: Layout) -> Self:
        """The inputs are read-only numpy views of the message's bytes, made once each
        input's dtype, shape and byte count matched ``layout``."""
        call = cls.header(body)
        call.inputs = _inline_arrays(body.get("inputs"), layout,
                                     "served_call message field 'inputs'")
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
            answer.output = checked_entries({"output": body.get("output")}, layout,
                                            "served_answer message field 'output'",
                                            convert)["output"]
        return answer


def _nbytes(dtype: str, shape: Any) -> int:
    return int(math.prod(shape)) * (2 if dtype == "bfloat16" else np.dtype(dtype).itemsize)


def inline_inputs(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """``{name: [dtype, shape, bytes]}`` of each array (or tensor) of ``inputs``: what a
    :class:`ServedCall` carries (a value that is neither is left as it is).

    >>> inline_inputs({"x": np.ones(2, np.float32)})
    {'x': ['float32', [2], b'\\x00\\x00\\x80?\\x00\\x00\\x80?']}
    """
    wire: dict[str, Any] = {}
    for name, value in inputs.items():
        if hasattr(value, "numpy") and not isinstance(value, np.ndarray):
            value = value.detach().cpu().numpy() if hasattr(value, "detach") else value.numpy()
        if isinstance(value, np.ndarray):
            array = np.ascontiguousarray(value)
            if array.dtype.byteorder == ">":
                array = array.astype(array.dtype.newbyteorder("<"))
            value = [array.dtype.name, list(array.shape), array.tobytes()]
        wire[name] = value
    return wire


def _inline_arrays(body: Any, layout: Layout, what: str) -> dict[str, Any]:
    """``{name: array}`` of a call's ``[dtype, shape, bytes]`` inputs, each checked against
    ``layout`` (dtype, shape and byte count, exactly) before an array is made: a read-only
    numpy view of the bytes the message carried, never an allocation a peer sized."""
    inline = checked_entries(body, layout, what, problem=_inline_problem)
    arrays = {}
    for name, (dtype, shape) in layout.items():
        if dtype == "bfloat16":  # numpy has no bfloat16 (a remote caller cannot make one either)
            raise ProtocolError(f"{what}: input {name!r} is bfloat16, which a call over the "
                                "network cannot carry")
        arrays[name] = np.frombuffer(inline[name][2], dtype=np.dtype(dtype)).reshape(shape)
    return arrays


def _inline_problem(value: Any, dtype: str, shape: tuple[int, ...]) -> str:
    """Why ``value`` is not ``[dtype, shape, bytes of that size]`` ("" if it is); nothing is
    made from what it claims."""
    if not (isinstance(value, list) and len(value) == 3):
        return f"a list of {len(value)}" if isinstance(value, list) else type(value).__name__
    got_dtype, got_shape, data = value
    if not isinstance(got_dtype, str) or not isinstance(got_shape, list) \
            or not all(type(d) is int for d in got_shape[:64]) or len(got_shape) > 64:
        return f"[{type(got_dtype).__name__}, {type(got_shape).__name__}, ...]"
    said = f"{printable(got_dtype, limit=16)}{got_shape}"
    if (got_dtype, tuple(got_shape)) != (dtype, tuple(shape)):
        return said
    if not isinstance(data, bytes):
        return f"{said} whose data is {type(data).__name__}, not bytes"
    if len(data) != _nbytes(dtype, shape):
        return f"{said} in {len(data)} bytes (expected {_nbytes(dtype, shape)})"
    return ""
