"""Wind-down delivery: an operator's `POST /registry/wind_down` reaches the app's `on_event` as
`WindDown` once, with the placement's ns, id and deadline; the worker acks it on its next
heartbeat and the node stops re-delivering it; a `null` deadline revokes it (a second message).

The fault proxy records the heartbeats: what each answered (`messages`) and acked (`acks`)."""

from __future__ import annotations

import time
from typing import Any

from support import FaultProxy, Node, Redis, StartWorker, eventually, operator_token


def _wind_down(node: Node, deadline: int | None) -> None:
    body = {"namespace": "/threads", "id": "t1", "deadline": deadline}
    queued = node.post("/registry/wind_down", body, operator_token())
    assert (queued.status_code, queued.json()) == (200, {"queued": True}), queued.text


def _message_ids(answer: Any) -> list[Any]:
    messages = answer.get("messages") if isinstance(answer, dict) else None
    return [m["msgId"] for m in messages or []]


def test_wind_down_is_delivered_once_acked_and_revocable(
    redis: Redis, node: Node, proxy: FaultProxy, start_worker: StartWorker
) -> None:
    worker = start_worker(proxy.url)
    node.place("/threads/t1")
    _wind_down(node, 30)
    assert redis.row("/threads", "t1")["expiry"] > time.time() * 1000  # type: ignore[index]

    downs = eventually(lambda: worker.events("WindDown"), 10, worker.log)
    assert len(downs) == 1
    down = downs[0]
    assert (down["ns"], down["id"]) == ("/threads", "t1")
    assert 20 < down["deadline"] <= 30, down
    msg_id = down["msg_id"]
    assert [m["msg_id"] for m in worker.info()["messages"]] == [msg_id]

    def acked_and_two_more() -> list[int] | None:
        """The index of the heartbeat that acked, once two more were answered."""
        beats = proxy.calls("heartbeat")
        acks = [i for i, c in enumerate(beats) if msg_id in (c.body.get("acks") or [])]
        answered = [c for c in beats[acks[0] + 1 :] if c.status] if acks else []
        return acks[:1] if len(answered) >= 2 else None

    [ack] = eventually(acked_and_two_more, 15, "the ack and two heartbeats after it")
    beats = proxy.calls("heartbeat")
    assert any(msg_id in _message_ids(c.answer) for c in beats[:ack]), "delivered by a heartbeat"
    assert beats[ack].status == 200
    assert [c for c in beats[ack + 1 :] if msg_id in _message_ids(c.answer)] == [], (
        "re-delivered after the ack"
    )
    assert [i for i, c in enumerate(beats) if msg_id in (c.body.get("acks") or [])] == [ack], (
        "acked once: an ack that landed is not sent again"
    )
    assert len(worker.events("WindDown")) == 1, "delivered to the app once"

    # A null deadline revokes: another message, deadline None.
    _wind_down(node, None)
    downs = eventually(lambda: (d := worker.events("WindDown"))[1:] and d, 10, worker.log)
    revoked = downs[1]
    assert (revoked["ns"], revoked["id"], revoked["deadline"]) == ("/threads", "t1", None)
    assert revoked["msg_id"] != msg_id
    assert "expiry" not in redis.row("/threads", "t1")  # type: ignore[operator]
