"""The spec's three rules for the Python worker (pinboard.md, heartbeat), against the real node
with the fault proxy in front of it counting every registry call:

(a) it registers again only from the heartbeat path: a release or tag answered 409
    `unknown session` + `reregister` is the caller's error and registers nothing; the next
    heartbeat's 409 registers again, with `prevSessionId` and the instances it holds;
(b) it gives up on release (and tag) and deregister after three tries on a transient failure
    (5xx, unreachable), and does not retry a 4xx at all;
(c) it retries a heartbeat 403 with the same session.
"""

from __future__ import annotations

from collections.abc import Callable

from support import (
    FaultProxy,
    Node,
    Redis,
    StartNode,
    StartWorker,
    eventually,
)

UNKNOWN_SESSION = {"error": "unknown session", "reregister": True}


def test_only_the_heartbeat_registers_again(
    redis: Redis,
    start_node: StartNode,
    start_proxy: Callable[[Node], FaultProxy],
    start_worker: StartWorker,
) -> None:
    # A longer lease: the rows of the lost session must outlive the test's pauses (the
    # sweeper deletes a row whose owner is dead for a lease) to be reclaimed.
    node = start_node(env={"PINBOARD_LEASE_TTL_MS": "6000"})
    proxy = start_proxy(node)
    worker = start_worker(proxy.url)
    first = worker.session
    t1 = node.place("/threads/t1").json()
    t2 = node.place("/threads/t2").json()
    assert {t1["session"], t2["session"]} == {first}

    # Heartbeats stop reaching the node (503s, retried), then the registry loses the session.
    # Once a faulted heartbeat is recorded, none is in flight to the node any more.
    proxy.fail("heartbeat", 503)
    eventually(lambda: any(c.injected for c in proxy.calls("heartbeat")), 10, "a 503 heartbeat")
    redis.drop_session(first)

    # The node's 409 for release and tag goes back to the caller, tried once.
    released = worker.call("release", ns="/threads", id="t1")
    assert released["error"] == "Refused", released
    assert (released["status"], released["reregister"]) == (409, True)
    assert "unknown session" in released["message"]
    tagged = worker.call("tag", ns="/threads", id="t2", tag="ws:W")
    assert (tagged["error"], tagged["status"], tagged["reregister"]) == ("Refused", 409, True)
    assert [(c.status, c.answer) for c in proxy.calls("release")] == [(409, UNKNOWN_SESSION)]
    assert [(c.status, c.answer) for c in proxy.calls("tag")] == [(409, UNKNOWN_SESSION)]

    # ... and registers nothing: heartbeats go on (failing) with the lost session.
    seen = len(proxy.calls("heartbeat"))
    eventually(lambda: len(proxy.calls("heartbeat")) >= seen + 2, 10, "two more heartbeats")
    assert len(proxy.calls("register")) == 1
    assert worker.session == first
    assert {c.body["sessionId"] for c in proxy.calls("heartbeat")} == {first}

    # The next heartbeat that reaches the node learns the session is lost: it registers again,
    # naming the lost session and reclaiming what it holds (t1 was given up by the release).
    proxy.clear("heartbeat")
    eventually(lambda: len(proxy.calls("register")) == 2, 15, worker.log)
    calls = proxy.calls()
    again = calls.index(proxy.calls("register")[1])
    before = [c for c in calls[:again] if c.route == "heartbeat"][-1]
    assert (before.status, before.answer, before.injected) == (409, UNKNOWN_SESSION, False)
    body = proxy.calls("register")[1].body
    assert body["prevSessionId"] == first
    assert body["instances"] == {"/threads": ["t2"]}

    second = eventually(lambda: (s := worker.session) != first and s, 10, "the new session")
    registered = [(e["session_id"], e["reregistered"]) for e in worker.events("Registered")]
    assert registered == [(first, False), (second, True)]
    assert worker.events("Evicted") == []
    assert redis.row("/threads", "t2") == {"sessionId": second, "epoch": t2["epoch"]}
    assert worker.held() == [["/threads", "t2", t2["epoch"]]]
    # Still served at its epoch, not a new activation.
    served = node.place("/threads/t2").json()
    assert (served["epoch"], served["activated"], served["session"]) == (
        t2["epoch"],
        False,
        second,
    )


def test_release_and_tag_give_up_after_three_tries(
    node: Node, proxy: FaultProxy, start_worker: StartWorker
) -> None:
    worker = start_worker(proxy.url)
    info = worker.info()
    for id in ("a", "b", "c", "d"):
        assert worker.forward(f"/threads/{id}", "5", info=info).status_code == 200

    # 5xx: three tries, then the last failure.
    proxy.fail("release", 503)
    failed = worker.call("release", ns="/threads", id="a")
    assert (failed["error"], failed["status"]) == ("Refused", 503), failed
    assert [c.status for c in proxy.calls("release")] == [503, 503, 503]

    # Unreachable (the connection closed unanswered): three tries too.
    proxy.drop("release")
    failed = worker.call("release", ns="/threads", id="b")
    assert failed["error"] == "Unreachable", failed
    assert [c.status for c in proxy.calls("release")][3:] == [None, None, None]

    # A 4xx is not transient: one try.
    proxy.fail("release", 400, {"error": "invalid namespace"})
    failed = worker.call("release", ns="/threads", id="c")
    assert (failed["error"], failed["status"]) == ("Refused", 400), failed
    assert len(proxy.calls("release")) == 7

    # A transient failure that clears: the second try lands.
    proxy.fail("tag", 502, times=1)
    tagged = worker.call("tag", ns="/threads", id="d", tag="x")
    assert tagged == {"result": False}, tagged  # no row: the node wrote nothing
    assert [(c.status, c.injected) for c in proxy.calls("tag")] == [(502, True), (200, False)]

    # Given up means given up: nothing more is sent later.
    proxy.clear()
    seen = len(proxy.calls("heartbeat"))
    eventually(lambda: len(proxy.calls("heartbeat")) >= seen + 1, 10, "a heartbeat")
    assert len(proxy.calls("release")) == 7
    assert [h[1] for h in worker.held()] == ["d"], "a released instance is dropped locally"


def test_deregister_at_shutdown_gives_up_after_three_tries(
    redis: Redis, node: Node, proxy: FaultProxy, start_worker: StartWorker
) -> None:
    worker = start_worker(proxy.url)
    session = worker.session
    node.place("/threads/t1")
    proxy.fail("release", 500)
    proxy.drop("deregister")
    worker.stop_gracefully()
    assert [c.status for c in proxy.calls("release")] == [500, 500, 500]
    assert [c.status for c in proxy.calls("deregister")] == [None, None, None]
    assert proxy.calls("deregister")[0].body == {"sessionId": session}
    # Nothing reached the node: the session and its row are still there (left to lapse).
    assert redis.session_record(session) != ""
    assert redis.row("/threads", "t1") is not None


def test_a_heartbeat_403_is_retried_with_the_same_session(
    start_node: StartNode, start_proxy: Callable[[Node], FaultProxy], start_worker: StartWorker
) -> None:
    # A lease long enough for three 403s and their backoff (at most 0.5 + 1 + 2 s after a
    # third of a lease): the session must not lapse on the node meanwhile, or the node's 409
    # would (rightly) have the worker register again.
    node = start_node(env={"PINBOARD_LEASE_TTL_MS": "9000"})
    proxy = start_proxy(node)
    worker = start_worker(proxy.url)
    session = worker.session
    proxy.fail("heartbeat", 403, {"error": "forbidden"}, times=3)

    def recovered() -> bool:
        beats = proxy.calls("heartbeat")
        injected = [i for i, c in enumerate(beats) if c.injected]
        return len(injected) == 3 and any(c.status == 200 for c in beats[injected[-1] + 1 :])

    eventually(recovered, 20, worker.log)
    beats = proxy.calls("heartbeat")
    assert {c.body["sessionId"] for c in beats} == {session}
    assert [c.status for c in beats if c.injected] == [403, 403, 403]
    assert len(proxy.calls("register")) == 1, "a 403 never registers again"
    assert worker.session == session
    assert len(worker.events("Registered")) == 1
    assert worker.info()["status"]["lease_healthy"]
    assert node.heartbeat(session).status_code == 200, "the node still knows the session"
