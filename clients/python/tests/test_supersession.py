"""Supersession (pinboard.md, hostname-aware registration): a registration of the same hostname
and namespace at a higher epoch rebinds it to another env, and the older worker's next
heartbeat gets 409 `superseded`. The worker then stops for good: `Superseded` reaches the app,
its instances are refused (503 `lease-unhealthy`, held or fresh), and it neither heartbeats nor
registers again (the fault proxy counts its registry calls). That worker runs under plain
uvicorn, which goes on serving (refusals); a second one of the old deployment, under
`pinboard_worker.serve`, exits 1."""

from __future__ import annotations

import time
from collections.abc import Callable

from support import LEASE_MS, FaultProxy, Node, StartNode, StartWorker, eventually, lease_unhealthy

HOSTNAME = "app.example.com"


def test_a_higher_epoch_registration_supersedes_this_one(
    start_node: StartNode, start_proxy: Callable[[Node], FaultProxy], start_worker: StartWorker
) -> None:
    node = start_node(env={"PINBOARD_HOSTNAME_AWARE": "true"})
    proxy = start_proxy(node)
    old = start_worker(
        proxy.url, namespaces=["/threads"], deployment=(HOSTNAME, "blue", 1), server="uvicorn"
    )
    served = start_worker(
        node.url, namespaces=["/threads"], client_id="worker-3", deployment=(HOSTNAME, "blue", 1)
    )
    info = old.info()
    assert old.forward("/threads/t1", "5", info=info).json()["activated"] is True

    start_worker(
        node.url, namespaces=["/threads"], client_id="worker-2", deployment=(HOSTNAME, "green", 2)
    )
    superseded = eventually(lambda: old.events("Superseded"), 15, old.log)
    assert "superseded" in superseded[0]["error"], superseded
    [refusal] = [c for c in proxy.calls("heartbeat") if c.status == 409]
    assert refusal.answer["superseded"] is True, refusal.answer

    status = old.info()["status"]
    assert (status["superseded"], status["lease_healthy"]) == (True, False), status
    assert old.held() == [], "its instances are dropped"
    for path, epoch in [("/threads/t1", "5"), ("/threads/fresh", "6")]:
        refused = old.forward(path, epoch, info=info)
        assert lease_unhealthy(refused), (path, refused.status_code, refused.headers, refused.text)

    # A third of the lease and more later: no heartbeat, no register, nothing.
    calls = len(proxy.calls())
    time.sleep(LEASE_MS / 1000)
    assert len(proxy.calls()) == calls, [c.route for c in proxy.calls()[calls:]]
    assert len(old.events("Registered")) == 1
    assert old.info()["status"]["superseded"] is True
    assert served.wait(30) == 1, served.log()
