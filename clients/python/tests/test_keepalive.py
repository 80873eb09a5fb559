"""POSTs through the node to a worker under uvicorn after the worker timed its keep-alive
connections out (uvicorn closes a connection idle for 5 s): every one answers 200. Once with the
node's default idle timeout (4 s: the pool drops them first), once with the node keeping them a
minute (the check before reuse finds them closed)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from support import Node, StartNode, StartWorker

ROUNDS = 2
AT_ONCE = 6
IDLE_S = 6.0


def post_at_once(node: Node, round: int) -> list[int]:
    """`AT_ONCE` POSTs with a body at once, each on a connection of its own, so that the node
    opens (and pools) as many connections to the worker."""

    def post(i: int) -> int:
        with httpx.Client(base_url=node.url, timeout=10, trust_env=False) as client:
            reply = client.post(f"/threads/k{i}/messages", json={"round": round, "n": i})
            return reply.status_code

    with ThreadPoolExecutor(AT_ONCE) as pool:
        return list(pool.map(post, range(AT_ONCE)))


@pytest.mark.parametrize("idle_ms", [None, "60000"], ids=["default-idle", "pool-keeps-a-minute"])
def test_posts_after_uvicorns_keep_alive_timeout_all_answer_200(
    start_node: StartNode, start_worker: StartWorker, idle_ms: str | None
) -> None:
    env = {"PINBOARD_FORWARDS__UPSTREAM_IDLE_TIMEOUT_MS": idle_ms} if idle_ms else {}
    node = start_node(env=env)
    start_worker(node.url, namespaces=["/threads"])
    for i in range(AT_ONCE):
        node.place(f"/threads/k{i}")
    for round in range(ROUNDS):
        # Longer than uvicorn's 5 s: every pooled connection is closed by the worker.
        time.sleep(IDLE_S)
        assert post_at_once(node, round) == [200] * AT_ONCE, node.log()
