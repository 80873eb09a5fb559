"""The library's runner: a worker's ASGI application under uvicorn for the life of the process,
ended by SIGTERM or SIGINT or by the worker stopping on its own, and the way it ended as the
process's exit status, so that a supervisor (systemd, Kubernetes) sees a worker that cannot go
on and restarts it. uvicorn is imported only here (`pip install pinboard-worker[serve]`)."""

from __future__ import annotations

import asyncio
import signal
import socket
from typing import TYPE_CHECKING, Any

from .control import CredentialRefused

if TYPE_CHECKING:
    from .asgi import PinnedMiddleware
    from .worker import Worker

EXIT_SUPERSEDED = 1
"""A higher-epoch registration of the same hostname displaced the worker (as `pinned-example`
exits)."""
EXIT_NOT_STARTED = 3
"""The server did not start (the application's lifespan startup failed, the address could not
be bound), so the worker never registered: uvicorn's own status for that."""
EXIT_CREDENTIAL_REFUSED = 4
"""The registry refused the worker's credential until its lease lapsed."""


def serve(
    app: PinnedMiddleware[Worker], *, sockets: list[socket.socket] | None = None, **options: Any
) -> int:
    """Serves `app` (what `worker.asgi(...)` returns) with uvicorn, `options` going to
    `uvicorn.Config` (`host`, `port`, `timeout_graceful_shutdown`, ...) and `sockets` already
    bound, if given, served instead. Runs until SIGTERM or SIGINT (then the worker releases what
    it holds and deregisters at the lifespan's shutdown) or until the worker stops on its own;
    returns the exit status: 0 after a signal, `EXIT_SUPERSEDED` (1), `EXIT_NOT_STARTED` (3),
    `EXIT_CREDENTIAL_REFUSED` (4, the refusal logged). `sys.exit(serve(app, port=9000))`."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, **{"lifespan": "on", **options}))
    worker = app.worker
    status = 0

    async def until_the_worker_stops() -> None:
        nonlocal status
        try:
            await worker.wait_stopped()
        except CredentialRefused:
            status = EXIT_CREDENTIAL_REFUSED
        else:
            status = EXIT_SUPERSEDED if worker.status().superseded else 0
        server.should_exit = True

    async def run() -> None:
        watch = asyncio.ensure_future(until_the_worker_stops())
        try:
            await server.serve(sockets=sockets)
        finally:
            watch.cancel()

    # uvicorn turns SIGINT and SIGTERM into its graceful shutdown, then raises the signal again
    # for the handler it replaced, which would end the process by that signal (status 143, or
    # a KeyboardInterrupt) however the shutdown went. The handler it replaces is this one: it
    # only asks for that shutdown, so the status returned here is the process's.
    def shut_down(signum: int, frame: object) -> None:
        server.should_exit = True

    replaced = {
        signum: signal.signal(signum, shut_down) for signum in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        asyncio.run(run())
    except SystemExit:
        # How uvicorn gives up when it cannot start; past the start it is not uvicorn's.
        if server.started:
            raise
    finally:
        for signum, handler in replaced.items():
            signal.signal(signum, handler)
    return status if server.started else EXIT_NOT_STARTED
