"""`pinboard_worker.serve`'s exit status when the server never starts (the others are seen
from real worker processes: 0 in `stop_gracefully`, 1 in `test_supersession.py`, 4 in
`test_credentials.py`)."""

from __future__ import annotations

import socket

import pinboard_worker
from pinboard_worker.asgi import Receive, Scope, Send


async def refuses_to_start(scope: Scope, receive: Receive, send: Send) -> None:
    assert scope["type"] == "lifespan"
    await receive()
    await send({"type": "lifespan.startup.failed", "message": "the app cannot start"})


def test_an_app_that_fails_to_start_is_status_3() -> None:
    worker = pinboard_worker.Worker(
        pinboard_worker.Config(
            registry="http://127.0.0.1:1",
            token="t",
            client_id="c",
            namespaces=["/threads"],
            advertise_url="http://127.0.0.1:2",
        )
    )
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        status = pinboard_worker.serve(
            worker.asgi(refuses_to_start), sockets=[listener], log_level="critical"
        )
    assert status == pinboard_worker.EXIT_NOT_STARTED == 3
    assert worker.session_id is None, "the worker never started"
