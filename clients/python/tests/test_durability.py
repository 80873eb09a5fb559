"""Durability (contract §7) against the real node: `POST /{ns}/{id}/_wake` with a `wake`
attestation runs `on_wake` on what the FileStore holds (202 while a slow hook runs, 200 once it
is done); without a store `_wake` is not mounted; `schedule_wake` writes the node's wake sorted
set, and the node's own sweep sends the `_wake` once it is due.

The store's state is written by the test with its own `FileStore` on the worker's directory
(another process, the same format)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
from support import (
    INVALID_ATTESTATION,
    Node,
    Redis,
    StartNode,
    StartWorker,
    WorkerProcess,
    eventually,
    wake_key,
)

import pinboard_worker


def _wake(worker: WorkerProcess, id: str, epoch: str, purpose: str = "wake") -> httpx.Response:
    return worker.forward(f"/threads/{id}/_wake", epoch, method="POST", purpose=purpose)


def test_wake_hydrates_from_the_store(
    node: Node, start_worker: StartWorker, tmp_path: Path
) -> None:
    store = pinboard_worker.FileStore(tmp_path / "store")
    store.save("/threads", "a", b"saved")
    worker = start_worker(node.url, store=store.dir, wake_wait=0.3)

    # The instance path's checks come first: a wake token for this instance and epoch, POST.
    assert _wake(worker, "a", "7", purpose="forward").json() == INVALID_ATTESTATION
    bare = worker.request("POST", "/threads/a/_wake", [("pinboard-epoch", "7")])
    assert (bare.status_code, bare.json()) == (403, INVALID_ATTESTATION)
    got = worker.forward("/threads/a/_wake", "7", method="GET", purpose="wake")
    assert (got.status_code, got.headers.get("allow")) == (405, "POST")
    assert worker.info()["wakes"] == [], "nothing above reached the hook"

    # A hook slower than wake_wait: 202 while it runs (no second one starts), then 200.
    worker.wake_hook(hold=True)
    for _ in range(2):
        reply = _wake(worker, "a", "7")
        assert (reply.status_code, reply.json()) == (202, {"activating": True})
    assert ["/threads", "a", "7"] in worker.held(), "admitted at its epoch like any request"
    worker.wake_hook(hold=False)
    done = eventually(
        lambda: (r := _wake(worker, "a", "7")).status_code == 200 and r, 10, worker.log
    )
    assert done.json() == {"ok": True}
    assert worker.info()["wakes"] == [
        {"ns": "/threads", "id": "a", "epoch": "7", "activated": True, "state": "saved"}
    ], "one hook, on the stored state, activated"

    # The next wake runs the hook again, quickly: 200 at once, resident already.
    reply = _wake(worker, "a", "7")
    assert (reply.status_code, reply.json()) == (200, {"ok": True})
    assert worker.info()["wakes"][1]["activated"] is False
    stale = _wake(worker, "a", "6")
    assert (stale.status_code, stale.text) == (409, "stale placement epoch")

    # A failing hook is a 500 and is tried again by the next wake; no state was ever saved.
    worker.wake_hook(fail=True)
    failed = _wake(worker, "b", "3")
    assert (failed.status_code, failed.json()) == (500, {"detail": "wake failed"})
    worker.wake_hook()
    assert _wake(worker, "b", "3").json() == {"ok": True}
    wakes = worker.info()["wakes"]
    assert [(w["id"], w["state"]) for w in wakes[2:]] == [("b", None), ("b", None)]


def test_wake_is_not_mounted_without_a_store(node: Node, start_worker: StartWorker) -> None:
    worker = start_worker(node.url)
    for purpose in ("wake", "forward"):
        reply = _wake(worker, "a", "7", purpose=purpose)
        assert (reply.status_code, reply.json()) == (404, {"detail": "not found"}), purpose
    bare = worker.request("POST", "/threads/a/_wake")
    assert bare.status_code == 404
    assert worker.held() == [], "nothing admitted"
    # The instance's other paths are served as ever.
    other = worker.forward("/threads/a/_wakeup", "7", method="POST")
    assert (other.status_code, other.json()["rest"]) == (200, "/_wakeup")
    # And there is nothing to schedule on.
    refused = worker.call("schedule", ns="/threads", id="a", at=time.time() + 60)
    assert refused["error"] == "NoStore", refused


def test_schedule_wake_writes_the_nodes_schedule_and_the_sweep_wakes(
    redis: Redis, start_node: StartNode, start_worker: StartWorker, tmp_path: Path
) -> None:
    node = start_node(env={"PINBOARD_SWEEP_INTERVAL_MS": "100"})
    store = pinboard_worker.FileStore(tmp_path / "store")
    store.save("/threads", "a", b"saved")
    worker = start_worker(node.url, store=store.dir)
    in_an_hour = time.time() + 3600
    not_held = worker.call("schedule", ns="/threads", id="a", at=in_an_hour)
    assert not_held["error"] == "NotHeld", not_held

    placed = node.place("/threads/a/x").json()
    epoch = placed["epoch"]
    assert redis.row("/threads", "a") == {"sessionId": worker.session, "epoch": epoch}

    def score() -> str:
        return redis.cli("ZSCORE", wake_key("/threads", "a"), "a")

    # Written on the node's schedule and in the store; a cancel takes it off both.
    at_ms = int(in_an_hour * 1000)
    assert worker.call("schedule", ns="/threads", id="a", at=in_an_hour) == {"result": True}
    assert score() == str(at_ms)
    assert store.scheduled("/threads", "a") == at_ms
    assert worker.call("cancel", ns="/threads", id="a") == {"result": True}
    assert score() == ""
    assert store.scheduled("/threads", "a") is None
    assert store.load("/threads", "a") == b"saved", "a cancel keeps the state"

    # Due soon: the node's sweep sends `_wake` at the placement's epoch; the hook's 200 takes
    # the entry off the schedule.
    assert worker.call("schedule", ns="/threads", id="a", at=time.time() + 0.3) == {"result": True}
    woken = eventually(lambda: worker.info()["wakes"], 20, node.log)
    assert woken == [
        {"ns": "/threads", "id": "a", "epoch": epoch, "activated": False, "state": "saved"}
    ]
    eventually(lambda: score() == "", 10, "the entry removed")
    time.sleep(0.5)
    assert len(worker.info()["wakes"]) == 1, "woken once"

    # Once the placement moved on, the node writes nothing.
    redis.set_row("/threads", "a", {"sessionId": worker.session, "epoch": epoch + "0"})
    assert worker.call("schedule", ns="/threads", id="a", at=in_an_hour) == {"result": False}
    assert score() == ""
