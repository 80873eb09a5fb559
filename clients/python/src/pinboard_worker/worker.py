"""The `Worker`: one registration with Pinboard, its control task, and what the application
calls while it runs (its session, held instances, release, tag, wakes, headroom, draining).

Everything runs on the event loop that called `start()` (the ASGI server's); nothing here is
thread-safe, as nothing in asyncio is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .asgi import ASGIApp, PinnedMiddleware
from .config import Config
from .control import Control, CredentialRefused
from .credential import Credential
from .durable import DurabilityStore, Wakes
from .registry import CallError, NoSession, NoStore, NotHeld, Registry
from .state import State
from .types import Event, Instance, Message, Status

log = logging.getLogger("pinboard_worker")

EventHook = Callable[["Worker", Event], Awaitable[None]]
WakeHook = Callable[["Worker", Instance, "bytes | None"], Awaitable[None]]

LISTEN_WAIT = 5.0
"""Seconds the first registration waits for the advertise URL to accept connections (the ASGI
server binds after the application's startup): the node probes it while registering."""
EVENTS_DRAIN = 5.0
"""Seconds events already queued may still run once the worker stopped."""


@dataclass(frozen=True)
class Held:
    """An instance this worker holds."""

    ns: str
    id: str
    epoch: str


class Worker:
    """A worker of `config`: `on_event(worker, event)` gets `Registered`, `WindDown`,
    `Evicted`, `Drain` and `Superseded`, in order and off the heartbeat path; with
    `config.durability`, `on_wake(worker, instance, state)` gets each `_wake` of the node's
    durability sweep. Raises `ConfigError` naming a bad setting (a token file that cannot be
    read included)."""

    def __init__(
        self,
        config: Config,
        *,
        on_event: EventHook | None = None,
        on_wake: WakeHook | None = None,
    ) -> None:
        base = config.validate()
        self._credential = Credential(config.token, config.token_file)
        self.config = config
        self._state = State(config, base)
        self.advertise_url = config.advertise_url.rstrip("/")
        self._on_event = on_event
        self.on_wake = on_wake
        self.wakes = Wakes()
        self._registry: Registry | None = None
        self._stop = asyncio.Event()
        self._graceful = False
        self._events: asyncio.Queue[Event | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._delivery: asyncio.Task[None] | None = None
        self._registered = asyncio.Event()
        self._ended = asyncio.Event()
        """Set once the worker stopped on its own (superseded, credential refused) or was
        stopped and left."""
        self._refused: CredentialRefused | None = None

    # --- lifetime -----------------------------------------------------------------------

    async def start(self) -> None:
        """Starts registering and heartbeating in the background; returns at once. The ASGI
        middleware calls it at the server's lifespan startup."""
        if self._task is not None:
            return
        self._registry = Registry(
            self.config.registry,
            self._credential,
            self.config.call_timeout,
            self.config.registry_ca_file,
        )
        self._delivery = asyncio.ensure_future(self._deliver())
        self._task = asyncio.ensure_future(self._run(self._registry))

    async def stop(self, graceful: bool = True) -> None:
        """Stops. Graceful: no new activations, every held instance released, the session
        deregistered (each given up after three tries). Otherwise the lease just lapses."""
        if self._task is None or self._stop.is_set():
            return
        self._graceful = graceful
        self._stop.set()
        await self._task
        if self._delivery is not None:
            self._events.put_nowait(None)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._delivery, EVENTS_DRAIN)
        if self._registry is not None:
            await self._registry.close()

    async def run(self) -> None:
        """Starts the worker (unless started) and returns once it stopped: after `stop()`, or
        superseded by a higher-epoch registration. Raises `CredentialRefused` when it stopped
        because the registry refused its credential until its lease lapsed."""
        await self.start()
        await self.wait_stopped()

    async def wait_stopped(self) -> None:
        """`run()` without starting the worker: until it stopped (the ASGI lifespan starts and
        stops it). Raises `CredentialRefused` as `run()` does."""
        await self._ended.wait()
        if self._refused is not None:
            raise self._refused

    async def wait_registered(self, timeout: float | None = None) -> str:
        """Until the worker holds a session (or `asyncio.TimeoutError`): the session."""
        await asyncio.wait_for(self._registered.wait(), timeout)
        assert self._state.session is not None
        return self._state.session

    def asgi(self, app: ASGIApp) -> PinnedMiddleware[Worker]:
        """`app` behind this worker's middleware: the ASGI application to serve."""
        return PinnedMiddleware(app, self)

    async def woken(self, inst: Instance, saved: bytes | None) -> None:
        """A claimed `_wake`'s stored state, handed to `on_wake` (the middleware calls it)."""
        if self.on_wake is not None:
            await self.on_wake(self, inst, saved)

    # --- what the application reads and sets ---------------------------------------------

    @property
    def state(self) -> State:
        return self._state

    @property
    def secret(self) -> str:
        """The secret registered with Pinboard: it signs attestations for this worker."""
        return self._state.secret

    @property
    def session_id(self) -> str | None:
        return self._state.session

    @property
    def store(self) -> DurabilityStore | None:
        return self.config.durability

    def status(self) -> Status:
        return self._state.status()

    def held(self) -> list[Held]:
        """Held instances, sorted by namespace and id."""
        return [Held(ns, id, epoch) for ns, id, epoch in self._state.held.held()]

    def messages(self) -> list[Message]:
        """Wind-down messages received, oldest first (the last 1024)."""
        return list(self._state.messages)

    def set_headroom(self, headroom: int) -> None:
        """The headroom sent on the next heartbeat."""
        self._state.headroom = headroom

    def set_draining(self, draining: bool) -> None:
        """This worker's own draining flag, sent on the next heartbeat: while set, the
        registry places no new instances here."""
        self._state.draining = draining

    # --- registry calls the application makes ---------------------------------------------

    async def release(self, ns: str, id: str) -> bool:
        """Gives up `(ns, id)`: the worker stops holding it at once (so a re-registration does
        not reclaim it), then asks the registry to free its placement, quoting the epoch it
        was held at (given up after three tries). Whether the registry freed a row."""
        epoch = self._state.held.forget(ns, id, time.monotonic())
        if epoch is None:
            raise NotHeld(ns, id)
        self._state.goodbyes.instance_ended(ns, id)
        rows = [{"sessionId": self._session(), "namespace": ns, "id": id, "epoch": epoch}]
        answer = await self._call("release", rows)
        released = answer.get("released")
        return isinstance(released, int) and released > 0

    async def tag(self, ns: str, id: str, tag: str) -> bool:
        """Sets the placement's owner tag (1-256 characters), quoting the epoch held: whether
        the registry wrote it (`False` when the placement moved on)."""
        epoch = self._epoch_held(ns, id)
        body = {"sessionId": self._session(), "namespace": ns, "id": id, "epoch": epoch, "tag": tag}
        return (await self._call("tag", body)).get("tagged") is True

    async def schedule_wake(self, ns: str, id: str, at: float) -> bool:
        """Asks the node to wake `(ns, id)` at `at` (seconds since the Unix epoch): recorded
        in the store, then `POST /registry/schedule` quoting the epoch held. Whether the node
        wrote it (`False` when the placement moved on)."""
        return await self._schedule(ns, id, int(at * 1000))

    async def cancel_wake(self, ns: str, id: str) -> bool:
        return await self._schedule(ns, id, None)

    async def _schedule(self, ns: str, id: str, wake_at_ms: int | None) -> bool:
        store = self.config.durability
        if store is None:
            raise NoStore()
        epoch = self._epoch_held(ns, id)
        if wake_at_ms is None:
            store.cancel(ns, id)
        else:
            store.schedule(ns, id, wake_at_ms)
        row = {
            "sessionId": self._session(),
            "namespace": ns,
            "id": id,
            "epoch": epoch,
            "wakeAt": wake_at_ms,
        }
        scheduled = (await self._call("schedule", [row])).get("scheduled")
        return isinstance(scheduled, int) and scheduled > 0

    def _session(self) -> str:
        if self._state.session is None:
            raise NoSession()
        return self._state.session

    def _epoch_held(self, ns: str, id: str) -> str:
        epoch = self._state.held.epoch_of(ns, id)
        if epoch is None:
            raise NotHeld(ns, id)
        return epoch

    async def _call(self, route: str, body: Any) -> dict[str, Any]:
        # A `reregister` answer is the caller's error: only the heartbeat path registers again.
        if self._registry is None:
            raise NoSession()
        return await self._registry.post_thrice(route, body)

    # --- the background tasks ------------------------------------------------------------

    def _emit(self, event: Event) -> None:
        from .types import Registered

        if isinstance(event, Registered):
            self._registered.set()
        # What the event ends, the open WebSockets are told first: at once, or once a
        # wind-down's deadline passed.
        goodbyes = self._state.goodbyes
        deadline = goodbyes.on_event(event, self._state.held)
        if deadline is not None:
            asyncio.get_running_loop().call_later(
                deadline.after, goodbyes.deadline_reached, deadline
            )
        self._events.put_nowait(event)

    async def _run(self, registry: Registry) -> None:
        control = Control(self._state, registry, self._emit, self._stop, self.advertise_url)
        try:
            await self._until_listening()
            await control.lifecycle()
            if not self._stop.is_set():
                self._ended.set()  # superseded: stopped on its own
            # Nothing left to do with the registry until the stop.
            await self._stop.wait()
            if self._graceful:
                await control.leave()
                # Everything held was released: every WebSocket's epoch ended here.
                self._state.goodbyes.all_ended()
        except CredentialRefused as refused:
            # Nothing to release or deregister: those calls would be refused too.
            self._refused = refused
            self._state.goodbyes.all_ended()
        except Exception:
            log.exception("pinboard_worker control task failed")
        finally:
            self._ended.set()

    async def _until_listening(self) -> None:
        """Until the advertise URL accepts a TCP connection, for `LISTEN_WAIT` at most (a
        worker behind a NAT may not reach its own advertise URL: it registers anyway)."""
        url = urllib.parse.urlsplit(self.advertise_url)
        host = url.hostname or "127.0.0.1"
        port = url.port or (443 if url.scheme == "https" else 80)
        deadline = time.monotonic() + LISTEN_WAIT
        while time.monotonic() < deadline and not self._stop.is_set():
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 1.0)
            except (OSError, asyncio.TimeoutError):
                await asyncio.sleep(0.05)
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return

    async def _deliver(self) -> None:
        """Hands events to the application one at a time, in order."""
        while True:
            event = await self._events.get()
            if event is None:
                return
            if self._on_event is None:
                continue
            try:
                await self._on_event(self, event)
            except Exception:
                log.exception("on_event failed for %r", event)


__all__ = ["CallError", "Held", "Worker"]
