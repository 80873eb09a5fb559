"""The workers under test: an ASGI app behind `worker.asgi(app)`, served by uvicorn.

Run as a script by `support.WorkerProcess`, configured by the environment:
`PINNED_TEST_FD` (the listening socket to serve), `PINNED_TEST_APP` (`starlette`: the
instrumented app below; `fastapi`: the README's minimal shape), `PINNED_TEST_REGISTRY`,
`PINNED_TEST_SERVER` (`serve`: `pinboard_worker.serve`, the default; `uvicorn`: a plain
`uvicorn.Server`, as `uvicorn module:app` runs it, which does not end when the worker stops),
`PINNED_TEST_TOKEN` or `PINNED_TEST_TOKEN_FILE`, `PINNED_TEST_KEEP_ON_REFUSED` (set:
`exit_on_refused_credential=False`), `PINNED_TEST_ADVERTISE`, `PINNED_TEST_NAMESPACES`
(comma-separated),
`PINNED_TEST_CLIENT_ID`, `PINNED_TEST_STORE` (a FileStore directory, optional),
`PINNED_TEST_WAKE_WAIT`, `PINNED_TEST_CALL_TIMEOUT`, and for a hostname-aware registration
`PINNED_TEST_HOSTNAME`, `PINNED_TEST_ENV` and `PINNED_TEST_EPOCH` (takeover `wind_down`).

The Starlette app answers every instance request with what `pinboard_worker.instance(request)` says,
echoes on `/{ns}/{id}/ws` (after a greeting: the instance), sends `tick` every 50 ms on
`/{ns}/{id}/ticks` (never receiving), records how each of those WebSockets ended, and has
test-only routes outside every namespace (the middleware hands them to the app untouched):
`GET /_test/info` (the worker's session, secret, held instances, status, the events `on_event`
got, the wakes `on_wake` got, how WebSockets ended), `POST /_test/call`
(`worker.release/tag/schedule_wake/cancel_wake`, the outcome or the error as JSON) and
`POST /_test/wake-hook` (make `on_wake` wait or fail).

With a store, an instance also keeps a note in it: `PUT /{ns}/{id}/note[?after_ms=N]` saves the
body fenced at the request's epoch after waiting N ms (a slow save, where a pause can fall):
`{"saved": true, "epoch"}`, or 409 `{"detail": "stale epoch: stored S, offered O"}` once the
instance was placed elsewhere at a later epoch that saved or claimed it; `GET` reads it. Each
step (`saving`, `saved`, `refused`) is recorded for `/_test/info`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import sys
from typing import Any

import uvicorn
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

import pinboard_worker


class Recorder:
    """What the hooks saw, and how `on_wake` should behave."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.wakes: list[dict[str, Any]] = []
        self.released = asyncio.Event()
        """Set unless `on_wake` is told to hold."""
        self.released.set()
        self.fail = False
        self.websockets: list[dict[str, Any]] = []
        """How each WebSocket of the app ended: its path, and the code its disconnect said
        (or the error its send raised)."""
        self.notes: list[dict[str, Any]] = []
        """What the note route did: `{"id", "epoch", "step", "detail"?}`."""

    async def on_event(self, worker: pinboard_worker.Worker, event: pinboard_worker.Event) -> None:
        self.events.append(event_json(event))

    async def on_wake(
        self,
        worker: pinboard_worker.Worker,
        instance: pinboard_worker.Instance,
        state: bytes | None,
    ) -> None:
        self.wakes.append(
            {
                "ns": instance.ns,
                "id": instance.id,
                "epoch": instance.epoch,
                "activated": instance.activated,
                "state": None if state is None else state.decode("latin-1"),
            }
        )
        await self.released.wait()
        if self.fail:
            raise RuntimeError("told to fail")


def event_json(event: pinboard_worker.Event) -> dict[str, Any]:
    if isinstance(event, pinboard_worker.WindDown):
        return {"type": "WindDown", **dataclasses.asdict(event.message)}
    return {"type": type(event).__name__, **dataclasses.asdict(event)}


def config() -> pinboard_worker.Config:
    env = os.environ
    store = env.get("PINNED_TEST_STORE")
    deploy_epoch = env.get("PINNED_TEST_EPOCH")
    return pinboard_worker.Config(
        registry=env["PINNED_TEST_REGISTRY"],
        token=env.get("PINNED_TEST_TOKEN"),
        token_file=env.get("PINNED_TEST_TOKEN_FILE"),
        exit_on_refused_credential="PINNED_TEST_KEEP_ON_REFUSED" not in env,
        client_id=env.get("PINNED_TEST_CLIENT_ID", "worker-1"),
        namespaces=env.get("PINNED_TEST_NAMESPACES", "/threads").split(","),
        advertise_url=env["PINNED_TEST_ADVERTISE"],
        call_timeout=float(env.get("PINNED_TEST_CALL_TIMEOUT", "5")),
        durability=pinboard_worker.FileStore(store) if store else None,
        wake_wait=float(env.get("PINNED_TEST_WAKE_WAIT", "1")),
        hostname=env.get("PINNED_TEST_HOSTNAME"),
        env=env.get("PINNED_TEST_ENV"),
        takeover="wind_down" if deploy_epoch else None,
        epoch=int(deploy_epoch) if deploy_epoch else None,
    )


def instance_json(request: Request | WebSocket, worker: pinboard_worker.Worker) -> dict[str, Any]:
    room = pinboard_worker.instance(request)
    return {
        "ns": room.ns,
        "id": room.id,
        "rest": room.rest,
        "epoch": room.epoch,
        "activated": room.activated,
        "caller": room.caller,
        "depth": room.depth,
        "acct": room.acct,
        "session": worker.session_id,
        "method": request.scope.get("method"),
        "query": request.scope.get("query_string", b"").decode("latin-1"),
    }


def starlette_app(worker: pinboard_worker.Worker, recorder: Recorder) -> Starlette:
    async def info(request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "session": worker.session_id,
                "secret": worker.secret,
                "held": [[h.ns, h.id, h.epoch] for h in worker.held()],
                "status": dataclasses.asdict(worker.status()),
                "events": recorder.events,
                "messages": [dataclasses.asdict(m) for m in worker.messages()],
                "wakes": recorder.wakes,
                "websockets": recorder.websockets,
                "notes": recorder.notes,
            }
        )

    async def call(request: Request) -> JSONResponse:
        body = await request.json()
        op, ns, id = body["op"], body["ns"], body["id"]
        result: Any
        try:
            if op == "release":
                result = await worker.release(ns, id)
            elif op == "tag":
                result = await worker.tag(ns, id, body["tag"])
            elif op == "schedule":
                result = await worker.schedule_wake(ns, id, body["at"])
            elif op == "cancel":
                result = await worker.cancel_wake(ns, id)
            else:
                return JSONResponse({"unknown op": op}, status_code=400)
        except pinboard_worker.CallError as e:
            return JSONResponse(
                {
                    "error": type(e).__name__,
                    "status": getattr(e, "status", None),
                    "reregister": getattr(e, "reregister", False),
                    "superseded": getattr(e, "superseded", False),
                    "message": str(e),
                }
            )
        return JSONResponse({"result": result})

    async def wake_hook(request: Request) -> JSONResponse:
        body = await request.json()
        if body["hold"]:
            recorder.released.clear()
        else:
            recorder.released.set()
        recorder.fail = bool(body["fail"])
        return JSONResponse({})

    async def note(request: Request) -> JSONResponse:
        room = pinboard_worker.instance(request)
        store = worker.store
        assert store is not None, "the note route needs a store"
        if request.method == "GET":
            saved = store.load(room.ns, room.id)
            return JSONResponse({"note": None if saved is None else saved.decode("latin-1")})
        body = await request.body()
        step = {"id": room.id, "epoch": room.epoch}
        recorder.notes.append({**step, "step": "saving"})
        await asyncio.sleep(int(request.query_params.get("after_ms", "0")) / 1000)
        try:
            store.save_fenced(room.ns, room.id, pinboard_worker.Fence.of(room), body)
        except pinboard_worker.StaleEpochError as stale:
            recorder.notes.append({**step, "step": "refused", "detail": str(stale)})
            return JSONResponse({"detail": str(stale)}, status_code=409)
        recorder.notes.append({**step, "step": "saved"})
        return JSONResponse({"saved": True, "epoch": room.epoch})

    async def serve(request: Request) -> JSONResponse:
        return JSONResponse(instance_json(request, worker))

    async def echo(ws: WebSocket) -> None:
        await ws.accept()
        await ws.send_json(instance_json(ws, worker))
        try:
            while True:
                text = await ws.receive_text()
                await ws.send_text(f"echo:{text}")
        except WebSocketDisconnect as gone:
            recorder.websockets.append({"path": ws.url.path, "code": gone.code})

    async def ticks(ws: WebSocket) -> None:
        """Sends without ever receiving: only a failing send can end it."""
        await ws.accept()
        await ws.send_json(instance_json(ws, worker))
        try:
            while True:
                await ws.send_text("tick")
                await asyncio.sleep(0.05)
        except WebSocketDisconnect as gone:
            recorder.websockets.append({"path": ws.url.path, "code": gone.code})

    methods = ["GET", "POST", "PUT", "DELETE"]
    return Starlette(
        routes=[
            Route("/_test/info", info),
            Route("/_test/call", call, methods=["POST"]),
            Route("/_test/wake-hook", wake_hook, methods=["POST"]),
            WebSocketRoute("/{ns}/{id}/ws", echo),
            WebSocketRoute("/{ns}/{id}/ticks", ticks),
            Route("/{ns}/{id}/note", note, methods=["GET", "PUT"]),
            Route("/{ns}/{id}{rest:path}", serve, methods=methods),
        ]
    )


def fastapi_app(worker: pinboard_worker.Worker) -> FastAPI:
    """The README's shape: a plain FastAPI app whose handlers read `pinboard_worker.instance`."""
    api = FastAPI()

    @api.get("/threads/{id}")
    async def thread(id: str, request: Request) -> dict[str, Any]:
        room = pinboard_worker.instance(request)
        return {"id": id, "ns": room.ns, "epoch": room.epoch, "fresh": room.activated}

    return api


def main() -> None:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("pinboard_worker").setLevel(logging.DEBUG)
    recorder = Recorder()
    worker = pinboard_worker.Worker(config(), on_event=recorder.on_event, on_wake=recorder.on_wake)
    if os.environ.get("PINNED_TEST_APP", "starlette") == "fastapi":
        app = worker.asgi(fastapi_app(worker))
    else:
        app = worker.asgi(starlette_app(worker, recorder))
    listener = socket.socket(fileno=int(os.environ["PINNED_TEST_FD"]))
    options: dict[str, Any] = {"log_level": "info", "timeout_graceful_shutdown": 5}
    if os.environ.get("PINNED_TEST_SERVER", "serve") == "uvicorn":
        uvicorn.Server(uvicorn.Config(app, lifespan="on", **options)).run(sockets=[listener])
    else:
        sys.exit(pinboard_worker.serve(app, sockets=[listener], **options))


if __name__ == "__main__":
    main()
