"""Reclaim after a node restart: the node is killed while the worker holds instances, and a new
one starts on the same port and Redis. A killed node leaves the session in Redis, so the test
also drops it (the registry lost it), and places one of the ids elsewhere meanwhile. The
worker's next heartbeat gets 409 `reregister`; it registers again with `prevSessionId` and its
instances, keeps serving the reclaimed one at the same epoch (not a new activation), and the
one placed elsewhere comes back in `duplicates` and is reported `Evicted`.

The fault proxy in front of the node's port (the same across the restart) records the calls."""

from __future__ import annotations

from collections.abc import Callable

from support import FaultProxy, Node, Redis, StartNode, StartWorker, eventually


def test_a_restarted_node_has_the_worker_reclaim_its_instances(
    redis: Redis,
    start_node: StartNode,
    start_proxy: Callable[[Node], FaultProxy],
    start_worker: StartWorker,
) -> None:
    # A longer lease than the other tests': the rows must outlive the restart (the sweeper
    # deletes a row whose owner is dead for a lease) to be reclaimed.
    lease = {"PINBOARD_LEASE_TTL_MS": "6000"}
    node = start_node(env=lease)
    proxy = start_proxy(node)
    worker = start_worker(proxy.url)
    first = worker.session
    t1 = node.place("/threads/t1").json()
    t2 = node.place("/threads/t2").json()
    assert t1["activated"] and t2["activated"]

    node.kill()
    redis.drop_session(first)
    redis.set_row("/threads", "t2", {"sessionId": "elsewhere", "epoch": t2["epoch"]})
    again = start_node(env=lease, listen=node.addr)

    second = eventually(lambda: (s := worker.session) != first and s, 20, worker.log)
    registers = proxy.calls("register")
    assert len(registers) == 2
    body, answer = registers[1].body, registers[1].answer
    assert body["prevSessionId"] == first
    assert body["instances"] == {"/threads": ["t1", "t2"]}
    assert answer["sessionId"] == second
    assert answer["duplicates"] == [{"ns": "/threads", "id": "t2"}]
    lost = [c for c in proxy.calls("heartbeat") if c.status == 409]
    assert lost and lost[0].answer == {"error": "unknown session", "reregister": True}

    evicted = eventually(lambda: worker.events("Evicted"), 10, worker.log)
    assert evicted == [{"type": "Evicted", "ns": "/threads", "id": "t2"}]
    registered = [(e["session_id"], e["reregistered"]) for e in worker.events("Registered")]
    assert registered == [(first, False), (second, True)]
    assert worker.held() == [["/threads", "t1", t1["epoch"]]]
    assert redis.row("/threads", "t1") == {"sessionId": second, "epoch": t1["epoch"]}

    # The reclaimed instance is served at its epoch: not a new activation.
    served = again.place("/threads/t1").json()
    assert (served["epoch"], served["activated"], served["session"]) == (
        t1["epoch"],
        False,
        second,
    )
    # The evicted one is stale here at its old epoch; placed here again, it is a new one.
    stale = worker.forward("/threads/t2", t2["epoch"])
    assert (stale.status_code, stale.text) == (409, "stale placement epoch")
    back = again.place("/threads/t2").json()
    assert back["activated"] is True
    assert int(back["epoch"]) > int(t2["epoch"])
