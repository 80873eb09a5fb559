"""WebSockets of an instance say goodbye when its epoch ends on the worker: through the real
node, with a real client (`websockets`), the middleware closes them itself with 1012 and a
reason naming the epoch that ended (an operator's wind-down at its deadline, a release, a newer
epoch placed here) or `moved` (a move's wind-down, queued as the node queues one), and the app
sees a disconnect; an app that only sends ends as it would if its client left. The node, stopped
past its grace, closes them 1001 itself."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import websockets.sync.client
from support import (
    Node,
    Redis,
    StartNode,
    StartWorker,
    WorkerProcess,
    eventually,
    operator_token,
    placements_key,
)
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

WAIT = 15.0


@contextlib.contextmanager
def _connect(node: Node, path: str) -> Iterator[tuple[ClientConnection, dict[str, Any]]]:
    """A WebSocket through the node to `path`, its greeting, and one echo."""
    with websockets.sync.client.connect(f"ws://{node.addr}{path}", open_timeout=WAIT) as ws:
        greeting: dict[str, Any] = json.loads(ws.recv(timeout=WAIT))
        if path.endswith("/ws"):
            ws.send("hi")
            assert ws.recv(timeout=WAIT) == "echo:hi"
        yield ws, greeting


def _closed(ws: ClientConnection) -> tuple[int, str]:
    """The code and reason of the close the client gets (messages before it skipped)."""
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            ws.recv(timeout=WAIT)
    frame = closed.value.rcvd
    assert frame is not None, f"closed without a close frame: {closed.value!r}"
    return frame.code, frame.reason


def _holding(node: Node, start_worker: StartWorker, path: str) -> WorkerProcess:
    """A worker registered with `node`, holding the instance of `path` (placed through it)."""
    worker = start_worker(node.url)
    node.place(path)
    return worker


def _app_saw_end(worker: WorkerProcess, path: str) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        return next((w for w in worker.info()["websockets"] if w["path"] == path), None)

    return eventually(ended, 10, lambda: f"the app's {path} ended\n{worker.log()}")


def test_an_operator_wind_down_closes_1012_naming_the_epoch_at_its_deadline(
    node: Node, start_worker: StartWorker
) -> None:
    worker = _holding(node, start_worker, "/threads/w1")
    with _connect(node, "/threads/w1/ws") as (ws, greeting):
        body = {"namespace": "/threads", "id": "w1", "deadline": 1}
        queued = node.post("/registry/wind_down", body, operator_token())
        assert queued.json() == {"queued": True}, queued.text
        asked = time.monotonic()
        assert _closed(ws) == (1012, f"epoch {greeting['epoch']} ended")
        # Not before the deadline: the fence is a lease (3 s here) at least.
        assert time.monotonic() - asked > 1.5
    assert _app_saw_end(worker, "/threads/w1/ws")["code"] == 1012
    assert "Exception in ASGI application" not in worker.log()


def test_a_moved_wind_down_closes_1012_moved(
    redis: Redis, node: Node, start_worker: StartWorker
) -> None:
    worker = _holding(node, start_worker, "/threads/m1")
    # As the node queues a move's wind-down: an absolute deadline (ms) and `moved`.
    message = {
        "type": "wind_down",
        "ns": "/threads",
        "id": "m1",
        "deadline": int(time.time() * 1000) + 500,
        "moved": True,
    }
    queue = f"pinboard:{{r}}:control:{worker.session}"
    with _connect(node, "/threads/m1/ws") as (ws, _):
        redis.cli("HSET", queue, "900001", json.dumps(message))
        assert _closed(ws) == (1012, "moved")
    downs = eventually(lambda: worker.events("WindDown"), 10, worker.log)
    assert downs[0]["moved"] is True


def test_a_release_and_a_newer_epoch_close_the_old_epochs_sockets(
    redis: Redis, node: Node, start_worker: StartWorker
) -> None:
    worker = _holding(node, start_worker, "/threads/r1")
    with _connect(node, "/threads/r1/ws") as (released, greeting):
        assert worker.call("release", ns="/threads", id="r1") == {"result": True}
        assert _closed(released) == (1012, f"epoch {greeting['epoch']} ended")

    node.place("/threads/n1")
    with _connect(node, "/threads/n1/ws") as (old, greeting):
        # The row gone (as after the fence of a wind-down the worker never acted on), the next
        # request places the instance again, here, at a newer epoch.
        redis.cli("HDEL", placements_key("/threads", "n1"), "n1")
        node.place("/threads/n1")
        with _connect(node, "/threads/n1/ws") as (newer, again):
            assert int(again["epoch"]) > int(greeting["epoch"])
            assert _closed(old) == (1012, f"epoch {greeting['epoch']} ended")
            newer.send("still")
            assert newer.recv(timeout=WAIT) == "echo:still", "the newer epoch's socket stays"


def test_an_app_that_only_sends_ends_as_when_its_client_leaves(
    node: Node, start_worker: StartWorker
) -> None:
    worker = _holding(node, start_worker, "/threads/t1")
    with _connect(node, "/threads/t1/ticks") as (ws, greeting):
        assert worker.call("release", ns="/threads", id="t1") == {"result": True}
        assert _closed(ws) == (1012, f"epoch {greeting['epoch']} ended")
    # Its next send was refused as a send on a closed socket: Starlette's disconnect, 1006.
    assert _app_saw_end(worker, "/threads/t1/ticks")["code"] == 1006
    assert "Exception in ASGI application" not in worker.log()


def test_a_node_stopped_past_its_grace_closes_1001(
    start_node: StartNode, start_worker: StartWorker
) -> None:
    node = start_node(env={"PINBOARD_HTTP__SHUTDOWN_GRACE_MS": "300"})
    worker = _holding(node, start_worker, "/threads/s1")
    with _connect(node, "/threads/s1/ws") as (ws, _):
        node.signal(signal.SIGTERM)
        assert _closed(ws) == (1001, "")
    # The worker's side of the tunnel ends too: the app sees its client gone.
    _app_saw_end(worker, "/threads/s1/ws")
    assert node.proc.wait(10) == 0
