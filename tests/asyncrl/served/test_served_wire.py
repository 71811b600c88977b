"""A remote call's inputs on the wire: checked against the module's layout before any array.

A ``served_call`` carries each input as ``[dtype, shape, bytes]`` in its header: the
transport builds no tensor from it, and the trainer compares dtype, shape and byte count
with the module's own layout before it makes an array (a view of the bytes that came).
A peer's claim (a shape of 2**40 elements in a message of a few bytes) sizes nothing and
is refused naming what was expected and what came.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import anyio
import numpy as np
import pytest
import torch

from asyncrl._protocol import ServedCall, decode
from asyncrl.served import ServedModule
from asyncrl.served._remote_calls import RemoteCalls
from transports import Message, ProtocolError
from transports._codec import decode_message, encode_message

from .served_envs import Scale

pytestmark = pytest.mark.anyio
NAME = "env.transform[0]"
LAYOUT = {"next_observation": ("float32", (3,))}
EXPECTED = "must hold exactly {'next_observation': float32[3]}, got "


def wire(inputs: dict[str, Any], call: int = 1, *, raw: bool = False) -> Message:
    """``inputs`` through the real codec, as the trainer's hub hands a call over (``raw``:
    as they are, not in :meth:`ServedCall.to_body`'s form)."""
    body = {"name": NAME, "call": call, "inputs": inputs} if raw \
        else ServedCall(NAME, call, inputs).to_body()
    frames = encode_message(body, kind=ServedCall.KIND)
    decoded = decode_message(frames)
    return Message(b"w", decoded.kind, decoded.seq, decoded.body)


@pytest.mark.parametrize("claim, got", [
    (["float32", [1 << 40], b""], "float32[1099511627776]"),  # 4 TiB claimed in 0 bytes
    (["float32", [1 << 20], b"\0" * 12], "float32[1048576]"),
    (["float32", [3], b"\0" * 8], "float32[3] in 8 bytes (expected 12)"),
    (["float64", [3], b"\0" * 24], "float64[3]"),
    (["float32", [True, 1, 1], b"\0" * 4], "[str, list, ...]"),  # a bool is no dimension
    (["float32", [3], "twelve bytes"], "float32[3] whose data is str, not bytes"),
    (["float32", [3]], "a list of 2"),
    (torch.ones(3), "Tensor"),  # a tensor frame (an earlier worker's form): not read
])
def test_a_claim_that_differs_from_the_layout_is_refused_naming_expected_and_got(
        claim: Any, got: str) -> None:
    message = wire({"next_observation": claim}, raw=True)
    with pytest.raises(ProtocolError) as refused:
        decode(ServedCall, message.body, layout=LAYOUT)
    assert str(refused.value) == f"served_call message field 'inputs' {EXPECTED}" \
        f"{{'next_observation': {got}}}"


def test_a_valid_call_is_a_read_only_view_of_the_bytes_that_came() -> None:
    call = decode(ServedCall, wire({"next_observation": np.arange(3, dtype=np.float32)}).body,
                  layout=LAYOUT)
    array = call.inputs["next_observation"]
    assert array.dtype == np.float32 and array.tolist() == [0.0, 1.0, 2.0]
    assert not array.flags.writeable and not array.flags.owndata  # nothing copied


class _Sent:
    def __init__(self) -> None:
        self.answers: list[dict[str, Any]] = []

    async def __call__(self, peer: bytes, body: Any, kind: str) -> None:
        self.answers.append(body)


async def test_a_call_claiming_a_huge_shape_is_answered_with_the_refusal_and_allocates_nothing(
        ) -> None:
    huge = wire({"next_observation": ["float32", [1 << 40], b""]}, call=9)
    big = wire({"next_observation": np.zeros(1 << 20, np.float32)}, call=10)  # 4 MiB sent
    with anyio.fail_after(60):
        async with ServedModule(Scale(2.0), name=NAME,
                                example={"next_observation": torch.zeros(3)}, clients=2) as served:
            sent = _Sent()
            calls = RemoteCalls(served, sent)
            tracemalloc.start()
            try:
                await calls.on_message(object(), huge)
                await calls.on_message(object(), big)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
    assert peak < 256 << 10, f"refusing two calls cost {peak} bytes of Python/numpy memory"
    assert [a["call"] for a in sent.answers] == [9, 10]
    assert sent.answers[0]["error"] == ("refused: served_call message field 'inputs' "
                                        f"{EXPECTED}{{'next_observation': "
                                        "float32[1099511627776]}")
    assert sent.answers[1]["error"].endswith("{'next_observation': float32[1048576]}")
    assert served.statistics().calls == 0
    assert calls.refused == {"malformed": 2}
