"""A bare Hub in its own process (killed by tests to play a coordinator that dies).

Usage: python hub.py ENDPOINT
"""

import sys

import anyio

from transports import Hub


async def main(endpoint: str) -> None:
    async with Hub(endpoint, heartbeat_interval=0.25, peer_timeout=2) as hub:
        print("up", hub.instance, flush=True)
        async for item in hub:
            print(item, flush=True)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1])
