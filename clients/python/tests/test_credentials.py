"""Worker credentials against the real node, with the fault proxy recording the token each
registry call carried: a token file renewed on disk is sent from the next call on, so the worker
outlives its first token; a worker whose token expires and is not renewed stops once its lease
lapsed, naming the refusal, and its process (`pinboard_worker.serve`) exits 4; with
`exit_on_refused_credential=False` it goes on retrying, and a token file fixed later brings it
back.

Tokens are minted by PyJWT with an `exp` of the test's choosing; the node allows 30 s past
`exp`, so "expired" is seen from the node's own answer, never reckoned from the clock here."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import uvicorn
from support import (
    Call,
    FaultProxy,
    Node,
    StartNode,
    StartWorker,
    eventually,
    passport_token,
)

import pinboard_worker
from pinboard_worker.asgi import Message, Receive, Scope, Send

LEEWAY = 30
"""Seconds past `exp` the node still accepts a token."""


def _expiring(seconds: float) -> str:
    """A worker token the node accepts for about `seconds` more."""
    return passport_token(time.time() - LEEWAY + seconds)


def _expired() -> str:
    return passport_token(time.time() - LEEWAY - 120)


def _refused(node: Node, token: str) -> bool:
    """Whether the node refuses `token` now (a heartbeat of an unknown session is 409 to a
    token it accepts, 401 to one it does not)."""
    body = {
        "sessionId": "none",
        "headroom": 1,
        "draining": False,
        "challenge": "c",
        "challengeValue": "v",
    }
    return node.post("/registry/heartbeat", body, token).status_code == 401


def _write(path: Path, token: str) -> None:
    """Replaces `path` as Kubernetes and Vault agents do: a new file renamed over it."""
    fresh = path.with_suffix(".new")
    fresh.write_text(token + "\n")
    fresh.replace(path)


def _heartbeats_after(proxy: FaultProxy, call: Call) -> list[Call]:
    beats = proxy.calls("heartbeat")
    return beats[beats.index(call) + 1 :] if call in beats else beats


def test_a_renewed_token_file_outlives_the_first_token(
    node: Node, proxy: FaultProxy, start_worker: StartWorker, tmp_path: Path
) -> None:
    first, second = _expiring(12), passport_token(time.time() + 3600)
    path = tmp_path / "token"
    _write(path, first)
    worker = start_worker(proxy.url, token_file=path)
    session = worker.session
    assert [c.bearer for c in proxy.calls("register")] == [first]

    _write(path, second)
    eventually(lambda: any(c.bearer == second for c in proxy.calls("heartbeat")), 10, worker.log)
    # The first token expires; the worker, on the second, keeps its session and its lease.
    eventually(lambda: _refused(node, first), 30, "the first token expiring", interval=0.5)
    expired_at = proxy.calls("heartbeat")[-1]
    eventually(
        lambda: [c for c in _heartbeats_after(proxy, expired_at) if c.status == 200][2:],
        15,
        worker.log,
    )
    beats = proxy.calls("heartbeat")
    assert {c.status for c in beats} == {200}, [(c.status, c.answer) for c in beats]
    switched = [c.bearer for c in beats].index(second)
    assert {c.bearer for c in beats[:switched]} <= {first}
    assert {c.bearer for c in beats[switched:]} == {second}, "never back to the old token"
    assert {c.body["sessionId"] for c in beats} == {session}
    assert len(proxy.calls("register")) == 1
    assert worker.info()["status"]["lease_healthy"]
    assert "token_file" in worker.log() and "holds a new token" in worker.log()


def _refusal_line(session: str) -> str:
    return (
        f"stopping: heartbeat of session {session} refused 401 'unauthorized' until the lease "
        "lapsed; the registry does not accept this worker's credential (token or token_file)"
    )


def test_a_token_that_expires_unreplaced_stops_the_worker_with_status_4(
    start_node: StartNode, start_proxy: Callable[[Node], FaultProxy], start_worker: StartWorker
) -> None:
    node = start_node()
    proxy = start_proxy(node)
    worker = start_worker(proxy.url, token=_expiring(12))
    session = worker.session

    code = worker.wait(90)
    assert code == 4, f"exit status {code}:\n{worker.log()}"
    line = _refusal_line(session)
    assert worker.log().count(line) == 1, worker.log()
    # Refused, and retried with the same session, until the lease lapsed; nothing after.
    beats = proxy.calls("heartbeat")
    refused = [c for c in beats if c.status == 401]
    assert len(refused) >= 2, [(c.status, c.answer) for c in beats]
    assert beats[-len(refused) :] == refused, "refusals to the end, none between successes"
    assert {c.answer["error"] for c in refused} == {"unauthorized"}
    assert {c.body["sessionId"] for c in beats} == {session}
    assert len(proxy.calls("register")) == 1
    assert proxy.calls("release") == [] and proxy.calls("deregister") == []


def test_with_exit_off_a_refused_worker_retries_until_its_token_file_is_fixed(
    node: Node, proxy: FaultProxy, start_worker: StartWorker, tmp_path: Path
) -> None:
    path = tmp_path / "token"
    _write(path, passport_token(time.time() + 3600))
    worker = start_worker(proxy.url, token_file=path, exit_on_refused_credential=False)
    first = worker.session

    _write(path, _expired())
    eventually(lambda: not worker.info()["status"]["lease_healthy"], 15, worker.log)
    # Past the lease: still running, still heartbeating, each refused.
    lapsed = proxy.calls("heartbeat")[-1]
    eventually(lambda: len(_heartbeats_after(proxy, lapsed)) >= 2, 15, worker.log)
    assert {c.status for c in _heartbeats_after(proxy, lapsed)} == {401}
    assert worker.proc.poll() is None
    assert "stopping:" not in worker.log()

    # Fixed: renewed on the next heartbeat (or registered again, if the node dropped the
    # session meanwhile), with the fixed token.
    fixed = passport_token(time.time() + 3600)
    _write(path, fixed)
    eventually(lambda: worker.info()["status"]["lease_healthy"], 20, worker.log)
    renewed = [c for c in proxy.calls() if c.status == 200 and c.bearer == fixed]
    assert {c.route for c in renewed} & {"heartbeat", "register"}, proxy.calls()[-3:]
    assert worker.session in (first, proxy.calls("register")[-1].answer["sessionId"])


def test_run_raises_credential_refused(node: Node) -> None:
    """`await worker.run()` in the test's own event loop, the worker's app served by uvicorn
    beside it (lifespan off: `run` starts the worker)."""

    async def not_found(scope: Scope, receive: Receive, send: Send) -> None:
        reply: Message = {"type": "http.response.start", "status": 404, "headers": []}
        await send(reply)
        await send({"type": "http.response.body", "body": b""})

    async def main() -> tuple[pinboard_worker.Worker, pinboard_worker.CredentialRefused]:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        config = pinboard_worker.Config(
            registry=node.url,
            token=_expiring(12),
            client_id="run",
            namespaces=["/threads"],
            advertise_url=f"http://127.0.0.1:{listener.getsockname()[1]}",
        )
        worker = pinboard_worker.Worker(config)
        app = worker.asgi(not_found)
        server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning"))
        serving = asyncio.ensure_future(server.serve(sockets=[listener]))
        try:
            with pytest.raises(pinboard_worker.CredentialRefused) as refused:
                await asyncio.wait_for(worker.run(), 90)
            await worker.stop()  # nothing left to do: returns at once
        finally:
            server.should_exit = True
            await serving
            listener.close()
        return worker, refused.value

    worker, refused = asyncio.run(main())
    assert (refused.status, refused.error) == (401, "unauthorized")
    assert str(refused) == (
        "the registry refused this worker's credential until its lease lapsed: 401 unauthorized"
    )
    assert worker.session_id is not None, "it had registered"
    status = worker.status()
    assert not status.lease_healthy and worker.held() == []
