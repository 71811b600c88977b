"""The relay fuzzer's target: a host relay and its two honest members, measured from inside.

Usage: python relay_target.py BACKEND UPSTREAM TOKEN

Runs a :class:`~asyncrl._worker.relay.HostRelay` that joins the coordinator at UPSTREAM
(the fuzzer's hostile one, see ``test_wire_fuzz_relay.py``) for members ``m0`` and
``m1``, each an honest :class:`transports.Link` on the relay's own endpoint, in this
process, so that what it measures is the relay's alone (``measured.py``: the event
loop's longest stall, the peak memory since the baseline, every refusal counted). A
member acks every weights message with the version its meta names, and checks each
*probe* (a weights message whose meta carries TOKEN, which only the fuzzer's honest
sends have): its body must be ``{"value": full((PROBE_SIZE,), version)}`` exactly
(or, streamed, that tensor's bytes as the one part of one chunk).

Commands on stdin, one a line, each answered with one JSON line on stdout: ``report``,
``baseline``. End of stdin ends it; a relay that ends by itself prints
``{"event": "ended", ...}``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the checkout

from asyncrl._protocol import WEIGHTS_KIND, WeightsApplied
from asyncrl._worker.relay import HostRelay
from tests.chaos.measured import LIVENESS, Measured, run, say
from transports import Link, Message

MEMBERS = (b"m0", b"m1")
PROBE_SIZE = 256


def probe_value(version: int) -> torch.Tensor:
    """What a probe of ``version`` holds."""
    return torch.full((PROBE_SIZE,), float(version))


class Member:
    """One honest member: acks what comes, checks the probes."""

    def __init__(self, link: Link, token: str) -> None:
        self.link, self.token = link, token
        self.probes: dict[int, bool] = {}  # version -> its body was exact
        self.others = 0

    async def serve(self) -> None:
        async for message in self.link:
            if message.kind == WEIGHTS_KIND:
                await self.take(message)

    async def take(self, message: Message) -> None:
        meta = message.meta if isinstance(message.meta, dict) else {}
        version = meta.get("version")
        if meta.get("probe") == self.token and type(version) is int:
            body = message.body
            if "chunk" in meta:  # one chunk of one part: the value's bytes
                value = (body[0].view(torch.float32) if isinstance(body, list) and len(body) == 1
                         and isinstance(body[0], torch.Tensor) else None)
            else:
                value = body.get("value") if isinstance(body, dict) else None
            self.probes[version] = (isinstance(value, torch.Tensor)
                                    and torch.equal(value, probe_value(version)))
            while len(self.probes) > 1000:
                del self.probes[next(iter(self.probes))]
        else:
            self.others += 1
        if message.needs_ack:
            if type(version) is int and 0 <= version < 1 << 62:
                await self.link.ack(message, WeightsApplied("policy", version).to_body())
            else:
                await self.link.ack(message, error=ValueError("no version to apply"))


async def main(upstream: str, token: str) -> None:
    members: list[Member] = []
    relay: HostRelay | None = None

    def numbers() -> dict[str, Any]:
        stats = relay.statistics() if relay is not None else None
        return {"registered": bool(stats and stats.registered),
                "attached": stats.attached if stats else 0,
                "peers": len(relay.hub.peers) if relay is not None and relay.hub else 0,
                "probes": {m.link.identity.decode(): {str(v): ok for v, ok in m.probes.items()}
                           for m in members},
                "others": sum(m.others for m in members)}

    measured = Measured(numbers)
    with measured.ending():
        async with HostRelay(upstream, MEMBERS, **LIVENESS) as relay, \
                Link(relay.endpoint, identity=MEMBERS[0], **LIVENESS) as first, \
                Link(relay.endpoint, identity=MEMBERS[1], **LIVENESS) as second, \
                anyio.create_task_group() as tg:
            members.extend([Member(first, token), Member(second, token)])
            measured.start(tg)
            for member in members:
                tg.start_soon(member.serve)
            say(event="listening", endpoint=relay.endpoint)


if __name__ == "__main__":
    run(main, sys.argv[2], sys.argv[3])
