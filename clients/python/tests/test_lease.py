"""Past its lease the worker serves nothing new (pinboard.md, in-band refusal): a new activation
gets 503 + `Retry-After: 1` + `Pinned-Refusal: lease-unhealthy`, and an instance it holds is
refused too (the registry may have placed it elsewhere by then). Once a heartbeat renews the
lease it serves again.

The lease lapses two ways here: the fault proxy fails every heartbeat, or the node is stopped
with SIGSTOP so the heartbeat hangs (the lease is counted from when the call was sent)."""

from __future__ import annotations

import signal
from typing import Any

from support import FaultProxy, Node, StartWorker, WorkerProcess, eventually, lease_unhealthy


def _lease_healthy(worker: WorkerProcess) -> bool:
    healthy: bool = worker.info()["status"]["lease_healthy"]
    return healthy


def _check_refusals(worker: WorkerProcess, info: dict[str, Any]) -> None:
    fresh = worker.forward("/threads/fresh", "6", info=info)
    assert lease_unhealthy(fresh), (fresh.status_code, fresh.headers, fresh.text)
    held = worker.forward("/threads/held/x", "5", info=info)
    assert lease_unhealthy(held), "a held instance is not served past the lease either"
    stale = worker.forward("/threads/held", "4", info=info)
    assert (stale.status_code, stale.text) == (409, "stale placement epoch")
    assert [h[1] for h in worker.held()] == ["held"], "the refused activation is not held"


def _check_served_again(worker: WorkerProcess) -> None:
    # Past the node's view of the lease too, the session lapsed there as well: the worker may
    # have registered again (a new session) meanwhile, so its current one is asked for.
    eventually(lambda: _lease_healthy(worker), 15, worker.log)
    fresh = worker.forward("/threads/fresh", "6")
    assert (fresh.status_code, fresh.json()["activated"]) == (200, True), fresh.text


def test_failed_heartbeats_past_the_lease_refuse_new_activations(
    node: Node, proxy: FaultProxy, start_worker: StartWorker
) -> None:
    worker = start_worker(proxy.url)
    info = worker.info()
    assert worker.forward("/threads/held", "5", info=info).json()["activated"] is True

    proxy.fail("heartbeat", 503)
    eventually(lambda: not _lease_healthy(worker), 15, "the lease lapsing")
    _check_refusals(worker, info)

    proxy.clear()
    _check_served_again(worker)


def test_a_stopped_node_lets_the_lease_lapse(node: Node, start_worker: StartWorker) -> None:
    worker = start_worker(node.url)
    info = worker.info()
    assert worker.forward("/threads/held", "5", info=info).json()["activated"] is True

    node.signal(signal.SIGSTOP)
    try:
        eventually(lambda: not _lease_healthy(worker), 15, "the lease lapsing")
        _check_refusals(worker, info)
    finally:
        node.signal(signal.SIGCONT)
    _check_served_again(worker)
