"""An operator's move and pause of one instance held by Python workers, through the real node:
a move (`POST /registry/move`) tells the owner a `WindDown` with `moved`, closes the
instance's WebSockets with 1012 `moved` at the fence, and the next placement goes to the named
worker; a pause (`POST /registry/pause`) makes the node answer 503 `instance paused` +
`Retry-After: 1` while the worker keeps holding the instance, and a resume serves it again at
the same epoch."""

from __future__ import annotations

import json
import time

import pytest
import websockets.sync.client
from support import Node, Redis, StartWorker, eventually, operator_token
from websockets.exceptions import ConnectionClosed

WAIT = 15.0


def test_a_move_closes_the_websocket_1012_moved_and_places_on_the_named_worker(
    redis: Redis, node: Node, start_worker: StartWorker
) -> None:
    owner = start_worker(node.url, client_id="worker-1")
    node.place("/threads/m1")
    heir = start_worker(node.url, client_id="worker-2")
    assert redis.row("/threads", "m1")["sessionId"] == owner.session  # type: ignore[index]

    url = f"ws://{node.addr}/threads/m1/ws"
    with websockets.sync.client.connect(url, open_timeout=WAIT) as ws:
        greeting = json.loads(ws.recv(timeout=WAIT))
        assert greeting["session"] == owner.session
        body = {"namespace": "/threads", "id": "m1", "to": "worker-2"}
        moved = node.post("/registry/move", body, operator_token())
        assert (moved.status_code, moved.json()) == (200, {"queued": True, "to": heir.session})
        asked = time.monotonic()
        row = redis.row("/threads", "m1")
        assert row is not None and row["mv"]["to"] == heir.session, row

        # The owner hears a move, and at its fence (one lease: 3 s here) the socket is closed
        # for its client to reconnect where the instance goes.
        downs = eventually(lambda: owner.events("WindDown"), 10, owner.log)
        assert (downs[0]["id"], downs[0]["moved"]) == ("m1", True)
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                ws.recv(timeout=WAIT)
        frame = closed.value.rcvd
        assert frame is not None and (frame.code, frame.reason) == (1012, "moved")
        assert time.monotonic() - asked > 1.5, "not before the fence"

    # Past the fence, the next request places the instance on the named worker, and the row no
    # longer names it.
    served = node.place("/threads/m1").json()
    assert served["session"] == heir.session, served
    row = redis.row("/threads", "m1")
    assert row is not None and row["sessionId"] == heir.session and "mv" not in row, row
    history = node.get(
        "/registry/history",
        params={"ns": "/threads", "id": "m1"},
        headers={"authorization": f"Bearer {operator_token()}"},
    )
    assert history.status_code == 200, history.text
    assert history.json()["entries"][0]["reason"] == "moved", history.text


def test_a_pause_answers_503_and_a_resume_serves_the_held_instance_again(
    node: Node, start_worker: StartWorker
) -> None:
    worker = start_worker(node.url)
    before = node.place("/threads/p1").json()
    body = {"namespace": "/threads", "id": "p1", "reason": "incident 12"}
    paused = node.post("/registry/pause", body, operator_token())
    assert (paused.status_code, paused.json()) == (200, {"ok": True}), paused.text

    refused = node.get("/threads/p1")
    assert refused.status_code == 503
    assert refused.json() == {"error": "instance paused"}
    assert refused.headers["retry-after"] == "1"
    # The worker still holds it: the pause is the node's answer, not the placement's end.
    assert ["/threads", "p1"] in [held[:2] for held in worker.held()], worker.held()
    assert worker.events("WindDown") == []

    body = {"namespace": "/threads", "id": "p1"}
    resumed = node.post("/registry/resume", body, operator_token())
    assert (resumed.status_code, resumed.json()) == (200, {"ok": True}), resumed.text
    after = node.get("/threads/p1")
    assert after.status_code == 200, after.text
    assert (after.json()["session"], after.json()["epoch"]) == (before["session"], before["epoch"])
