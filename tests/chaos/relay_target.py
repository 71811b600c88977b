"""The relay fuzzer's target: a host relay and its two honest members, measured from inside.

Usage: python relay_target.py BACKEND UPSTREAM

Runs a :class:`~asyncrl._worker.relay.HostRelay` that joins the coordinator at UPSTREAM
(the fuzzer's hostile one, see ``test_wire_fuzz_relay.py``) for members ``m0`` and
``m1``, each an honest :class:`transports.Link` on the relay's own endpoint, in this
process, so that what it measures is the relay's alone (``wire_target.Gauges``: the
event loop's longest stall, the peak memory since the baseline). A member acks every
weights message with the version its meta names, and checks each *probe* (a weights
message whose meta carries the session's ``probe`` token, which only the fuzzer's
honest sends have): its body must be ``{"value": full((PROBE_SIZE,), version)}`` exactly
(or, streamed, that tensor's bytes as the one part of one chunk).

Commands on stdin, one a line, each answered with one JSON line on stdout: ``report``,
``baseline``. End of stdin ends it; a relay that ends by itself prints
``{"event": "ended", ...}``.
"""

from __future__ import annotations

import faulthandler
import logging
import signal
import sys
import traceback
from typing import Any

import anyio
import anyio.to_thread
import torch

from asyncrl._protocol import WEIGHTS_KIND, WeightsApplied
from asyncrl._worker.relay import HostRelay
from tests.chaos.wire_target import Gauges, _counted, _status, _Warnings, reactions, say, warnings
from transports import Link, Message, RateLimitedLog

MEMBERS = (b"m0", b"m1")
LIVENESS: dict[str, Any] = {"heartbeat_interval": 0.2, "peer_timeout": 1.5}
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
    RateLimitedLog.log = _counted  # type: ignore[method-assign]
    logging.getLogger().addHandler(_Warnings())
    logging.getLogger().setLevel(logging.INFO)
    gauges = Gauges()
    members: list[Member] = []
    relay: HostRelay | None = None

    def report() -> dict[str, Any]:
        stats = relay.statistics() if relay is not None else None
        return {"event": "report", "max_gap": round(gauges.max_gap, 3),
                "max_busy": round(gauges.max_busy, 3),
                "rss_growth_mb": round((_status("VmHWM") - gauges.baseline_kib) / 1024, 1),
                "registered": bool(stats and stats.registered),
                "attached": stats.attached if stats else 0,
                "peers": len(relay.hub.peers) if relay is not None and relay.hub else 0,
                "probes": {m.link.identity.decode(): {str(v): ok for v, ok in m.probes.items()}
                           for m in members},
                "others": sum(m.others for m in members),
                "reactions": dict(reactions), "warnings": list(warnings)[-5:]}

    async def commands(scope: anyio.CancelScope) -> None:
        while line := await anyio.to_thread.run_sync(sys.stdin.readline,
                                                     abandon_on_cancel=True):
            if line.strip() == "baseline":
                gauges.reset()
                say(event="baseline", rss_mb=round(gauges.baseline_kib / 1024, 1))
            else:
                say(**report())
        scope.cancel()

    try:
        async with HostRelay(upstream, MEMBERS, **LIVENESS) as relay, \
                Link(relay.endpoint, identity=MEMBERS[0], **LIVENESS) as first, \
                Link(relay.endpoint, identity=MEMBERS[1], **LIVENESS) as second, \
                anyio.create_task_group() as tg:
            members.extend([Member(first, token), Member(second, token)])
            tg.start_soon(gauges.tick)
            tg.start_soon(commands, tg.cancel_scope)
            for member in members:
                tg.start_soon(member.serve)
            say(event="listening", endpoint=relay.endpoint)
    except BaseException as exc:  # the fuzzer wants to know how the relay ended
        if isinstance(exc, anyio.get_cancelled_exc_class()):
            raise
        say(event="ended", error=f"{type(exc).__name__}: {exc}",
            traceback=traceback.format_exc()[-4000:])
        raise SystemExit(1) from None


if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1)
    anyio.run(main, sys.argv[2], sys.argv[3], backend=sys.argv[1])
