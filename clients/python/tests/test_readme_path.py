"""The README's path: a plain FastAPI app wrapped by `worker.asgi(app)` under uvicorn, serving
`/{ns}/{id}` through the node (`fastapi_app` in `apps.py`, which has no test-only routes: the
registration is seen from the node's side)."""

from __future__ import annotations

from support import Node, Redis, StartWorker, eventually, operator_token


def test_a_fastapi_app_serves_instances_through_the_node(
    redis: Redis, node: Node, start_worker: StartWorker
) -> None:
    worker = start_worker(node.url, app="fastapi", namespaces=["/threads"], wait=False)
    operator = {"authorization": f"Bearer {operator_token()}"}

    def registered() -> list[str]:
        listed = node.get("/registry/workers", headers=operator).json()["workers"]
        return [w["sessionId"] for w in listed if w["advertiseUrl"] == worker.url]

    [session] = eventually(registered, 20, worker.log)

    first = node.place("/threads/r1")
    body = first.json()
    assert (body["id"], body["ns"], body["fresh"]) == ("r1", "/threads", True)
    assert first.headers["x-accel-buffering"] == "no", "answered through the node"
    assert redis.row("/threads", "r1") == {"sessionId": session, "epoch": body["epoch"]}
    again = node.get("/threads/r1").json()
    assert (again["epoch"], again["fresh"]) == (body["epoch"], False)

    # The app's own routes outside the namespaces are the app's: FastAPI's 404 here.
    assert worker.client.get("/threads").status_code == 404

    worker.stop_gracefully()
    assert redis.row("/threads", "r1") is None
