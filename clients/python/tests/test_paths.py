"""Instance paths that say other segments once decoded (issue 23, L4): `..%2F..%2Fadmin`
reaches a uvicorn app as `../../admin`. The node refuses them (400 `invalid instance id`) and
so does the middleware (400 `invalid instance path`), before the attestation is even read and
before anything is activated: on crafted ASGI scopes, and under uvicorn behind the real node.

The cases are the list the Rust library's tests read too (pinned/tests/data)."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import time
import urllib.parse
from typing import Any

import pytest
from support import (
    Node,
    StartWorker,
    attest,
    shared_inputs,
)

import pinboard_worker
from pinboard_worker.asgi import Message, Scope, splits_when_decoded

SPLITTING = shared_inputs("paths-that-split.json")


def _raw_get(url: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """`GET path` with the path sent byte for byte (no client normalizes it)."""
    parsed = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parsed.hostname or "", parsed.port, timeout=10)
    try:
        conn.request("GET", path, headers=headers or {})
        reply = conn.getresponse()
        return reply.status, reply.read().decode()
    finally:
        conn.close()


# --- on crafted scopes -----------------------------------------------------------------------


SETTINGS: dict[str, Any] = {
    "registry": "http://127.0.0.1:1",
    "token": "t",
    "client_id": "paths",
    "namespaces": ["/threads"],
    "advertise_url": "http://127.0.0.1:2",
}


def _worker() -> pinboard_worker.Worker:
    """A worker as after a registration (session `s-1`, a live lease), with no registry."""
    worker = pinboard_worker.Worker(pinboard_worker.Config(**SETTINGS))
    worker.state.session = "s-1"
    worker.state.lease_until = time.monotonic() + 3600
    return worker


def _call(
    worker: pinboard_worker.Worker, raw: bytes, *, with_raw_path: bool = True
) -> tuple[int, bytes]:
    """The middleware's answer to an attested `GET` of raw path `raw`, as uvicorn gives it:
    `path` decoded, `raw_path` as sent (or none, as some servers give)."""
    called: list[Scope] = []

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        called.append(scope)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"app"})

    token = attest(worker.secret, "s-1", "/threads/a", "17")
    scope: Scope = {
        "type": "http",
        "method": "GET",
        "path": urllib.parse.unquote(raw.decode()),
        "query_string": b"",
        "headers": [(b"pinboard-attestation", token.encode()), (b"pinboard-epoch", b"17")],
    }
    if with_raw_path:
        scope["raw_path"] = raw
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(worker.asgi(app)(scope, receive, send))
    status = sent[0]["status"]
    assert (status == 200) == bool(called)
    return status, b"".join(m.get("body", b"") for m in sent[1:])


@pytest.mark.parametrize("rest", SPLITTING)
def test_a_splitting_path_is_refused_before_admission(rest: str) -> None:
    worker = _worker()
    assert _call(worker, f"/threads/a{rest}".encode()) == (400, b"invalid instance path")
    assert worker.held() == [], "nothing was activated"


def test_without_a_raw_path_what_decodes_to_dot_segments_is_still_refused() -> None:
    worker = _worker()
    for rest in ("/..%2F..%2Fadmin", "/x/%2e%2e/y", "/x%5Cy", "/x/../y"):
        raw = f"/threads/a{rest}".encode()
        assert _call(worker, raw, with_raw_path=False) == (400, b"invalid instance path"), rest


def test_encoded_bytes_that_split_nothing_reach_the_app() -> None:
    worker = _worker()
    for raw in (b"/threads/a", b"/threads/a/x%20y/%41/a.b/...", b"/threads/a/%252F"):
        assert _call(worker, raw) == (200, b"app"), raw


def test_the_rule() -> None:
    assert not splits_when_decoded("/x/y.z/...", b"/threads/a/x/y.z/...")
    assert splits_when_decoded("/x/y", b"/threads/a/x%2Fy")
    assert splits_when_decoded("/x/y", b"/threads%2fa/x/y")
    assert splits_when_decoded("/x/..", None)
    assert splits_when_decoded("/x\\y", None)
    assert not splits_when_decoded("", b"/threads/a")


# --- under uvicorn, behind the real node -----------------------------------------------------


def test_the_node_and_the_worker_each_refuse_a_splitting_path(
    node: Node, start_worker: StartWorker
) -> None:
    worker = start_worker(node.url)
    served = node.place("/threads/abc/x%20y").json()
    assert (served["id"], served["rest"]) == ("abc", "/x y")
    info = worker.info()
    for rest in SPLITTING:
        status, body = _raw_get(node.url, f"/threads/abc{rest}")
        if re.search(r"%(2f|5c)|\\\\", rest, re.IGNORECASE):
            # The repro: the node never forwards an encoded separator.
            assert (status, body) == (400, "invalid instance id"), rest
        elif status == 200:
            # A dot segment the node removed before placing: the worker saw a clean path.
            assert not splits_when_decoded(json.loads(body)["rest"], None), (rest, body)
        else:
            assert (status, body) == (400, "invalid instance id"), rest
        # Sent straight to the worker, attested for its instance: the middleware refuses it.
        token = attest(info["secret"], info["session"], "/threads/abc", served["epoch"])
        headers = {"pinboard-attestation": token, "pinboard-epoch": served["epoch"]}
        refused = _raw_get(worker.url, f"/threads/abc{rest}", headers)
        assert refused == (400, "invalid instance path"), rest
