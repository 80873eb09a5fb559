"""A chat-room server on Starlette and pinboard_worker: each room `/rooms/{id}` is an instance
that Pinboard places on exactly one worker, which keeps the room's members and last messages in
memory.

    POST /rooms/{id}/messages    {"from": name, "text": text}: kept and sent to every member
    GET  /rooms/{id}/messages    the last 50, the members, and the epoch and session serving it
    WS   /rooms/{id}/ws?name=N   joins: each message arrives as JSON; text sent is posted
    POST /rooms/{id}/leave       gives the room up: {"released": bool}

A room lives with its placement: it starts empty when placed here, and is dropped when it is
evicted, wound down or left, its members told and closed with code 1012 (reconnecting through
Pinboard finds the room where it is now).

    PINNED_TOKEN=... python chat.py --registry http://127.0.0.1:8080
    python chat.py --registry http://127.0.0.1:8080 --token-file /var/run/secrets/pinboard/token

prints `listening ADDR advertise=URL`, then `registered session=ID` on every (re)registration.
It runs under `pinboard_worker.serve`: SIGTERM or SIGINT releases every room, deregisters and
exits 0; superseded by a higher-epoch registration it exits 1; a configuration it cannot start
with exits 2 (one the server cannot start with, 3); a credential the registry refused until
the lease lapsed exits 4.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import socket
import sys
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeGuard

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

import pinboard_worker

HISTORY = 50
MAX_NAME = 64
MAX_TEXT = 4000
RECONNECT = 1012
"""The close code for "service restart": the client may reconnect, and Pinboard places it."""

log = logging.getLogger("chat")


@dataclass(eq=False)
class Member:
    name: str
    ws: WebSocket


@dataclass
class Room:
    epoch: str
    """The placement this state belongs to."""
    messages: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=HISTORY))
    members: set[Member] = field(default_factory=set)


class Chat:
    """The rooms this worker holds, by (namespace, id), and the ASGI app that serves them."""

    def __init__(self, config: pinboard_worker.Config) -> None:
        self.rooms: dict[tuple[str, str], Room] = {}
        self.worker = pinboard_worker.Worker(config, on_event=self.on_event)
        routes = [
            Route("/{id}/messages", self.read, methods=["GET"]),
            Route("/{id}/messages", self.post, methods=["POST"]),
            Route("/{id}/leave", self.leave, methods=["POST"]),
            WebSocketRoute("/{id}/ws", self.join),
        ]
        self.app = self.worker.asgi(
            Starlette(routes=[Mount(ns, routes=routes) for ns in config.namespaces])
        )

    async def room(self, inst: pinboard_worker.Instance) -> Room:
        """The room a request is for. Placed here anew (`activated`), it starts empty: what
        memory holds of it is from an earlier placement, and may be behind. The epoch check
        also covers a placement whose first request got here only through another route (a
        404, say), which never looked at `activated`."""
        key = (inst.ns, inst.id)
        old = self.rooms.get(key)
        if inst.activated or old is None or old.epoch != inst.epoch:
            self.rooms[key] = Room(inst.epoch)
            if old is not None:
                await send(old.members, {"notice": "the room moved"}, close="the room moved")
        return self.rooms[key]

    async def drop(self, ns: str, id: str, why: str) -> None:
        room = self.rooms.pop((ns, id), None)
        if room is not None:
            await send(room.members, {"notice": why}, close=why)

    async def say(self, room: Room, name: str, text: str) -> dict[str, Any]:
        message = {"from": name, "text": text, "at": round(time.time(), 3)}
        room.messages.append(message)
        await send(room.members, message)
        return message

    # --- the routes, each under every namespace -----------------------------------------------

    async def read(self, request: Request) -> JSONResponse:
        inst = pinboard_worker.instance(request)
        room = await self.room(inst)
        return JSONResponse(
            {
                "room": inst.id,
                "members": sorted(member.name for member in room.members),
                "messages": list(room.messages),
                "epoch": room.epoch,
                "session": self.worker.session_id,
            }
        )

    async def post(self, request: Request) -> JSONResponse:
        room = await self.room(pinboard_worker.instance(request))
        try:
            body = await request.json()
        except ValueError:
            body = None
        name, text = (
            (body.get("from"), body.get("text")) if isinstance(body, dict) else (None, None)
        )
        if not (valid(name, MAX_NAME) and valid(text, MAX_TEXT)):
            detail = f'expected {{"from": 1-{MAX_NAME} characters, "text": 1-{MAX_TEXT}}}'
            return JSONResponse({"detail": detail}, 400)
        return JSONResponse(await self.say(room, name, text))

    async def leave(self, request: Request) -> JSONResponse:
        inst = pinboard_worker.instance(request)
        await self.drop(inst.ns, inst.id, "the room was closed")
        try:
            released = await self.worker.release(inst.ns, inst.id)
        except pinboard_worker.CallError as why:
            return JSONResponse({"detail": str(why)}, 502)
        return JSONResponse({"released": released})

    async def join(self, ws: WebSocket) -> None:
        inst = pinboard_worker.instance(ws)
        room = await self.room(inst)
        name = ws.query_params.get("name", "")
        if not valid(name, MAX_NAME):
            await ws.close(1008, f"?name= must be 1 to {MAX_NAME} characters")
            return
        await ws.accept()
        member = Member(name, ws)
        room.members.add(member)
        try:
            async for text in ws.iter_text():
                # The middleware checked this WebSocket once, when it opened. Before posting,
                # make sure the room is still this one and still this worker's (a lapsed lease
                # may have let Pinboard place it elsewhere).
                if (
                    self.rooms.get((inst.ns, inst.id)) is not room
                    or not self.worker.status().lease_healthy
                ):
                    await send([member], {"notice": "the room moved"}, close="the room moved")
                    break
                if valid(text, MAX_TEXT):
                    await self.say(room, name, text)
        finally:
            room.members.discard(member)

    # --- the worker's events ----------------------------------------------------------------

    async def on_event(self, worker: pinboard_worker.Worker, event: pinboard_worker.Event) -> None:
        match event:
            case pinboard_worker.Registered(session_id):
                print(f"registered session={session_id}", flush=True)
            case pinboard_worker.WindDown(message) if message.deadline is not None:
                # A room has nothing to hand over: give it up now rather than at the deadline.
                await self.drop(message.ns, message.id, "the room is moving")
                try:
                    await worker.release(message.ns, message.id)
                except pinboard_worker.CallError as why:
                    log.warning("releasing %s/%s: %s", message.ns, message.id, why)
            case pinboard_worker.WindDown(message):
                log.info("wind-down of %s/%s revoked", message.ns, message.id)
            case pinboard_worker.Evicted(ns, id):
                await self.drop(ns, id, "the room moved")
            case pinboard_worker.Drain(draining, deadline):
                log.info("draining=%s deadline=%s", draining, deadline)
            case pinboard_worker.Superseded(error):
                log.warning("superseded (%s): shutting down", error)


def valid(value: object, limit: int) -> TypeGuard[str]:
    return isinstance(value, str) and 0 < len(value) <= limit


async def send(members: Iterable[Member], message: Any, close: str | None = None) -> None:
    """Sends `message` to every member (one gone meanwhile is skipped), then closes each with
    `close` as the reason when given."""

    async def one(ws: WebSocket) -> None:
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            await ws.send_json(message)
            if close is not None:
                await ws.close(RECONNECT, close)

    await asyncio.gather(*(one(member.ws) for member in list(members)))


# --- the command line ---------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")


FLAGS = [
    ("registry", None, "Pinboard's URL, with its base_path if it has one"),
    ("token", None, "a Passport credential with the pinboard:worker scope"),
    ("token-file", None, "a file holding it, read again for every call (instead of --token)"),
    ("listen", "127.0.0.1:0", "host:port to serve on; port 0 picks a free one"),
    ("namespaces", "/rooms", "the namespaces served, comma-separated"),
    ("client-id", "chat", "this worker's name in Pinboard"),
    ("advertise-url", None, "where Pinboard reaches this server (default: http:// + --listen)"),
]


def parse_args() -> argparse.Namespace:
    """The flags, each defaulting to its environment variable `PINNED_*`, then to `FLAGS`."""
    parser = Parser(description="A chat-room instance server on the pinboard_worker library.")
    for flag, default, about in FLAGS:
        var = "PINNED_" + flag.upper().replace("-", "_")
        parser.add_argument(
            f"--{flag}", default=os.environ.get(var, default), help=f"{about} ({var})"
        )
    args = parser.parse_args()
    if not args.registry:
        parser.error("--registry or PINNED_REGISTRY is required")
    if not args.token and not args.token_file:
        parser.error("--token (PINNED_TOKEN) or --token-file (PINNED_TOKEN_FILE) is required")
    return args


def bind(listen: str) -> tuple[socket.socket, str]:
    """A socket bound to `host:port` (port 0: a free one), and the address it got. Bound here,
    not by uvicorn, so that the advertise URL can name the port before the worker starts."""
    host, colon, port = listen.rpartition(":")
    if not colon or not port.isdigit():
        raise ValueError(f"--listen: {listen!r} is not host:port")
    host = host.strip("[]")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
    except OSError as why:
        sock.close()
        raise OSError(f"--listen {listen}: {why.strerror}") from why
    host, bound = sock.getsockname()[:2]
    return sock, f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}"


def main() -> int:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # else a line per heartbeat
    try:
        sock, addr = bind(args.listen)
        chat = Chat(
            pinboard_worker.Config(
                registry=args.registry,
                token=args.token or None,
                token_file=args.token_file or None,
                client_id=args.client_id,
                namespaces=args.namespaces.split(","),
                advertise_url=args.advertise_url or f"http://{addr}",
            )
        )
    except (OSError, ValueError) as why:  # pinboard_worker.ConfigError is a ValueError
        print(f"chat.py: {why}", file=sys.stderr)
        return 2
    print(f"listening {addr} advertise={chat.worker.advertise_url}", flush=True)

    # log_config=None: uvicorn logs through the root logger above (its own setup would print
    # access lines on stdout). The worker stops (releases, deregisters) at the lifespan's
    # shutdown, after the open connections: an open WebSocket may hold that up 5 s at most.
    return pinboard_worker.serve(
        chat.app, sockets=[sock], log_config=None, timeout_graceful_shutdown=5
    )


if __name__ == "__main__":
    sys.exit(main())
