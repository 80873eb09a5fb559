"""What the middleware costs a request, side by side in one run: the same trivial ASGI app
called bare and behind `PinnedMiddleware` (attestation verified, epoch parsed and bound, the
instance admitted), in process, with no server and no network, so the difference is the
middleware's own work. The worker's session and lease are set by hand (no registry).

    python benches/middleware.py [requests]     # prints the median of 7 rounds of each
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import statistics
import sys
import time
from typing import Any

import pinboard_worker
from pinboard_worker.asgi import Message, Scope


def mint(secret: str, claims: dict[str, Any]) -> str:
    def part(value: dict[str, Any]) -> str:
        raw = json.dumps(value, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    signed = part({"alg": "HS256", "typ": "pinboard+jwt"}) + "." + part(claims)
    mac = hmac.new(secret.encode(), signed.encode(), hashlib.sha256).digest()
    return signed + "." + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


async def app(scope: Scope, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def rounds(requests: int) -> tuple[float, float]:
    worker = pinboard_worker.Worker(
        pinboard_worker.Config(
            registry="http://127.0.0.1:1",
            token="t",
            client_id="bench",
            namespaces=["/threads"],
            advertise_url="http://127.0.0.1:2",
        )
    )
    worker.state.session = "s-1"
    worker.state.lease_until = time.monotonic() + 3600
    wrapped = worker.asgi(app)
    now = int(time.time())
    token = mint(
        worker.secret,
        {
            "aud": "s-1",
            "iat": now,
            "exp": now + 30,
            "purpose": "forward",
            "inst": "/threads/a",
            "epoch": "17",
        },
    )
    scope: Scope = {
        "type": "http",
        "method": "GET",
        "path": "/threads/a/count",
        "query_string": b"",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"pinboard-attestation", token.encode()),
            (b"pinboard-epoch", b"17"),
        ],
    }

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    statuses: list[int] = []

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    async def per_request(target: Any) -> float:
        started = time.perf_counter()
        for _ in range(requests):
            await target(scope, receive, send)
        return (time.perf_counter() - started) / requests * 1e6

    bare, behind = [], []
    for _ in range(7):
        bare.append(await per_request(app))
        behind.append(await per_request(wrapped))
    assert set(statuses) == {200}, set(statuses)
    return statistics.median(bare), statistics.median(behind)


def main() -> None:
    requests = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    bare, behind = asyncio.run(rounds(requests))
    print(f"python {sys.version.split()[0]}, {requests} requests per round, median of 7")
    print(f"bare app:           {bare:6.2f} us/request")
    print(f"behind middleware:  {behind:6.2f} us/request")
    print(f"middleware's cost:  {behind - bare:6.2f} us/request")


if __name__ == "__main__":
    main()
