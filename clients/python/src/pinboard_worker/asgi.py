"""The ASGI middleware: what a worker serves (contract §4) in front of any ASGI application,
under any ASGI server (uvicorn, hypercorn, ...), Starlette and FastAPI apps included.

- `GET /_pinned/challenge?challenge=C`: `{"value": V}` for the current or the previous
  challenge, 404 `unknown challenge` for a stale one, 403 `invalid proxy secret` without
  `Pinboard-Proxy-Secret` equal to the secret or a valid `challenge` attestation.
- `GET /_pinned/stats` (a `stats` attestation): the worker described as JSON.
- `/{ns}/{id}{rest}` for a registered namespace, HTTP or WebSocket: the attestation (a
  `forward` token, bound to this `{ns}/{id}` and epoch), `Pinboard-Epoch` (digits, exactly one),
  the epoch guard (stale refused) and, for a new activation, a live lease; then the app gets it
  with `scope["pinned"]` set to the `Instance` (`pinboard_worker.instance(request)`). A
  WebSocket is closed 1012 by the middleware itself once its instance's epoch ends here
  (wound down, moved, evicted, released: `goodbye.py`).
- `POST /{ns}/{id}/_wake` (a `wake` token), only with a durability store: the `on_wake` hook.
- Everything else goes to the app untouched (its own health checks, say): no instance there.
- The lifespan: the worker starts registering at startup and leaves gracefully at shutdown.

Every check is decided here, on the path the app routes on (`scope["path"]`), so what the app
sees as an instance path is exactly what was checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import urllib.parse
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Generic, Protocol, TypeVar

from . import attestation, epoch
from .attestation import Attestation, Binding, InvalidAttestation
from .config import Config
from .durable import Begin, Wakes
from .fencing import Fence
from .goodbye import Close, Goodbye, WebSocketClosed
from .held import Admission
from .state import State
from .types import Instance

log = logging.getLogger("pinboard_worker")


class Served(Protocol):
    """What the middleware needs of the worker behind it, and all it touches. `Worker` is one
    and builds the middleware (`worker.asgi(app)`): this module imports nothing of worker.py."""

    config: Config
    advertise_url: str
    wakes: Wakes

    @property
    def state(self) -> State: ...

    @property
    def secret(self) -> str: ...

    async def start(self) -> None: ...

    async def stop(self, graceful: bool = True) -> None: ...

    async def woken(self, inst: Instance, saved: bytes | None) -> None:
        """A claimed `_wake`'s stored state handed to the application (its `on_wake`)."""
        ...


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

ATTESTATION = b"pinboard-attestation"
EPOCH = b"pinboard-epoch"
PROXY_SECRET = b"pinboard-proxy-secret"
WS_POLICY_VIOLATION = 1008


def instance(request: Any) -> Instance:
    """The `Instance` an admitted request is for: pass a Starlette/FastAPI `Request` or
    `WebSocket`, or an ASGI scope. `LookupError` for a request that is not an instance's."""
    scope = getattr(request, "scope", request)
    found = scope.get("pinned")
    if not isinstance(found, Instance):
        raise LookupError("not an instance request: no scope['pinned']")
    return found


class Answer:
    """One answer the middleware writes itself (never the app's)."""

    def __init__(
        self, status: int, body: Any, headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        self.status = status
        if isinstance(body, str):
            self.body = body.encode()
            content_type = b"text/plain; charset=utf-8"
        else:
            self.body = json.dumps(body, separators=(",", ":")).encode()
            content_type = b"application/json"
        self.headers = [
            (b"content-type", content_type),
            (b"content-length", str(len(self.body)).encode()),
            *(headers or []),
        ]

    async def send(self, send: Send, prefix: str = "http.") -> None:
        await send(
            {"type": prefix + "response.start", "status": self.status, "headers": self.headers}
        )
        await send({"type": prefix + "response.body", "body": self.body})


def invalid_attestation() -> Answer:
    return Answer(403, {"detail": "invalid attestation"})


def lease_unhealthy() -> Answer:
    """The in-band refusal: Pinboard releases the placement and re-places the instance."""
    return Answer(
        503,
        {"detail": "lease unhealthy"},
        [(b"retry-after", b"1"), (b"pinned-refusal", b"lease-unhealthy")],
    )


def not_found() -> Answer:
    return Answer(404, {"detail": "not found"})


def method_not_allowed(allow: bytes) -> Answer:
    return Answer(405, "method not allowed", [(b"allow", allow)])


W = TypeVar("W", bound=Served)


class PinnedMiddleware(Generic[W]):
    def __init__(self, app: ASGIApp, worker: W) -> None:
        self.app = app
        self.worker = worker
        self.key = attestation.Key(worker.secret.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        state = self.worker.state
        path: str = scope["path"]
        if state.base:
            if path != state.base and not path.startswith(state.base + "/"):
                await self.app(scope, receive, send)
                return
            path = path[len(state.base) :]
        if path in ("/_pinned/challenge", "/_pinned/stats"):
            await self._pinned_route(scope, path, receive, send)
            return
        split = split_instance(path, self.worker.config.namespaces)
        if split is None:
            await self.app(scope, receive, send)
            return
        ns, id, rest = split
        if splits_when_decoded(rest, scope.get("raw_path")):
            await self._refuse(scope, receive, send, Answer(400, "invalid instance path"))
            return
        wake = rest == "/_wake"
        if wake:
            if kind != "http" or self.worker.config.durability is None:
                await self._refuse(scope, receive, send, not_found())
                return
            if scope["method"] != "POST":
                await self._refuse(scope, receive, send, method_not_allowed(b"POST"))
                return
        admitted = self._admit(scope, ns, id, rest, "wake" if wake else "forward")
        if isinstance(admitted, Answer):
            await self._refuse(scope, receive, send, admitted)
            return
        if wake:
            await self._wake(admitted, receive, send)
            return
        inner = dict(scope)
        inner["pinned"] = admitted
        if state.base:
            inner["path"] = path
            inner["root_path"] = scope.get("root_path", "") + state.base
            raw = scope.get("raw_path")
            if isinstance(raw, bytes) and raw.startswith(state.base.encode()):
                inner["raw_path"] = raw[len(state.base) :]
        if kind == "http":
            await self.app(inner, receive, self._withheld_past_the_lease(send))
        else:
            await self._websocket(inner, admitted, receive, send)

    # --- the checks ------------------------------------------------------------------------

    def _attested(self, scope: Scope, purpose: str) -> tuple[Binding, Attestation]:
        tokens = header_values(scope, ATTESTATION)
        session = self.worker.state.session
        if len(tokens) != 1 or session is None:
            raise InvalidAttestation("no single attestation, or no session")
        binding, attested = attestation.verify(tokens[0], self.key, session, time.time())
        if binding.purpose != purpose:
            raise InvalidAttestation("issued for another purpose than this route's")
        return binding, attested

    def _admit(self, scope: Scope, ns: str, id: str, rest: str, purpose: str) -> Instance | Answer:
        """The five checks of an instance request, in order: the `Instance`, or the answer."""
        try:
            binding, attested = self._attested(scope, purpose)
        except InvalidAttestation as why:
            log.debug("refusing an unattested request to %s/%s: %s", ns, id, why)
            return invalid_attestation()
        epochs = header_values(scope, EPOCH)
        at = epoch.parse(epochs[0]) if epochs else None
        if at is None:
            return Answer(400, "malformed placement epoch")
        # The token names the placement it was minted for: another instance's or another
        # epoch's token, or a second `Pinboard-Epoch` beside it, is a replay.
        if binding.inst != f"{ns}/{id}" or len(epochs) != 1 or binding.epoch != at:
            log.debug("refusing a replayed attestation to %s/%s at %s", ns, id, at)
            return invalid_attestation()
        admission = self.worker.state.admit(ns, id, at)
        if admission is Admission.STALE:
            return Answer(409, "stale placement epoch")
        if admission is Admission.REFUSED:
            log.debug("refusing %s/%s at %s: lease unhealthy or stopping", ns, id, at)
            return lease_unhealthy()
        return Instance(
            ns=ns,
            id=id,
            rest=rest,
            epoch=at,
            activated=admission is Admission.ACTIVATED,
            attestation=attested,
        )

    def _withheld_past_the_lease(self, send: Send) -> Send:
        """Admitted on a live lease, the answer may still come past it (the worker paused
        while the app ran): by then the instance may be another worker's, so the answer is
        withheld, refused like a forward that came past the lease."""
        state = self.worker.state
        withheld = False

        async def guarded(message: Message) -> None:
            nonlocal withheld
            if message["type"] == "http.response.start" and not state.lease_healthy():
                withheld = True
                log.debug("withholding an answer: the lease lapsed while the app answered")
                await lease_unhealthy().send(send)
                return
            if withheld:
                return
            await send(message)

        return guarded

    async def _websocket(self, scope: Scope, inst: Instance, receive: Receive, send: Send) -> None:
        """An admitted WebSocket, the app's until it is done with it, or until its instance's
        epoch ends here first (`goodbye.py`): then the middleware closes it itself, 1012 and
        the reason, and the app's pending (or next) `receive` gets `websocket.disconnect`."""
        socket = _Farewell(self.worker.state.goodbyes.open(inst.ns, inst.id, inst.epoch))
        closer = asyncio.ensure_future(socket.close_when_said(send))
        try:
            await self.app(scope, socket.receiving(receive), socket.sending(send))
        except Exception as e:
            # What an app raises once its socket was closed under it (a send refused, the
            # disconnect it did not expect) ends it as a client's leaving would.
            if socket.goodbye.said is None or not _ended_by_close(e):
                raise
            log.debug("the app of %s/%s ended on its goodbye: %r", inst.ns, inst.id, e)
        finally:
            socket.goodbye.leave()
            if socket.goodbye.said is None:
                closer.cancel()
            # The close goes out before the server ends the connection.
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await closer

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, answer: Answer) -> None:
        if scope["type"] == "http":
            await answer.send(send)
            return
        await receive()  # websocket.connect
        if answer.status == 403:
            # A WebSocket's invalid attestation: accepted only to be closed 1008 at once.
            await send({"type": "websocket.accept"})
            await send(
                {
                    "type": "websocket.close",
                    "code": WS_POLICY_VIOLATION,
                    "reason": "invalid attestation",
                }
            )
        elif "websocket.http.response" in scope.get("extensions", {}):
            # The refusal as an HTTP answer to the upgrade, so that Pinboard can read it (its
            # in-band refusal re-places the instance).
            await answer.send(send, prefix="websocket.http.")
        else:
            await send({"type": "websocket.close", "code": WS_POLICY_VIOLATION})

    # --- /_pinned/* --------------------------------------------------------------------------

    async def _pinned_route(self, scope: Scope, path: str, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._refuse(scope, receive, send, not_found())
            return
        if scope["method"] not in ("GET", "HEAD"):
            await method_not_allowed(b"GET, HEAD").send(send)
            return
        if path == "/_pinned/challenge":
            await self._challenge(scope).send(send)
        else:
            await self._stats(scope).send(send)

    def _challenge(self, scope: Scope) -> Answer:
        state = self.worker.state
        secrets = header_values(scope, PROXY_SECRET)
        by_secret = len(secrets) == 1 and _constant_time_eq(secrets[0], state.secret)
        if not by_secret:
            try:
                self._attested(scope, "challenge")
            except InvalidAttestation:
                return Answer(403, "invalid proxy secret")
        challenge = query_param(scope.get("query_string", b"").decode("latin-1"), "challenge")
        value = state.challenge_value(challenge) if challenge is not None else None
        if value is None:
            return Answer(404, "unknown challenge")
        return Answer(200, {"value": value})

    def _stats(self, scope: Scope) -> Answer:
        try:
            self._attested(scope, "stats")
        except InvalidAttestation as why:
            log.debug("refusing a stats call: %s", why)
            return invalid_attestation()
        worker, state = self.worker, self.worker.state
        instances = state.held.instances()
        return Answer(
            200,
            {
                "sessionId": state.session,
                "clientId": worker.config.client_id,
                "advertiseUrl": worker.advertise_url,
                "namespaces": worker.config.namespaces,
                "instances": instances,
                "instanceCount": sum(len(ids) for ids in instances.values()),
                "headroom": state.headroom,
                "draining": state.draining or state.registry_draining,
                "degraded": state.degraded,
                "leaseHealthy": state.lease_healthy(),
                "uptimeMs": int((time.monotonic() - state.started) * 1000),
            },
        )

    # --- _wake ---------------------------------------------------------------------------------

    async def _wake(self, inst: Instance, receive: Receive, send: Send) -> None:
        """An admitted `_wake`: runs `on_wake` on the stored state unless one runs already or
        has just finished (the sweep asking again after a 202); 200 if it is done within
        `wake_wait`, else 202 while it goes on."""
        await _drain_body(receive)
        worker = self.worker
        begun = worker.wakes.begin(inst.ns, inst.id, inst.epoch, time.monotonic())
        if begun is Begin.RUNNING:
            await Answer(202, {"activating": True}).send(send)
            return
        if begun is Begin.DONE:
            await Answer(200, {"ok": True}).send(send)
            return
        task = asyncio.ensure_future(self._run_wake(inst))
        try:
            ok = await asyncio.wait_for(asyncio.shield(task), worker.config.wake_wait)
        except asyncio.TimeoutError:
            await Answer(202, {"activating": True}).send(send)
            return
        if ok:
            worker.wakes.collect(inst.ns, inst.id)
            await Answer(200, {"ok": True}).send(send)
        else:
            await Answer(500, {"detail": "wake failed"}).send(send)

    async def _run_wake(self, inst: Instance) -> bool:
        worker = self.worker
        ok = False
        try:
            store = worker.config.durability
            assert store is not None
            # Claimed at the wake's epoch before the hook hydrates: a former owner's late save
            # is refused from now on; a later owner's claim fails this (stale) wake.
            saved = store.claim(inst.ns, inst.id, Fence.of(inst))
            await worker.woken(inst, saved)
            ok = True
        except Exception:
            log.exception("wake of %s/%s at %s failed", inst.ns, inst.id, inst.epoch)
        worker.wakes.finish(inst.ns, inst.id, ok, time.monotonic())
        return ok

    # --- lifespan ------------------------------------------------------------------------------

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Starts the worker once the app's own startup completed (so what the app sets up
        is ready before the node places anything here) and stops it gracefully as shutdown
        begins (releasing while the app still runs); an app without a lifespan gets the
        messages answered here."""
        received = False

        async def hooked_receive() -> Message:
            nonlocal received
            message = await receive()
            received = True
            if message["type"] == "lifespan.shutdown":
                await self.worker.stop()
            return message

        async def hooked_send(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete":
                await self.worker.start()
            await send(message)

        try:
            await self.app(scope, hooked_receive, hooked_send)
        except Exception:
            if received:
                raise
            # The app does not speak lifespan (it refused the scope before reading it).
            log.debug("the app refused the lifespan scope; the middleware answers it")
        else:
            if received:
                return
        while True:
            message = await hooked_receive()
            if message["type"] == "lifespan.startup":
                await hooked_send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return


class _Farewell:
    """An admitted WebSocket's ASGI channel, with its goodbye: `close_when_said` sends the
    close once the goodbye comes (unless the app closed the socket or the client left first);
    from then on the app's `receive` answers `websocket.disconnect` with the goodbye's code and
    reason, and its `send` raises `WebSocketClosed`. Sends go one at a time, so that the close
    never cuts into a message being written."""

    def __init__(self, goodbye: Goodbye) -> None:
        self.goodbye = goodbye
        self.said: Close | None = None
        """The close sent for the goodbye."""
        self._over = False
        """The app closed the socket, or the client left: nothing to say."""
        self._sending = asyncio.Lock()

    async def close_when_said(self, send: Send) -> None:
        close = await self.goodbye.wait()
        async with self._sending:
            if self._over:
                return
            self._over = True
            self.said = close
            log.info(
                "closing a WebSocket of %s/%s: %d %s",
                self.goodbye.ns,
                self.goodbye.id,
                close.code,
                close.reason,
            )
            await send({"type": "websocket.close", "code": close.code, "reason": close.reason})

    def receiving(self, receive: Receive) -> Receive:
        pending: asyncio.Future[Message] | None = None

        async def received() -> Message:
            nonlocal pending
            if self.goodbye.said is None:
                if pending is None:
                    pending = asyncio.ensure_future(receive())
                said: asyncio.Future[Any] = asyncio.ensure_future(self.goodbye.wait())
                try:
                    waited: set[asyncio.Future[Any]] = {pending, said}
                    await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    said.cancel()
                if pending.done():
                    message, pending = pending.result(), None
                    if message["type"] == "websocket.disconnect":
                        self._over = True
                    return message
            if pending is not None:
                pending.cancel()
                pending = None
            close = self.goodbye.said
            assert close is not None
            return {"type": "websocket.disconnect", "code": close.code, "reason": close.reason}

        return received

    def sending(self, send: Send) -> Send:
        async def sent(message: Message) -> None:
            async with self._sending:
                if self.said is not None:
                    raise WebSocketClosed(f"WebSocket closed: {self.said.reason}")
                if message["type"] in ("websocket.close", "websocket.http.response.start"):
                    self._over = True
                await send(message)

        return sent


def _ended_by_close(error: Exception) -> bool:
    """Whether an app's error is its socket's close showing: a send refused (an `OSError`, as
    ASGI has it), or a framework's disconnect (Starlette's `WebSocketDisconnect`)."""
    return isinstance(error, OSError) or type(error).__name__ == "WebSocketDisconnect"


def header_values(scope: Scope, name: bytes) -> list[str]:
    return [value.decode("latin-1") for key, value in scope["headers"] if key.lower() == name]


def split_instance(path: str, namespaces: list[str]) -> tuple[str, str, str] | None:
    """`/{segment}/{id}{rest}` -> `("/{segment}", id, rest)` when `/{segment}` is one of
    `namespaces` and `id` is not empty."""
    slash = path.find("/", 1)
    if not path.startswith("/") or slash < 0:
        return None
    ns, tail = path[:slash], path[slash + 1 :]
    if ns not in namespaces:
        return None
    end = tail.find("/")
    id, rest = (tail, "") if end < 0 else (tail[:end], tail[end:])
    return (ns, id, rest) if id else None


_ENCODED_SEPARATOR = re.compile(rb"%(?:2f|5c)", re.IGNORECASE)


def splits_when_decoded(rest: str, raw_path: object) -> bool:
    """Whether an instance path says other segments to the app than it said to Pinboard: its
    decoded `rest` (after `{id}`) holds a dot segment or a `\\`, or the raw path (when the
    server gives it, as uvicorn's `scope["raw_path"]`) an encoded `/` or `\\` (`%2F`, `%5C`).
    Pinboard refuses such a path itself; this is the same rule at the worker, should anything
    else reach it. (A namespace and an id hold no `%`: the whole raw path is looked at.)"""
    if "\\" in rest or any(seg in (".", "..") for seg in rest.split("/")):
        return True
    return isinstance(raw_path, bytes) and _ENCODED_SEPARATOR.search(raw_path) is not None


def query_param(query: str, name: str) -> str | None:
    """The first value of `name` in a query string, percent-decoded (`+` kept)."""
    for pair in query.split("&"):
        key, _, value = pair.partition("=")
        if urllib.parse.unquote(key) == name:
            return urllib.parse.unquote(value)
    return None


def _constant_time_eq(given: str, secret: str) -> bool:
    import hmac

    return hmac.compare_digest(given.encode("latin-1"), secret.encode("latin-1"))


async def _drain_body(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body"):
            return
