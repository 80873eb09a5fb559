"""What the middleware refuses, against a worker registered with the real node: requests sent
straight to the worker, attested with PyJWT as the node would (or would not) attest them.

- instance requests (contract §4, §11): every invalid or misbound attestation is 403
  `{"detail":"invalid attestation"}` (a WebSocket: closed 1008), a missing or non-digit
  `Pinboard-Epoch` 400 `malformed placement epoch`, a stale epoch 409 `stale placement epoch`;
- `/_pinned/challenge`: the current challenge's value for the proxy secret or a `challenge`
  attestation, 404 `unknown challenge`, 403 `invalid proxy secret`;
- `/_pinned/stats`: attested with a `stats` token only (and the node's own stats call).

The worker registers through the fault proxy, which only records here: the challenges the
worker sent are read from the calls it saw.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import websockets.exceptions
import websockets.sync.client
from conftest import Logs
from support import (
    INVALID_ATTESTATION,
    FaultProxy,
    Node,
    Redis,
    WorkerProcess,
    attest,
    eventually,
    operator_token,
)

Headers = list[tuple[str, str | bytes]]


@dataclass
class Fleet:
    redis: Redis
    node: Node
    proxy: FaultProxy
    worker: WorkerProcess
    info: dict[str, Any]


@pytest.fixture(scope="module")
def fleet(binary: object, tmp_path_factory: pytest.TempPathFactory) -> Generator[Fleet, None, None]:
    base = tmp_path_factory.mktemp("refusals")
    redis = Redis(base / "redis")
    redis.end_cold_start()
    node = proxy = worker = None
    try:
        node = Node(redis.url, base / "node.log")
        proxy = FaultProxy(node.url)
        worker = WorkerProcess(proxy.url, base / "worker.log")
        worker.wait_registered()
        yield Fleet(redis, node, proxy, worker, worker.info())
    finally:
        for part in (worker, proxy, node):
            if part is not None:
                part.close() if isinstance(part, FaultProxy) else part.kill()
        redis.stop()


@pytest.fixture(autouse=True)
def _logs_on_failure(fleet: Fleet, logs: Logs) -> None:
    logs.paths += [fleet.node.log_path, fleet.worker.log_path]


def _epoch(value: str) -> tuple[str, str]:
    return ("pinboard-epoch", value)


def _attested(token: str, epoch: str = "7") -> Headers:
    return [("pinboard-attestation", token), _epoch(epoch)]


Case = Callable[[dict[str, Any], str], Headers]
"""The headers of a refused request to `/threads/{id}`, from the worker's info."""


def _forward(info: dict[str, Any], id: str, **kw: Any) -> str:
    """A valid forward token for `/threads/{id}` at epoch 7, but for `kw`."""
    options: dict[str, Any] = {"inst": f"/threads/{id}", "epoch": "7", "purpose": "forward"}
    options.update(kw)
    inst, epoch, purpose = options.pop("inst"), options.pop("epoch"), options.pop("purpose")
    return attest(info["secret"], info["session"], inst, epoch, purpose, **options)


REFUSED: dict[str, Case] = {
    "missing": lambda info, id: [_epoch("7")],
    "garbled": lambda info, id: _attested("garbage"),
    "not base64": lambda info, id: _attested("!!!.???.###"),
    "empty": lambda info, id: _attested(""),
    "wrong secret": lambda info, id: _attested(
        attest("not-the-secret-" * 4, info["session"], f"/threads/{id}", "7")
    ),
    "wrong aud": lambda info, id: _attested(
        attest(info["secret"], "another-session", f"/threads/{id}", "7")
    ),
    "expired": lambda info, id: _attested(_forward(info, id, iat=time.time() - 120)),
    "issued in the future": lambda info, id: _attested(_forward(info, id, iat=time.time() + 120)),
    "typ JWT": lambda info, id: _attested(_forward(info, id, headers={"typ": "JWT"})),
    "alg none": lambda info, id: _attested(_forward(info, id, algorithm="none")),
    "alg HS512": lambda info, id: _attested(_forward(info, id, algorithm="HS512")),
    "crit header": lambda info, id: _attested(_forward(info, id, headers={"crit": ["exp"]})),
    "purpose stats": lambda info, id: _attested(_forward(info, id, purpose="stats")),
    "purpose wake": lambda info, id: _attested(_forward(info, id, purpose="wake")),
    "purpose challenge": lambda info, id: _attested(_forward(info, id, purpose="challenge")),
    "purpose unknown": lambda info, id: _attested(_forward(info, id, purpose="admin")),
    "inst of another id": lambda info, id: _attested(_forward(info, id, inst="/threads/other")),
    "inst of another ns": lambda info, id: _attested(_forward(info, id, inst=f"/docs/{id}")),
    "no inst": lambda info, id: _attested(
        attest(info["secret"], info["session"], None, "7", "forward")
    ),
    "epoch mismatch": lambda info, id: _attested(_forward(info, id, epoch="8"), "7"),
    "epoch other digits": lambda info, id: _attested(_forward(info, id, epoch="07"), "7"),
    "no epoch claim": lambda info, id: _attested(
        attest(info["secret"], info["session"], f"/threads/{id}", None, "forward")
    ),
    "two epoch headers": lambda info, id: [*_attested(_forward(info, id)), _epoch("7")],
    "two attestations": lambda info, id: [
        ("pinboard-attestation", _forward(info, id)),
        *_attested(_forward(info, id)),
    ],
    # The attestation is checked before the epoch: a bad token with a bad epoch is a 403.
    "garbled with a malformed epoch": lambda info, id: _attested("garbage", "7x"),
}


@pytest.mark.parametrize("case", list(REFUSED), ids=list(REFUSED))
def test_invalid_attestations_are_403(fleet: Fleet, case: str) -> None:
    id = "r-" + case.replace(" ", "-")
    headers = REFUSED[case](fleet.info, id)
    reply = fleet.worker.request("GET", f"/threads/{id}/x", headers)
    assert (reply.status_code, reply.json()) == (403, INVALID_ATTESTATION), reply.text
    assert [h for h in fleet.worker.held() if h[1] == id] == [], "nothing admitted"


def test_a_valid_attestation_is_served(fleet: Fleet) -> None:
    token = _forward(fleet.info, "ok", epoch="7")
    reply = fleet.worker.request("GET", "/threads/ok/x?y=1", _attested(token))
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["ns"] == "/threads"
    assert (body["id"], body["rest"], body["query"]) == ("ok", "/x", "y=1")
    assert (body["epoch"], body["activated"]) == ("7", True)
    assert ["/threads", "ok", "7"] in fleet.worker.held()
    # The attestation's optional claims reach the app.
    acct = {"sub": "alice", "claims": {"plan": "pro"}}
    token = _forward(fleet.info, "ok", caller="/docs/d1", depth=2, acct=acct)
    body = fleet.worker.request("GET", "/threads/ok", _attested(token)).json()
    assert (body["caller"], body["depth"], body["acct"]) == ("/docs/d1", 2, acct)
    assert body["activated"] is False


MALFORMED: dict[str, Callable[[dict[str, Any]], Headers]] = {
    "no epoch header": lambda info: [("pinboard-attestation", _forward(info, "m", epoch="7"))],
    "letters": lambda info: _attested(_forward(info, "m", epoch="7x"), "7x"),
    "negative": lambda info: _attested(_forward(info, "m", epoch="-1"), "-1"),
    "plus": lambda info: _attested(_forward(info, "m", epoch="+1"), "+1"),
    "exponent": lambda info: _attested(_forward(info, "m", epoch="1e3"), "1e3"),
    "hex": lambda info: _attested(_forward(info, "m", epoch="0x10"), "0x10"),
    "empty": lambda info: _attested(_forward(info, "m", epoch=""), ""),
    # U+00B2 SUPERSCRIPT TWO: str.isdigit() says yes; not an ASCII digit.
    "superscript digit": lambda info: [
        ("pinboard-attestation", _forward(info, "m", epoch="\u00b2")),
        ("pinboard-epoch", "\u00b2".encode("latin-1")),
    ],
}


@pytest.mark.parametrize("case", list(MALFORMED), ids=list(MALFORMED))
def test_malformed_epochs_are_400(fleet: Fleet, case: str) -> None:
    reply = fleet.worker.request("GET", "/threads/m", MALFORMED[case](fleet.info))
    assert (reply.status_code, reply.text) == (400, "malformed placement epoch")
    assert reply.headers["content-type"].startswith("text/plain")
    assert [h for h in fleet.worker.held() if h[1] == "m"] == []


def test_stale_epochs_are_409(fleet: Fleet) -> None:
    worker = fleet.worker

    def at(epoch: str) -> httpx.Response:
        return worker.forward("/threads/s1/x", epoch, info=fleet.info)

    def stale(reply: httpx.Response) -> bool:
        return (reply.status_code, reply.text) == (409, "stale placement epoch")

    assert at("10").json()["activated"] is True
    assert stale(at("9"))
    assert stale(at("1"))
    assert at("010").json()["activated"] is False, "numerically the epoch held"
    # Re-placed here at a higher epoch: a new activation, and the old epoch is stale now.
    assert at("11").json()["activated"] is True
    assert stale(at("10"))
    assert ["/threads", "s1", "11"] in worker.held()
    # Released: its epoch and any lower one are stale; a higher one activates it again.
    assert worker.call("release", ns="/threads", id="s1") == {"result": False}, "no row"
    assert ["/threads", "s1", "11"] not in worker.held()
    assert stale(at("11"))
    assert stale(at("5"))
    reply = at("12")
    assert (reply.status_code, reply.json()["activated"]) == (200, True)


def _text(headers: Headers) -> list[tuple[str, str]]:
    return [(k, v.decode("latin-1") if isinstance(v, bytes) else v) for k, v in headers]


def _ws_url(fleet: Fleet, path: str) -> str:
    return fleet.worker.url.replace("http://", "ws://") + path


def test_a_websocket_with_an_invalid_attestation_is_closed_1008(fleet: Fleet) -> None:
    cases: list[Headers] = [
        [_epoch("7")],
        _attested("garbage"),
        _attested(_forward(fleet.info, "w1", purpose="stats")),
        _attested(_forward(fleet.info, "w1", inst="/threads/w2")),
    ]
    for headers in cases:
        with (
            websockets.sync.client.connect(
                _ws_url(fleet, "/threads/w1/ws"), additional_headers=_text(headers), open_timeout=10
            ) as ws,
            pytest.raises(websockets.exceptions.ConnectionClosed) as closed,
        ):
            ws.recv(timeout=10)
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1008, headers
    assert [h for h in fleet.worker.held() if h[1] == "w1"] == []

    # A valid one is admitted and reaches the app.
    token = _forward(fleet.info, "w1", epoch="7")
    with websockets.sync.client.connect(
        _ws_url(fleet, "/threads/w1/ws"),
        additional_headers=_text(_attested(token)),
        open_timeout=10,
    ) as ws:
        first = ws.recv(timeout=10)
        assert '"activated":true' in str(first).replace(" ", "")
        ws.send("hi")
        assert ws.recv(timeout=10) == "echo:hi"


def test_a_websocket_with_a_malformed_epoch_is_answered_400(fleet: Fleet) -> None:
    token = _forward(fleet.info, "w3", epoch="x")
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        websockets.sync.client.connect(
            _ws_url(fleet, "/threads/w3/ws"), additional_headers=_text(_attested(token, "x"))
        )
    assert refused.value.response.status_code == 400
    assert refused.value.response.body == b"malformed placement epoch"


# --- /_pinned/challenge ------------------------------------------------------------------


def _challenge(fleet: Fleet, challenge: str, headers: Headers) -> httpx.Response:
    return fleet.worker.request("GET", f"/_pinned/challenge?challenge={challenge}", headers)


def _latest_challenge(fleet: Fleet) -> tuple[str, str]:
    """The challenge and value of the last register or heartbeat the worker sent."""
    sent = [c for c in fleet.proxy.calls() if c.route in ("register", "heartbeat")]
    body = sent[-1].body
    return body["challenge"], body["challengeValue"]


def test_the_challenge_is_answered_for_the_secret_or_a_challenge_attestation(
    fleet: Fleet,
) -> None:
    secret, session = fleet.info["secret"], fleet.info["session"]
    by_secret: Headers = [("pinboard-proxy-secret", secret)]

    def answered(headers: Callable[[], Headers]) -> bool:
        # The current challenge moves on with every heartbeat: ask for the latest one seen.
        challenge, value = _latest_challenge(fleet)
        reply = _challenge(fleet, challenge, headers())
        return reply.status_code == 200 and reply.json() == {"value": value}

    eventually(lambda: answered(lambda: by_secret), 10, "the challenge answered for the secret")
    eventually(
        lambda: answered(
            lambda: [("pinboard-attestation", attest(secret, session, None, None, "challenge"))]
        ),
        10,
        "the challenge answered for a challenge attestation",
    )

    # A challenge the worker never sent, or one several heartbeats old, is unknown.
    unknown = _challenge(fleet, secrets.token_hex(16), by_secret)
    assert (unknown.status_code, unknown.text) == (404, "unknown challenge")
    first = fleet.proxy.calls("register")[0].body["challenge"]
    eventually(lambda: len(fleet.proxy.calls("heartbeat")) >= 2, 10, "two heartbeats")
    old = _challenge(fleet, first, by_secret)
    assert (old.status_code, old.text) == (404, "unknown challenge")

    # Without the secret or a valid challenge attestation: 403, checked before the challenge.
    challenge, _ = _latest_challenge(fleet)
    refused: list[Headers] = [
        [],
        [("pinboard-proxy-secret", "not-the-secret")],
        [("pinboard-proxy-secret", secret), ("pinboard-proxy-secret", secret)],
        [("pinboard-attestation", attest(secret, session, None, None, "forward"))],
        [("pinboard-attestation", attest(secret, session, None, None, "stats"))],
        [("pinboard-attestation", attest(secret, "another-session", None, None, "challenge"))],
        [("pinboard-attestation", attest("wrong" * 8, session, None, None, "challenge"))],
    ]
    for headers in refused:
        for asked in (challenge, "stale"):
            reply = _challenge(fleet, asked, headers)
            assert (reply.status_code, reply.text) == (403, "invalid proxy secret"), headers
    posted = fleet.worker.client.post(f"/_pinned/challenge?challenge={challenge}")
    assert posted.status_code == 405


# --- /_pinned/stats ----------------------------------------------------------------------


def test_stats_are_attested(fleet: Fleet) -> None:
    secret, session = fleet.info["secret"], fleet.info["session"]
    assert fleet.worker.forward("/docs/st1", "3", info=fleet.info).status_code == 200
    unattested: list[Headers] = [
        [],
        [("pinboard-attestation", "garbage")],
        [("pinboard-attestation", attest(secret, session, None, None, "forward"))],
        [("pinboard-attestation", attest(secret, session, None, None, "challenge"))],
        [("pinboard-attestation", attest(secret, "another-session", None, None, "stats"))],
        [("pinboard-proxy-secret", secret)],
    ]
    for headers in unattested:
        reply = fleet.worker.request("GET", "/_pinned/stats", headers)
        assert (reply.status_code, reply.json()) == (403, INVALID_ATTESTATION), headers
    token = attest(secret, session, None, None, "stats")
    reply = fleet.worker.request("GET", "/_pinned/stats", [("pinboard-attestation", token)])
    assert reply.status_code == 200, reply.text
    stats = reply.json()
    assert stats["sessionId"] == session
    assert stats["clientId"] == "worker-1"
    assert stats["advertiseUrl"] == fleet.worker.url
    assert stats["namespaces"] == ["/threads", "/docs"]
    assert "st1" in stats["instances"]["/docs"]
    assert stats["instanceCount"] == sum(len(ids) for ids in stats["instances"].values())
    assert stats["leaseHealthy"] is True

    # The node's own stats call, attested by the node, is accepted.
    operator = {"authorization": f"Bearer {operator_token()}"}
    seen = fleet.node.get("/registry/stats", headers=operator).json()
    assert [w["stats"]["sessionId"] for w in seen["workers"]] == [session], seen
    assert "st1" in seen["workers"][0]["stats"]["instances"]["/docs"]


def test_head_on_stats_is_answered_like_get_without_a_body(fleet: Fleet) -> None:
    token = attest(fleet.info["secret"], fleet.info["session"], None, None, "stats")
    stats = fleet.worker.request("HEAD", "/_pinned/stats", [("pinboard-attestation", token)])
    assert (stats.status_code, stats.content) == (200, b"")
    # The worker still answers afterwards on the same connection.
    assert fleet.worker.request("GET", "/_pinned/stats", []).status_code == 403
