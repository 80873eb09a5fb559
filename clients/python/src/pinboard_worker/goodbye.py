"""The WebSocket goodbye: when an instance's epoch ends on this worker with WebSockets open,
they are closed with 1012 (service restart) and a reason, so that their clients reconnect (and
reach the instance where it lives now) rather than see a reset. The Rust library's
`pinboard_protocol::worker::goodbye`, decided the same way.

The middleware `open`s a `Goodbye` for each WebSocket of an admitted instance, at its epoch,
and closes the socket once `Goodbye.wait()` returns. What ends an epoch is decided here:

- a wind-down whose deadline is reached (the placement is fenced then): the epoch held when the
  message came, and those before it; a later message revokes or replaces it. The worker sleeps
  until the deadline (`Deadline`, `loop.call_later`), the rest is decided here;
- a move (a wind-down with `moved`): the same, with the reason `moved`;
- an eviction (not reclaimed at a re-registration) or a release by the application: every epoch
  of the instance; a supersession, the credential refused past the lease, a graceful stop: every
  instance's;
- a newer epoch admitted for the instance: the older ones.

The reason names the epoch that ended (`epoch 1733456789012 ended`), or says `moved`: at most
123 bytes, as a close frame's reason must be. Runs on the worker's event loop, as everything
here does.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from .epoch import order
from .held import HeldMap
from .types import Event, Evicted, Message, Superseded, WindDown

SERVICE_RESTART = 1012
"""The close code of the goodbye (RFC 6455 §7.4.1): the service is restarting, reconnect."""
MAX_REASON = 123
"""The longest reason a close frame carries (125 bytes of payload, 2 of them the code)."""


@dataclass(frozen=True)
class Close:
    """How a WebSocket is closed."""

    code: int
    reason: str

    @staticmethod
    def epoch_ended(epoch: str) -> Close:
        """1012 `epoch {epoch} ended` (`epoch ended` for an epoch too long to name)."""
        named = f"epoch {epoch} ended"
        return Close(SERVICE_RESTART, named if len(named) <= MAX_REASON else "epoch ended")

    @staticmethod
    def moved() -> Close:
        return Close(SERVICE_RESTART, "moved")


class WebSocketClosed(ConnectionError):
    """An application's send on a WebSocket its goodbye closed. An `OSError`, as ASGI has a
    send on a closed WebSocket raise (Starlette turns it into `WebSocketDisconnect`), so that an
    app that did not see the disconnect yet ends the way it ends when its client leaves."""


@dataclass(frozen=True)
class Deadline:
    """A wind-down's deadline: once `after` seconds have passed, hand it to
    `Goodbyes.deadline_reached`."""

    after: float
    ns: str
    id: str
    through: str
    """The epoch held when the message came: it and those before it end."""
    moved: bool
    ticket: int


class Goodbye:
    """The goodbye of one WebSocket of an instance at an epoch."""

    def __init__(self, goodbyes: Goodbyes, ns: str, id: str, epoch: str) -> None:
        self._goodbyes = goodbyes
        self.ns, self.id, self.epoch = ns, id, epoch
        self.said: Close | None = None
        self._event = asyncio.Event()

    async def wait(self) -> Close:
        """Returns once this WebSocket's epoch ended here, with how to close it."""
        await self._event.wait()
        assert self.said is not None
        return self.said

    def leave(self) -> None:
        """The WebSocket is over: out of the table."""
        self._goodbyes._leave(self)

    def _say(self, close: Close) -> None:
        if self.said is None:
            self.said = close
            self._event.set()


class Goodbyes:
    """The open goodbyes of a worker, by instance."""

    def __init__(self) -> None:
        self._open: dict[tuple[str, str], list[Goodbye]] = {}
        self._pending: dict[tuple[str, str], int] = {}
        """The wind-down pending per instance, by its deadline's ticket."""
        self._tickets = itertools.count()

    def __len__(self) -> int:
        return sum(len(sockets) for sockets in self._open.values())

    def open(self, ns: str, id: str, epoch: str) -> Goodbye:
        """The goodbye of a WebSocket of `(ns, id)` admitted at `epoch`."""
        goodbye = Goodbye(self, ns, id, epoch)
        self._open.setdefault((ns, id), []).append(goodbye)
        return goodbye

    def on_event(self, event: Event, held: HeldMap) -> Deadline | None:
        """What an event of the registry protocol ends: at once, or (a wind-down with a
        deadline) at the `Deadline` returned, which the worker sleeps until."""
        if isinstance(event, WindDown):
            return self._wind_down(event.message, held)
        if isinstance(event, Evicted):
            self.instance_ended(event.ns, event.id)
        elif isinstance(event, Superseded):
            self.all_ended()
        return None

    def _wind_down(self, message: Message, held: HeldMap) -> Deadline | None:
        key = (message.ns, message.id)
        self._pending.pop(key, None)
        through = held.epoch_of(message.ns, message.id)
        if message.deadline is None or through is None:
            return None
        ticket = next(self._tickets)
        self._pending[key] = ticket
        return Deadline(message.deadline, message.ns, message.id, through, message.moved, ticket)

    def deadline_reached(self, deadline: Deadline) -> None:
        """A wind-down's deadline passed: its instance's WebSockets up to its epoch are closed,
        unless a later message revoked or replaced it."""
        key = (deadline.ns, deadline.id)
        if self._pending.get(key) != deadline.ticket:
            return
        del self._pending[key]
        through = order(deadline.through)
        self._close(key, lambda epoch: order(epoch) <= through, deadline.moved)

    def newer_epoch(self, ns: str, id: str, epoch: str) -> None:
        """`(ns, id)` was admitted at `epoch`: the WebSockets of older epochs are closed."""
        if self._open:
            newer = order(epoch)
            self._close((ns, id), lambda open: order(open) < newer, False)

    def instance_ended(self, ns: str, id: str) -> None:
        """Every epoch of `(ns, id)` ended here (evicted, or released)."""
        self._close((ns, id), lambda _: True, False)

    def all_ended(self) -> None:
        """Every instance's epoch ended here (superseded, the credential refused, a graceful
        stop)."""
        for key in list(self._open):
            self.instance_ended(*key)

    def _close(self, key: tuple[str, str], ends: Callable[[str], bool], moved: bool) -> None:
        sockets = self._open.get(key, [])
        ending = [goodbye for goodbye in sockets if ends(goodbye.epoch)]
        staying = [goodbye for goodbye in sockets if not ends(goodbye.epoch)]
        if staying:
            self._open[key] = staying
        else:
            self._open.pop(key, None)
        for goodbye in ending:
            goodbye._say(Close.moved() if moved else Close.epoch_ended(goodbye.epoch))

    def _leave(self, goodbye: Goodbye) -> None:
        key = (goodbye.ns, goodbye.id)
        sockets = [g for g in self._open.get(key, []) if g is not goodbye]
        if sockets:
            self._open[key] = sockets
        else:
            self._open.pop(key, None)
