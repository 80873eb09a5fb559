"""Graceful shutdown: SIGTERM to uvicorn runs the lifespan shutdown, in which the worker
releases every placement it holds (the rows go from Redis) and deregisters (the registry no
longer knows the session)."""

from __future__ import annotations

from support import Node, Redis, StartWorker, operator_token


def test_sigterm_releases_held_placements_and_deregisters(
    redis: Redis, node: Node, start_worker: StartWorker
) -> None:
    worker = start_worker(node.url)
    session = worker.session
    node.place("/threads/t1")
    node.place("/docs/d1")
    assert redis.row("/threads", "t1") is not None
    assert redis.row("/docs", "d1") is not None
    assert redis.session_record(session) != ""

    worker.stop_gracefully()

    assert redis.row("/threads", "t1") is None
    assert redis.row("/docs", "d1") is None
    assert redis.session_record(session) == ""
    gone = node.heartbeat(session)
    assert (gone.status_code, gone.json()) == (
        409,
        {"error": "unknown session", "reregister": True},
    )
    listed = node.get("/registry/workers", headers={"authorization": f"Bearer {operator_token()}"})
    assert listed.json()["workers"] == []
    assert f"deregistered session={session} held=2 released=2" in worker.log()
